//! The Raft log and vote: openraft's [`RaftLogStorage`] and [`RaftLogReader`] over the engine.
//!
//! Owns the meaning of the engine's records (entries, vote, committed, last purged) and the
//! durability promise: **durable before acknowledged**. An `append` writes its entries to the
//! engine in one batch (readable as soon as `append` returns) and hands openraft's callback to
//! the log's flush thread, which fires it only after `Engine::sync` (an `fdatasync`) covered the
//! batch. `save_vote`, `truncate` and `purge` return only once synced. The flush
//! thread takes every job queued while it was syncing and covers them with one sync (group
//! commit), so each call costs at most one sync and concurrent appends share one. Jobs complete
//! in submission order, so callbacks fire in log order.
//!
//! This module does not read the state machine and never decides what is committed.

use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::Arc;
use std::sync::mpsc;
use std::thread::JoinHandle;

use openraft::storage::{IOFlushed, LogState, RaftLogStorage};
use openraft::{OptionalSend, RaftLogReader};
use serde::de::DeserializeOwned;

use super::StorageError;
use super::codec;
use super::disk::Disk;
use super::engine::{Engine, EngineKind, MetaKey, WriteBatch};
use super::observer::StorageObserver;
use super::snapshot_policy::LogBytes;
use crate::{Entry, LogId, TypeConfig, Vote};

/// Name of the log's flush thread (shows in `top -H` and panics).
const FLUSH_THREAD_NAME: &str = "lockd-log-flush";

/// The Raft log and vote of one node. Give it to `openraft::Raft::new`; dropping it waits for
/// queued flushes to finish.
#[derive(Debug)]
pub struct LogStore {
    engine: Arc<Engine>,
    flusher: Flusher,
    /// Bytes of entries written, for the snapshot policy.
    written: Arc<LogBytes>,
}

/// A read-only view of the log for openraft's replication tasks. Cheap to clone.
#[derive(Debug, Clone)]
pub struct LogReader {
    engine: Arc<Engine>,
}

impl LogStore {
    /// Opens the log in `dir` with the engine already there, or a fresh one of the default
    /// kind ([`EngineKind::Wal`]), verifying every stored record (format version, checksum) and
    /// that the log has no hole. Refuses to open, naming the record and the file, otherwise.
    pub fn open(dir: &Path) -> Result<LogStore, StorageError> {
        Self::open_with(dir, EngineKind::default())
    }

    /// [`LogStore::open`], creating a fresh log with the engine `fresh` (an existing log keeps
    /// its engine).
    pub fn open_with(dir: &Path, fresh: EngineKind) -> Result<LogStore, StorageError> {
        LogStore::open_on(Disk::Os, dir, fresh, None, LogBytes::shared())
    }

    /// [`LogStore::open_with`] on `disk`.
    pub(crate) fn open_on(
        disk: Disk,
        dir: &Path,
        fresh: EngineKind,
        observer: Option<Arc<dyn StorageObserver>>,
        written: Arc<LogBytes>,
    ) -> Result<LogStore, StorageError> {
        let engine = Arc::new(Engine::open_on(disk, dir, fresh)?);
        verify_all(&engine)?;
        let flusher = Flusher::start(engine.clone(), observer)?;
        Ok(LogStore {
            engine,
            flusher,
            written,
        })
    }

    /// The engine's directory, for logs and error messages.
    pub fn dir(&self) -> &Path {
        self.engine.dir()
    }

    /// The engine storing the log.
    pub fn engine_kind(&self) -> EngineKind {
        self.engine.kind()
    }

    /// The index of the last entry in the log, if any (`RaftLogStorage::get_log_state`
    /// without the runtime and without decoding the entry).
    pub(crate) fn last_index(&self) -> Result<Option<u64>, StorageError> {
        Ok(self.engine.last_log()?.map(|(index, _)| index))
    }

    /// Writes `entries` as one batch, replacing the log from the first of them on: readable at
    /// once, durable after the next sync.
    fn write_entries(&self, entries: impl IntoIterator<Item = Entry>) -> Result<(), io::Error> {
        let mut batch = WriteBatch::default();
        let mut first = true;
        let mut bytes = 0u64;
        for entry in entries {
            let index = entry.log_id.index;
            if first {
                // An append replaces the log from its first entry on. openraft truncates a
                // conflicting tail before appending, so this normally removes nothing; it
                // guarantees that no entry of an older, longer log survives past this append.
                batch.remove_logs(Bound::Included(index), Bound::Unbounded);
                first = false;
            }
            let record = codec::encode(&entry)
                .map_err(|source| StorageError::Encode {
                    record: entry_name(index),
                    source,
                })
                .map_err(io::Error::other)?;
            bytes += record.len() as u64;
            batch.put_log(index, &record).map_err(io::Error::other)?;
        }
        self.engine.write(batch).map_err(io::Error::other)?;
        self.written.add(bytes);
        Ok(())
    }

