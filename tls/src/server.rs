//! The rustls server config of a node: this node's certificate chain and key, client
//! certificates verified against the cluster's CA (required, or optional so that a client may
//! authenticate with a bearer token instead), ALPN `h2`. [`ServerTls`] rebuilds it when the
//! files change (see `reload`), so each new connection is accepted with the files on disk now.

use std::sync::Arc;

use rustls::ServerConfig;
use rustls::server::WebPkiClientVerifier;

use crate::principal::principal_of;
use crate::reload::Reloading;
use crate::{ALPN_H2, TlsError, TlsFiles, pem, provider};

/// Whether a TLS client must present a certificate (`--require-client-cert`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientCerts {
    /// A handshake without a client certificate fails.
    Required,
    /// A client may present none (its connection then has no principal); one it presents must
    /// still chain to the CA.
    Optional,
}

/// The server config built from `files` now.
pub fn server_config(
    files: &TlsFiles,
    client_certs: ClientCerts,
) -> Result<ServerConfig, TlsError> {
    let roots = Arc::new(pem::load_roots(&files.ca)?);
    let certs = pem::load_certs(&files.cert)?;
    let key = pem::load_key(&files.key)?;
    let refused = |reason: String| TlsError::Config {
        files: files.describe(),
        reason,
    };
    let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider());
    let verifier = match client_certs {
        ClientCerts::Required => verifier,
        ClientCerts::Optional => verifier.allow_unauthenticated(),
    }
    .build()
    .map_err(|e| refused(format!("cannot verify clients with this CA: {e}")))?;
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| refused(e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)
        .map_err(|e| refused(format!("the certificate and key cannot be used: {e}")))?;
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    Ok(config)
}

/// A node's server config, following its files on disk.
#[derive(Debug)]
pub struct ServerTls(Reloading<ServerConfig>);

impl ServerTls {
    /// Loads `files`; fails (naming the file) if they cannot be used now.
    pub fn load(files: TlsFiles, client_certs: ClientCerts) -> Result<Self, TlsError> {
        Reloading::load(files, "server", move |files| {
            server_config(files, client_certs)
        })
        .map(Self)
    }

    /// The config for the next accepted connection (rebuilt first if the files changed).
    pub fn current(&self) -> Arc<ServerConfig> {
        self.0.current()
    }

    /// An acceptor with [`ServerTls::current`]'s config.
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.current())
    }
}

/// The principal of the client certificate the handshake of `connection` verified: `None`
/// when the client presented none, `Some(Err)` when its certificate names no usable principal.
pub fn client_principal(connection: &rustls::ServerConnection) -> Option<Result<String, String>> {
    let leaf = connection.peer_certificates()?.first()?;
    Some(principal_of(leaf))
}
