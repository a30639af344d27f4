//! Reading PEM files: certificate chains, one private key, and a CA bundle as a root store.
//!
//! Owns turning a path into rustls types; every error names the path. Parsing is
//! rustls-pki-types' PEM reader; nothing here looks inside the DER.

use std::path::Path;

use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::TlsError;

/// Largest PEM file read, in bytes. A certificate chain or key is a few KiB; a CA bundle of a
/// few hundred certificates stays under 1 MiB. Anything bigger is not one of ours.
pub const PEM_FILE_BYTES_MAX: u64 = 1024 * 1024;

/// The bytes of `path`, refusing a file larger than [`PEM_FILE_BYTES_MAX`].
pub fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    let io = |source| TlsError::Read {
        path: path.to_owned(),
        source,
    };
    let len = std::fs::metadata(path).map_err(io)?.len();
    if len > PEM_FILE_BYTES_MAX {
        return Err(content(
            path,
            format!("is {len} bytes; a PEM file here is at most {PEM_FILE_BYTES_MAX}"),
        ));
    }
    std::fs::read(path).map_err(io)
}

fn content(path: &Path, reason: impl Into<String>) -> TlsError {
    TlsError::Content {
        path: path.to_owned(),
        reason: reason.into(),
    }
}

/// Every `CERTIFICATE` block of `pem` (read from `path`, named in errors), in order; at least
/// one.
pub fn certs_from(path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| content(path, format!("not a PEM certificate file: {e}")))?;
    if certs.is_empty() {
        return Err(content(path, "holds no PEM CERTIFICATE block"));
    }
    Ok(certs)
}

/// The certificate chain in `path`: the leaf first, then any intermediates.
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    certs_from(path, &read(path)?)
}

/// The private key in `path` (PKCS#8, PKCS#1 or SEC1 PEM); the first one if several.
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = read(path)?;
    PrivateKeyDer::from_pem_slice(&pem)
        .map_err(|e| content(path, format!("holds no usable PEM private key: {e}")))
}

/// The CA certificates in `path` as a root store; every certificate must be usable as a trust
/// anchor.
pub fn load_roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let certs = load_certs(path)?;
    let mut roots = RootCertStore::empty();
    for (i, cert) in certs.into_iter().enumerate() {
        roots.add(cert).map_err(|e| {
            content(
                path,
                format!("certificate {} is not a usable CA: {e}", i + 1),
            )
        })?;
    }
    Ok(roots)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let err = load_certs(&missing).unwrap_err().to_string();
        assert!(err.contains("missing.pem"), "{err}");

        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not a certificate\n").unwrap();
        let err = load_certs(&junk).unwrap_err().to_string();
        assert!(err.contains("junk.pem") && err.contains("no PEM"), "{err}");
        let err = load_key(&junk).unwrap_err().to_string();
        assert!(
            err.contains("junk.pem") && err.contains("private key"),
            "{err}"
        );
        let err = load_roots(&junk).unwrap_err().to_string();
        assert!(err.contains("junk.pem"), "{err}");
    }

    #[test]
    fn an_oversized_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("big.pem");
        std::fs::write(&big, vec![b'a'; PEM_FILE_BYTES_MAX as usize + 1]).unwrap();
        let err = load_certs(&big).unwrap_err().to_string();
        assert!(err.contains("big.pem") && err.contains("at most"), "{err}");
    }
}
