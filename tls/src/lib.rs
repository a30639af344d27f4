//! lockd's TLS (docs/SECURITY.md §1): the PEM files a node and its clients are configured with,
//! the principal a certificate names, and the rustls configurations built from those files,
//! rebuilt when the files change on disk so certificates rotate without a restart.
//!
//! Everything uses rustls with the ring provider, passed explicitly (never the process-wide
//! default provider), so no OpenSSL and no aws-lc are linked and no other crate's choice of
//! provider can change ours.
//!
//! # Layout
//! - [`error`]: [`TlsError`], every failure naming the file it is about.
//! - [`pem`]: reading certificates, private keys and a CA bundle from PEM files.
//! - [`principal`]: the principal of a certificate: first URI SAN, else first DNS SAN, else
//!   subject CN.
//! - [`files`]: the three files of one identity ([`TlsFiles`]) and the fingerprint that says
//!   whether they changed.
//! - [`reload`]: a value built from the files and rebuilt when they change; a bad new file is
//!   logged once and the old value kept.
//! - [`server`]: the rustls server config (this node's certificate, client certificates
//!   verified against the CA, required or optional).
//! - [`client`]: the rustls client config for dialling with this identity (mutual TLS to a
//!   peer), and [`client::TlsConnector`], a connector for tonic channels that takes the current
//!   config for every new connection.
//! - `mint` (cargo feature `mint`): a CA and leaf certificates made with rcgen, written as PEM.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod client;
pub mod error;
pub mod files;
#[cfg(feature = "mint")]
pub mod mint;
pub mod pem;
pub mod principal;
pub mod reload;
pub mod server;

pub use error::TlsError;
pub use files::TlsFiles;
pub use principal::{principal_of, serial_of};

/// The ALPN protocol every lockd TLS connection speaks: gRPC is HTTP/2, and gRPC stacks of
/// other languages refuse a TLS server that does not negotiate `h2`.
pub const ALPN_H2: &[u8] = b"h2";

/// The crypto provider of every config this crate builds.
pub fn provider() -> std::sync::Arc<rustls::crypto::CryptoProvider> {
    std::sync::Arc::new(rustls::crypto::ring::default_provider())
}
