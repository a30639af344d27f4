//! [`TestPki`]: a throwaway certificate authority and the certificates of one test cluster,
//! minted with lock-tls (`mint`) into the cluster's directory (docs/SECURITY.md §1).
//!
//! Owns the files and their names only: `ca.pem` / `ca-key.pem`, and for every identity
//! `<name>.pem` / `<name>-key.pem`, where a leaf's principal is its name (its first URI SAN).
//! Every leaf also names `DNS:localhost` and `IP:127.0.0.1`, so the harness dials nodes at
//! 127.0.0.1 and verifies them, and carries both EKUs, so a node's one certificate serves its
//! port and dials its peers. Which roles the names have is the node's configuration
//! ([`crate::ClusterConfig::roles`]), not the certificate's.

use std::path::{Path, PathBuf};

use lock_tls::mint::Authority;

use crate::HarnessError;

/// The identities every TLS cluster mints besides its nodes' `node-<id>`, each mapped to the
/// role of the same name: `client` ⊂ `operator` ⊂ `admin`.
pub const STANDARD_CLIENTS: [&str; 3] = ["client", "operator", "admin"];

/// The identity the harness's own clients ([`crate::NodeClient`], [`crate::ClusterClient`])
/// present unless a test asks for another: it may call everything a test needs.
pub const HARNESS_IDENTITY: &str = "admin";

/// The principal of node `id`'s certificate (and its role-map entry `node-<id>=node`).
pub fn node_principal(id: u64) -> String {
    format!("node-{id}")
}

/// A CA and the certificates it issued, as files in one directory.
#[derive(Debug)]
pub struct TestPki {
    dir: PathBuf,
    authority: Authority,
}

impl TestPki {
    /// A new CA named `name` in `dir` (created if missing), with a certificate for each of
    /// `identities`.
    pub fn create(dir: &Path, name: &str, identities: &[String]) -> Result<Self, HarnessError> {
        std::fs::create_dir_all(dir).map_err(|e| {
            HarnessError::new(format!("cannot create the PKI dir {}: {e}", dir.display()))
        })?;
        let authority = Authority::new(name)
            .map_err(|e| HarnessError::new(format!("cannot mint the test CA: {e}")))?;
        let pki = Self {
            dir: dir.to_owned(),
            authority,
        };
        pki.authority
            .write(&pki.ca(), &pki.dir.join("ca-key.pem"))
            .map_err(|e| HarnessError::new(format!("cannot write the test CA: {e}")))?;
        for identity in identities {
            pki.try_mint(identity)?;
        }
        Ok(pki)
    }

    /// The PKI of a cluster with `nodes` nodes: `node-1` … `node-<nodes>` and
    /// [`STANDARD_CLIENTS`], in `dir`.
    pub fn for_cluster(
        dir: &Path,
        nodes: impl IntoIterator<Item = u64>,
    ) -> Result<Self, HarnessError> {
        let identities: Vec<String> = nodes
            .into_iter()
            .map(node_principal)
            .chain(STANDARD_CLIENTS.iter().map(|s| (*s).to_owned()))
            .collect();
        Self::create(dir, "lock-tests CA", &identities)
    }

    /// The directory holding the files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The CA certificate every node and client trusts.
    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// The `(certificate, key)` files of `name`, minted at creation or by [`TestPki::mint`].
    ///
    /// # Panics
    /// If no certificate was minted for `name` (a test bug).
    pub fn identity(&self, name: &str) -> (PathBuf, PathBuf) {
        let (cert, key) = self.paths(name);
        assert!(
            cert.exists() && key.exists(),
            "no certificate minted for {name:?} in {}; mint it with TestPki::mint",
            self.dir.display()
        );
        (cert, key)
    }

    /// Mints (or re-mints, replacing the files) a certificate for a new principal from this
    /// CA and returns its `(certificate, key)` files. The principal has no role unless the
    /// cluster was started with one for it ([`crate::ClusterConfig::roles`]).
    ///
    /// # Panics
    /// If minting or writing fails.
    pub fn mint(&self, principal: &str) -> (PathBuf, PathBuf) {
        self.try_mint(principal).unwrap_or_else(|e| panic!("{e}"))
    }

    fn try_mint(&self, principal: &str) -> Result<(PathBuf, PathBuf), HarnessError> {
        let (cert, key) = self.paths(principal);
        self.authority
            .issue(principal)
            .and_then(|leaf| leaf.write(&cert, &key))
            .map_err(|e| {
                HarnessError::new(format!("cannot mint a certificate for {principal:?}: {e}"))
            })?;
        Ok((cert, key))
    }

