//! Minting certificates with rcgen (cargo feature `mint`): a throwaway CA and leaf
//! certificates for `lockd dev` and the test harness, written as PEM files.
//!
//! A leaf carries its principal three ways: as its first URI SAN (which wins by the rule in
//! `principal`, so its `DNS:localhost` SAN does not become its principal), as its subject CN,
//! and nowhere else. It also carries `DNS:localhost` and `IP:127.0.0.1`, so clients can dial a
//! local node by either, and both the server and the client EKU, since a node's one certificate
//! serves its port and dials its peers. Keys are ECDSA P-256, made by ring.
//!
//! Files are written whole through a temporary file and a rename, so a node reloading its
//! files never reads half of one; key files are made readable by their owner only.

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType, SerialNumber,
};

use crate::TlsError;

/// A certificate authority able to issue leaves.
pub struct Authority {
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl std::fmt::Debug for Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authority").finish_non_exhaustive()
    }
}

/// One issued certificate and its key, as PEM text.
#[derive(Clone)]
pub struct Leaf {
    /// The principal the certificate names.
    pub principal: String,
    /// The certificate, PEM.
    pub cert_pem: String,
    /// Its private key, PEM (PKCS#8).
    pub key_pem: String,
}

impl std::fmt::Debug for Leaf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leaf")
            .field("principal", &self.principal)
            .finish_non_exhaustive()
    }
}

fn mint_error(name: &str, e: impl std::fmt::Display) -> TlsError {
    TlsError::Mint {
        name: name.to_owned(),
        reason: e.to_string(),
    }
}

/// A fresh serial: random, so a re-issued certificate is told apart from the one it replaces,
/// and positive (the top bit clear) as DER integers for serials must be.
fn serial() -> SerialNumber {
    SerialNumber::from((rand::random::<u64>() >> 1) | 1)
}

impl Authority {
    /// A new self-signed CA whose subject CN is `name`.
    pub fn new(name: &str) -> Result<Self, TlsError> {
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params.serial_number = Some(serial());
        let key = KeyPair::generate().map_err(|e| mint_error(name, e))?;
        let cert = params.self_signed(&key).map_err(|e| mint_error(name, e))?;
        Ok(Self { cert, key })
    }

    /// The CA in the PEM files `cert` and `key` (as [`Authority::write`] wrote them), to issue
    /// more leaves that chain to the same CA certificate.
    pub fn load(cert: &Path, key: &Path) -> Result<Self, TlsError> {
        let text = |path: &Path| {
            String::from_utf8(crate::pem::read(path)?).map_err(|_| TlsError::Content {
                path: path.to_owned(),
                reason: "is not PEM text".into(),
            })
        };
        let (cert_pem, key_pem) = (text(cert)?, text(key)?);
        let content = |path: &Path, e: rcgen::Error| TlsError::Content {
            path: path.to_owned(),
            reason: e.to_string(),
        };
        let key_pair = KeyPair::from_pem(&key_pem).map_err(|e| content(key, e))?;
        let params =
            CertificateParams::from_ca_cert_pem(&cert_pem).map_err(|e| content(cert, e))?;
        // Signing needs rcgen's own certificate object; re-signing the parsed parameters gives
        // one with the same subject and key, which is all that issuing uses.
        let reissued = params
            .self_signed(&key_pair)
            .map_err(|e| content(cert, e))?;
        Ok(Self {
            cert: reissued,
            key: key_pair,
        })
    }

    /// The CA certificate, PEM.
    pub fn cert_pem(&self) -> String {
        self.cert.pem()
    }

    /// The CA's private key, PEM.
    pub fn key_pem(&self) -> String {
        self.key.serialize_pem()
    }

    /// Writes the CA certificate to `cert` and its key to `key`.
    pub fn write(&self, cert: &Path, key: &Path) -> Result<(), TlsError> {
        write_file(cert, &self.cert_pem(), false)?;
        write_file(key, &self.key_pem(), true)
    }

