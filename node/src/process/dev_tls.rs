//! The throwaway PKI of `lockd dev` (docs/SECURITY.md §1): a CA and the certificates of the
//! three nodes and of one client, one operator and one admin, under `<dir>/tls/`, made with
//! lock-tls's `mint` on the first run and reused on the next ones.
//!
//! Files: `ca.pem`, `ca-key.pem`; `node{1,2,3}.pem` + `node{N}-key.pem` (principals
//! `node-1`..`node-3`); `client.pem`, `operator.pem`, `admin.pem` + `-key.pem` (principals
//! `client`, `operator`, `admin`). Every leaf has the SANs `DNS:localhost` and `IP:127.0.0.1`.
//! A missing leaf is issued again by the existing CA; a missing CA file makes a new CA and
//! every leaf anew (old leaves would not chain to it). Owns these files and the `lockd run`
//! TLS and role arguments that go with them; nothing else.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use lock_tls::mint::Authority;

/// The folder under the dev dir that holds the certificates.
pub const TLS_SUBDIR: &str = "tls";

/// The people of the dev cluster besides its nodes: (principal, role). Each principal is also
/// its file stem.
const USERS: [(&str, &str); 3] = [
    ("client", "client"),
    ("operator", "operator"),
    ("admin", "admin"),
];

/// The dev cluster's certificates on disk.
#[derive(Debug)]
pub struct DevPki {
    /// `<dev dir>/tls`.
    pub dir: PathBuf,
    /// Whether anything was minted on this run (else every file was reused).
    pub minted: bool,
    nodes: u16,
}

impl DevPki {
    /// The certificate and key paths of `stem` (`node1`, `client`, …).
    pub fn identity(&self, stem: &str) -> (PathBuf, PathBuf) {
        (
            self.dir.join(format!("{stem}.pem")),
            self.dir.join(format!("{stem}-key.pem")),
        )
    }

    /// The CA certificate.
    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// Makes sure `dir` holds the CA and the certificates of `nodes` nodes and the users, minting
    /// what is missing.
    pub fn ensure(dir: &Path, nodes: u16) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let mut pki = Self {
            dir: dir.to_owned(),
            minted: false,
            nodes,
        };
        let ca_key = dir.join("ca-key.pem");
        let (ca, fresh_ca) = if pki.ca().exists() && ca_key.exists() {
            let ca = Authority::load(&pki.ca(), &ca_key).with_context(|| {
                format!(
                    "cannot reuse the dev CA in {} (delete the folder to start over)",
                    dir.display()
                )
            })?;
            (ca, false)
        } else {
            let ca = Authority::new("lockd dev CA")?;
            ca.write(&pki.ca(), &ca_key)?;
            (ca, true)
        };
        pki.minted = fresh_ca;
        let leaves = (1..=nodes)
            .map(|id| (format!("node{id}"), format!("node-{id}")))
            .chain(USERS.iter().map(|(p, _)| (p.to_string(), p.to_string())));
        for (stem, principal) in leaves {
            let (cert, key) = pki.identity(&stem);
            if fresh_ca || !cert.exists() || !key.exists() {
                ca.issue(&principal)?.write(&cert, &key)?;
                pki.minted = true;
            }
        }
        Ok(pki)
    }

    /// The `lockd run` arguments of node `id`: its TLS files, client certificates required, and
    /// the role map (when this `lockd` has the `--role` flag).
    pub fn node_args(&self, id: u16) -> Vec<OsString> {
        let (cert, key) = self.identity(&format!("node{id}"));
        let mut args: Vec<OsString> = vec![
            "--tls-ca".into(),
            self.ca().into(),
            "--tls-cert".into(),
            cert.into(),
            "--tls-key".into(),
            key.into(),
            "--require-client-cert".into(),
        ];
        if run_has_flag("role") {
            let nodes = (1..=self.nodes).map(|n| format!("node-{n}=node"));
            let users = USERS.iter().map(|(p, r)| format!("{p}={r}"));
            for mapping in nodes.chain(users) {
                args.push("--role".into());
                args.push(mapping.into());
            }
        }
        args
    }

    /// A client TLS config presenting the admin certificate.
    pub fn admin_tls(&self) -> anyhow::Result<Arc<lock_tls::client::ClientTls>> {
        let (cert, key) = self.identity("admin");
        let config = lock_tls::client::client_config(&self.ca(), Some((&cert, &key)))?;
        Ok(Arc::new(lock_tls::client::ClientTls::Fixed(Arc::new(
            config,
        ))))
    }

    /// The shell lines that point lockctl and the SDK at the cluster as `client`, and the
    /// operator's and admin's files beside them.
    pub fn export_lines(&self) -> Vec<String> {
        let (cert, key) = self.identity("client");
        let mut lines = vec![format!(
            "export LOCKD_CA={} LOCKD_CERT={} LOCKD_KEY={}",
            self.ca().display(),
            cert.display(),
            key.display()
        )];
        for who in ["operator", "admin"] {
            let (cert, key) = self.identity(who);
            lines.push(format!(
                "# as {who}: export LOCKD_CERT={} LOCKD_KEY={}",
                cert.display(),
                key.display()
            ));
        }
        lines
    }
}

/// Whether `lockd run` of this executable accepts `--NAME` (the role map is passed only to a
/// build that has it).
fn run_has_flag(name: &str) -> bool {
    use clap::CommandFactory;
    crate::process::cli::Cli::command()
        .find_subcommand("run")
        .is_some_and(|run| run.get_arguments().any(|a| a.get_long() == Some(name)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_files_are_minted_once_and_a_missing_leaf_is_reissued_by_the_same_ca() {
        let dir = tempfile::tempdir().unwrap();
        let tls = dir.path().join(TLS_SUBDIR);
        let pki = DevPki::ensure(&tls, 3).unwrap();
        assert!(pki.minted);
        for stem in ["node1", "node2", "node3", "client", "operator", "admin"] {
            let (cert, key) = pki.identity(stem);
            assert!(cert.exists() && key.exists(), "{stem}");
        }
        let ca_before = std::fs::read(pki.ca()).unwrap();
        let node2 = lock_tls::pem::load_certs(&pki.identity("node2").0).unwrap();
        assert_eq!(lock_tls::principal_of(&node2[0]).unwrap(), "node-2");

        let again = DevPki::ensure(&tls, 3).unwrap();
        assert!(!again.minted, "everything reused");

        std::fs::remove_file(pki.identity("operator").0).unwrap();
        let again = DevPki::ensure(&tls, 3).unwrap();
        assert!(again.minted);
        assert_eq!(std::fs::read(pki.ca()).unwrap(), ca_before, "the same CA");
        let (cert, key) = again.identity("operator");
        let files = lock_tls::TlsFiles {
            ca: again.ca(),
            cert,
            key,
        };
        lock_tls::server::server_config(&files, lock_tls::server::ClientCerts::Required)
            .expect("the reissued leaf chains to the CA on disk");
        again.admin_tls().unwrap();
        let lines = again.export_lines().join("\n");
        assert!(
            lines.contains("LOCKD_CA=") && lines.contains("client-key.pem"),
            "{lines}"
        );
        assert!(
            lines.contains("operator.pem") && lines.contains("admin.pem"),
            "{lines}"
        );
    }
}
