//! The client side: a rustls client config that trusts the cluster's CA and, for mutual TLS,
//! presents an identity's certificate (a node dialling its peers, or an SDK client with a
//! certificate), and [`TlsConnector`], the connector that puts a tonic channel's connections
//! over TLS with the config current when each connection is made.
//!
//! Why a connector rather than tonic's own `ClientTlsConfig`: tonic builds its rustls config
//! once per endpoint, so a rotated certificate would only be used after the channel is made
//! anew. The connector asks [`ClientTls::current`] for every new connection instead; a channel
//! that reconnects after a peer restarts picks up the new files by itself. Channels using it
//! are made with an `http://` URI: the connector already does the TLS, and an `https://` URI
//! would ask tonic's TLS layer (when its TLS feature is compiled in) to wrap it a second time.

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use hyper_util::rt::TokioIo;
use rustls::ClientConfig;
use rustls_pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use crate::reload::Reloading;
use crate::{ALPN_H2, TlsError, TlsFiles, pem, provider};

/// A client config trusting the CA in `ca`, presenting `identity` (certificate chain and key
/// files) when given.
pub fn client_config(
    ca: &Path,
    identity: Option<(&Path, &Path)>,
) -> Result<ClientConfig, TlsError> {
    let roots = pem::load_roots(ca)?;
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config {
            files: ca.display().to_string(),
            reason: e.to_string(),
        })?
        .with_root_certificates(roots);
    let mut config = match identity {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let certs = pem::load_certs(cert)?;
            let key_der = pem::load_key(key)?;
            builder
                .with_client_auth_cert(certs, key_der)
                .map_err(|e| TlsError::Config {
                    files: format!("cert {}, key {}", cert.display(), key.display()),
                    reason: format!("the certificate and key cannot be used: {e}"),
                })?
        }
    };
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    Ok(config)
}

/// The client config of a connection to be made: fixed, or following an identity's files.
#[derive(Debug)]
pub enum ClientTls {
    /// Built once (an SDK client whose files are read at start).
    Fixed(Arc<ClientConfig>),
    /// Rebuilt when the CA, certificate or key file changes (a node dialling its peers).
    Reloading(Box<Reloading<ClientConfig>>),
}

impl ClientTls {
    /// A config following `files` (mutual TLS with the identity in them).
    pub fn reloading(files: TlsFiles) -> Result<Self, TlsError> {
        Reloading::load(files, "client", |files| {
            client_config(&files.ca, Some((&files.cert, &files.key)))
        })
        .map(|r| Self::Reloading(Box::new(r)))
    }

    /// The config for the next connection.
    pub fn current(&self) -> Arc<ClientConfig> {
        match self {
            Self::Fixed(config) => config.clone(),
            Self::Reloading(reloading) => reloading.current(),
        }
    }
}

/// A tonic connector (`Endpoint::connect_with_connector`) that dials TCP with Nagle off and
/// does the TLS handshake with [`ClientTls::current`], verifying the server's certificate for
/// the URI's host (a DNS name or an IP address SAN).
#[derive(Clone, Debug)]
pub struct TlsConnector {
    tls: Arc<ClientTls>,
    timeout: Option<Duration>,
}

impl TlsConnector {
    /// A connector using `tls`.
    pub fn new(tls: Arc<ClientTls>) -> Self {
        Self { tls, timeout: None }
    }

    /// Bounds the TCP connect and the handshake together by `timeout` (tonic's
    /// `Endpoint::connect_timeout` bounds the same; this is for users of the connector alone).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }
}

/// The host of `uri` as a TLS server name, and its port (443 if none).
fn host_and_port(uri: &Uri) -> std::io::Result<(ServerName<'static>, String, u16)> {
    let bad =
        |why: &str| std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{uri}: {why}"));
    let host = uri.host().ok_or_else(|| bad("no host"))?;
    // An IPv6 literal comes bracketed in a URI; the server name and the socket address do not
    // want the brackets.
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let name = ServerName::try_from(host.clone())
        .map_err(|e| bad(&format!("not a TLS server name: {e}")))?;
    Ok((name, host, uri.port_u16().unwrap_or(443)))
}

