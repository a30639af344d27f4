//! The storage families: the durations raft-store reports through its [`StorageObserver`]
//! (log flushes, snapshot builds), and the sizes on disk, read from the storage directory at
//! each scrape (`lockd_wal_bytes`, `lockd_snapshot_bytes`).
//!
//! Owns those four families' updates. Reads file sizes only (no file contents), and never
//! fails a scrape: a directory that cannot be read reports 0.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use lock_raft_store::storage::{SNAPSHOT_DIR_NAME, StorageObserver};

use super::families::Families;

/// Observes log flushes and snapshot builds into the node's histograms.
#[derive(Debug)]
pub struct StorageTimings {
    families: Arc<Families>,
}

impl StorageTimings {
    /// Observes into `families`.
    pub fn new(families: Arc<Families>) -> Self {
        Self { families }
    }
}

impl StorageObserver for StorageTimings {
    fn log_synced(&self, took: Duration) {
        self.families.wal_fsync_duration.observe(took.as_secs_f64());
    }

    fn snapshot_built(&self, took: Duration, bytes: u64) {
        self.families
            .snapshot_build_duration
            .observe(took.as_secs_f64());
        // The build's own size, at once: the scrape's directory read agrees once it runs.
        self.families
            .snapshot_bytes
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }
}

/// The storage directory of a Raft node (`<data_dir>/raft`), read for its sizes.
#[derive(Clone, Debug)]
pub struct StorageDir {
    dir: PathBuf,
}

/// The log engines' folders inside the storage directory: the WAL's segments, or sled's
/// database. A data dir holds one of them.
const LOG_DIR_NAMES: [&str; 2] = ["wal", "log"];

impl StorageDir {
    /// The storage directory `dir`.
    pub fn new(dir: PathBuf) -> Self {
        Self { dir }
    }

    /// Sets `lockd_wal_bytes` and `lockd_snapshot_bytes` from the files on disk. Blocking
    /// file-system calls: run it off the async workers.
    pub fn refresh(&self, families: &Families) {
        let log: u64 = LOG_DIR_NAMES
            .iter()
            .map(|name| tree_bytes(&self.dir.join(name)))
            .sum();
        families.wal_bytes.set(clamp(log));
        families
            .snapshot_bytes
            .set(clamp(newest_file_bytes(&self.dir.join(SNAPSHOT_DIR_NAME))));
    }
}

fn clamp(bytes: u64) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

/// Most directory levels [`tree_bytes`] descends: sled keeps one level of blobs; anything
/// deeper is not the log's.
const TREE_DEPTH_MAX: usize = 3;

/// Bytes of the regular files under `dir` (0 if it does not exist).
fn tree_bytes(dir: &Path) -> u64 {
    fn walk(dir: &Path, depth: usize) -> u64 {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return 0;
        };
        entries
            .flatten()
            .map(|entry| match entry.metadata() {
                Ok(m) if m.is_file() => m.len(),
                Ok(m) if m.is_dir() && depth < TREE_DEPTH_MAX => walk(&entry.path(), depth + 1),
                _ => 0,
            })
            .sum()
    }
    walk(dir, 0)
}

/// Size of the newest snapshot file in `dir`: the snapshot directory keeps one current file,
/// and briefly its predecessor while a new one is written.
fn newest_file_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "snap"))
        .filter_map(|e| e.metadata().ok())
        .filter(std::fs::Metadata::is_file)
        .max_by_key(|m| m.modified().ok())
        .map_or(0, |m| m.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_come_from_the_files_on_disk() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("wal")).unwrap();
        std::fs::write(dir.path().join("wal/00000001.seg"), vec![0u8; 300]).unwrap();
        std::fs::write(dir.path().join("wal/00000002.seg"), vec![0u8; 200]).unwrap();
        std::fs::create_dir_all(dir.path().join(SNAPSHOT_DIR_NAME)).unwrap();
        std::fs::write(
            dir.path().join(SNAPSHOT_DIR_NAME).join("1-2-3.snap"),
            vec![0u8; 70],
        )
        .unwrap();
        let (families, _registry) = Families::registered(true);
        StorageDir::new(dir.path().to_path_buf()).refresh(&families);
        assert_eq!(families.wal_bytes.get(), 500);
        assert_eq!(families.snapshot_bytes.get(), 70);
    }

    #[test]
    fn a_missing_directory_reports_zero() {
        let (families, _registry) = Families::registered(true);
        families.wal_bytes.set(9);
        StorageDir::new(PathBuf::from("/nonexistent/lockd-metrics-test")).refresh(&families);
        assert_eq!(families.wal_bytes.get(), 0);
        assert_eq!(families.snapshot_bytes.get(), 0);
    }
}
