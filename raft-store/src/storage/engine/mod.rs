//! The one seam between the log store and the disk: where the Raft log and its metadata (vote,
//! committed and last purged log ids) live, and how a write is made durable.
//!
//! Two engines sit behind [`Engine`], with the same contract:
//!
//! - [`EngineKind::Wal`] (`wal.rs`, the default for new data directories): append-only segment
//!   files in `<dir>/wal/`, one `write` per batch and one `fdatasync` per flush group. Built for
//!   the Raft log's access pattern; `wal.rs` explains why it replaced sled as the default.
//! - [`EngineKind::Sled`] (`sled_engine.rs`): a sled 0.34 database in `<dir>/log/`, the store the
//!   project started on, kept for directories created with it and for `--log-engine sled`.
//!
//! The contract both keep: [`Engine::write`] applies a [`WriteBatch`] in its order and makes it
//! readable at once, but not durable; [`Engine::sync`] makes every write applied before it
//! durable; after a crash the store holds a prefix of the writes in write order, and the
//! metadata ops of one batch with the removal they came with (a purge's last-purged id and its
//! removal land together). Records are opaque bytes (already framed by `codec`): the engines
//! must not know what an entry or a vote is.
//!
//! An existing directory keeps its engine whatever is asked for (a data directory is never
//! converted behind an operator's back); a fresh one gets the requested kind.

mod sled_engine;
mod wal;

use std::fmt;
use std::ops::Bound;
use std::path::Path;
use std::str::FromStr;

use super::StorageError;
use super::disk::Disk;

pub use sled_engine::{EngineError, LAYOUT_VERSION};
pub(crate) use wal::SEGMENT_BYTES as WAL_SEGMENT_BYTES;
pub use wal::WAL_FORMAT_VERSION;

/// The largest framed log entry the log store accepts: 1 MiB. It must hold the largest entry a
/// leader can propose, a `Batch` of `limits::BATCH_MAX` commands of the largest size the
/// argument limits allow (asserted below); much more would also strain the Raft transport,
/// which ships whole entries.
pub const RECORD_BYTES_MAX: usize = 1024 * 1024;

/// An upper bound of one command's postcard encoding: every string argument at its limit (no
/// command has them all), the principal of an `AsCaller` around it, plus 64 bytes of tags,
/// integers and length prefixes.
const COMMAND_BYTES_BOUND: usize = lock_api::limits::KEY_LEN_MAX
    + lock_api::limits::PRINCIPAL_LEN_MAX
    + lock_api::limits::OWNER_ID_LEN_MAX
    + lock_api::limits::SESSION_ID_LEN_MAX
    + lock_api::limits::OPERATOR_LEN_MAX
    + lock_api::limits::REASON_LEN_MAX
    + 64;

const _: () = assert!(
    crate::limits::BATCH_MAX * COMMAND_BYTES_BOUND + 1024 <= RECORD_BYTES_MAX,
    "a full batch of the largest commands must fit one log record"
);

/// Refuses a log entry record above [`RECORD_BYTES_MAX`], naming the entry.
fn check_record_len(index: u64, record: &[u8]) -> Result<(), StorageError> {
    if record.len() > RECORD_BYTES_MAX {
        return Err(StorageError::TooLarge {
            record: format!("log entry {index}"),
            len: record.len(),
            max: RECORD_BYTES_MAX,
        });
    }
    Ok(())
}

/// Which engine stores the log.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EngineKind {
    /// Append-only segment files in `<dir>/wal/` (the default).
    #[default]
    Wal,
    /// A sled 0.34 database in `<dir>/log/`.
    Sled,
}

impl EngineKind {
    /// The name used in configuration and logs: `wal` or `sled`.
    pub fn name(self) -> &'static str {
        match self {
            EngineKind::Wal => "wal",
            EngineKind::Sled => "sled",
        }
    }

    /// The sub-directory of the storage directory the engine owns.
    pub fn dir_name(self) -> &'static str {
        match self {
            EngineKind::Wal => wal::WAL_DIR_NAME,
            EngineKind::Sled => sled_engine::LOG_DIR_NAME,
        }
    }
}

impl fmt::Display for EngineKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for EngineKind {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "wal" => Ok(EngineKind::Wal),
            "sled" => Ok(EngineKind::Sled),
            other => Err(format!(
                "unknown log engine {other:?}: expected wal or sled"
            )),
        }
    }
}

