//! The run's throwaway PKI (docs/SECURITY.md §1): a CA, one certificate per node (principal
//! `node-<id>`) and the clients' (`client` for the workload, `admin` for the nemeses and the
//! status probes), minted with lock-tls (`mint`) into the run's work folder, so every run's
//! nodes serve TLS as `lockd run` requires by default.
//!
//! Owns the files and the nodes' TLS flags and role map; dialling is the SDK's
//! (`lock_client::TlsConfig`) and the status probe's (`tonic` TLS config).

use std::path::{Path, PathBuf};

use anyhow::Context;
use lock_tls::mint::Authority;

/// The principal the workload's clients present: the `client` role is all a lock user needs.
pub const WORKLOAD_IDENTITY: &str = "client";

/// The principal the nemeses (force-revoke, membership changes) and the status probes present.
pub const ADMIN_IDENTITY: &str = "admin";

/// The principal of node `id`'s certificate.
pub fn node_principal(id: u64) -> String {
    format!("node-{id}")
}

/// The run's CA and certificates, as files in one folder.
#[derive(Debug)]
pub struct Pki {
    dir: PathBuf,
    node_ids: Vec<u64>,
}

impl Pki {
    /// Mints a CA and the certificates of the nodes `node_ids` and of
    /// [`WORKLOAD_IDENTITY`] and [`ADMIN_IDENTITY`] into `dir`. With `node_uid`, each node's
    /// key is handed to the uid that node runs as (the namespace mode), since key files are
    /// readable by their owner only.
    pub fn mint(
        dir: &Path,
        node_ids: &[u64],
        node_uid: Option<fn(u64) -> u32>,
    ) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let pki = Self {
            dir: dir.to_owned(),
            node_ids: node_ids.to_vec(),
        };
        let ca = Authority::new("lock-jepsen CA").context("minting the run's CA")?;
        ca.write(&pki.ca(), &dir.join("ca-key.pem"))
            .context("writing the run's CA")?;
        let names = node_ids
            .iter()
            .map(|&id| node_principal(id))
            .chain([WORKLOAD_IDENTITY.to_owned(), ADMIN_IDENTITY.to_owned()]);
        for name in names {
            let (cert, key) = pki.identity(&name);
            ca.issue(&name)
                .and_then(|leaf| leaf.write(&cert, &key))
                .with_context(|| format!("minting the certificate of {name}"))?;
        }
        if let Some(uid_of) = node_uid {
            for &id in node_ids {
                let (_, key) = pki.identity(&node_principal(id));
                let uid = uid_of(id);
                std::os::unix::fs::chown(&key, Some(uid), Some(uid))
                    .with_context(|| format!("chown {} to {uid}", key.display()))?;
            }
        }
        Ok(pki)
    }

    /// The CA certificate.
    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// The `(certificate, key)` files of `name`.
    pub fn identity(&self, name: &str) -> (PathBuf, PathBuf) {
        (
            self.dir.join(format!("{name}.pem")),
            self.dir.join(format!("{name}-key.pem")),
        )
    }

    /// The SDK's TLS config presenting `name`'s certificate.
    pub fn sdk(&self, name: &str) -> lock_client::TlsConfig {
        let (cert, key) = self.identity(name);
        lock_client::TlsConfig::new(self.ca()).with_identity(cert, key)
    }

    /// A tonic TLS config presenting `name`'s certificate (the status probes).
    pub fn tonic(&self, name: &str) -> anyhow::Result<tonic::transport::ClientTlsConfig> {
        let read = |path: &Path| {
            std::fs::read(path).with_context(|| format!("reading {}", path.display()))
        };
        let (cert, key) = self.identity(name);
        Ok(tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(read(&self.ca())?))
            .identity(tonic::transport::Identity::from_pem(
                read(&cert)?,
                read(&key)?,
            )))
    }

    /// Node `id`'s `lockd run` TLS flags: CA, certificate and key, client certificates
    /// required (as `lockd dev` runs).
    pub fn node_args(&self, id: u64) -> Vec<std::ffi::OsString> {
        let (cert, key) = self.identity(&node_principal(id));
        vec![
            "--tls-ca".into(),
            self.ca().into(),
            "--tls-cert".into(),
            cert.into(),
            "--tls-key".into(),
            key.into(),
            "--require-client-cert".into(),
        ]
    }

    /// The role map every node gets, as `LOCKD_ROLES` (`p=r,p=r`): every node `node`, the
    /// workload `client`, the nemeses `admin`.
    pub fn roles_env(&self) -> (&'static str, String) {
        let map: Vec<String> = self
            .node_ids
            .iter()
            .map(|&id| format!("{}=node", node_principal(id)))
            .chain([
                format!("{WORKLOAD_IDENTITY}=client"),
                format!("{ADMIN_IDENTITY}=admin"),
            ])
            .collect();
        ("LOCKD_ROLES", map.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_pki_has_every_node_and_both_clients_and_maps_their_roles() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pki = Pki::mint(dir.path(), &[1, 2, 4], None).expect("minted");
        for name in ["node-1", "node-2", "node-4", "client", "admin"] {
            let (cert, key) = pki.identity(name);
            assert!(cert.is_file() && key.is_file(), "{name}");
        }
        assert!(pki.tonic("admin").is_ok());
        assert_eq!(
            pki.roles_env().1,
            "node-1=node,node-2=node,node-4=node,client=client,admin=admin"
        );
        let args: Vec<String> = pki
            .node_args(2)
            .into_iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert!(
            args.iter().any(|a| a.ends_with("node-2-key.pem")),
            "{args:?}"
        );
    }
}
