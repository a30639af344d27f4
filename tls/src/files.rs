//! The three files of one TLS identity (the CA, this identity's certificate chain, its key)
//! and a cheap fingerprint of them that tells whether any changed on disk.
//!
//! The fingerprint is each file's inode, length and modification time, so a file rewritten in
//! place or replaced by a rename shows as a change without reading a byte; checking it costs
//! three `stat` calls.

use std::path::PathBuf;
use std::time::SystemTime;

/// The CA that signs every node and client certificate, and one identity's certificate chain
/// and private key, as paths.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM CA bundle: peers' and clients' certificates must chain to one of these.
    pub ca: PathBuf,
    /// PEM certificate chain of this identity, leaf first.
    pub cert: PathBuf,
    /// PEM private key of the leaf.
    pub key: PathBuf,
}

/// One file's identity on disk; `None` when it cannot be read (missing, no permission).
#[derive(Clone, Debug, PartialEq, Eq)]
struct FileStamp {
    ino: u64,
    len: u64,
    modified: Option<SystemTime>,
}

/// What the three files looked like at one moment; two equal fingerprints mean nothing
/// changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fingerprint([Option<FileStamp>; 3]);

impl TlsFiles {
    /// The three files' current fingerprint.
    pub fn fingerprint(&self) -> Fingerprint {
        use std::os::unix::fs::MetadataExt;
        let stamp = |path: &PathBuf| {
            std::fs::metadata(path).ok().map(|m| FileStamp {
                ino: m.ino(),
                len: m.len(),
                modified: m.modified().ok(),
            })
        };
        Fingerprint([stamp(&self.ca), stamp(&self.cert), stamp(&self.key)])
    }

    /// `ca, cert, key` paths for messages.
    pub fn describe(&self) -> String {
        format!(
            "TLS files (ca {}, cert {}, key {})",
            self.ca.display(),
            self.cert.display(),
            self.key.display()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rewrite_or_a_replacement_changes_the_fingerprint() {
        let dir = tempfile::tempdir().unwrap();
        let files = TlsFiles {
            ca: dir.path().join("ca.pem"),
            cert: dir.path().join("cert.pem"),
            key: dir.path().join("key.pem"),
        };
        for path in [&files.ca, &files.cert, &files.key] {
            std::fs::write(path, "a").unwrap();
        }
        let first = files.fingerprint();
        assert_eq!(first, files.fingerprint(), "nothing changed");
        std::fs::write(&files.cert, "ab").unwrap();
        let second = files.fingerprint();
        assert_ne!(first, second, "a longer file");
        let tmp = dir.path().join("new.pem");
        std::fs::write(&tmp, "cd").unwrap();
        std::fs::rename(&tmp, &files.cert).unwrap();
        assert_ne!(second, files.fingerprint(), "same length, another inode");
        std::fs::remove_file(&files.key).unwrap();
        assert_ne!(second, files.fingerprint(), "a missing file");
    }
}
