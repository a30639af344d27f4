//! The connections a node's port accepts: TCP with Nagle off, then, when TLS is on, a TLS
//! handshake with the server config current at that moment (so rotated certificates are used
//! by new connections, docs/SECURITY.md §1). Every connection carries a [`PeerIdentity`]
//! (remote address and, when its client presented a verified certificate, its principal) as
//! tonic's `ConnectInfo`, so every request on it has the identity in its extensions.
//!
//! Handshakes run concurrently, each bounded by [`HANDSHAKE_TIMEOUT`], at most
//! [`HANDSHAKES_PENDING_MAX`] at once: a client that opens connections and never finishes its
//! handshake ties up a bounded number of slots for a bounded time, and connections beyond the
//! limit are closed at once. Refused handshakes are logged by `log_limit`: the first one with
//! its cause and remote address, then at most one summary a minute, however many come.
//!
//! Owns accepting and handshaking only; what a principal may do is the authorization layer's.

use std::io::IoSlice;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use lock_tls::server::ServerTls;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::Connected;

use crate::log_limit::{LogLimit, Note};
use crate::peer::PeerIdentity;

/// How long a client may take to finish its TLS handshake. A handshake is two round trips and
/// a signature; 10 s covers a loaded machine and a slow link, and still frees a slot held by a
/// client that connected and went silent.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Most TLS handshakes in progress at once. Far above any legitimate burst of new connections
/// (clients keep one HTTP/2 connection each), low enough that a flood of half-open handshakes
/// costs bounded memory.
pub const HANDSHAKES_PENDING_MAX: usize = 256;

/// Accepted connections waiting for the server to take them.
const ACCEPTED_QUEUE: usize = 64;

/// Pause after a failed `accept` (typically out of file descriptors), so the loop does not
/// spin while the condition lasts.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);

/// One accepted connection, plaintext or TLS, with its peer's identity.
#[derive(Debug)]
pub struct Connection {
    io: Io,
    identity: PeerIdentity,
}

#[derive(Debug)]
enum Io {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

impl Connected for Connection {
    type ConnectInfo = PeerIdentity;

    fn connect_info(&self) -> PeerIdentity {
        self.identity.clone()
    }
}

impl AsyncRead for Connection {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match &self.io {
            Io::Plain(s) => s.is_write_vectored(),
            Io::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// The refused handshakes of one listener, logged as an episode that never ends on its own:
/// a good connection between two bad ones must not make the next bad one worth a line again.
#[derive(Debug, Default)]
struct Refusals(Mutex<LogLimit>);

impl Refusals {
    fn note(&self, remote: SocketAddr, error: &dyn std::fmt::Display) {
        let text = format!("{remote}: {error}");
        let note = self
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .failed(Instant::now(), &text);
        match note {
            None => {}
            Some(Note::Began) => tracing::warn!(
                %remote,
                %error,
                "TLS handshake refused; further refusals are summarised at most once a minute"
            ),
            Some(Note::Summary(s)) => tracing::warn!(
                refused = s.count,
                refused_total = s.total,
                last = %s.last_error,
                "TLS handshakes refused since the last line"
            ),
        }
    }
}

/// The connections `listener` accepts, plaintext when `tls` is `None`, as the stream tonic's
/// `serve_with_incoming` takes. The accepting task ends when the stream is dropped.
pub fn incoming(
    listener: TcpListener,
    tls: Option<Arc<ServerTls>>,
) -> ReceiverStream<std::io::Result<Connection>> {
    let (tx, rx) = mpsc::channel(ACCEPTED_QUEUE);
    tokio::spawn(accept_loop(listener, tls, tx));
    ReceiverStream::new(rx)
}

async fn accept_loop(
    listener: TcpListener,
    tls: Option<Arc<ServerTls>>,
    tx: mpsc::Sender<std::io::Result<Connection>>,
) {
    let pending = Arc::new(Semaphore::new(HANDSHAKES_PENDING_MAX));
    let refusals = Arc::new(Refusals::default());
    let mut accept_failing = LogLimit::default();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            // The server stopped taking connections: close the listener.
            () = tx.closed() => return,
        };
        let (tcp, remote) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                match accept_failing.failed(Instant::now(), &e) {
                    None => {}
                    Some(Note::Began) => tracing::warn!(error = %e, "cannot accept a connection"),
                    Some(Note::Summary(s)) => tracing::warn!(
                        failed = s.count,
                        last_error = %s.last_error,
                        "still cannot accept connections"
                    ),
                }
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                continue;
            }
        };
        if let Some(ended) = accept_failing.succeeded(Instant::now()) {
            tracing::info!(failed = ended.total, "accepting connections again");
        }
        // Nagle off: a follower answering pipelined appends otherwise held each answer while an
        // earlier one was unacknowledged, and the leader's delayed ACK made that about 40 ms
        // (lock-bench W3 p99 44 ms against 3.6 ms until this was set).
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(%remote, error = %e, "cannot turn Nagle off");
        }
        let Some(tls) = &tls else {
            let connection = Connection {
                io: Io::Plain(tcp),
                identity: PeerIdentity {
                    remote: Some(remote),
                    principal: None,
                },
            };
            if tx.send(Ok(connection)).await.is_err() {
                return;
            }
            continue;
        };
        let Ok(slot) = pending.clone().try_acquire_owned() else {
            refusals.note(
                remote,
                &format!(
                    "{HANDSHAKES_PENDING_MAX} TLS handshakes already in progress; connection closed"
                ),
            );
            continue;
        };
        let (acceptor, tx, refusals) = (tls.acceptor(), tx.clone(), refusals.clone());
        tokio::spawn(async move {
            let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await;
            drop(slot);
            let stream = match handshake {
                Ok(Ok(stream)) => stream,
                Ok(Err(e)) => return refusals.note(remote, &e),
                Err(_) => {
                    return refusals.note(
                        remote,
                        &format!("the TLS handshake did not finish within {HANDSHAKE_TIMEOUT:?}"),
                    );
                }
            };
            let principal = match lock_tls::server::client_principal(stream.get_ref().1) {
                None => None,
                Some(Ok(principal)) => Some(principal),
                Some(Err(reason)) => {
                    // Verified by the CA but naming nobody: the connection stays, with no
                    // principal, and authorization refuses what needs one.
                    refusals.note(
                        remote,
                        &format!("client certificate without a principal: {reason}"),
                    );
                    None
                }
            };
            let connection = Connection {
                io: Io::Tls(Box::new(stream)),
                identity: PeerIdentity {
                    remote: Some(remote),
                    principal,
                },
            };
            // A closed receiver means the server stopped; the connection is dropped with it.
            let _ = tx.send(Ok(connection)).await;
        });
    }
}