async fn connect(tls: Arc<ClientTls>, uri: Uri) -> std::io::Result<TokioIo<TlsStream<TcpStream>>> {
    let (name, host, port) = host_and_port(&uri)?;
    let tcp = TcpStream::connect((host.as_str(), port)).await?;
    // Nagle off, as on the serving side: a small gRPC answer must not wait for an ACK.
    tcp.set_nodelay(true)?;
    let stream = tokio_rustls::TlsConnector::from(tls.current())
        .connect(name, tcp)
        .await?;
    Ok(TokioIo::new(stream))
}

impl tower::Service<Uri> for TlsConnector {
    type Response = TokioIo<TlsStream<TcpStream>>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = std::io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let tls = self.tls.clone();
        let timeout = self.timeout;
        Box::pin(async move {
            let connecting = connect(tls, uri.clone());
            match timeout {
                None => connecting.await,
                Some(limit) => tokio::time::timeout(limit, connecting).await.map_err(|_| {
                    std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("{uri}: TLS connect did not finish within {limit:?}"),
                    )
                })?,
            }
        })
    }
}

#[cfg(all(test, feature = "mint"))]
mod tests {
    use std::path::Path;

    use tokio::net::TcpListener;
    use tower::Service;

    use super::*;
    use crate::mint::Authority;
    use crate::server::{ClientCerts, ServerTls, client_principal};

    fn files(dir: &Path, stem: &str) -> TlsFiles {
        TlsFiles {
            ca: dir.join("ca.pem"),
            cert: dir.join(format!("{stem}.pem")),
            key: dir.join(format!("{stem}-key.pem")),
        }
    }

    /// Accepts TLS connections with `tls` and sends each client's principal.
    fn serve(listener: TcpListener, tls: Arc<ServerTls>) -> tokio::sync::mpsc::Receiver<String> {
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let Ok(stream) = tls.acceptor().accept(tcp).await else {
                    continue;
                };
                let principal = client_principal(stream.get_ref().1)
                    .and_then(Result::ok)
                    .unwrap_or_default();
                let _ = tx.send(principal).await;
            }
        });
        rx
    }

    async fn dial(connector: &mut TlsConnector, port: u16) -> String {
        let uri: Uri = format!("http://127.0.0.1:{port}").parse().unwrap();
        let io = connector.call(uri).await.expect("the handshake succeeds");
        let leaf = io.inner().get_ref().1.peer_certificates().unwrap()[0].clone();
        crate::principal_of(&leaf).unwrap()
    }

    #[tokio::test]
    async fn both_sides_use_rotated_files_for_the_next_connection() {
        let dir = tempfile::tempdir().unwrap();
        let ca = Authority::new("test ca").unwrap();
        ca.write(&dir.path().join("ca.pem"), &dir.path().join("ca-key.pem"))
            .unwrap();
        let (server_files, client_files) =
            (files(dir.path(), "server"), files(dir.path(), "client"));
        ca.issue("server-1")
            .unwrap()
            .write(&server_files.cert, &server_files.key)
            .unwrap();
        ca.issue("client-1")
            .unwrap()
            .write(&client_files.cert, &client_files.key)
            .unwrap();
        let server =
            Arc::new(ServerTls::load(server_files.clone(), ClientCerts::Required).unwrap());
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let mut principals = serve(listener, server);
        let mut connector = TlsConnector::new(Arc::new(
            ClientTls::reloading(client_files.clone()).unwrap(),
        ))
        .with_timeout(Duration::from_secs(10));

        assert_eq!(dial(&mut connector, port).await, "server-1");
        assert_eq!(principals.recv().await.unwrap(), "client-1");

        ca.issue("client-2")
            .unwrap()
            .write(&client_files.cert, &client_files.key)
            .unwrap();
        ca.issue("server-2")
            .unwrap()
            .write(&server_files.cert, &server_files.key)
            .unwrap();
        assert_eq!(dial(&mut connector, port).await, "server-2");
        assert_eq!(principals.recv().await.unwrap(), "client-2");

        // A certificate of another CA on the client side: the server refuses it.
        let other = Authority::new("other ca").unwrap();
        other
            .issue("intruder")
            .unwrap()
            .write(&client_files.cert, &client_files.key)
            .unwrap();
        let uri: Uri = format!("http://127.0.0.1:{port}").parse().unwrap();
        // TLS 1.3: the client may finish before the server refuses; the server never accepts.
        let _ = connector.call(uri).await;
        let next = tokio::time::timeout(Duration::from_millis(500), principals.recv()).await;
        assert!(
            next.is_err(),
            "the server accepted another CA's client: {next:?}"
        );
    }
}
