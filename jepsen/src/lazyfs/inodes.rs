//! The mount's inode numbers and the backing paths they stand for.
//!
//! A mounted inode is numbered by its backing file's inode number, so two names of one file
//! (hard links) are one inode and a page cache keyed by it follows the file through renames.
//! FUSE reserves 1 for the root: the backing root's number and 1 trade places (1 is never a
//! regular file's number on the file systems the harness uses, but a bijection costs nothing).
//! Owns the table of known inodes and its updates on rename and unlink; does no IO.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// FUSE's inode number of the root.
pub const ROOT_INO: u64 = 1;

/// Known inodes: number → path relative to the backing root ("" is the root).
#[derive(Debug)]
pub struct Inodes {
    root_backing_ino: u64,
    paths: HashMap<u64, PathBuf>,
}

impl Inodes {
    /// A table that knows the root, whose backing inode number is `root_backing_ino`.
    pub fn new(root_backing_ino: u64) -> Self {
        let mut paths = HashMap::new();
        paths.insert(ROOT_INO, PathBuf::new());
        Self {
            root_backing_ino,
            paths,
        }
    }

    /// The mount's number for backing inode `backing_ino`.
    pub fn ino(&self, backing_ino: u64) -> u64 {
        if backing_ino == self.root_backing_ino {
            ROOT_INO
        } else if backing_ino == ROOT_INO {
            self.root_backing_ino
        } else {
            backing_ino
        }
    }

    /// The relative path of inode `ino`, if known.
    pub fn path(&self, ino: u64) -> Option<&Path> {
        self.paths.get(&ino).map(PathBuf::as_path)
    }

    /// Notes that inode `ino` is at `path` (a lookup or a create found it there).
    pub fn insert(&mut self, ino: u64, path: PathBuf) {
        self.paths.insert(ino, path);
    }

    /// Forgets `path` (unlinked or removed); an inode known under it is forgotten too.
    pub fn remove(&mut self, path: &Path) {
        self.paths.retain(|&ino, p| ino == ROOT_INO || p != path);
    }

    /// Moves `from` (and, for a directory, everything under it) to `to`; whatever was known
    /// at `to` was replaced and is forgotten.
    pub fn rename(&mut self, from: &Path, to: &Path) {
        self.remove(to);
        for path in self.paths.values_mut() {
            if let Ok(rest) = path.strip_prefix(from)
                && !from.as_os_str().is_empty()
            {
                *path = to.join(rest);
            }
        }
    }

    /// Number of known inodes.
    pub fn len(&self) -> usize {
        self.paths.len()
    }

    /// Whether only the root is known.
    pub fn is_empty(&self) -> bool {
        self.paths.len() <= 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_root_and_one_trade_numbers_and_renames_move_subtrees() {
        let mut inodes = Inodes::new(2);
        assert_eq!(inodes.ino(2), ROOT_INO);
        assert_eq!(inodes.ino(1), 2);
        assert_eq!(inodes.ino(77), 77);
        inodes.insert(10, "raft".into());
        inodes.insert(11, "raft/wal".into());
        inodes.insert(12, "raft/wal/1.wal".into());
        inodes.insert(13, "other".into());
        inodes.rename(Path::new("raft"), Path::new("other"));
        assert_eq!(inodes.path(12), Some(Path::new("other/wal/1.wal")));
        assert_eq!(inodes.path(13), None, "the replaced target is forgotten");
        inodes.remove(Path::new("other/wal/1.wal"));
        assert_eq!(inodes.path(12), None);
        assert_eq!(inodes.path(ROOT_INO), Some(Path::new("")));
        assert_eq!(inodes.len(), 3);
    }
}