    /// Writes `entries` as `append` does but queues no flush: what a node has written and not
    /// yet synced when it loses power, for the power-cut test.
    #[cfg(test)]
    pub(crate) fn append_unflushed(&self, entries: Vec<Entry>) -> Result<(), io::Error> {
        self.write_entries(entries)
    }

    /// Makes every write so far durable, through the flush thread so that it is ordered with
    /// the appends queued before it.
    async fn sync(&self) -> Result<(), StorageError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.flusher.submit(FlushJob::Sync(tx))?;
        rx.await.map_err(|_| StorageError::FlusherStopped {
            path: self.engine.dir().to_path_buf(),
        })?
    }
}

// One typed reader per metadata record, so that what is written and what is read back (and
// verified on open) cannot disagree about the type.

fn load_vote(engine: &Engine) -> Result<Option<Vote>, StorageError> {
    read_meta(engine, MetaKey::Vote)
}

fn load_committed(engine: &Engine) -> Result<Option<LogId>, StorageError> {
    // Stored as the `Option` openraft hands over, so `Some(None)` is a saved "nothing".
    Ok(read_meta::<Option<LogId>>(engine, MetaKey::Committed)?.flatten())
}

fn load_last_purged(engine: &Engine) -> Result<Option<LogId>, StorageError> {
    read_meta(engine, MetaKey::LastPurged)
}

fn meta_name(key: MetaKey) -> &'static str {
    match key {
        MetaKey::Vote => "vote",
        MetaKey::Committed => "committed log id",
        MetaKey::LastPurged => "last purged log id",
    }
}

fn entry_name(index: u64) -> String {
    format!("log entry {index}")
}

fn read_meta<T: DeserializeOwned>(
    engine: &Engine,
    key: MetaKey,
) -> Result<Option<T>, StorageError> {
    let Some(record) = engine.get_meta(key)? else {
        return Ok(None);
    };
    codec::decode(&record)
        .map(Some)
        .map_err(|source| StorageError::Corrupt {
            record: meta_name(key).to_string(),
            path: engine.dir().to_path_buf(),
            source,
        })
}

fn encode_meta<T: serde::Serialize>(key: MetaKey, value: &T) -> Result<Vec<u8>, StorageError> {
    codec::encode(value).map_err(|source| StorageError::Encode {
        record: meta_name(key).to_string(),
        source,
    })
}

fn decode_entry(engine: &Engine, index: u64, record: &[u8]) -> Result<Entry, StorageError> {
    let entry: Entry = codec::decode(record).map_err(|source| StorageError::Corrupt {
        record: entry_name(index),
        path: engine.dir().to_path_buf(),
        source,
    })?;
    if entry.log_id.index != index {
        return Err(StorageError::Layout {
            path: engine.dir().to_path_buf(),
            message: format!(
                "{} holds the entry of index {}",
                entry_name(index),
                entry.log_id.index
            ),
        });
    }
    Ok(entry)
}

/// The open-time integrity check: every metadata record decodes, every log entry passes its
/// version and checksum check, and the entries are contiguous and after the last purged one.
/// The log is purged after every snapshot, so this reads a bounded amount.
fn verify_all(engine: &Engine) -> Result<(), StorageError> {
    load_vote(engine)?;
    load_committed(engine)?;
    let last_purged = load_last_purged(engine)?;
    let mut previous: Option<u64> = last_purged.map(|id| id.index);
    let mut first = true;
    engine.scan_log(Bound::Unbounded, Bound::Unbounded, |index, record| {
        codec::verify(record).map_err(|source| StorageError::Corrupt {
            record: entry_name(index),
            path: engine.dir().to_path_buf(),
            source,
        })?;
        let fits = match previous {
            None => true,
            // Entries start right after the last purged one, except that openraft may purge
            // beyond the log's end (after installing a snapshot) and then append after it.
            Some(before) if first => index > before,
            Some(before) => Some(index) == before.checked_add(1),
        };
        if !fits {
            return Err(StorageError::Layout {
                path: engine.dir().to_path_buf(),
                message: format!(
                    "{} follows index {previous:?} (last purged {last_purged:?}): the log has a hole",
                    entry_name(index)
                ),
            });
        }
        first = false;
        previous = Some(index);
        Ok(true)
    })
}

