//! Durable openraft storage (storage-v2) for the lock cluster: the Raft log and vote in a
//! write-ahead log (or, for directories created with it, sled), the lock state machine in
//! memory, and its snapshots as files.
//!
//! # Layout on disk
//!
//! ```text
//! <dir>/wal/          WAL segments (engine/wal.rs): log entries, vote, committed, last purged
//! <dir>/log/          or, with the sled engine, a sled database (engine/sled_engine.rs)
//! <dir>/snapshots/    <snapshot id>.snap, one current snapshot (snapshot.rs)
//! ```
//!
//! # Construction
//!
//! [`open`] returns the two halves openraft takes:
//!
//! ```no_run
//! # use lock_raft_store::{SnapshotData, TypeConfig};
//! # async fn f<N>(config: std::sync::Arc<openraft::Config>, network: N) -> Result<(), Box<dyn std::error::Error>>
//! # where
//! #     N: openraft::RaftNetworkFactory<TypeConfig>,
//! #     N::Network: openraft::network::NetSnapshot<TypeConfig, SnapshotData = SnapshotData>,
//! # {
//! use lock_raft_store::storage;
//! let (log_store, state_machine) = storage::open(std::path::Path::new("/var/lib/lockd"), None)?;
//! let reader = state_machine.reader(); // keep for serving reads
//! let raft = lock_raft_store::Raft::new(1, config, network, log_store, state_machine).await?;
//! # Ok(()) }
//! ```
//!
//! # Modules
//!
//! - `engine`: the one seam over the log's storage: the WAL engine and the sled engine.
//! - `disk`: the file-system calls of the WAL and the snapshot files, `std::fs` in production;
//!   in tests a simulated disk that loses unsynced writes on a power cut (`disk/power_cut.rs`,
//!   driven by `power_cut_test.rs` and the WAL's own tests).
//! - `codec`: the `[version][crc32][postcard]` frame of every persisted record.
//! - [`log_store`]: [`LogStore`] / [`LogReader`], openraft's `RaftLogStorage`.
//! - [`state_machine`]: [`StateMachineStore`], openraft's `RaftStateMachine`, [`StateReader`] and
//!   [`StopSnapshot`], a stopping node's last snapshot.
//! - [`observer`]: [`StorageObserver`], the durations of log flushes and snapshot builds for
//!   the node's metrics.
//! - `snapshot`: snapshot files (atomic write, checksum, clean-up).
//! - [`snapshot_policy`]: when a snapshot is due (log bytes against snapshot size, staggered
//!   across nodes).
//!
//! Nothing here reads a clock or decides lock semantics: that is the lock table's job.

mod codec;
mod disk;
mod engine;
pub mod log_store;
pub mod observer;
mod own_load;
#[cfg(test)]
mod own_load_test;
#[cfg(test)]
mod power_cut_test;
mod snapshot;
pub mod snapshot_data;
pub mod snapshot_policy;
pub mod state_machine;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use codec::CodecError;
pub use engine::{
    EngineError, EngineKind, LAYOUT_VERSION, LayoutFound, RECORD_BYTES_MAX, WAL_FORMAT_VERSION,
};
pub use log_store::{LogReader, LogStore};
pub use observer::StorageObserver;
pub use snapshot::{SNAPSHOT_BYTES_MAX, decode_table, file_name as snapshot_file_name};
pub use snapshot_data::{Incoming, SnapshotData, SnapshotInbox};
pub use snapshot_policy::{LogBytes, SnapshotPolicy, ask_interval};
pub use state_machine::{ApplyObserver, StateMachineStore, StateReader, StopSnapshot};

/// Sub-directory of the storage directory holding snapshot files.
pub const SNAPSHOT_DIR_NAME: &str = "snapshots";

/// Opens (creating if needed) the storage in `dir` and returns openraft's two storage halves.
///
/// The log store verifies every stored record's format version and checksum before returning,
/// and the state machine loads the latest snapshot; any mismatch refuses to start with an error
/// naming the file. `observer`, if given, learns of every applied batch's events
/// ([`ApplyObserver`]). Blocks on disk IO: call it before starting the Raft node, or from a
/// blocking task.
pub fn open(
    dir: &Path,
    observer: Option<Arc<dyn ApplyObserver>>,
) -> Result<(LogStore, StateMachineStore), StorageError> {
    open_with(dir, EngineKind::default(), observer)
}

/// [`open`], creating a fresh log with the engine `fresh`; a directory that already holds a log
/// keeps its engine (logged when it differs).
pub fn open_with(
    dir: &Path,
    fresh: EngineKind,
    observer: Option<Arc<dyn ApplyObserver>>,
) -> Result<(LogStore, StateMachineStore), StorageError> {
    open_observed(dir, fresh, observer, None, None)
}

