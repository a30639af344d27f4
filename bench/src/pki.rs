//! The certificates of one benchmarked cluster: a CA minted for the run (lock-tls `mint`), a
//! certificate per server (lockd node or etcd member) written next to it, and the client
//! identity every benchmark connection presents. Both systems are served TLS the same way by
//! default — mutual TLS between the servers and from the client — so the table compares the
//! same transport on both sides; `--insecure` runs both plaintext.
//!
//! Owns minting and where the files go; each system decides which flags carry them.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use lock_tls::mint::Authority;
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

/// The principal every benchmark connection presents. lockd's `client` role covers sessions,
/// lock calls and `Status`; etcd (without `--auth`) checks only that the CA signed it.
pub const BENCH_IDENTITY: &str = "client";

/// A CA under one directory, the certificates it issued there, and the client's TLS config.
pub struct BenchPki {
    dir: PathBuf,
    ca: Authority,
    client: ClientTlsConfig,
}

/// One server's certificate and key files, as [`BenchPki::issue`] wrote them.
#[derive(Debug, Clone)]
pub struct ServerFiles {
    /// The certificate, PEM: SANs `localhost` and `127.0.0.1`, server and client EKU, so the
    /// same file serves clients and authenticates the server to its peers.
    pub cert: PathBuf,
    /// Its private key, PEM (PKCS #8), readable by the owner only.
    pub key: PathBuf,
}

impl BenchPki {
    /// Mints a CA named `name` into `dir` (created if missing), and the client identity.
    pub fn mint(dir: &Path, name: &str) -> Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let ca = Authority::new(name).with_context(|| format!("minting {name}"))?;
        ca.write(&dir.join("ca.pem"), &dir.join("ca-key.pem"))
            .with_context(|| format!("writing {name} into {}", dir.display()))?;
        let client = ca
            .issue(BENCH_IDENTITY)
            .context("minting the benchmark client's certificate")?;
        let client = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(ca.cert_pem()))
            .identity(Identity::from_pem(&client.cert_pem, &client.key_pem));
        Ok(Self {
            dir: dir.to_owned(),
            ca,
            client,
        })
    }

    /// The CA certificate's file.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// Issues `principal` a certificate and writes it to `<principal>.pem` and
    /// `<principal>-key.pem` beside the CA.
    pub fn issue(&self, principal: &str) -> Result<ServerFiles> {
        let files = ServerFiles {
            cert: self.dir.join(format!("{principal}.pem")),
            key: self.dir.join(format!("{principal}-key.pem")),
        };
        self.ca
            .issue(principal)
            .and_then(|leaf| leaf.write(&files.cert, &files.key))
            .with_context(|| format!("minting {principal}'s certificate"))?;
        Ok(files)
    }

    /// The TLS config of every benchmark connection: trusts the CA, presents
    /// [`BENCH_IDENTITY`].
    pub fn client(&self) -> ClientTlsConfig {
        self.client.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issued_files_sit_beside_the_ca_and_hold_a_certificate_and_a_private_key() {
        let dir = tempfile::tempdir().unwrap();
        let pki = BenchPki::mint(&dir.path().join("pki"), "test CA").unwrap();
        let files = pki.issue("etcd-1").unwrap();
        assert_eq!(files.cert.parent(), pki.ca_file().parent());
        let cert = std::fs::read_to_string(&files.cert).unwrap();
        let key = std::fs::read_to_string(&files.key).unwrap();
        assert!(cert.starts_with("-----BEGIN CERTIFICATE-----"), "{cert}");
        assert!(key.starts_with("-----BEGIN PRIVATE KEY-----"), "{key}");
        let ca = std::fs::read_to_string(pki.ca_file()).unwrap();
        assert!(ca.starts_with("-----BEGIN CERTIFICATE-----"));
        assert_ne!(
            ca, cert,
            "the server's certificate is its own, not the CA's"
        );
    }
}