fn read_entries<RB: RangeBounds<u64>>(
    engine: &Engine,
    range: RB,
) -> Result<Vec<Entry>, StorageError> {
    let mut entries = Vec::new();
    engine.scan_log(
        range.start_bound().cloned(),
        range.end_bound().cloned(),
        |index, record| {
            entries.push(decode_entry(engine, index, record)?);
            Ok::<_, StorageError>(true)
        },
    )?;
    Ok(entries)
}

impl RaftLogReader<TypeConfig> for LogReader {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, io::Error> {
        read_entries(&self.engine, range).map_err(io::Error::other)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, io::Error> {
        load_vote(&self.engine).map_err(io::Error::other)
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, io::Error> {
        read_entries(&self.engine, range).map_err(io::Error::other)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, io::Error> {
        load_vote(&self.engine).map_err(io::Error::other)
    }
}

// Every error openraft sees is an `io::Error` wrapping our `StorageError`, whose message names
// the file and the record; openraft stops the node on any of them.
impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogReader;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, io::Error> {
        let state = || -> Result<LogState<TypeConfig>, StorageError> {
            let last_purged_log_id = load_last_purged(&self.engine)?;
            let last_log_id = match self.engine.last_log()? {
                Some((index, record)) => Some(decode_entry(&self.engine, index, &record)?.log_id),
                None => last_purged_log_id,
            };
            Ok(LogState {
                last_purged_log_id,
                last_log_id,
            })
        };
        state().map_err(io::Error::other)
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        LogReader {
            engine: self.engine.clone(),
        }
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), io::Error> {
        let record = encode_meta(MetaKey::Vote, vote).map_err(io::Error::other)?;
        self.engine
            .put_meta(MetaKey::Vote, &record)
            .map_err(io::Error::other)?;
        self.sync().await.map_err(io::Error::other)
    }

    /// Stored without a write or sync of its own (`Engine::put_meta_deferred`): the next
    /// append, vote or sync writes and makes it durable (and sled's background flush, on that
    /// engine). Losing the latest value in a crash only makes the
    /// restarted node re-apply fewer entries before it learns the commit index again; both
    /// engines persist writes as a prefix in write order, so a durable committed id never
    /// points past durable entries.
    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), io::Error> {
        let record = encode_meta(MetaKey::Committed, &committed).map_err(io::Error::other)?;
        self.engine
            .put_meta_deferred(MetaKey::Committed, &record)
            .map_err(io::Error::other)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, io::Error> {
        load_committed(&self.engine).map_err(io::Error::other)
    }

    /// Writes the entries (readable at once: openraft's replication may read and send them to
    /// followers before they are durable here) and hands `callback` to the flush thread, which
    /// fires it once an `fdatasync` covered them. openraft counts this node towards a commit
    /// only then.
    async fn append<I>(
        &mut self,
        entries: I,
        callback: IOFlushed<TypeConfig>,
    ) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        self.write_entries(entries)?;
        self.flusher
            .submit(FlushJob::Append(callback))
            .map_err(io::Error::other)
    }

