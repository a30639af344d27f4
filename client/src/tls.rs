//! [`TlsConfig`]: which CA the client trusts and which certificate it presents, from the
//! caller or from `LOCKD_CA`, `LOCKD_CERT` and `LOCKD_KEY` (docs/SECURITY.md §1).
//!
//! Owns the file names and reading the files once, when a client is built: a missing or
//! unreadable file is an `InvalidArgument` naming the file (and the variable it came from,
//! when it came from the environment) before anything is dialled, instead of a handshake
//! failure at the first call. The handshake itself is rustls through tonic
//! (`ClientTlsConfig`); nothing here speaks TLS.
//!
//! A client's certificate is re-read only when a new client is built: nodes re-read theirs on
//! rotation, a client process is expected to be restarted (or to build a new `LockClient`).

use std::path::{Path, PathBuf};

use lock_api::LockError;
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

/// The CA file (PEM) that signs the cluster's node certificates.
pub const ENV_CA: &str = "LOCKD_CA";
/// This client's certificate chain (PEM), presented to nodes that require one.
pub const ENV_CERT: &str = "LOCKD_CERT";
/// The private key (PEM) of [`ENV_CERT`].
pub const ENV_KEY: &str = "LOCKD_KEY";
/// A bearer token, sent instead of (or beside) a client certificate; see
/// [`crate::ClientConfig::token`].
pub const ENV_TOKEN: &str = "LOCKD_TOKEN";

/// Whether `err` is a connection failure the SDK judged to be the two ends disagreeing about
/// TLS (a plaintext client at a TLS node, an untrusted CA, a missing client certificate): its
/// message then ends with advice on which setting to fix, and a caller should not suggest that
/// the cluster is down.
pub fn is_tls_mismatch(err: &LockError) -> bool {
    match err {
        LockError::Contention { message } => crate::router::TLS_HINT_OPENINGS
            .iter()
            .any(|opening| message.contains(opening)),
        _ => false,
    }
}

/// Largest PEM file the client reads. A CA bundle or a certificate chain with its key is a few
/// kilobytes; a file a thousand times that is a wrong path (a log, a binary), not a certificate.
pub const PEM_FILE_MAX_BYTES: u64 = 1024 * 1024;

/// The TLS side of a client: the CA that signs the nodes' certificates, and optionally this
/// client's own certificate and key (mutual TLS, the usual way a client authenticates; a node
/// started with `--require-client-cert` refuses a client without one).
///
/// With a `TlsConfig` every endpoint is dialled `https://`, and the node's certificate must
/// name the host dialled (`127.0.0.1` or `localhost` for `lockd dev`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsConfig {
    /// The CA certificate(s) (PEM) that node certificates must chain to.
    pub ca: PathBuf,
    /// This client's certificate chain (PEM); given with `key` or not at all.
    pub cert: Option<PathBuf>,
    /// The private key (PEM) of `cert`.
    pub key: Option<PathBuf>,
}

impl TlsConfig {
    /// Trusts the nodes signed by `ca`; presents no certificate (the node must accept a bearer
    /// token or not require client certificates).
    pub fn new(ca: impl Into<PathBuf>) -> Self {
        Self {
            ca: ca.into(),
            cert: None,
            key: None,
        }
    }

    /// Also presents the certificate `cert` with its private key `key` (mutual TLS).
    pub fn with_identity(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.cert = Some(cert.into());
        self.key = Some(key.into());
        self
    }

    /// The TLS config the environment describes: `LOCKD_CA`, with `LOCKD_CERT` and `LOCKD_KEY`
    /// for a client certificate. `Ok(None)` when none of the three is set (a blank value counts
    /// as unset). `Err(InvalidArgument)` naming the variables when they do not fit together:
    /// a certificate without its key or the reverse, or a certificate without a CA.
    pub fn from_env() -> Result<Option<Self>, LockError> {
        Self::from_vars(|name| std::env::var_os(name))
    }

    /// [`TlsConfig::from_env`] over any lookup, so tests need not touch the process's
    /// environment.
    fn from_vars(
        lookup: impl Fn(&str) -> Option<std::ffi::OsString>,
    ) -> Result<Option<Self>, LockError> {
        let var = |name: &str| lookup(name).filter(|v| !v.is_empty()).map(PathBuf::from);
        let (ca, cert, key) = (var(ENV_CA), var(ENV_CERT), var(ENV_KEY));
        match (ca, cert, key) {
            (None, None, None) => Ok(None),
            (None, _, _) => Err(LockError::invalid(format!(
                "{ENV_CERT}/{ENV_KEY} are set but {ENV_CA} is not: set {ENV_CA} to the CA file \
                 that signs the cluster's certificates"
            ))),
            (Some(ca), cert, key) => {
                let config = Self { ca, cert, key };
                config.check_pairing(ENV_CERT, ENV_KEY)?;
                Ok(Some(config))
            }
        }
    }

    /// Checks that `cert` and `key` are given together; the error names both fields.
    pub fn validate(&self) -> Result<(), LockError> {
        self.check_pairing("tls.cert", "tls.key")
    }

    fn check_pairing(&self, cert: &str, key: &str) -> Result<(), LockError> {
        match (&self.cert, &self.key) {
            (Some(_), None) => Err(LockError::invalid(format!(
                "client config: {cert} is set but {key} is not; give the certificate's private key too"
            ))),
            (None, Some(_)) => Err(LockError::invalid(format!(
                "client config: {key} is set but {cert} is not; give the key's certificate too"
            ))),
            _ => Ok(()),
        }
    }