/// A metadata record kept beside the log, one value each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetaKey {
    /// The last saved vote.
    Vote,
    /// The last saved committed log id.
    Committed,
    /// The log id of the last purged entry.
    LastPurged,
}

impl MetaKey {
    /// Every metadata key.
    pub const ALL: [MetaKey; 3] = [MetaKey::Vote, MetaKey::Committed, MetaKey::LastPurged];
}

/// One change in a [`WriteBatch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Op {
    /// Store `record` as the log entry at `index`, replacing any entry there.
    PutLog { index: u64, record: Vec<u8> },
    /// Store `record` as the metadata record `key`.
    PutMeta { key: MetaKey, record: Vec<u8> },
    /// Remove every log entry with an index in `first..=last`.
    RemoveLogs { first: u64, last: u64 },
}

/// Changes to apply together, in order ([`Engine::write`]).
#[derive(Debug, Default)]
pub struct WriteBatch {
    ops: Vec<Op>,
}

impl WriteBatch {
    /// Stores `record` as the log entry at `index`. Refuses a record above
    /// [`RECORD_BYTES_MAX`], naming the entry.
    pub fn put_log(&mut self, index: u64, record: &[u8]) -> Result<(), StorageError> {
        check_record_len(index, record)?;
        self.ops.push(Op::PutLog {
            index,
            record: record.to_vec(),
        });
        Ok(())
    }

    /// Stores `record` as the metadata record `key`.
    pub fn put_meta(&mut self, key: MetaKey, record: &[u8]) {
        self.ops.push(Op::PutMeta {
            key,
            record: record.to_vec(),
        });
    }

    /// Removes every log entry with an index in `(start, end)`. An empty range adds nothing.
    pub fn remove_logs(&mut self, start: Bound<u64>, end: Bound<u64>) {
        let first = match start {
            Bound::Included(i) => i,
            Bound::Excluded(i) => match i.checked_add(1) {
                Some(i) => i,
                None => return,
            },
            Bound::Unbounded => 0,
        };
        let last = match end {
            Bound::Included(i) => i,
            Bound::Excluded(i) => match i.checked_sub(1) {
                Some(i) => i,
                None => return,
            },
            Bound::Unbounded => u64::MAX,
        };
        if first <= last {
            self.ops.push(Op::RemoveLogs { first, last });
        }
    }

    /// Whether the batch changes nothing.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}

/// The open log engine of one storage directory.
#[derive(Debug)]
pub enum Engine {
    /// See [`EngineKind::Wal`].
    Wal(wal::WalEngine),
    /// See [`EngineKind::Sled`].
    Sled(sled_engine::SledEngine),
}

impl Engine {
    /// Opens the engine of `storage_dir`: the one whose directory exists, or a fresh store of
    /// kind `fresh` when neither does. A directory holding both is refused (an operator copied
    /// one over the other; which one is current cannot be told).
    ///
    /// Only the WAL engine runs on a disk other than the operating system's (sled opens its
    /// files itself).
    pub(crate) fn open_on(
        disk: Disk,
        storage_dir: &Path,
        fresh: EngineKind,
    ) -> Result<Engine, StorageError> {
        let present = |kind: EngineKind| disk.exists(&storage_dir.join(kind.dir_name()));
        let kind = match (present(EngineKind::Wal), present(EngineKind::Sled)) {
            (true, true) => {
                return Err(StorageError::Layout {
                    path: storage_dir.to_path_buf(),
                    message: format!(
                        "holds both a {}/ and a {}/ log directory; keep the current one and move \
                         the other away",
                        EngineKind::Wal.dir_name(),
                        EngineKind::Sled.dir_name()
                    ),
                });
            }
            (true, false) => EngineKind::Wal,
            (false, true) => EngineKind::Sled,
            (false, false) => fresh,
        };
        if kind != fresh {
            tracing::info!(
                dir = %storage_dir.display(),
                found = %kind,
                requested = %fresh,
                "the data directory already holds a log; keeping its engine"
            );
        }
        match (kind, &disk) {
            (EngineKind::Wal, _) => wal::WalEngine::open(disk, storage_dir).map(Engine::Wal),
            (EngineKind::Sled, Disk::Os) => {
                sled_engine::SledEngine::open(storage_dir).map(Engine::Sled)
            }
            #[cfg(test)]
            (EngineKind::Sled, Disk::PowerCut(_)) => Err(StorageError::Layout {
                path: storage_dir.to_path_buf(),
                message: "the sled engine runs on the operating system's disk only".to_string(),
            }),
        }
    }

