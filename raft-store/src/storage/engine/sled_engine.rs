//! The sled engine: the Raft log and its metadata in a sled 0.34 database, how their keys are
//! encoded, and how a write is made durable.
//!
//! Owns the sled database in `<dir>/log/`, its single tree [`TREE_NAME`], the key layout, and
//! [`SledEngine::sync`] (sled flush, then `fdatasync` of sled's data file). It stores opaque bytes
//! (already framed by `codec`) and must not know what an entry or a vote is. Nothing outside this
//! file names sled (docs/DESIGN.md D-deps). New data directories get the WAL engine (`wal.rs`,
//! which explains why); this one serves directories created with it and `--log-engine sled`.
//!
//! # Why the extra `fdatasync`
//!
//! sled 0.34's `flush` writes its log buffers with `pwrite` followed by `sync_file_range`, which
//! starts and waits for the data write-back of that byte range but neither flushes the disk's
//! volatile cache nor persists the file's size or allocation metadata. A write acknowledged after
//! that alone can be lost by a power failure. So after every sled flush [`SledEngine::sync`] calls
//! `File::sync_data` (`fdatasync`) on sled's data file `<dir>/log/db`, through one handle kept
//! open for the life of the engine.
//!
//! # Why large segments
//!
//! sled writes any page image larger than a quarter of a segment to a separate "blob" file, and
//! sled 0.34 never fsyncs blob files. A leaf node holds up to 17 values before it splits, so the
//! engine stores a log record as chunks of at most [`CHUNK_BYTES`] (64 KiB) under consecutive
//! keys, and with [`SEGMENT_BYTES`] = 16 MiB (the largest sled accepts) a leaf never reaches the
//! blob threshold whatever the record sizes. As a second line of defence, [`SledEngine::sync`] also
//! fsyncs any blob file it has not synced before (and the blob directory).
//!
//! # Key layout (one tree, two key spaces)
//!
//! - log chunk: `[b'l'][index: u64 big-endian][chunk: u16 big-endian]`. Big-endian so sled's
//!   byte order is (index, chunk) order: a range scan is a log range, chunks in order. The chunks
//!   of one record are written in one batch, so they are present all or none.
//! - metadata: `m/<name>` ([`MetaKey`]), always after every log key (`m` > `l`).
//! - layout version: `m/layout` = [`LAYOUT_VERSION`] as a big-endian `u32`, written when a
//!   fresh store is created and checked by [`SledEngine::open`]: a directory written with another
//!   layout, or a non-empty one without the record (written before the record existed, layout
//!   0), is refused with [`StorageError::LayoutVersion`] instead of failing later on a key it
//!   cannot parse. Change [`LAYOUT_VERSION`] whenever this key layout changes incompatibly.

use std::collections::HashSet;
use std::ffi::OsString;
use std::fmt;
use std::fs::File;
use std::io;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use super::super::disk::Disk;
use super::{
    LayoutFound, MetaKey, Op, RECORD_BYTES_MAX, StorageError, WriteBatch, check_record_len,
    sync_dir,
};

/// The sled tree holding the log and its metadata. Versioned so that a future incompatible
/// layout can live beside this one during a migration.
pub const TREE_NAME: &str = "lockd.raft.v1";

/// Sub-directory of the storage directory that sled owns.
pub const LOG_DIR_NAME: &str = "log";

/// sled 0.34's data file inside its directory (`Config::db_path`: `<path>/db`). It is the file
/// whose writes sled only `sync_file_range`s, so it is the one [`SledEngine::sync`] `fdatasync`s.
pub const SLED_DATA_FILE_NAME: &str = "db";

/// sled 0.34's configuration file (`Config::config_path`: `<path>/conf`), written at creation
/// without an fsync; [`SledEngine::open`] syncs it, since sled refuses to open without it.
pub const SLED_CONFIG_FILE_NAME: &str = "conf";

/// sled 0.34's directory of oversized page images (`Config::blob_path`: `<path>/blobs/<lsn>`).
pub const SLED_BLOB_DIR_NAME: &str = "blobs";

