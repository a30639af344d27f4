//! The one error type of lock-tls. Every variant that is about a file names it, so an operator
//! reading a start-up failure or a refused reload knows which file to fix.

use std::path::PathBuf;

/// A TLS set-up failure.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file could not be written (minting).
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file was read but does not hold what it should.
    #[error("{path}: {reason}")]
    Content {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// rustls refused the certificates or key (for example a key that does not match the
    /// certificate); `files` names the files involved.
    #[error("{files}: {reason}")]
    Config {
        /// The files the refused configuration was built from.
        files: String,
        /// rustls's reason.
        reason: String,
    },
    /// A certificate could not be created (feature `mint`).
    #[error("cannot create the certificate for {name:?}: {reason}")]
    Mint {
        /// The principal or CA name.
        name: String,
        /// Why.
        reason: String,
    },
}