    /// Which engine this is.
    pub fn kind(&self) -> EngineKind {
        match self {
            Engine::Wal(_) => EngineKind::Wal,
            Engine::Sled(_) => EngineKind::Sled,
        }
    }

    /// The engine's directory (`<storage dir>/wal` or `<storage dir>/log`), for error messages.
    pub fn dir(&self) -> &Path {
        match self {
            Engine::Wal(e) => e.dir(),
            Engine::Sled(e) => e.dir(),
        }
    }

    /// Reads the metadata record `key`.
    pub fn get_meta(&self, key: MetaKey) -> Result<Option<Vec<u8>>, StorageError> {
        match self {
            Engine::Wal(e) => Ok(e.get_meta(key)),
            Engine::Sled(e) => e.get_meta(key),
        }
    }

    /// Stores the metadata record `key` (not yet durable: see [`Engine::sync`]).
    pub fn put_meta(&self, key: MetaKey, record: &[u8]) -> Result<(), StorageError> {
        let mut batch = WriteBatch::default();
        batch.put_meta(key, record);
        self.write(batch)
    }

    /// Stores the metadata record `key` for reads at once; the engine may hold the write back
    /// until its next write or sync (the WAL does, saving a `pwrite` per call; sled buffers
    /// every write in memory anyway). For records rewritten often that need not be durable on
    /// their own, like the committed log id.
    pub fn put_meta_deferred(&self, key: MetaKey, record: &[u8]) -> Result<(), StorageError> {
        match self {
            Engine::Wal(e) => e.put_meta_deferred(key, record),
            Engine::Sled(_) => self.put_meta(key, record),
        }
    }

    /// Calls `f(index, record)` for each log entry with an index in `(start, end)`, in index
    /// order, until `f` returns `Ok(false)` or the range ends.
    pub fn scan_log<E>(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
        f: impl FnMut(u64, &[u8]) -> Result<bool, E>,
    ) -> Result<(), E>
    where
        E: From<StorageError>,
    {
        match self {
            Engine::Wal(e) => e.scan_log(start, end, f),
            Engine::Sled(e) => e.scan_log(start, end, f),
        }
    }

    /// The last log entry, as `(index, record)`.
    pub fn last_log(&self) -> Result<Option<(u64, Vec<u8>)>, StorageError> {
        match self {
            Engine::Wal(e) => e.last_log(),
            Engine::Sled(e) => e.last_log(),
        }
    }

    /// Applies `batch` in its order; readable at once, durable after the next [`Engine::sync`].
    pub fn write(&self, batch: WriteBatch) -> Result<(), StorageError> {
        if batch.is_empty() {
            return Ok(());
        }
        match self {
            Engine::Wal(e) => e.write(batch),
            Engine::Sled(e) => e.apply(batch),
        }
    }

    /// Makes every write applied before the call durable. Blocks for the disk; call it off the
    /// async runtime's worker threads.
    pub fn sync(&self) -> Result<(), StorageError> {
        match self {
            Engine::Wal(e) => e.sync(),
            Engine::Sled(e) => e.sync(),
        }
    }

    /// Replaces the stored log entry at `index` with a copy whose byte `byte` (modulo its
    /// length) has one bit flipped, through a normal write, for tests that prove a corrupt
    /// record is reported rather than panicked on. Returns whether the entry existed.
    #[cfg(test)]
    pub fn corrupt_log_for_test(&self, index: u64, byte: usize) -> Result<bool, StorageError> {
        let mut found = None;
        self.scan_log(
            Bound::Included(index),
            Bound::Included(index),
            |_, record| {
                found = Some(record.to_vec());
                Ok::<_, StorageError>(false)
            },
        )?;
        let Some(mut value) = found else {
            return Ok(false);
        };
        let at = byte % value.len();
        value[at] ^= 0x01;
        let mut batch = WriteBatch::default();
        batch.put_log(index, &value)?;
        self.write(batch)?;
        Ok(true)
    }
}

/// The layout version found in a database: the record's value, or `None` for a non-empty
/// database without the record (layout 0). Displayed as `1` or `0 (no layout record)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayoutFound(pub Option<u32>);

impl fmt::Display for LayoutFound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(version) => write!(f, "{version}"),
            None => write!(f, "0 (no layout record)"),
        }
    }
}