/// sled segment size: the largest sled 0.34 accepts (16 MiB). Page images above a quarter of
/// it go to blob files, which sled never fsyncs; a large segment keeps our leaves below that.
pub const SEGMENT_BYTES: usize = 16 * 1024 * 1024;

/// The largest piece of a record stored under one key. A full sled leaf (at most 17 values, 20
/// with headroom for a split in progress) of such pieces stays below the blob threshold of a
/// quarter segment.
pub const CHUNK_BYTES: usize = 64 * 1024;

const _: () = assert!(RECORD_BYTES_MAX / CHUNK_BYTES <= u16::MAX as usize);

/// sled's page cache budget. sled defaults to 1 GiB; the log is purged after every snapshot,
/// so the working set is small, and 64 MiB leaves memory to the lock table.
pub const CACHE_BYTES: u64 = 64 * 1024 * 1024;

/// sled's background flush interval. Our own writes that need durability call
/// [`SledEngine::sync`] themselves; this background flush only bounds how long a write that does
/// not need it (the committed log id) stays in memory.
pub const BACKGROUND_FLUSH_MS: u64 = 500;

const _: () = assert!(20 * (CHUNK_BYTES + 64) < SEGMENT_BYTES / 4 - 1024);
const _: () = assert!(
    SEGMENT_BYTES <= 1 << 24,
    "sled 0.34 refuses segments above 16 MiB"
);

/// The version of the key layout described in the module doc, stored under the metadata
/// key `m/layout`.
/// Version 0 stands for every directory written before the record existed (the first layout,
/// one key per entry, and this chunked one before the record was added): such a directory is
/// refused rather than guessed at.
pub const LAYOUT_VERSION: u32 = 1;

/// The key of the layout version record: a metadata key, so outside the log key space, and not
/// a [`MetaKey`], so no caller can overwrite it.
const LAYOUT_KEY: &[u8] = b"m/layout";

/// First byte of every log chunk key (see the module doc).
const LOG_KEY_PREFIX: u8 = b'l';
/// First byte of every metadata key.
const META_KEY_PREFIX: u8 = b'm';
/// Length of a log chunk key.
const LOG_KEY_LEN: usize = 11;

/// The sled key of a metadata record.
fn meta_key(key: MetaKey) -> &'static [u8] {
    match key {
        MetaKey::Vote => b"m/vote",
        MetaKey::Committed => b"m/committed",
        MetaKey::LastPurged => b"m/last_purged",
    }
}

const _: () = assert!(b"m/vote"[0] == META_KEY_PREFIX);
const _: () = assert!(LAYOUT_KEY[0] == META_KEY_PREFIX);

fn log_key(index: u64, chunk: u16) -> [u8; LOG_KEY_LEN] {
    let mut key = [0u8; LOG_KEY_LEN];
    key[0] = LOG_KEY_PREFIX;
    key[1..9].copy_from_slice(&index.to_be_bytes());
    key[9..].copy_from_slice(&chunk.to_be_bytes());
    key
}

/// Decodes a log chunk key into `(index, chunk)`; `None` for a key outside the log key space or
/// of the wrong length.
fn log_key_parts(key: &[u8]) -> Option<(u64, u16)> {
    let (&prefix, rest) = key.split_first()?;
    if prefix != LOG_KEY_PREFIX || rest.len() != LOG_KEY_LEN - 1 {
        return None;
    }
    let (index, chunk) = rest.split_at(8);
    Some((
        u64::from_be_bytes(index.try_into().ok()?),
        u16::from_be_bytes(chunk.try_into().ok()?),
    ))
}

/// The first chunk key of the log range's start bound, or `None` if the range is empty.
fn start_key(start: Bound<u64>) -> Option<[u8; LOG_KEY_LEN]> {
    match start {
        Bound::Included(i) => Some(log_key(i, 0)),
        Bound::Excluded(i) => i.checked_add(1).map(|i| log_key(i, 0)),
        Bound::Unbounded => Some(log_key(0, 0)),
    }
}