/// [`open_with`], and `storage`, if given, learns how long each log flush and each snapshot
/// build takes ([`StorageObserver`]). The node's own snapshot is decoded behind the start when
/// its data has at least `background_from` bytes (`None`: 16 MiB; tests set less).
pub fn open_observed(
    dir: &Path,
    fresh: EngineKind,
    observer: Option<Arc<dyn ApplyObserver>>,
    storage: Option<Arc<dyn StorageObserver>>,
    background_from: Option<u64>,
) -> Result<(LogStore, StateMachineStore), StorageError> {
    open_on(
        disk::Disk::Os,
        dir,
        fresh,
        observer,
        storage,
        background_from,
    )
}

/// [`open_observed`] on `disk`: the operating system's, or in tests a simulated one.
pub(crate) fn open_on(
    disk: disk::Disk,
    dir: &Path,
    fresh: EngineKind,
    observer: Option<Arc<dyn ApplyObserver>>,
    storage: Option<Arc<dyn StorageObserver>>,
    background_from: Option<u64>,
) -> Result<(LogStore, StateMachineStore), StorageError> {
    disk.create_dir_all(dir)
        .map_err(|source| StorageError::Io {
            op: "create directory",
            path: dir.to_path_buf(),
            source,
        })?;
    let written = LogBytes::shared();
    let log_store = LogStore::open_on(disk.clone(), dir, fresh, storage.clone(), written.clone())?;
    // The entries of the log as it opens were all proposed before this start, so no caller
    // waits for their answers: while a large snapshot loads, they may wait for it.
    let own = state_machine::OwnSnapshot {
        background_from: background_from.unwrap_or(own_load::BACKGROUND_LOAD_MIN_BYTES),
        queue_until: log_store.last_index()?,
        #[cfg(test)]
        gate: None,
    };
    let state_machine =
        StateMachineStore::open_on(disk, &dir.join(SNAPSHOT_DIR_NAME), observer, storage, own)?
            .with_log_bytes(written);
    Ok((log_store, state_machine))
}

/// Why the storage failed. Every variant names the file or directory involved, and the record
/// when one is.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// A file-system call failed.
    #[error("cannot {op} {}: {source}", path.display())]
    Io {
        /// What was attempted.
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// The embedded database failed.
    #[error("cannot {op} in {}: {source}", path.display())]
    Engine {
        /// What was attempted.
        op: &'static str,
        /// The database directory.
        path: PathBuf,
        /// The database's error.
        source: EngineError,
    },
    /// A stored record failed its version or checksum check or did not decode.
    #[error("{record} in {} is unreadable: {source}", path.display())]
    Corrupt {
        /// Which record ("log entry 42", "vote", "snapshot file").
        record: String,
        /// The file or directory holding it.
        path: PathBuf,
        /// What is wrong with it.
        source: CodecError,
    },
    /// A value could not be encoded (a bug or a value that postcard cannot represent).
    #[error("cannot encode {record}: {source}")]
    Encode {
        /// Which record.
        record: String,
        /// postcard's error.
        source: postcard::Error,
    },
    /// A record is larger than its limit.
    #[error("{record} is {len} bytes, above the limit of {max} bytes")]
    TooLarge {
        /// Which record.
        record: String,
        /// Its size.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The files are readable but do not fit together (a hole in the log, a foreign key).
    #[error("inconsistent storage in {}: {message}", path.display())]
    Layout {
        /// The file or directory.
        path: PathBuf,
        /// What does not fit.
        message: String,
    },
    /// The directory was written with a storage layout this build does not read (another
    /// [`LAYOUT_VERSION`], or none recorded in a non-empty directory).
    #[error(
        "{} was written with storage layout {found}; this lockd reads layout {expected}: restore \
         a matching lockd version or start from an empty data dir",
        path.display()
    )]
    LayoutVersion {
        /// The database directory.
        path: PathBuf,
        /// The layout version found.
        found: LayoutFound,
        /// The layout version this build reads, [`LAYOUT_VERSION`].
        expected: u32,
    },
    /// A flush shared by several callers failed (the first error, as text, since one error
    /// value cannot be handed to each of them).
    #[error("flush of the log in {} failed: {message}", path.display())]
    FlushFailed {
        /// The database directory.
        path: PathBuf,
        /// The flush's error.
        message: String,
    },
    /// The log store's flush thread stopped, so nothing more can be made durable.
    #[error("the flush thread of the log in {} has stopped", path.display())]
    FlusherStopped {
        /// The database directory.
        path: PathBuf,
    },
}