    /// A second CA, unrelated to this one, in the subdirectory `foreign/`, with certificates
    /// for the same standard names (`node-1` … `node-3`, `client`, `operator`, `admin`): what
    /// the cluster must refuse although the names match. Mint more with its
    /// [`TestPki::mint`]. Calling it again replaces the foreign CA.
    ///
    /// # Panics
    /// If minting or writing fails.
    pub fn foreign(&self) -> TestPki {
        let identities: Vec<String> = (1..=3)
            .map(node_principal)
            .chain(STANDARD_CLIENTS.iter().map(|s| (*s).to_owned()))
            .collect();
        Self::create(&self.dir.join("foreign"), "a foreign CA", &identities)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// The PEM text of the CA and of `name`'s certificate and key, for a tonic TLS config.
    ///
    /// # Panics
    /// If the files cannot be read (as [`TestPki::identity`]).
    pub fn pem_of(&self, name: &str) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
        let (cert, key) = self.identity(name);
        (read(&self.ca()), read(&cert), read(&key))
    }

    /// The files of `name`: the principal with every character that is not safe in a file
    /// name replaced (`spiffe://x/y` → `spiffe___x_y`).
    fn paths(&self, name: &str) -> (PathBuf, PathBuf) {
        let stem: String = name
            .chars()
            .map(|c| match c {
                'a'..='z' | 'A'..='Z' | '0'..='9' | '-' | '_' | '.' => c,
                _ => '_',
            })
            .collect();
        (
            self.dir.join(format!("{stem}.pem")),
            self.dir.join(format!("{stem}-key.pem")),
        )
    }
}

/// The `lockd run` flags of node `id` in a TLS cluster: its CA, certificate and key from
/// `pki`, and `--require-client-cert` if asked.
pub fn node_tls_args(pki: &TestPki, id: u64, require_client_cert: bool) -> Vec<std::ffi::OsString> {
    let (cert, key) = pki.identity(&node_principal(id));
    let mut args: Vec<std::ffi::OsString> = vec![
        "--tls-ca".into(),
        pki.ca().into(),
        "--tls-cert".into(),
        cert.into(),
        "--tls-key".into(),
        key.into(),
    ];
    if require_client_cert {
        args.push("--require-client-cert".into());
    }
    args
}

/// The environment variable that carries a node's role map (`p=r,p=r`; docs/NODE_CLI.md).
pub const ROLES_ENV: &str = "LOCKD_ROLES";

/// The role map of a TLS cluster of the nodes `ids`, as the value of [`ROLES_ENV`]:
/// `node-<id>=node` for every node, each of [`STANDARD_CLIENTS`] mapped to the role of its
/// name, then `roles`. It travels in the environment rather than as `--role` flags, so one
/// variable holds it however many principals there are; a test that passes `--role` itself
/// (in `extra_args`) replaces the whole map, as clap lets a flag override its variable.
pub fn roles_env(
    ids: impl IntoIterator<Item = u64>,
    roles: &[(String, String)],
) -> (String, String) {
    let standard = STANDARD_CLIENTS
        .iter()
        .map(|name| ((*name).to_owned(), (*name).to_owned()));
    let map: Vec<String> = ids
        .into_iter()
        .map(|n| (node_principal(n), "node".to_owned()))
        .chain(standard)
        .chain(roles.iter().cloned())
        .map(|(principal, role)| format!("{principal}={role}"))
        .collect();
    (ROLES_ENV.to_owned(), map.join(","))
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_pki_has_the_nodes_and_the_standard_clients_and_mints_more() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pki = TestPki::for_cluster(dir.path(), 1..=2).expect("minted");
        assert!(pki.ca().exists());
        for name in ["node-1", "node-2", "client", "operator", "admin"] {
            let (cert, key) = pki.identity(name);
            assert!(
                std::fs::read_to_string(cert)
                    .expect("cert")
                    .contains("BEGIN CERTIFICATE")
            );
            assert!(
                std::fs::read_to_string(key)
                    .expect("key")
                    .contains("PRIVATE KEY")
            );
        }
        let (cert, _) = pki.mint("spiffe://lockd/mallory");
        assert_eq!(
            cert.file_name().and_then(|n| n.to_str()),
            Some("spiffe___lockd_mallory.pem")
        );
        let foreign = pki.foreign();
        assert_ne!(
            std::fs::read(foreign.ca()).expect("foreign ca"),
            std::fs::read(pki.ca()).expect("ca")
        );
        assert!(
            foreign
                .identity("admin")
                .0
                .starts_with(dir.path().join("foreign"))
        );
    }

    #[test]
    fn the_role_map_names_every_node_the_standard_clients_and_the_extra_ones() {
        let extra = [("mallory".to_owned(), "client".to_owned())];
        assert_eq!(
            roles_env(1..=2, &extra),
            (
                ROLES_ENV.to_owned(),
                "node-1=node,node-2=node,client=client,operator=operator,admin=admin,\
                 mallory=client"
                    .to_owned()
            )
        );
    }

    #[test]
    #[should_panic(expected = "no certificate minted for \"nobody\"")]
    fn an_identity_never_minted_is_a_test_bug() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pki = TestPki::create(dir.path(), "ca", &[]).expect("minted");
        let _ = pki.identity("nobody");
    }
}