/// The chunk-key bound matching the log range's end bound.
fn end_key(end: Bound<u64>) -> Bound<[u8; LOG_KEY_LEN]> {
    match end {
        Bound::Included(i) => Bound::Included(log_key(i, u16::MAX)),
        Bound::Excluded(i) => Bound::Excluded(log_key(i, 0)),
        Bound::Unbounded => Bound::Included(log_key(u64::MAX, u16::MAX)),
    }
}

/// The error sled reported, kept opaque so that no other module depends on sled's types.
#[derive(Debug)]
pub struct EngineError(sled::Error);

impl fmt::Display for EngineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sled: {}", self.0)
    }
}

impl std::error::Error for EngineError {}

/// Writes to apply together, atomically: after a crash either all of them are present or none.
#[derive(Debug, Default)]
pub(super) struct SledBatch {
    inner: sled::Batch,
}

impl SledBatch {
    /// Stores `record` as the log entry at `index`, in chunks of at most [`CHUNK_BYTES`].
    /// Replacing an entry with a shorter one must remove the old one first
    /// ([`SledEngine::remove_logs`]), or its surplus chunks would remain.
    /// Refuses a record above [`RECORD_BYTES_MAX`], naming the entry.
    pub fn put_log(&mut self, index: u64, record: &[u8]) -> Result<(), StorageError> {
        check_record_len(index, record)?;
        for (chunk, piece) in (0..=u16::MAX).zip(record.chunks(CHUNK_BYTES)) {
            self.inner.insert(&log_key(index, chunk), piece);
        }
        if record.is_empty() {
            self.inner.insert(&log_key(index, 0), &[][..]);
        }
        Ok(())
    }

    /// Removes one chunk key.
    fn remove_key(&mut self, key: &[u8]) {
        self.inner.remove(key);
    }

    /// Stores `record` as the metadata record `key`.
    pub fn put_meta(&mut self, key: MetaKey, record: &[u8]) {
        self.inner.insert(meta_key(key), record);
    }
}

/// The open sled database plus the handles [`SledEngine::sync`] needs.
#[derive(Debug)]
pub struct SledEngine {
    /// `<dir>/log`, for error messages.
    dir: PathBuf,
    db: sled::Db,
    tree: sled::Tree,
    /// `<dir>/log/db`, opened once: `sync_data` on it is the `fdatasync` that makes sled's
    /// flushed writes durable. The mutex serialises syncs (a sync is a barrier anyway).
    data_file: Mutex<File>,
    /// Blob files already fsynced (by file name); see the module doc.
    synced_blobs: Mutex<HashSet<OsString>>,
}

impl SledEngine {
    /// Opens (creating if needed) the sled database in `<storage_dir>/log`, and makes its
    /// directory entries durable.
    pub fn open(storage_dir: &Path) -> Result<SledEngine, StorageError> {
        let dir = storage_dir.join(LOG_DIR_NAME);
        std::fs::create_dir_all(&dir).map_err(|source| StorageError::Io {
            op: "create directory",
            path: dir.clone(),
            source,
        })?;
        let db = sled::Config::new()
            .path(&dir)
            .segment_size(SEGMENT_BYTES)
            .cache_capacity(CACHE_BYTES)
            .flush_every_ms(Some(BACKGROUND_FLUSH_MS))
            .open()
            .map_err(|e| StorageError::Engine {
                op: "open the database",
                path: dir.clone(),
                source: EngineError(e),
            })?;
        // Whether anything at all was stored before, in any tree (sled's default tree included),
        // looked at before `open_tree` creates ours.
        let fresh = is_empty(&db).map_err(|e| StorageError::Engine {
            op: "list the database's trees",
            path: dir.clone(),
            source: EngineError(e),
        })?;
        let tree = db.open_tree(TREE_NAME).map_err(|e| StorageError::Engine {
            op: "open tree",
            path: dir.clone(),
            source: EngineError(e),
        })?;
        check_layout(&dir, &tree, fresh)?;
        let data_path = dir.join(SLED_DATA_FILE_NAME);
        let data_file = File::open(&data_path).map_err(|source| StorageError::Io {
            op: "open sled's data file",
            path: data_path.clone(),
            source,
        })?;
        let engine = SledEngine {
            dir,
            db,
            tree,
            data_file: Mutex::new(data_file),
            synced_blobs: Mutex::new(HashSet::new()),
        };
        // sled created `db`, `conf` and `blobs/` without syncing them or their directory
        // entries.
        engine.sync()?;
        let config_path = engine.dir.join(SLED_CONFIG_FILE_NAME);
        File::open(&config_path)
            .and_then(|f| f.sync_all())
            .map_err(|source| StorageError::Io {
                op: "fsync sled's configuration file",
                path: config_path,
                source,
            })?;
        for path in [engine.dir.clone(), storage_dir.to_path_buf()] {
            sync_dir(&Disk::Os, &path)?;
        }
        Ok(engine)
    }

