//! The data dir's identity file: which cluster and which node the data belongs to.
//!
//! A node started on a data dir written by another cluster, or by another node of the same
//! cluster, would join with a log and a vote that are not its own: Raft's safety rests on each
//! node's vote and log being its own, so such a start is refused, naming both identities.
//! Owns the `identity` file only; the Raft storage lives beside it in [`STORAGE_SUBDIR`].

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The identity file's name inside the data dir.
pub const IDENTITY_FILE: &str = "identity";
/// The Raft storage's folder inside the data dir.
pub const STORAGE_SUBDIR: &str = "raft";
/// First line of the file: names the format and its version.
const HEADER_V1: &str = "lockd-identity v1";
/// Largest identity file read: the real one is under 200 bytes, so anything larger is not ours.
const IDENTITY_BYTES_MAX: u64 = 4096;

/// Who a data dir belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// The cluster's name.
    pub cluster_name: String,
    /// The node's id.
    pub node_id: u64,
}

/// Why a data dir cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// The data dir belongs to another cluster or node.
    #[error(
        "data dir {dir} belongs to cluster {:?} node {}, but this node is cluster {:?} node {}; refusing to start (use the right --data-dir, or a fresh one)",
        found.cluster_name, found.node_id, expected.cluster_name, expected.node_id
    )]
    Mismatch {
        /// The data dir.
        dir: PathBuf,
        /// What the file says.
        found: Identity,
        /// What the configuration says.
        expected: Identity,
    },
    /// The data dir holds Raft data but no identity file: written by something else.
    #[error(
        "data dir {dir} holds Raft data but no `identity` file; refusing to start on data of unknown origin"
    )]
    Orphan {
        /// The data dir.
        dir: PathBuf,
    },
    /// The identity file is not one we wrote.
    #[error("identity file {path} is malformed: {reason}")]
    Malformed {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// Reading or writing failed.
    #[error("data dir {path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The IO error.
        source: std::io::Error,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> IdentityError + '_ {
    move |source| IdentityError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Checks (or, on a fresh dir, writes) the identity of `data_dir`. Returns `true` if the dir was
/// fresh (no identity file was there before this call).
pub fn ensure(data_dir: &Path, expected: &Identity) -> Result<bool, IdentityError> {
    fs::create_dir_all(data_dir).map_err(io(data_dir))?;
    let path = data_dir.join(IDENTITY_FILE);
    match fs::metadata(&path) {
        Ok(meta) => {
            if meta.len() > IDENTITY_BYTES_MAX {
                return Err(IdentityError::Malformed {
                    path,
                    reason: format!("{} bytes; ours are under {IDENTITY_BYTES_MAX}", meta.len()),
                });
            }
            let text = fs::read_to_string(&path).map_err(io(&path))?;
            let found = parse(&text).map_err(|reason| IdentityError::Malformed {
                path: path.clone(),
                reason,
            })?;
            if &found != expected {
                return Err(IdentityError::Mismatch {
                    dir: data_dir.to_owned(),
                    found,
                    expected: expected.clone(),
                });
            }
            Ok(false)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if data_dir.join(STORAGE_SUBDIR).exists() {
                return Err(IdentityError::Orphan {
                    dir: data_dir.to_owned(),
                });
            }
            write(data_dir, &path, expected)?;
            Ok(true)
        }
        Err(e) => Err(io(&path)(e)),
    }
}

fn render(identity: &Identity) -> String {
    format!(
        "{HEADER_V1}\ncluster_name={}\nnode_id={}\n",
        identity.cluster_name, identity.node_id
    )
}

fn parse(text: &str) -> Result<Identity, String> {
    let mut lines = text.lines();
    if lines.next() != Some(HEADER_V1) {
        return Err(format!("first line is not {HEADER_V1:?}"));
    }
    let (mut cluster_name, mut node_id) = (None, None);
    for line in lines.filter(|l| !l.trim().is_empty()) {
        match line.split_once('=') {
            Some(("cluster_name", v)) => cluster_name = Some(v.to_owned()),
            Some(("node_id", v)) => {
                node_id = Some(
                    v.parse::<u64>()
                        .map_err(|e| format!("node_id {v:?}: {e}"))?,
                )
            }
            _ => return Err(format!("unexpected line {line:?}")),
        }
    }
    Ok(Identity {
        cluster_name: cluster_name.ok_or("no cluster_name line")?,
        node_id: node_id.ok_or("no node_id line")?,
    })
}

/// Writes the file durably: temp file, fsync, rename, fsync the directory, so a crash leaves
/// either no identity or the whole one.
fn write(dir: &Path, path: &Path, identity: &Identity) -> Result<(), IdentityError> {
    let tmp = dir.join(format!("{IDENTITY_FILE}.tmp"));
    let mut file = fs::File::create(&tmp).map_err(io(&tmp))?;
    file.write_all(render(identity).as_bytes())
        .map_err(io(&tmp))?;
    file.sync_all().map_err(io(&tmp))?;
    drop(file);
    fs::rename(&tmp, path).map_err(io(path))?;
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(dir))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(name: &str, node: u64) -> Identity {
        Identity {
            cluster_name: name.into(),
            node_id: node,
        }
    }

    #[test]
    fn fresh_then_same_then_mismatch() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("n1");
        assert!(ensure(&data, &id("a", 1)).unwrap(), "fresh");
        assert!(
            !ensure(&data, &id("a", 1)).unwrap(),
            "second start is not fresh"
        );
        let err = ensure(&data, &id("b", 1)).unwrap_err().to_string();
        assert!(err.contains("\"a\"") && err.contains("\"b\""), "{err}");
        let err = ensure(&data, &id("a", 2)).unwrap_err().to_string();
        assert!(err.contains("node 1") && err.contains("node 2"), "{err}");
    }

    #[test]
    fn orphan_and_malformed_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join(STORAGE_SUBDIR)).unwrap();
        assert!(matches!(
            ensure(dir.path(), &id("a", 1)),
            Err(IdentityError::Orphan { .. })
        ));
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(IDENTITY_FILE), "hello\n").unwrap();
        assert!(matches!(
            ensure(dir.path(), &id("a", 1)),
            Err(IdentityError::Malformed { .. })
        ));
    }
}