    /// Removes every entry after `last_log_id` (all of them for `None`), durably.
    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> Result<(), io::Error> {
        let from = match last_log_id {
            Some(log_id) => Bound::Excluded(log_id.index),
            None => Bound::Unbounded,
        };
        let mut batch = WriteBatch::default();
        batch.remove_logs(from, Bound::Unbounded);
        self.engine.write(batch).map_err(io::Error::other)?;
        self.sync().await.map_err(io::Error::other)
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), io::Error> {
        let mut batch = WriteBatch::default();
        let record = encode_meta(MetaKey::LastPurged, &log_id).map_err(io::Error::other)?;
        // One batch: the last purged id and the removal land together or not at all.
        batch.put_meta(MetaKey::LastPurged, &record);
        batch.remove_logs(Bound::Unbounded, Bound::Included(log_id.index));
        self.engine.write(batch).map_err(io::Error::other)?;
        self.sync().await.map_err(io::Error::other)
    }
}

/// Work for the flush thread.
enum FlushJob {
    /// An append's callback: fire it once the append is durable.
    Append(IOFlushed<TypeConfig>),
    /// A caller awaiting durability of everything written so far.
    Sync(tokio::sync::oneshot::Sender<Result<(), StorageError>>),
}

/// The flush thread: a dedicated OS thread because `Engine::sync` blocks on the disk for
/// milliseconds, which must not stall the async runtime's workers.
#[derive(Debug)]
struct Flusher {
    /// `None` only while dropping, so the thread sees the channel close.
    tx: Option<mpsc::Sender<FlushJob>>,
    thread: Option<JoinHandle<()>>,
    engine: Arc<Engine>,
}

impl Flusher {
    fn start(
        engine: Arc<Engine>,
        observer: Option<Arc<dyn StorageObserver>>,
    ) -> Result<Flusher, StorageError> {
        let (tx, rx) = mpsc::channel::<FlushJob>();
        let thread_engine = engine.clone();
        let thread = std::thread::Builder::new()
            .name(FLUSH_THREAD_NAME.to_string())
            .spawn(move || flush_loop(&thread_engine, &rx, observer.as_deref()))
            .map_err(|source| StorageError::Io {
                op: "start the flush thread for",
                path: engine.dir().to_path_buf(),
                source,
            })?;
        Ok(Flusher {
            tx: Some(tx),
            thread: Some(thread),
            engine,
        })
    }