    /// The database directory, `<storage dir>/log`, for error messages.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn engine_error(&self, op: &'static str, e: sled::Error) -> StorageError {
        StorageError::Engine {
            op,
            path: self.dir.clone(),
            source: EngineError(e),
        }
    }

    /// Reads the metadata record `key`.
    pub fn get_meta(&self, key: MetaKey) -> Result<Option<Vec<u8>>, StorageError> {
        self.tree
            .get(meta_key(key))
            .map(|v| v.map(|v| v.to_vec()))
            .map_err(|e| self.engine_error("read metadata", e))
    }

    /// Reads the log entry record at `index` (openraft reads ranges; tests read one).
    #[cfg(test)]
    pub fn get_log(&self, index: u64) -> Result<Option<Vec<u8>>, StorageError> {
        let mut found = None;
        self.scan_log(
            Bound::Included(index),
            Bound::Included(index),
            |_, record| {
                found = Some(record.to_vec());
                Ok::<_, StorageError>(false)
            },
        )?;
        Ok(found)
    }

    /// Calls `f(index, record)` for each log entry with an index in `(start, end)`, in index
    /// order, with the entry's chunks joined, until `f` returns `Ok(false)` or the range ends.
    /// A chunk missing from the middle of a record is a [`StorageError::Layout`] error.
    pub fn scan_log<E>(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
        mut f: impl FnMut(u64, &[u8]) -> Result<bool, E>,
    ) -> Result<(), E>
    where
        E: From<StorageError>,
    {
        let Some(start) = start_key(start) else {
            return Ok(());
        };
        // The record being joined: its index and the bytes of its chunks so far.
        let mut pending: Option<(u64, Vec<u8>)> = None;
        for item in self.tree.range((Bound::Included(start), end_key(end))) {
            let (key, value) = item.map_err(|e| self.engine_error("scan the log", e))?;
            let (index, chunk) = self.key_parts(&key)?;
            match &mut pending {
                Some((at, record)) if *at == index => {
                    // Chunk k follows k full chunks.
                    if usize::from(chunk) * CHUNK_BYTES != record.len() {
                        return Err(self.missing_chunk(index, chunk).into());
                    }
                    record.extend_from_slice(&value);
                }
                _ => {
                    if chunk != 0 {
                        return Err(self.missing_chunk(index, chunk).into());
                    }
                    if let Some((at, record)) = pending.replace((index, value.to_vec()))
                        && !f(at, &record)?
                    {
                        return Ok(());
                    }
                }
            }
        }
        if let Some((at, record)) = pending {
            f(at, &record)?;
        }
        Ok(())
    }

    fn key_parts(&self, key: &[u8]) -> Result<(u64, u16), StorageError> {
        log_key_parts(key).ok_or_else(|| StorageError::Layout {
            path: self.dir.clone(),
            message: format!("key {key:02x?} in the log key space is not a log key"),
        })
    }

    fn missing_chunk(&self, index: u64, chunk: u16) -> StorageError {
        StorageError::Layout {
            path: self.dir.clone(),
            message: format!(
                "log entry {index}: chunk {chunk} does not follow the chunks before it"
            ),
        }
    }

    /// The last log entry, as `(index, record)`.
    pub fn last_log(&self) -> Result<Option<(u64, Vec<u8>)>, StorageError> {
        let last = self
            .tree
            .range(log_key(0, 0)..=log_key(u64::MAX, u16::MAX))
            .next_back()
            .transpose()
            .map_err(|e| self.engine_error("read the last log entry", e))?;
        let Some((key, _)) = last else {
            return Ok(None);
        };
        let (index, _) = self.key_parts(&key)?;
        let mut found = None;
        self.scan_log(
            Bound::Included(index),
            Bound::Included(index),
            |at, record| {
                found = Some((at, record.to_vec()));
                Ok::<_, StorageError>(false)
            },
        )?;
        Ok(found)
    }

    /// Adds to `batch` the removal of every log entry (every chunk) with an index in
    /// `(start, end)`.
    fn remove_logs(
        &self,
        batch: &mut SledBatch,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<(), StorageError> {
        let Some(start) = start_key(start) else {
            return Ok(());
        };
        for item in self.tree.range((Bound::Included(start), end_key(end))) {
            let (key, _) = item.map_err(|e| self.engine_error("scan the log", e))?;
            batch.remove_key(&key);
        }
        Ok(())
    }

    /// Applies the engine-neutral `batch` atomically, in its order (a removal, then puts at the
    /// removed indexes, leaves the puts): one sled batch, not yet durable.
    pub fn apply(&self, batch: WriteBatch) -> Result<(), StorageError> {
        let mut sled_batch = SledBatch::default();
        for op in batch.ops {
            match op {
                Op::PutLog { index, record } => sled_batch.put_log(index, &record)?,
                Op::PutMeta { key, record } => sled_batch.put_meta(key, &record),
                Op::RemoveLogs { first, last } => self.remove_logs(
                    &mut sled_batch,
                    Bound::Included(first),
                    Bound::Included(last),
                )?,
            }
        }
        self.write(sled_batch)
    }

    /// Applies `batch` atomically (not yet durable: see [`SledEngine::sync`]).
    fn write(&self, batch: SledBatch) -> Result<(), StorageError> {
        self.tree
            .apply_batch(batch.inner)
            .map_err(|e| self.engine_error("apply a write batch", e))
    }

    /// Makes every write applied before the call durable: sled flush, then `fdatasync` of sled's
    /// data file, then fsync of any blob file not synced before. Blocks for the disk; call it
    /// off the async runtime's worker threads.
    pub fn sync(&self) -> Result<(), StorageError> {
        self.db.flush().map_err(|e| self.engine_error("flush", e))?;
        let data_file = self
            .data_file
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        data_file.sync_data().map_err(|source| StorageError::Io {
            op: "fdatasync",
            path: self.dir.join(SLED_DATA_FILE_NAME),
            source,
        })?;
        drop(data_file);
        self.sync_blobs()
    }

    /// fsyncs blob files created since the last call (normally there are none: see the module
    /// doc), then the blob directory if any was new.
    fn sync_blobs(&self) -> Result<(), StorageError> {
        let blob_dir = self.dir.join(SLED_BLOB_DIR_NAME);
        let read_dir = |source| StorageError::Io {
            op: "list blob directory",
            path: blob_dir.clone(),
            source,
        };
        let mut synced = self
            .synced_blobs
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut present = HashSet::new();
        let mut new_blob = false;
        let entries = match std::fs::read_dir(&blob_dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(read_dir(e)),
        };
        for entry in entries {
            let name = entry.map_err(read_dir)?.file_name();
            if !synced.contains(&name) {
                let path = blob_dir.join(&name);
                match File::open(&path).and_then(|f| f.sync_all()) {
                    Ok(()) => new_blob = true,
                    // sled garbage-collected it between the listing and the open.
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(source) => {
                        return Err(StorageError::Io {
                            op: "fsync blob file",
                            path,
                            source,
                        });
                    }
                }
            }
            present.insert(name);
        }
        if new_blob {
            sync_dir(&Disk::Os, &blob_dir)?;
        }
        *synced = present;
        Ok(())
    }
}

