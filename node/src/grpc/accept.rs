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

/// The bounds on handshakes in progress; [`AcceptLimits::default`] is what a node uses (tests
/// shrink them to see them work).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AcceptLimits {
    /// How long one handshake may take.
    pub handshake_timeout: Duration,
    /// Most handshakes in progress at once; a connection beyond them is closed at once.
    pub handshakes_pending_max: usize,
}

impl Default for AcceptLimits {
    fn default() -> Self {
        Self {
            handshake_timeout: HANDSHAKE_TIMEOUT,
            handshakes_pending_max: HANDSHAKES_PENDING_MAX,
        }
    }
}

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
    incoming_with(listener, tls, AcceptLimits::default())
}

/// [`incoming`] with other handshake bounds.
pub fn incoming_with(
    listener: TcpListener,
    tls: Option<Arc<ServerTls>>,
    limits: AcceptLimits,
) -> ReceiverStream<std::io::Result<Connection>> {
    let (tx, rx) = mpsc::channel(ACCEPTED_QUEUE);
    tokio::spawn(accept_loop(listener, tls, limits, tx));
    ReceiverStream::new(rx)
}

async fn accept_loop(
    listener: TcpListener,
    tls: Option<Arc<ServerTls>>,
    limits: AcceptLimits,
    tx: mpsc::Sender<std::io::Result<Connection>>,
) {
    let AcceptLimits {
        handshake_timeout,
        handshakes_pending_max,
    } = limits;
    let pending = Arc::new(Semaphore::new(handshakes_pending_max));
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
                    "{handshakes_pending_max} TLS handshakes already in progress; connection closed"
                ),
            );
            continue;
        };
        let (acceptor, tx, refusals) = (tls.acceptor(), tx.clone(), refusals.clone());
        tokio::spawn(async move {
            let handshake = tokio::time::timeout(handshake_timeout, acceptor.accept(tcp)).await;
            drop(slot);
            let stream = match handshake {
                Ok(Ok(stream)) => stream,
                Ok(Err(e)) => return refusals.note(remote, &e),
                Err(_) => {
                    return refusals.note(
                        remote,
                        &format!("the TLS handshake did not finish within {handshake_timeout:?}"),
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

#[cfg(test)]
mod tests {
    use std::path::Path;

    use futures::StreamExt;
    use lock_tls::TlsFiles;
    use lock_tls::mint::Authority;
    use lock_tls::server::ClientCerts;
    use tokio::io::AsyncWriteExt;

    use super::*;

    /// How long a test waits for a connection it expects (or makes sure none comes).
    const WAIT: Duration = Duration::from_secs(5);

    fn identity(
        dir: &Path,
        ca: &Authority,
        principal: &str,
    ) -> (std::path::PathBuf, std::path::PathBuf) {
        let paths = (
            dir.join(format!("{principal}.pem")),
            dir.join(format!("{principal}-key.pem")),
        );
        ca.issue(principal)
            .unwrap()
            .write(&paths.0, &paths.1)
            .unwrap();
        paths
    }

    /// A TLS client connection to `addr` as `who` (or anonymous), kept open by the caller.
    async fn tls_client(
        addr: SocketAddr,
        ca: &Path,
        who: Option<(&Path, &Path)>,
    ) -> tokio_rustls::client::TlsStream<TcpStream> {
        let config = lock_tls::client::client_config(ca, who).unwrap();
        let tcp = TcpStream::connect(addr).await.unwrap();
        let name = tokio_rustls::rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
        tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn a_tls_connection_carries_its_clients_principal_and_junk_yields_none() {
        let dir = tempfile::tempdir().unwrap();
        let ca = Authority::new("accept test ca").unwrap();
        let ca_path = dir.path().join("ca.pem");
        ca.write(&ca_path, &dir.path().join("ca-key.pem")).unwrap();
        let (cert, key) = identity(dir.path(), &ca, "node-1");
        let client = identity(dir.path(), &ca, "client");
        let files = TlsFiles {
            ca: ca_path.clone(),
            cert,
            key,
        };
        let tls = Arc::new(ServerTls::load(files, ClientCerts::Optional).unwrap());
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut incoming = incoming(listener, Some(tls));

        let named = tls_client(addr, &ca_path, Some((&client.0, &client.1))).await;
        let conn = tokio::time::timeout(WAIT, incoming.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        let identity = conn.connect_info();
        assert_eq!(identity.principal.as_deref(), Some("client"));
        assert_eq!(
            identity.remote,
            Some(named.get_ref().0.local_addr().unwrap())
        );

        // Plaintext HTTP/2 on the TLS port: refused, no connection reaches the server.
        let mut plain = TcpStream::connect(addr).await.unwrap();
        plain
            .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            .await
            .unwrap();
        // A client without a certificate (none is required here) is served, with no principal.
        let _anonymous = tls_client(addr, &ca_path, None).await;
        let conn = tokio::time::timeout(WAIT, incoming.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(
            conn.connect_info().principal,
            None,
            "the plaintext client never arrives"
        );
        let nothing = tokio::time::timeout(Duration::from_millis(300), incoming.next()).await;
        assert!(nothing.is_err(), "no other connection was accepted");
    }

    /// A server for a fresh PKI in `dir` with `limits`; returns its address, the CA file, a
    /// client identity and the accepted connections.
    async fn tls_server(dir: &Path, limits: AcceptLimits) -> TestServer {
        let ca = Authority::new("accept test ca").unwrap();
        let ca_path = dir.join("ca.pem");
        ca.write(&ca_path, &dir.join("ca-key.pem")).unwrap();
        let (cert, key) = identity(dir, &ca, "node-1");
        let client = identity(dir, &ca, "client");
        let files = TlsFiles {
            ca: ca_path.clone(),
            cert,
            key,
        };
        let tls = Arc::new(ServerTls::load(files, ClientCerts::Required).unwrap());
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        TestServer {
            addr: listener.local_addr().unwrap(),
            ca: ca_path,
            client,
            incoming: incoming_with(listener, Some(tls), limits),
        }
    }

    struct TestServer {
        addr: SocketAddr,
        ca: std::path::PathBuf,
        client: (std::path::PathBuf, std::path::PathBuf),
        incoming: ReceiverStream<std::io::Result<Connection>>,
    }

    impl TestServer {
        /// Whether a TLS handshake as the client completes and the server then takes the
        /// connection (in TLS 1.3 the client can finish before the server has refused).
        async fn serves_a_client(&mut self) -> bool {
            let who = (self.client.0.as_path(), self.client.1.as_path());
            let config = lock_tls::client::client_config(&self.ca, Some(who)).unwrap();
            let tcp = TcpStream::connect(self.addr).await.unwrap();
            let name = tokio_rustls::rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
            let Ok(_stream) = tokio_rustls::TlsConnector::from(Arc::new(config))
                .connect(name, tcp)
                .await
            else {
                return false;
            };
            matches!(
                tokio::time::timeout(Duration::from_millis(500), self.incoming.next()).await,
                Ok(Some(Ok(_)))
            )
        }
    }

    #[tokio::test]
    async fn a_silent_client_is_closed_after_the_handshake_timeout_and_holds_a_bounded_slot() {
        use tokio::io::AsyncReadExt;
        let dir = tempfile::tempdir().unwrap();
        let limits = AcceptLimits {
            handshake_timeout: Duration::from_secs(2),
            handshakes_pending_max: 1,
        };
        let mut server = tls_server(dir.path(), limits).await;

        // A client that connects and never says a word holds the one handshake slot...
        let silent_since = Instant::now();
        let mut silent = TcpStream::connect(server.addr).await.unwrap();
        // ...so a proper client is turned away while it does (once the loop has taken the
        // silent one: until then the proper one may still get the slot and be served).
        let mut turned_away = false;
        while silent_since.elapsed() < limits.handshake_timeout / 2 {
            if !server.serves_a_client().await {
                turned_away = true;
                break;
            }
        }
        assert!(turned_away, "a second handshake got past a limit of one");

        // The silent client is closed once its handshake time is up; then clients are served.
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(WAIT, silent.read(&mut byte)).await;
        assert!(
            matches!(read, Ok(Ok(0)) | Ok(Err(_))),
            "the silent client was not closed: {read:?}"
        );
        assert!(silent_since.elapsed() >= limits.handshake_timeout);
        assert!(server.serves_a_client().await);
    }

    #[tokio::test]
    async fn every_request_on_a_connection_carries_its_peer_identity() {
        let dir = tempfile::tempdir().unwrap();
        let TestServer {
            addr,
            ca,
            client,
            incoming,
        } = tls_server(dir.path(), AcceptLimits::default()).await;
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = {
            let seen = seen.clone();
            move |request: tonic::Request<()>| {
                let identity = PeerIdentity::of(&request).cloned();
                seen.lock().unwrap().push(identity);
                Ok(request)
            }
        };
        let (_reporter, health) = tonic_health::server::health_reporter();
        let router = tonic::transport::Server::builder().add_service(
            tonic::service::interceptor::InterceptedService::new(health, record),
        );
        tokio::spawn(router.serve_with_incoming(incoming));

        let config = lock_tls::client::client_config(&ca, Some((&client.0, &client.1))).unwrap();
        let tls = Arc::new(lock_tls::client::ClientTls::Fixed(Arc::new(config)));
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect_with_connector(lock_tls::client::TlsConnector::new(tls))
            .await
            .unwrap();
        let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
        for _ in 0..2 {
            health
                .check(tonic_health::pb::HealthCheckRequest::default())
                .await
                .unwrap();
        }
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 2);
        for identity in seen {
            let identity = identity.expect("the request carries the connection's identity");
            assert_eq!(identity.principal.as_deref(), Some("client"));
            assert!(identity.remote.is_some());
        }
    }

    #[tokio::test]
    async fn a_plaintext_listener_attaches_the_remote_address_and_no_principal() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut incoming = incoming(listener, None);
        let client = TcpStream::connect(addr).await.unwrap();
        let conn = tokio::time::timeout(WAIT, incoming.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(
            conn.connect_info(),
            PeerIdentity {
                remote: Some(client.local_addr().unwrap()),
                principal: None
            }
        );
    }
}