/// fsyncs a directory of `disk`, making the creation, rename or removal of its entries durable.
pub(crate) fn sync_dir(disk: &Disk, dir: &Path) -> Result<(), StorageError> {
    disk.sync_dir(dir).map_err(|source| StorageError::Io {
        op: "fsync directory",
        path: dir.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_kinds_parse_and_print() {
        for kind in [EngineKind::Wal, EngineKind::Sled] {
            assert_eq!(kind.name().parse::<EngineKind>(), Ok(kind));
        }
        let err = "rocksdb".parse::<EngineKind>().expect_err("unknown");
        assert!(
            err.contains("rocksdb") && err.contains("wal or sled"),
            "{err}"
        );
        assert_eq!(EngineKind::default(), EngineKind::Wal);
    }

    #[test]
    fn remove_ranges_normalise_bounds_and_skip_empty_ones() {
        let ops = |start, end| {
            let mut batch = WriteBatch::default();
            batch.remove_logs(start, end);
            batch.ops
        };
        use Bound::{Excluded, Included, Unbounded};
        assert_eq!(
            ops(Included(3), Unbounded),
            vec![Op::RemoveLogs {
                first: 3,
                last: u64::MAX
            }]
        );
        assert_eq!(
            ops(Unbounded, Included(9)),
            vec![Op::RemoveLogs { first: 0, last: 9 }]
        );
        assert_eq!(
            ops(Excluded(3), Excluded(5)),
            vec![Op::RemoveLogs { first: 4, last: 4 }]
        );
        assert!(ops(Excluded(3), Excluded(4)).is_empty());
        assert!(ops(Unbounded, Excluded(0)).is_empty());
        assert!(ops(Excluded(u64::MAX), Unbounded).is_empty());
    }

    fn both_kinds(mut f: impl FnMut(EngineKind)) {
        f(EngineKind::Wal);
        f(EngineKind::Sled);
    }

    #[test]
    fn a_batch_applies_in_order_and_survives_a_reopen_on_both_engines() {
        both_kinds(|kind| {
            let dir = tempfile::tempdir().expect("temp dir");
            {
                let engine = Engine::open_on(Disk::Os, dir.path(), kind).expect("open");
                assert_eq!(engine.kind(), kind);
                let mut batch = WriteBatch::default();
                for i in 1..=6 {
                    batch.put_log(i, &[i as u8; 3]).expect("put");
                }
                engine.write(batch).expect("write");
                let mut batch = WriteBatch::default();
                batch.remove_logs(Bound::Included(4), Bound::Unbounded);
                batch.put_log(4, b"new four").expect("put");
                batch.put_meta(MetaKey::Vote, b"vote");
                engine.write(batch).expect("write");
                engine.sync().expect("sync");
            }
            // sled lets go of its file lock a moment after the handle is dropped.
            let engine = sled_engine::tests::when_unlocked(|| {
                Engine::open_on(Disk::Os, dir.path(), EngineKind::default())
            })
            .expect("reopen");
            assert_eq!(
                engine.kind(),
                kind,
                "an existing directory keeps its engine"
            );
            let mut seen = Vec::new();
            engine
                .scan_log(Bound::Unbounded, Bound::Unbounded, |i, r| {
                    seen.push((i, r.to_vec()));
                    Ok::<_, StorageError>(true)
                })
                .expect("scan");
            assert_eq!(
                seen,
                vec![
                    (1, vec![1; 3]),
                    (2, vec![2; 3]),
                    (3, vec![3; 3]),
                    (4, b"new four".to_vec())
                ],
                "{kind}"
            );
            assert_eq!(
                engine.get_meta(MetaKey::Vote).expect("meta"),
                Some(b"vote".to_vec())
            );
            assert_eq!(engine.last_log().expect("last").map(|(i, _)| i), Some(4));
        });
    }

    #[test]
    fn a_directory_with_both_engines_is_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::create_dir(dir.path().join(EngineKind::Wal.dir_name())).expect("mkdir");
        std::fs::create_dir(dir.path().join(EngineKind::Sled.dir_name())).expect("mkdir");
        let message = Engine::open_on(Disk::Os, dir.path(), EngineKind::Wal)
            .expect_err("both")
            .to_string();
        assert!(message.contains("both a wal/ and a log/"), "{message}");
    }
}
