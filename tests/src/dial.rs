//! [`Dial`]: how the harness's clients reach a node — plaintext (a node run with
//! `--insecure`, or a refusal test), or TLS presenting one identity of the cluster's
//! [`TestPki`].
//!
//! Owns the scheme and the tonic TLS config; the channels are lazy, so building one for a
//! dead node succeeds and its calls fail.

use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::client::CONNECT_TIMEOUT;
use crate::pki::TestPki;

/// How a harness client connects to a node.
#[derive(Clone, Debug)]
pub enum Dial {
    /// `http://`, no TLS.
    Plain,
    /// `https://`, verifying the node against the config's CA and presenting its identity (if
    /// it has one).
    Tls(ClientTlsConfig),
}

impl Dial {
    /// TLS trusting `pki`'s CA and presenting `name`'s certificate.
    ///
    /// # Panics
    /// If `name` has no certificate in `pki` (see [`TestPki::identity`]).
    pub fn tls_as(pki: &TestPki, name: &str) -> Self {
        let (ca, cert, key) = pki.pem_of(name);
        Self::Tls(
            ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(ca))
                .identity(Identity::from_pem(cert, key)),
        )
    }

    /// TLS trusting `pki`'s CA and presenting no certificate (refused by a node that requires
    /// client certificates; a bearer token's way in).
    pub fn tls_anonymous(pki: &TestPki) -> Self {
        let ca = std::fs::read(pki.ca())
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", pki.ca().display()));
        Self::Tls(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca)))
    }

    /// Whether this dials TLS.
    pub fn is_tls(&self) -> bool {
        matches!(self, Self::Tls(_))
    }

    /// The endpoint URI of `addr` (`host:port`): `https://…` with TLS, else `http://…`.
    pub fn endpoint(&self, addr: &str) -> String {
        match self {
            Self::Plain => format!("http://{addr}"),
            Self::Tls(_) => format!("https://{addr}"),
        }
    }

    /// A lazily connected channel to `addr` (`host:port` or an endpoint URI, whose scheme is
    /// replaced by this dial's).
    ///
    /// # Panics
    /// If `addr` is not a valid address (a harness bug: the harness builds them).
    pub fn channel(&self, addr: &str) -> Channel {
        let addr = strip_scheme(addr);
        let endpoint = Endpoint::from_shared(self.endpoint(addr))
            .unwrap_or_else(|e| panic!("invalid endpoint {addr:?}: {e}"))
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true);
        let endpoint = match self {
            Self::Plain => endpoint,
            Self::Tls(tls) => endpoint
                .tls_config(tls.clone())
                .unwrap_or_else(|e| panic!("TLS config for {addr}: {e}")),
        };
        endpoint.connect_lazy()
    }
}

/// `host:port` of an address given with or without `http://` / `https://`.
pub fn strip_scheme(addr: &str) -> &str {
    addr.strip_prefix("https://")
        .or_else(|| addr.strip_prefix("http://"))
        .unwrap_or(addr)
}