    fn submit(&self, job: FlushJob) -> Result<(), StorageError> {
        let stopped = || StorageError::FlusherStopped {
            path: self.engine.dir().to_path_buf(),
        };
        self.tx
            .as_ref()
            .ok_or_else(stopped)?
            .send(job)
            .map_err(|_| stopped())
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(thread) = self.thread.take() {
            // The thread only finishes the flushes already queued; a panic in it was already
            // reported to every waiter as a closed channel.
            let _ = thread.join();
        }
    }
}

/// Serves flush jobs until every sender is gone. The first failed sync is final: after an
/// `fsync` error the kernel may have dropped the dirty pages it could not write and a later
/// `fsync` can succeed without them ("fsyncgate"), so every later job fails with the first
/// error instead of trusting a retry. openraft stops the node on the first one anyway.
fn flush_loop(
    engine: &Engine,
    rx: &mpsc::Receiver<FlushJob>,
    observer: Option<&dyn StorageObserver>,
) {
    let mut failed: Option<String> = None;
    while let Ok(first) = rx.recv() {
        let mut jobs = vec![first];
        jobs.extend(rx.try_iter());
        if failed.is_none() {
            let started = std::time::Instant::now();
            match engine.sync() {
                Ok(()) => {
                    if let Some(observer) = observer {
                        observer.log_synced(started.elapsed());
                    }
                }
                Err(e) => {
                    tracing::error!(error = %e, "log flush failed; the writes it covered are not durable");
                    failed = Some(e.to_string());
                }
            }
        }
        for job in jobs {
            let result = match &failed {
                None => Ok(()),
                Some(message) => Err(StorageError::FlushFailed {
                    path: engine.dir().to_path_buf(),
                    message: message.clone(),
                }),
            };
            match job {
                FlushJob::Append(callback) => {
                    callback.io_completed(result.map_err(|e| io::Error::other(e.to_string())))
                }
                // The waiter may have given up; nothing to tell it then.
                FlushJob::Sync(tx) => drop(tx.send(result)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use openraft::storage::RaftLogStorageExt;

    use super::*;
    use crate::storage::RECORD_BYTES_MAX;
    use crate::{Command, EntryPayload, LeaderId, Request};

    fn entry(index: u64, owner_id: String) -> Entry {
        Entry {
            log_id: LogId::new(
                LeaderId {
                    term: 1,
                    node_id: 0,
                },
                index,
            ),
            payload: EntryPayload::Normal(Request {
                stamp_ms: index,
                command: Command::OpenSession {
                    session_id: format!("s{index}"),
                    owner_id,
                    ttl_ms: 10_000,
                },
            }),
        }
    }

    async fn store_with_entries(dir: &Path, count: u64) -> LogStore {
        let mut store = LogStore::open(dir).expect("open");
        store
            .blocking_append((1..=count).map(|i| entry(i, format!("owner-{i}"))))
            .await
            .expect("append");
        store
    }

    #[tokio::test]
    async fn a_corrupt_log_record_is_an_error_naming_it_not_a_panic() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut store = store_with_entries(dir.path(), 5).await;
        // Flip a payload byte (past the 5-byte header) of entry 3, through the engine seam.
        assert!(store.engine.corrupt_log_for_test(3, 9).expect("corrupt"));

        let read = store.try_get_log_entries(1..6).await;
        let message = read.expect_err("a corrupt entry must not read").to_string();
        assert!(message.contains("log entry 3"), "{message}");
        assert!(message.contains("checksum mismatch"), "{message}");
        assert!(
            message.contains(&store.dir().display().to_string()),
            "{message}"
        );
        // Entries before it still read.
        assert_eq!(
            store.try_get_log_entries(1..3).await.expect("read").len(),
            2
        );
        let engine_dir = store.dir().to_path_buf();
        drop(store);

        let reopen = LogStore::open(dir.path()).expect_err("a corrupt log must refuse to open");
        let message = reopen.to_string();
        assert!(message.contains("log entry 3"), "{message}");
        assert!(
            message.contains(&engine_dir.display().to_string()),
            "{message}"
        );
        assert!(matches!(reopen, StorageError::Corrupt { .. }), "{reopen:?}");
    }

    #[tokio::test]
    async fn a_corrupt_version_byte_refuses_to_open() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = store_with_entries(dir.path(), 2).await;
        assert!(store.engine.corrupt_log_for_test(2, 0).expect("corrupt"));
        drop(store);
        let message = LogStore::open(dir.path()).expect_err("refuse").to_string();
        assert!(message.contains("log entry 2"), "{message}");
        assert!(message.contains("format version"), "{message}");
    }

    #[tokio::test]
    async fn an_entry_above_the_record_limit_is_refused_before_it_is_written() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut store = store_with_entries(dir.path(), 1).await;
        let huge = entry(2, "o".repeat(RECORD_BYTES_MAX));
        let message = store
            .blocking_append([huge])
            .await
            .expect_err("too large")
            .to_string();
        assert!(message.contains("log entry 2"), "{message}");
        assert!(message.contains(&RECORD_BYTES_MAX.to_string()), "{message}");
        let state = store.get_log_state().await.expect("state");
        assert_eq!(state.last_log_id.map(|id| id.index), Some(1));
    }

    #[tokio::test]
    async fn an_append_replaces_longer_entries_at_its_indexes() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut store = LogStore::open(dir.path()).expect("open");
        let long = "l".repeat(3 * 64 * 1024);
        store
            .blocking_append((1..=4).map(|i| entry(i, long.clone())))
            .await
            .expect("append long");
        store
            .blocking_append([entry(2, "short".to_string())])
            .await
            .expect("append short");
        let entries = store.try_get_log_entries(..).await.expect("read");
        assert_eq!(entries, vec![entry(1, long), entry(2, "short".to_string())]);
    }

    #[tokio::test]
    async fn appends_votes_and_purges_survive_a_reopen() {
        let dir = tempfile::tempdir().expect("temp dir");
        let vote = Vote::new(7, 2);
        {
            let mut store = store_with_entries(dir.path(), 10).await;
            store.save_vote(&vote).await.expect("vote");
            let committed = LogId::new(
                LeaderId {
                    term: 1,
                    node_id: 0,
                },
                6,
            );
            store
                .save_committed(Some(committed))
                .await
                .expect("committed");
            store
                .purge(LogId::new(
                    LeaderId {
                        term: 1,
                        node_id: 0,
                    },
                    4,
                ))
                .await
                .expect("purge");
            store
                .truncate_after(Some(LogId::new(
                    LeaderId {
                        term: 1,
                        node_id: 0,
                    },
                    8,
                )))
                .await
                .expect("truncate");
        }
        let mut store = LogStore::open(dir.path()).expect("reopen");
        assert_eq!(store.read_vote().await.expect("vote"), Some(vote));
        assert_eq!(
            store
                .read_committed()
                .await
                .expect("committed")
                .map(|id| id.index),
            Some(6)
        );
        let state = store.get_log_state().await.expect("state");
        assert_eq!(state.last_purged_log_id.map(|id| id.index), Some(4));
        assert_eq!(state.last_log_id.map(|id| id.index), Some(8));
        let entries = store.try_get_log_entries(..).await.expect("read");
        let indexes: Vec<u64> = entries.iter().map(|e| e.log_id.index).collect();
        assert_eq!(indexes, vec![5, 6, 7, 8]);
        assert_eq!(entries[0], entry(5, "owner-5".to_string()));
    }
}