    /// Reads the files into tonic's TLS config. Every error names the file, the field it was
    /// given in, and what was wrong with it.
    pub(crate) fn load(&self) -> Result<ClientTlsConfig, LockError> {
        self.validate()?;
        let ca = read_pem(&self.ca, "tls.ca", ENV_CA, "CERTIFICATE")?;
        let mut config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca));
        if let (Some(cert), Some(key)) = (&self.cert, &self.key) {
            let cert = read_pem(cert, "tls.cert", ENV_CERT, "CERTIFICATE")?;
            let key = read_pem(key, "tls.key", ENV_KEY, "PRIVATE KEY")?;
            config = config.identity(Identity::from_pem(cert, key));
        }
        Ok(config)
    }
}

/// Reads a PEM file, checking that it holds at least one `-----BEGIN … <label>-----` block,
/// so that a swapped or truncated file is named here rather than failing the handshake. The
/// error names the field, the environment variable that usually sets it, and the file.
fn read_pem(path: &Path, field: &str, var: &str, label: &str) -> Result<Vec<u8>, LockError> {
    let describe = |what: String| {
        LockError::invalid(format!(
            "client config: {field} ({var}) {}: {what}",
            path.display()
        ))
    };
    let len = std::fs::metadata(path)
        .map_err(|err| describe(format!("cannot read it: {err}")))?
        .len();
    if len > PEM_FILE_MAX_BYTES {
        return Err(describe(format!(
            "{len} bytes is not a PEM file (the limit is {PEM_FILE_MAX_BYTES})"
        )));
    }
    let bytes = std::fs::read(path).map_err(|err| describe(format!("cannot read it: {err}")))?;
    let text = String::from_utf8_lossy(&bytes);
    let holds_block = text.lines().any(|line| {
        line.starts_with("-----BEGIN ") && line.trim_end().ends_with(&format!("{label}-----"))
    });
    if !holds_block {
        return Err(describe(format!("holds no PEM {label} block")));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::ffi::OsString;

    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
        let map: HashMap<String, OsString> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        move |name| map.get(name).cloned()
    }

    fn message(err: LockError) -> String {
        match err {
            LockError::InvalidArgument { message } => message,
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }

    #[test]
    fn the_environment_gives_a_ca_and_an_optional_identity() {
        assert_eq!(TlsConfig::from_vars(vars(&[])), Ok(None));
        assert_eq!(TlsConfig::from_vars(vars(&[(ENV_CA, "")])), Ok(None));
        assert_eq!(
            TlsConfig::from_vars(vars(&[(ENV_CA, "ca.pem")])),
            Ok(Some(TlsConfig::new("ca.pem")))
        );
        assert_eq!(
            TlsConfig::from_vars(vars(&[
                (ENV_CA, "ca.pem"),
                (ENV_CERT, "c.pem"),
                (ENV_KEY, "k.pem")
            ])),
            Ok(Some(
                TlsConfig::new("ca.pem").with_identity("c.pem", "k.pem")
            ))
        );
    }

    #[test]
    fn environment_variables_that_do_not_fit_together_are_named() {
        let no_ca = message(
            TlsConfig::from_vars(vars(&[(ENV_CERT, "c.pem"), (ENV_KEY, "k.pem")])).unwrap_err(),
        );
        assert!(
            no_ca.contains(ENV_CA) && no_ca.contains(ENV_CERT),
            "{no_ca}"
        );
        let no_key =
            message(TlsConfig::from_vars(vars(&[(ENV_CA, "a"), (ENV_CERT, "c")])).unwrap_err());
        assert!(no_key.contains(ENV_KEY), "{no_key}");
        let no_cert =
            message(TlsConfig::from_vars(vars(&[(ENV_CA, "a"), (ENV_KEY, "k")])).unwrap_err());
        assert!(no_cert.contains(ENV_CERT), "{no_cert}");
    }

    #[test]
    fn unreadable_or_wrong_files_are_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = dir.path().join("missing-ca.pem");
        let err = message(TlsConfig::new(&missing).load().unwrap_err());
        assert!(
            err.contains("tls.ca") && err.contains("missing-ca.pem"),
            "{err}"
        );

        let not_pem = dir.path().join("ca.pem");
        std::fs::write(&not_pem, "hello").expect("write");
        let err = message(TlsConfig::new(&not_pem).load().unwrap_err());
        assert!(err.contains("no PEM CERTIFICATE block"), "{err}");

        let ca = dir.path().join("real-ca.pem");
        std::fs::write(
            &ca,
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        )
        .expect("write");
        assert!(TlsConfig::new(&ca).load().is_ok());
        // A certificate where the key should be: the key field is named.
        let err = message(
            TlsConfig::new(&ca)
                .with_identity(&ca, &ca)
                .load()
                .unwrap_err(),
        );
        assert!(
            err.contains("tls.key") && err.contains("PRIVATE KEY"),
            "{err}"
        );
        let half = TlsConfig {
            key: None,
            ..TlsConfig::new(&ca).with_identity(&ca, &ca)
        };
        assert!(message(half.validate().unwrap_err()).contains("tls.key"));
    }
}
