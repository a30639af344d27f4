//! The principal a certificate names (docs/SECURITY.md §1): its first URI SAN, else its first
//! DNS SAN, else its subject CN. URI first because a certificate whose principal is a
//! service name still needs `DNS:localhost`-style SANs for hostname checks; lockd's minted
//! certificates carry the principal as their first URI SAN for that reason.
//!
//! Owns that rule only. The DER is parsed by x509-parser; whether the certificate is to be
//! trusted is the TLS verifier's business, not this file's.

use rustls_pki_types::CertificateDer;
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

/// Longest principal, in bytes: it is logged, compared with role maps and recorded in audit
/// entries, so a certificate naming something longer is refused rather than carried around.
pub const PRINCIPAL_LEN_MAX: usize = 256;

/// The principal of the certificate `der`, or why it has none (not DER, no SAN or CN, an empty
/// or overlong name).
pub fn principal_of(der: &CertificateDer<'_>) -> Result<String, String> {
    let (_, cert) = X509Certificate::from_der(der.as_ref())
        .map_err(|e| format!("not an X.509 certificate: {e}"))?;
    let sans = cert
        .subject_alternative_name()
        .map_err(|e| format!("bad subjectAltName extension: {e}"))?;
    let names = sans
        .map(|ext| ext.value.general_names.as_slice())
        .unwrap_or_default();
    let uri = names.iter().find_map(|n| match n {
        GeneralName::URI(uri) => Some(*uri),
        _ => None,
    });
    let dns = names.iter().find_map(|n| match n {
        GeneralName::DNSName(dns) => Some(*dns),
        _ => None,
    });
    let cn = || {
        cert.subject()
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
    };
    let name = uri
        .or(dns)
        .or_else(cn)
        .ok_or("the certificate has no URI or DNS SAN and no subject CN")?;
    if name.is_empty() {
        return Err("the certificate's principal is empty".into());
    }
    if name.len() > PRINCIPAL_LEN_MAX {
        return Err(format!(
            "the certificate's principal is {} bytes; the limit is {PRINCIPAL_LEN_MAX}",
            name.len()
        ));
    }
    Ok(name.to_owned())
}

/// The serial number of the certificate `der` in lowercase hex: tells two certificates of the
/// same principal apart (a rotated certificate from the one it replaced).
pub fn serial_of(der: &CertificateDer<'_>) -> Result<String, String> {
    let (_, cert) = X509Certificate::from_der(der.as_ref())
        .map_err(|e| format!("not an X.509 certificate: {e}"))?;
    Ok(cert
        .raw_serial()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

#[cfg(all(test, feature = "mint"))]
mod tests {
    use super::*;
    use rcgen::{CertificateParams, DnType, KeyPair, SanType};

    fn cert(sans: Vec<SanType>, cn: Option<&str>) -> CertificateDer<'static> {
        let mut params = CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        if let Some(cn) = cn {
            params.distinguished_name.push(DnType::CommonName, cn);
        }
        params.subject_alt_names = sans;
        let key = KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().clone()
    }

    fn dns(name: &str) -> SanType {
        SanType::DnsName(name.try_into().unwrap())
    }

    fn uri(name: &str) -> SanType {
        SanType::URI(name.try_into().unwrap())
    }

    #[test]
    fn the_first_uri_san_wins_over_dns_and_cn() {
        let c = cert(
            vec![dns("localhost"), uri("node-1"), uri("second")],
            Some("cn"),
        );
        assert_eq!(principal_of(&c).unwrap(), "node-1");
        assert!(!serial_of(&c).unwrap().is_empty());
    }

    #[test]
    fn without_a_uri_the_first_dns_san() {
        let c = cert(
            vec![
                SanType::IpAddress("127.0.0.1".parse().unwrap()),
                dns("a.example"),
                dns("b.example"),
            ],
            Some("cn"),
        );
        assert_eq!(principal_of(&c).unwrap(), "a.example");
    }

    #[test]
    fn without_sans_the_subject_cn() {
        let c = cert(Vec::new(), Some("operator"));
        assert_eq!(principal_of(&c).unwrap(), "operator");
        let c = cert(
            vec![SanType::IpAddress("127.0.0.1".parse().unwrap())],
            Some("ip-only"),
        );
        assert_eq!(principal_of(&c).unwrap(), "ip-only");
    }

    #[test]
    fn no_name_at_all_and_garbage_are_refused() {
        let c = cert(Vec::new(), None);
        assert!(principal_of(&c).unwrap_err().contains("no URI"));
        let junk = CertificateDer::from(vec![0x30, 0x03, 0x02, 0x01, 0x01]);
        assert!(principal_of(&junk).unwrap_err().contains("X.509"));
        let long = "x".repeat(PRINCIPAL_LEN_MAX + 1);
        assert!(principal_of(&cert(Vec::new(), Some(&long))).is_err());
    }
}