    /// A new leaf certificate for `principal`, signed by this CA: URI SAN `principal`,
    /// `DNS:localhost`, `IP:127.0.0.1`, CN `principal`, server and client EKU.
    pub fn issue(&self, principal: &str) -> Result<Leaf, TlsError> {
        let ia5 = |s: &str| s.try_into().map_err(|e| mint_error(principal, e));
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, principal);
        params.subject_alt_names = vec![
            SanType::URI(ia5(principal)?),
            SanType::DnsName(ia5("localhost")?),
            SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        ];
        params.is_ca = IsCa::NoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.use_authority_key_identifier_extension = true;
        params.serial_number = Some(serial());
        let key = KeyPair::generate().map_err(|e| mint_error(principal, e))?;
        let cert = params
            .signed_by(&key, &self.cert, &self.key)
            .map_err(|e| mint_error(principal, e))?;
        Ok(Leaf {
            principal: principal.to_owned(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

impl Leaf {
    /// Writes the certificate to `cert` and the key to `key` (each replaced whole). The key is
    /// written first: a reader that sees the new certificate then also finds its key.
    pub fn write(&self, cert: &Path, key: &Path) -> Result<(), TlsError> {
        write_file(key, &self.key_pem, true)?;
        write_file(cert, &self.cert_pem, false)
    }
}

/// Writes `text` to `path` through a temporary file beside it and a rename; `private` makes
/// the file readable by its owner only.
pub fn write_file(path: &Path, text: &str, private: bool) -> Result<(), TlsError> {
    use std::os::unix::fs::OpenOptionsExt;
    let failed = |source| TlsError::Write {
        path: path.to_owned(),
        source,
    };
    let mut tmp_name = path.as_os_str().to_owned();
    tmp_name.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp_name);
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    if private {
        options.mode(0o600);
    }
    let mut file = options.open(&tmp).map_err(failed)?;
    file.write_all(text.as_bytes()).map_err(failed)?;
    file.sync_all().map_err(failed)?;
    drop(file);
    std::fs::rename(&tmp, path).map_err(failed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{TlsFiles, pem, principal_of};

    #[test]
    fn a_leaf_names_its_principal_and_chains_to_its_ca_even_after_a_reload_of_the_ca() {
        let dir = tempfile::tempdir().unwrap();
        let p = |name: &str| dir.path().join(name);
        let ca = Authority::new("test ca").unwrap();
        ca.write(&p("ca.pem"), &p("ca-key.pem")).unwrap();
        ca.issue("node-1")
            .unwrap()
            .write(&p("n1.pem"), &p("n1-key.pem"))
            .unwrap();
        let certs = pem::load_certs(&p("n1.pem")).unwrap();
        assert_eq!(principal_of(&certs[0]).unwrap(), "node-1");

        // A leaf issued by the CA loaded back from its files chains to the same CA file.
        let again = Authority::load(&p("ca.pem"), &p("ca-key.pem")).unwrap();
        again
            .issue("client")
            .unwrap()
            .write(&p("c.pem"), &p("c-key.pem"))
            .unwrap();
        let files = TlsFiles {
            ca: p("ca.pem"),
            cert: p("c.pem"),
            key: p("c-key.pem"),
        };
        crate::server::server_config(&files, crate::server::ClientCerts::Required).unwrap();
        crate::client::client_config(&files.ca, Some((&files.cert, &files.key))).unwrap();

        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(p("c-key.pem"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn a_key_that_does_not_match_the_certificate_is_refused_naming_the_files() {
        let dir = tempfile::tempdir().unwrap();
        let p = |name: &str| dir.path().join(name);
        let ca = Authority::new("test ca").unwrap();
        ca.write(&p("ca.pem"), &p("ca-key.pem")).unwrap();
        let one = ca.issue("one").unwrap();
        let two = ca.issue("two").unwrap();
        write_file(&p("cert.pem"), &one.cert_pem, false).unwrap();
        write_file(&p("key.pem"), &two.key_pem, true).unwrap();
        let files = TlsFiles {
            ca: p("ca.pem"),
            cert: p("cert.pem"),
            key: p("key.pem"),
        };
        let err = crate::server::server_config(&files, crate::server::ClientCerts::Required)
            .unwrap_err()
            .to_string();
        assert!(err.contains("cert.pem") && err.contains("key.pem"), "{err}");
    }
}