/// Whether no tree of `db` holds any key. A crash between creating our tree and writing the
/// layout record leaves an empty tree, which is still fresh.
fn is_empty(db: &sled::Db) -> Result<bool, sled::Error> {
    for name in db.tree_names() {
        if !db.open_tree(&name)?.is_empty() {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Checks the layout version record of `tree`, writing it first if the database is `fresh`
/// (made durable by the [`SledEngine::sync`] that [`SledEngine::open`] runs next). Refuses a database
/// written with another layout, or a non-empty one without the record.
fn check_layout(dir: &Path, tree: &sled::Tree, fresh: bool) -> Result<(), StorageError> {
    let engine_error = |op, e| StorageError::Engine {
        op,
        path: dir.to_path_buf(),
        source: EngineError(e),
    };
    let stored = tree
        .get(LAYOUT_KEY)
        .map_err(|e| engine_error("read the layout version", e))?;
    let found = match stored {
        Some(value) => {
            let bytes: [u8; 4] = value
                .as_ref()
                .try_into()
                .map_err(|_| StorageError::Layout {
                    path: dir.to_path_buf(),
                    message: format!(
                        "the layout version record is {} bytes, not 4: {:02x?}",
                        value.len(),
                        value.as_ref()
                    ),
                })?;
            Some(u32::from_be_bytes(bytes))
        }
        None if fresh => {
            tree.insert(LAYOUT_KEY, &LAYOUT_VERSION.to_be_bytes())
                .map_err(|e| engine_error("write the layout version", e))?;
            return Ok(());
        }
        None => None,
    };
    if found == Some(LAYOUT_VERSION) {
        return Ok(());
    }
    Err(StorageError::LayoutVersion {
        path: dir.to_path_buf(),
        found: LayoutFound(found),
        expected: LAYOUT_VERSION,
    })
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    #[test]
    fn log_keys_sort_in_index_then_chunk_order_and_round_trip() {
        let keys = [
            (0u64, 0u16),
            (0, 1),
            (0, u16::MAX),
            (1, 0),
            (255, 3),
            (256, 0),
            (1 << 40, 0),
            (u64::MAX, 0),
            (u64::MAX, u16::MAX),
        ];
        for pair in keys.windows(2) {
            let [(a, ca), (b, cb)] = [pair[0], pair[1]];
            assert!(log_key(a, ca) < log_key(b, cb), "{pair:?}");
        }
        for (index, chunk) in keys {
            assert_eq!(log_key_parts(&log_key(index, chunk)), Some((index, chunk)));
        }
        assert_eq!(log_key_parts(meta_key(MetaKey::Vote)), None);
        assert_eq!(log_key_parts(&[LOG_KEY_PREFIX, 1, 2]), None);
    }

    #[test]
    fn meta_keys_sort_outside_the_log_range() {
        let keys = [MetaKey::Vote, MetaKey::Committed, MetaKey::LastPurged];
        for key in keys.map(meta_key).into_iter().chain([LAYOUT_KEY]) {
            assert!(key > &log_key(u64::MAX, u16::MAX)[..], "{key:?}");
        }
    }

    fn record(index: u64, len: usize) -> Vec<u8> {
        (0..len).map(|i| (i as u64 * 31 + index) as u8).collect()
    }

    #[test]
    fn records_larger_than_a_chunk_are_split_and_joined_back() {
        let dir = tempfile::tempdir().expect("temp dir");
        let engine = SledEngine::open(dir.path()).expect("open");
        let lens = [
            0,
            1,
            CHUNK_BYTES - 1,
            CHUNK_BYTES,
            CHUNK_BYTES + 1,
            3 * CHUNK_BYTES + 7,
        ];
        let mut batch = SledBatch::default();
        for (index, len) in (10..).zip(lens) {
            batch.put_log(index, &record(index, len)).expect("put");
        }
        engine.write(batch).expect("write");

        let mut seen = Vec::new();
        engine
            .scan_log(Bound::Unbounded, Bound::Unbounded, |index, bytes| {
                seen.push((index, bytes.to_vec()));
                Ok::<_, StorageError>(true)
            })
            .expect("scan");
        let expected: Vec<_> = (10..)
            .zip(lens)
            .map(|(i, len)| (i, record(i, len)))
            .collect();
        assert_eq!(seen, expected);
        assert_eq!(
            engine.get_log(14).expect("get"),
            Some(record(14, CHUNK_BYTES + 1))
        );
        assert_eq!(
            engine.last_log().expect("last"),
            Some((15, record(15, 3 * CHUNK_BYTES + 7)))
        );

        let mut partial = Vec::new();
        engine
            .scan_log(Bound::Excluded(11), Bound::Excluded(15), |index, bytes| {
                partial.push((index, bytes.len()));
                Ok::<_, StorageError>(true)
            })
            .expect("scan");
        assert_eq!(
            partial,
            vec![
                (12, CHUNK_BYTES - 1),
                (13, CHUNK_BYTES),
                (14, CHUNK_BYTES + 1)
            ]
        );

        // Removing entries removes every chunk of them.
        let mut batch = SledBatch::default();
        engine
            .remove_logs(&mut batch, Bound::Included(13), Bound::Unbounded)
            .expect("remove");
        engine.write(batch).expect("write");
        assert_eq!(engine.last_log().expect("last").map(|(i, _)| i), Some(12));
        let rest = engine
            .tree
            .range(log_key(13, 0)..=log_key(u64::MAX, u16::MAX));
        assert_eq!(rest.count(), 0);
    }

    #[test]
    fn a_missing_middle_chunk_is_an_error_naming_the_entry() {
        let dir = tempfile::tempdir().expect("temp dir");
        let engine = SledEngine::open(dir.path()).expect("open");
        let mut batch = SledBatch::default();
        batch.put_log(5, &record(5, 3 * CHUNK_BYTES)).expect("put");
        engine.write(batch).expect("write");
        engine.tree.remove(log_key(5, 1)).expect("remove a chunk");
        let error = engine.get_log(5).expect_err("a hole in a record");
        assert!(error.to_string().contains("log entry 5"), "{error}");
    }

    #[test]
    fn a_record_above_the_limit_is_refused() {
        let mut batch = SledBatch::default();
        let error = batch
            .put_log(3, &vec![0; RECORD_BYTES_MAX + 1])
            .expect_err("too large");
        assert!(error.to_string().contains("log entry 3"), "{error}");
    }

    #[test]
    fn sync_creates_sleds_data_file_and_survives_reopen() {
        let dir = tempfile::tempdir().expect("temp dir");
        {
            let engine = SledEngine::open(dir.path()).expect("open");
            assert!(
                dir.path()
                    .join(LOG_DIR_NAME)
                    .join(SLED_DATA_FILE_NAME)
                    .is_file()
            );
            let mut batch = SledBatch::default();
            batch.put_log(7, b"seven").expect("small record");
            batch.put_meta(MetaKey::Vote, b"vote");
            engine.write(batch).expect("write");
            engine.sync().expect("sync");
        }
        let engine = reopen(dir.path()).expect("reopen");
        assert_eq!(engine.get_log(7).expect("read"), Some(b"seven".to_vec()));
        assert_eq!(
            engine.get_meta(MetaKey::Vote).expect("read"),
            Some(b"vote".to_vec())
        );
        assert_eq!(
            engine.last_log().expect("last"),
            Some((7, b"seven".to_vec()))
        );
    }

    /// Calls `open` again while it fails because sled's file lock is still held: sled 0.34
    /// releases it when its last background IO thread lets go of the file, which can be a
    /// moment after the previous handle was dropped. Gives up after ten seconds.
    pub(in crate::storage::engine) fn when_unlocked<T, E: fmt::Display>(
        mut open: impl FnMut() -> Result<T, E>,
    ) -> Result<T, E> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            match open() {
                Err(e)
                    if e.to_string().contains("could not acquire lock")
                        && std::time::Instant::now() < deadline =>
                {
                    std::thread::yield_now();
                }
                other => return other,
            }
        }
    }

    /// Opens `<dir>/log` with [`SledEngine::open`], once sled's file lock is free.
    fn reopen(dir: &Path) -> Result<SledEngine, StorageError> {
        when_unlocked(|| SledEngine::open(dir))
    }

    /// Opens the sled database in `<dir>/log` directly, bypassing [`SledEngine::open`]'s check,
    /// to fake a directory written by another layout.
    fn raw_tree(dir: &Path) -> (sled::Db, sled::Tree) {
        let db = when_unlocked(|| {
            sled::Config::new()
                .path(dir.join(LOG_DIR_NAME))
                .segment_size(SEGMENT_BYTES)
                .open()
        })
        .expect("open sled");
        let tree = db.open_tree(TREE_NAME).expect("open tree");
        (db, tree)
    }

    #[test]
    fn a_fresh_store_gets_the_layout_record_and_reopens() {
        let dir = tempfile::tempdir().expect("temp dir");
        {
            let engine = SledEngine::open(dir.path()).expect("open");
            assert_eq!(
                engine.tree.get(LAYOUT_KEY).expect("read").as_deref(),
                Some(&LAYOUT_VERSION.to_be_bytes()[..])
            );
        }
        {
            let (db, tree) = raw_tree(dir.path());
            assert_eq!(
                tree.get(LAYOUT_KEY).expect("read").as_deref(),
                Some(&LAYOUT_VERSION.to_be_bytes()[..]),
                "the record is durable"
            );
            drop((tree, db));
        }
        let engine = reopen(dir.path()).expect("reopen");
        assert_eq!(engine.get_log(1).expect("read"), None);
    }

    #[test]
    fn a_store_with_another_layout_version_is_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        drop(SledEngine::open(dir.path()).expect("open"));
        {
            let (db, tree) = raw_tree(dir.path());
            tree.insert(LAYOUT_KEY, &(LAYOUT_VERSION + 1).to_be_bytes())
                .expect("write");
            db.flush().expect("flush");
        }
        let error = reopen(dir.path()).expect_err("another layout");
        let log_dir = dir.path().join(LOG_DIR_NAME);
        assert_eq!(
            error.to_string(),
            format!(
                "{} was written with storage layout {}; this lockd reads layout {}: restore a \
                 matching lockd version or start from an empty data dir",
                log_dir.display(),
                LAYOUT_VERSION + 1,
                LAYOUT_VERSION
            )
        );
        assert!(matches!(
            error,
            StorageError::LayoutVersion { found: LayoutFound(Some(v)), .. } if v == LAYOUT_VERSION + 1
        ));
    }

    #[test]
    fn a_non_empty_store_without_the_layout_record_is_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        {
            // What layout 0 wrote: one key per entry, no chunk suffix, and no layout record.
            let (db, tree) = raw_tree(dir.path());
            let mut key = vec![LOG_KEY_PREFIX];
            key.extend_from_slice(&1u64.to_be_bytes());
            tree.insert(key, b"entry").expect("write");
            tree.insert(meta_key(MetaKey::Vote), b"vote")
                .expect("write");
            db.flush().expect("flush");
        }
        let error = reopen(dir.path()).expect_err("no layout record");
        let message = error.to_string();
        let log_dir = dir.path().join(LOG_DIR_NAME);
        assert!(
            message.starts_with(&format!(
                "{} was written with storage layout 0 (no layout record); this lockd reads \
                 layout {LAYOUT_VERSION}:",
                log_dir.display()
            )),
            "{message}"
        );
        // Refusing must not have written the record: the next open refuses again.
        let again = reopen(dir.path()).expect_err("still refused");
        assert!(matches!(
            again,
            StorageError::LayoutVersion {
                found: LayoutFound(None),
                ..
            }
        ));
    }

    #[test]
    fn an_empty_tree_without_the_record_is_still_fresh() {
        // A crash after creating the tree but before writing the record.
        let dir = tempfile::tempdir().expect("temp dir");
        {
            let (db, tree) = raw_tree(dir.path());
            drop(tree);
            db.flush().expect("flush");
        }
        let engine = reopen(dir.path()).expect("open");
        assert_eq!(
            engine.tree.get(LAYOUT_KEY).expect("read").as_deref(),
            Some(&LAYOUT_VERSION.to_be_bytes()[..])
        );
    }
}
