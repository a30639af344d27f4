//! Snapshot files: `<dir>/snapshots/<term>-<node>-<index>.snap` (named after the last log id
//! they cover, `empty.snap` before any), one current snapshot at a time.
//!
//! Owns how a snapshot reaches the disk and comes back. A file is written atomically (write a
//! `.tmp`, `fsync` it, rename it over its final name, `fsync` the directory), so a crash leaves
//! either the old snapshot or the new one, never half of one; only then are older files removed.
//! A file is one codec record (version + checksum) holding the snapshot's openraft metadata and
//! its data; the data is itself a codec record of the [`LockTable`], because it also travels to
//! followers on its own.
//!
//! The data record has two layouts, told apart by its format version byte: version 1 is the
//! table alone, applied under [`ApplyLimits::V1`] (every snapshot lockd wrote before apply
//! limits were replicated); version 2 is the table's [`ApplyLimits`] followed by the table. A
//! table under `V1` is still written as version 1, byte for byte what earlier releases wrote,
//! so they keep reading it; only a table under other limits needs version 2, which an older
//! build refuses by its version rather than applying the log under the wrong limits. Version 3
//! is the limits, then the principal of every bound session (docs/SECURITY.md §3), then the
//! table; it is written only when some session is bound, so a cluster that never ran with TLS
//! keeps writing what earlier releases read, and an older build refuses version 3 rather than
//! forgetting whom each session belongs to. On open, leftover `.tmp` files are removed, every `.snap` file is
//! verified (a corrupt one refuses to start, naming the file) and the newest one is current.
//!
//! This module stores and loads bytes; it does not decide when to snapshot (openraft does) and
//! never touches the in-memory state machine.

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use serde::Serialize;

use super::StorageError;
use super::codec::{self, CodecError};
use super::disk::{Disk, DiskFile};
use super::engine::sync_dir;
use super::snapshot_data::{Incoming, SnapshotData};
use crate::table::{self, ApplyLimits, LockTable};
use crate::{LogId, SnapshotMeta};

/// The largest snapshot file or snapshot data accepted. Snapshots are read whole into memory;
/// 1 GiB is far above any table the limits allow on a node with a few GiB of memory, so a
/// larger one is corruption or a misbehaving peer, not a state to load.
pub const SNAPSHOT_BYTES_MAX: usize = 1 << 30;

/// Snapshot data version 1: the lock table alone, under [`ApplyLimits::V1`].
const DATA_TABLE_ONLY: u8 = codec::FORMAT_VERSION;
/// Snapshot data version 2: the table's apply limits, then the table.
const DATA_WITH_LIMITS: u8 = 2;
/// Snapshot data version 3: the apply limits, the bound sessions' principals, then the table.
const DATA_WITH_PRINCIPALS: u8 = 3;
/// The snapshot data versions this build reads.
pub(crate) const DATA_VERSIONS: [u8; 3] = [DATA_TABLE_ONLY, DATA_WITH_LIMITS, DATA_WITH_PRINCIPALS];

/// Extension of a complete snapshot file.
const SNAPSHOT_EXT: &str = "snap";
/// Extension of a snapshot file being written.
const TEMP_EXT: &str = "tmp";

/// Snapshot metadata with the cluster's node types.
pub type Meta = SnapshotMeta;

/// The content of a snapshot file, as its codec record encodes it (tests: a node writes and
/// reads the same bytes a buffer at a time, never the whole file in memory).
#[cfg(test)]
#[derive(Debug, Serialize, serde::Deserialize)]
pub struct SnapshotFile {
    /// openraft's metadata: last log id and membership (and, in the encoding, the always empty
    /// snapshot id openraft 0.9 had there).
    pub meta: Meta,
    /// The snapshot data as openraft ships it: a codec record of the lock table.
    pub data: Vec<u8>,
}

/// Encodes the lock table and its apply limits as snapshot data into one buffer: version 3
/// (limits, principals, table) when a session is bound to a principal, else version 1 (the
/// table alone) when the limits are `V1`, else version 2. Tests only: a build streams the
/// same bytes into its file ([`SnapshotDir::write_table`]); this is the reference they are
/// compared with.
#[cfg(test)]
pub fn encode_table(table: &LockTable) -> Result<Vec<u8>, StorageError> {
    let principals = table.principals();
    let encoded = if !principals.is_empty() {
        codec::encode_as(DATA_WITH_PRINCIPALS, &(table.limits(), &principals, table))
    } else if *table.limits() == ApplyLimits::V1 {
        codec::encode_as(DATA_TABLE_ONLY, table)
    } else {
        codec::encode_as(DATA_WITH_LIMITS, &(table.limits(), table))
    };
    encoded.map_err(|source| StorageError::Encode {
        record: "snapshot data".to_string(),
        source,
    })
}

/// Bytes a snapshot build buffers between its encoder and its file: the build's memory
/// beyond the table clone, whatever the snapshot's size. Tests use 4 KiB, so that a table
/// small enough to build under the debug build's invariant checks still crosses many buffers.
const STREAM_BUFFER: usize = if cfg!(test) { 4 << 10 } else { 1 << 20 };

/// What follows the format version and checksum in the snapshot data of a table: the table
/// alone (version 1), its limits and the table (version 2), or its limits, the bound
/// sessions' principals and the table (version 3). Serializes as exactly the tuple
/// [`decode_table`] reads for its version.
struct DataPayload {
    version: u8,
    table: LockTable,
    principals: BTreeMap<String, String>,
}

impl DataPayload {
    /// The payload of `table`'s snapshot data: version 3 when a session is bound to a
    /// principal, else version 1 when the limits are `V1` (what earlier releases wrote), else
    /// version 2.
    fn of(table: LockTable) -> Self {
        let principals = table.principals();
        let version = if !principals.is_empty() {
            DATA_WITH_PRINCIPALS
        } else if *table.limits() == ApplyLimits::V1 {
            DATA_TABLE_ONLY
        } else {
            DATA_WITH_LIMITS
        };
        DataPayload {
            version,
            table,
            principals,
        }
    }
}

impl Serialize for DataPayload {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.version {
            DATA_WITH_PRINCIPALS => {
                (self.table.limits(), &self.principals, &self.table).serialize(serializer)
            }
            DATA_WITH_LIMITS => (self.table.limits(), &self.table).serialize(serializer),
            _ => self.table.serialize(serializer),
        }
    }
}

/// An `io::Write` that passes every byte on to `out` and counts the bytes and their CRC. An
/// error of `out` is kept here, since postcard's writer reports every error as a full buffer.
struct Counted<W> {
    out: W,
    len: u64,
    crc: crc32fast::Hasher,
    failed: Option<io::Error>,
}

impl<W: Write> Counted<W> {
    fn new(out: W) -> Self {
        Counted {
            out,
            len: 0,
            crc: crc32fast::Hasher::new(),
            failed: None,
        }
    }
}

impl<W: Write> Write for Counted<W> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        match self.out.write(bytes) {
            Ok(n) => {
                let written = bytes.get(..n).unwrap_or(bytes);
                self.crc.update(written);
                self.len += written.len() as u64;
                Ok(n)
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Err(e),
            Err(e) => {
                let kind = e.kind();
                self.failed = Some(e);
                Err(io::Error::new(kind, "snapshot write failed"))
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush().inspect_err(|e| {
            self.failed = Some(io::Error::new(e.kind(), e.to_string()));
        })
    }
}

/// Encodes `payload` into `out` through a buffer of [`STREAM_BUFFER`] bytes, and returns its
/// length and CRC. `record` names what is encoded, for the error.
fn stream_payload<W: Write>(
    payload: &DataPayload,
    out: W,
    record: impl Fn() -> String,
) -> Result<(u64, crc32fast::Hasher), StreamError> {
    let mut buffered = io::BufWriter::with_capacity(STREAM_BUFFER, Counted::new(out));
    if let Err(source) = postcard::to_io(payload, &mut buffered) {
        return Err(match buffered.get_mut().failed.take() {
            Some(io) => StreamError::Io(io),
            None => StreamError::Encode(StorageError::Encode {
                record: record(),
                source,
            }),
        });
    }
    buffered.flush().map_err(StreamError::Io)?;
    let counted = buffered
        .into_inner()
        .map_err(|e| StreamError::Io(e.into_error()))?;
    Ok((counted.len, counted.crc))
}

/// Why streaming snapshot data failed: the disk, or the encoder.
enum StreamError {
    Io(io::Error),
    Encode(StorageError),
}

/// The error of the IO step `op` on the file `path`, for `map_err`.
fn io_error<'p>(op: &'static str, path: &'p Path) -> impl FnOnce(io::Error) -> StorageError + 'p {
    move |source| StorageError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// Writes at a position of a file and onwards (each write a `pwrite`: wrap it in a buffer),
/// refusing to go past `end`.
struct FileAt<'f> {
    file: &'f DiskFile,
    at: u64,
    end: u64,
    /// A write would have passed `end`.
    too_large: bool,
}

impl Write for FileAt<'_> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        let after = self.at.saturating_add(bytes.len() as u64);
        if after > self.end {
            self.too_large = true;
            self.at = after;
            return Err(io::Error::other("the snapshot data is larger than allowed"));
        }
        self.file.write_all_at(bytes, self.at)?;
        self.at = after;
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Decodes snapshot data into a lock table and checks its invariants: the bytes came from the
/// disk or from the leader, and a table that breaks an invariant must never be served.
/// `origin` names where the data came from, for the error.
pub fn decode_table(data: &[u8], origin: &Path) -> Result<LockTable, StorageError> {
    if data.len() > SNAPSHOT_BYTES_MAX {
        return Err(StorageError::TooLarge {
            record: format!("snapshot data for {}", origin.display()),
            len: data.len(),
            max: SNAPSHOT_BYTES_MAX,
        });
    }
    let (version, payload) =
        codec::verify_versions(data, &DATA_VERSIONS).map_err(|source| StorageError::Corrupt {
            record: "snapshot data".to_string(),
            path: origin.to_path_buf(),
            source,
        })?;
    decode_payload_table(version, Slice(payload), origin)
}

/// [`decode_table`] of data read from its file a buffer at a time, never whole in memory. The
/// data must have been verified (version and checksum): a received snapshot is
/// ([`Incoming::finish`]), and an install verifies any other before it lets go of its table.
///
/// Once `cancel` is set the decode fails at its next buffer (an error like a truncated
/// file's): the caller that set it tells the two apart.
pub(crate) fn decode_table_streamed(
    data: &SnapshotData,
    origin: &Path,
    cancel: Option<&AtomicBool>,
) -> Result<LockTable, StorageError> {
    if let Some(bytes) = data.bytes() {
        return decode_table(bytes, origin);
    }
    if data.len() > SNAPSHOT_BYTES_MAX as u64 {
        return Err(StorageError::TooLarge {
            record: format!("snapshot data for {}", origin.display()),
            len: usize::try_from(data.len()).unwrap_or(usize::MAX),
            max: SNAPSHOT_BYTES_MAX,
        });
    }
    let io = |source| StorageError::Io {
        op: "read snapshot data from",
        path: origin.to_path_buf(),
        source,
    };
    let mut reader = io::BufReader::with_capacity(
        STREAM_BUFFER,
        Cancellable {
            inner: data.reader(),
            cancel,
        },
    );
    let mut header = [0u8; codec::HEADER_LEN];
    reader.read_exact(&mut header).map_err(io)?;
    let mut scratch = vec![0u8; STRING_SCRATCH];
    decode_payload_table(
        header[0],
        Stream {
            reader: &mut reader,
            scratch: &mut scratch,
        },
        origin,
    )
}

/// A reader that fails every read once `cancel` is set.
struct Cancellable<'c, R> {
    inner: R,
    cancel: Option<&'c AtomicBool>,
}

impl<R: Read> Read for Cancellable<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.cancel.is_some_and(|c| c.load(Ordering::Acquire)) {
            return Err(io::Error::other("the decode was cancelled"));
        }
        self.inner.read(buf)
    }
}

/// The longest string a streamed decode reads (postcard copies each into this buffer before
/// handing it over): far above any string a table holds, each bounded by the apply limits.
const STRING_SCRATCH: usize = 1 << 20;

/// Bytes read for a snapshot file's head (header, meta and data length): a membership's
/// encoding is far smaller.
const HEAD_READ_MAX: u64 = 1 << 20;

/// Where a snapshot's payload is decoded from: a verified slice, or a stream.
trait PayloadSource {
    /// Decodes the whole payload as exactly one `T` (trailing bytes are an error).
    fn take<T: serde::de::DeserializeOwned>(self) -> Result<T, CodecError>;
}

struct Slice<'p>(&'p [u8]);

impl PayloadSource for Slice<'_> {
    fn take<T: serde::de::DeserializeOwned>(self) -> Result<T, CodecError> {
        codec::decode_payload(self.0)
    }
}

struct Stream<'r, R> {
    reader: &'r mut R,
    scratch: &'r mut [u8],
}

impl<R: io::Read> PayloadSource for Stream<'_, R> {
    fn take<T: serde::de::DeserializeOwned>(self) -> Result<T, CodecError> {
        let (value, (reader, _)) =
            postcard::from_io((&mut *self.reader, self.scratch)).map_err(CodecError::Payload)?;
        let mut more = [0u8; 1];
        match reader.read(&mut more) {
            Ok(0) => Ok(value),
            Ok(_) => Err(CodecError::Payload(postcard::Error::DeserializeBadEncoding)),
            Err(_) => Err(CodecError::Payload(
                postcard::Error::DeserializeUnexpectedEnd,
            )),
        }
    }
}

/// The table of a payload of data format `version`, its limits and principals set, its
/// holders shared and its invariants checked.
fn decode_payload_table(
    version: u8,
    source: impl PayloadSource,
    origin: &Path,
) -> Result<LockTable, StorageError> {
    let corrupt = |source| StorageError::Corrupt {
        record: "snapshot data".to_string(),
        path: origin.to_path_buf(),
        source,
    };
    if !DATA_VERSIONS.contains(&version) {
        return Err(corrupt(CodecError::Version { found: version }));
    }
    let layout = |message: String| StorageError::Layout {
        path: origin.to_path_buf(),
        message: format!("snapshot data: {message}"),
    };
    // Each session's grants share its holder as they decode (`sharing_holders`), so the
    // decode never holds a holder per grant.
    let mut table = table::sharing_holders(|| {
        if version == DATA_WITH_PRINCIPALS {
            let (limits, principals, mut table): (
                ApplyLimits,
                BTreeMap<String, String>,
                LockTable,
            ) = source.take().map_err(corrupt)?;
            table
                .set_limits(limits)
                .map_err(|invalid| layout(invalid.to_string()))?;
            table.set_principals(principals).map_err(layout)?;
            Ok(table)
        } else if version == DATA_WITH_LIMITS {
            let (limits, mut table): (ApplyLimits, LockTable) = source.take().map_err(corrupt)?;
            table
                .set_limits(limits)
                .map_err(|invalid| layout(invalid.to_string()))?;
            Ok(table)
        } else {
            // Version 1 recorded no limits: it was applied under V1, whatever this build's
            // constants say.
            source.take::<LockTable>().map_err(corrupt)
        }
    })?;
    // The encoding repeats a session's keys in the session's lock set: held once, as applying
    // the log holds them (and any holder the pool could not share).
    table.share_holders();
    table
        .check_invariants()
        .map_err(|violation| StorageError::Layout {
            path: origin.to_path_buf(),
            message: format!("snapshot data breaks a lock table invariant: {violation}"),
        })?;
    Ok(table)
}

/// The file name of the snapshot covering the log up to `last_log_id`: term, node and index,
/// unique per log position (the same state always gets the same name, so rebuilding a snapshot
/// at one position overwrites one file). Only digits and dashes, so no name escapes the
/// directory. openraft 0.9 lockd named its snapshots the same way.
pub fn file_name(last_log_id: Option<&LogId>) -> String {
    match last_log_id {
        Some(id) => format!(
            "{}-{}-{}.{SNAPSHOT_EXT}",
            id.leader_id.term, id.leader_id.node_id, id.index
        ),
        None => format!("empty.{SNAPSHOT_EXT}"),
    }
}

/// The snapshot directory and which file in it is current.
#[derive(Debug)]
pub struct SnapshotDir {
    dir: PathBuf,
    disk: Disk,
    /// The current snapshot's metadata and file. The mutex is held across a whole write, so
    /// writes, clean-ups and reads of "current" never interleave.
    current: Mutex<Option<(Meta, PathBuf)>>,
    /// Temp files prepared so far, for their unique names.
    temps: AtomicU64,
    /// Passes of [`SnapshotDir::write_table`] over the data so far (tests).
    #[cfg(test)]
    encodes: AtomicU64,
}

/// A snapshot file written and synced under a temporary name ([`SnapshotDir::prepare`]), to
/// be committed or abandoned.
#[derive(Debug)]
pub struct Prepared {
    temp: PathBuf,
    path: PathBuf,
    meta: Meta,
}

impl Prepared {
    /// The temporary file it is written under.
    pub(crate) fn temp(&self) -> &Path {
        &self.temp
    }

    /// The snapshot's metadata.
    pub(crate) fn meta(&self) -> &Meta {
        &self.meta
    }
}

impl SnapshotDir {
    /// Opens (creating if needed) the snapshot directory: removes leftover temp files, verifies
    /// every snapshot file, keeps the newest as current and removes the others. Returns the
    /// current snapshot's content too, for the state machine to start from.
    pub fn open(
        disk: Disk,
        dir: &Path,
    ) -> Result<(SnapshotDir, Option<(Meta, SnapshotData)>), StorageError> {
        disk.create_dir_all(dir)
            .map_err(|source| StorageError::Io {
                op: "create directory",
                path: dir.to_path_buf(),
                source,
            })?;
        // The directory's own entry must be durable before a snapshot in it lets the log be
        // purged.
        let parent = dir.parent().filter(|p| !p.as_os_str().is_empty());
        sync_dir(&disk, parent.unwrap_or(Path::new(".")))?;
        let mut newest: Option<(Meta, SnapshotData, PathBuf)> = None;
        let mut stale = Vec::new();
        let mut paths: Vec<PathBuf> = list(&disk, dir)?;
        paths.sort();
        for path in paths {
            match path.extension().and_then(|e| e.to_str()) {
                Some(TEMP_EXT) => stale.push(path),
                Some(SNAPSHOT_EXT) => {
                    let file = disk.open_read(&path).map_err(|source| StorageError::Io {
                        op: "open",
                        path: path.clone(),
                        source,
                    })?;
                    let (meta, data) = verify_file(file, path.clone())?;
                    let newer = match &newest {
                        None => true,
                        Some((best, _, _)) => meta.last_log_id > best.last_log_id,
                    };
                    if newer {
                        if let Some((_, _, old)) = newest.replace((meta, data, path)) {
                            stale.push(old);
                        }
                    } else {
                        stale.push(path);
                    }
                }
                _ => {
                    tracing::warn!(path = %path.display(), "ignoring a foreign file in the snapshot directory")
                }
            }
        }
        for path in &stale {
            remove_file(&disk, path)?;
        }
        if !stale.is_empty() {
            sync_dir(&disk, dir)?;
        }
        let current = newest
            .as_ref()
            .map(|(meta, _, path)| (meta.clone(), path.clone()));
        let snapshot_dir = SnapshotDir {
            dir: dir.to_path_buf(),
            disk,
            current: Mutex::new(current),
            temps: AtomicU64::new(0),
            #[cfg(test)]
            encodes: AtomicU64::new(0),
        };
        Ok((snapshot_dir, newest.map(|(meta, data, _)| (meta, data))))
    }

    /// The directory, for error messages.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The current snapshot's file, for error messages.
    pub fn current_path(&self) -> Option<PathBuf> {
        let current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        current.as_ref().map(|(_, path)| path.clone())
    }

    /// Writes a snapshot of `table` as of `meta` durably and makes it current (unless a newer
    /// one already is, which only a race between a build and an install can cause), then
    /// removes the others; returns the length of its data. The data is encoded straight into
    /// the file through a buffer of [`STREAM_BUFFER`] bytes, never whole in memory, and once:
    /// it goes in after room left for the file's head and the data record's header, which
    /// hold its length and checksums and are written last. The head's length depends on the
    /// data's (a varint), so the room is sized from the last snapshot's; when the new length
    /// takes another width, the data is encoded a second time after the right room (a state
    /// crossing 2 MiB or 256 MiB). `last_len` is the last snapshot's data length (0: none),
    /// which the caller keeps for its snapshot policy anyway. The file is byte for byte the
    /// one [`SnapshotDir::prepare`] writes of the data [`encode_table`] gives. `table` is
    /// dropped once encoded, before the file is synced. Blocks on the disk and on the CPU.
    ///
    /// Encoding once nearly halved a build: the sizing pass it replaced was 55 % of a build's
    /// samples, and a build sized from the last one went from 0.57 to 0.30 s at 100,000
    /// sessions and from 1.08 to 0.61 s at a million held locks (`held_locks` example;
    /// docs/PERFORMANCE.md, "Session 19").
    pub fn write_table(
        &self,
        meta: &Meta,
        table: LockTable,
        last_len: u64,
    ) -> Result<u64, StorageError> {
        let path = self.dir.join(file_name(meta.last_log_id.as_ref()));
        let record = || format!("snapshot data for {}", path.display());
        let payload = DataPayload::of(table);
        let n = self.temps.fetch_add(1, Ordering::Relaxed);
        let temp = path.with_extension(format!("{n}.{TEMP_EXT}"));
        let file = self
            .disk
            .create_new(&temp)
            .map_err(io_error("create", &temp))?;
        let written = self.encode_into(&file, &temp, meta, &payload, last_len, &record);
        // The encoding is done: free the clone's chunks before the (slow) sync.
        drop(payload);
        let synced = written.and_then(|data_len| {
            file.sync_data().map_err(io_error("fsync", &temp))?;
            Ok(data_len)
        });
        drop(file);
        let data_len = match synced {
            Ok(data_len) => data_len,
            Err(e) => {
                if let Err(e) = remove_file(&self.disk, &temp) {
                    tracing::warn!(%e, "cannot remove a snapshot temp file that failed to write");
                }
                return Err(e);
            }
        };
        self.commit(Prepared {
            temp,
            path,
            meta: meta.clone(),
        })?;
        Ok(data_len)
    }

    /// Encodes `payload` into `file` with the head for `meta` before it (see
    /// [`SnapshotDir::write_table`]), its head's room sized for data of `last_len` bytes;
    /// returns the data's length. Leaves syncing to the caller.
    fn encode_into(
        &self,
        file: &DiskFile,
        temp: &Path,
        meta: &Meta,
        payload: &DataPayload,
        last_len: u64,
        record: &dyn Fn() -> String,
    ) -> Result<u64, StorageError> {
        let encode = |source| StorageError::Encode {
            record: format!("snapshot file {}", temp.display()),
            source,
        };
        let io = |op| io_error(op, temp);
        let mut head_len = file_head_of(meta, last_len, crc32fast::Hasher::new())
            .map_err(encode)?
            .len();
        let mut first: Option<(u64, u32)> = None;
        loop {
            let data_at = (head_len + codec::HEADER_LEN) as u64;
            let mut out = FileAt {
                file,
                at: data_at,
                end: data_at + (SNAPSHOT_BYTES_MAX - codec::HEADER_LEN) as u64,
                too_large: false,
            };
            let streamed = stream_payload(payload, &mut out, record);
            #[cfg(test)]
            self.encodes.fetch_add(1, Ordering::Relaxed);
            if out.too_large {
                return Err(StorageError::TooLarge {
                    record: record(),
                    len: usize::try_from(out.at - data_at)
                        .unwrap_or(usize::MAX)
                        .saturating_add(codec::HEADER_LEN),
                    max: SNAPSHOT_BYTES_MAX,
                });
            }
            let (payload_len, payload_crc) = match streamed {
                Ok(counted) => counted,
                Err(StreamError::Encode(e)) => return Err(e),
                Err(StreamError::Io(source)) => return Err(io("write")(source)),
            };
            let sum = payload_crc.clone().finalize();
            // A second pass must encode what the first did: the encoding is deterministic.
            if let Some(first) = first
                && first != (payload_len, sum)
            {
                return Err(io("write")(io::Error::other(format!(
                    "the snapshot data encoded to {payload_len} bytes with checksum \
                     {sum:#010x}, not the first pass's {} bytes with {:#010x}",
                    first.0, first.1
                ))));
            }
            let data_len = (codec::HEADER_LEN as u64).saturating_add(payload_len);
            let mut data_head = [payload.version, 0, 0, 0, 0];
            data_head[1..].copy_from_slice(&sum.to_le_bytes());
            let mut data_crc = crc32fast::Hasher::new();
            data_crc.update(&data_head);
            data_crc.combine(&payload_crc);
            let head = file_head_of(meta, data_len, data_crc).map_err(encode)?;
            if head.len() != head_len {
                // The length's varint took another width than the last snapshot's: encode
                // again after room of the right size.
                head_len = head.len();
                first = Some((payload_len, sum));
                file.set_len(0).map_err(io("truncate"))?;
                continue;
            }
            let heads = file
                .write_all_at(&head, 0)
                .and_then(|()| file.write_all_at(&data_head, head_len as u64));
            heads.map_err(io("write the head of"))?;
            return Ok(data_len);
        }
    }

    /// Removes a prepared file that will not be committed (best effort: the next open removes
    /// any temp file left).
    pub fn abandon(&self, prepared: Prepared) {
        if let Err(e) = remove_file(&self.disk, &prepared.temp) {
            tracing::warn!(%e, "cannot remove an abandoned snapshot temp file");
        }
    }

    /// The second half of [`SnapshotDir::prepare`]: renames the prepared file into place, makes
    /// the rename durable and the snapshot current, then removes the others.
    pub fn commit(&self, prepared: Prepared) -> Result<(), StorageError> {
        let Prepared { temp, path, meta } = prepared;
        let meta = &meta;
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        self.disk
            .rename(&temp, &path)
            .map_err(|source| StorageError::Io {
                op: "rename into place",
                path: path.clone(),
                source,
            })?;
        sync_dir(&self.disk, &self.dir)?;
        let superseded = match current.as_ref() {
            Some((current_meta, _)) => current_meta.last_log_id > meta.last_log_id,
            None => false,
        };
        if !superseded {
            *current = Some((meta.clone(), path));
        }
        // Remove every snapshot file but the current one, now that it is durable.
        let keep = current.as_ref().map(|(_, path)| path.clone());
        let mut removed = false;
        for other in list(&self.disk, &self.dir)? {
            let is_snapshot = other.extension().and_then(|e| e.to_str()) == Some(SNAPSHOT_EXT);
            if is_snapshot && Some(&other) != keep.as_ref() {
                remove_file(&self.disk, &other)?;
                removed = true;
            }
        }
        if removed {
            sync_dir(&self.disk, &self.dir)?;
        }
        Ok(())
    }

    /// A snapshot of `meta` with `len` bytes of data arriving from a leader: a temporary file
    /// its chunks are written into as they come ([`Incoming`]), never whole in memory, and
    /// which an install commits as the current snapshot. Blocks on the disk.
    pub fn receive(&self, meta: &Meta, len: u64) -> Result<Incoming, StorageError> {
        let path = self.dir.join(file_name(meta.last_log_id.as_ref()));
        if len > SNAPSHOT_BYTES_MAX as u64 {
            return Err(StorageError::TooLarge {
                record: format!("snapshot data for {}", path.display()),
                len: usize::try_from(len).unwrap_or(usize::MAX),
                max: SNAPSHOT_BYTES_MAX,
            });
        }
        // The head's length does not depend on the checksum, which is written at the end.
        let head_len = file_head_of(meta, len, crc32fast::Hasher::new())
            .map_err(|source| StorageError::Encode {
                record: format!("snapshot file {}", path.display()),
                source,
            })?
            .len();
        // Unique per write, so a build and an install of the same position never share one.
        let n = self.temps.fetch_add(1, Ordering::Relaxed);
        let temp = path.with_extension(format!("{n}.{TEMP_EXT}"));
        let file = self
            .disk
            .create_new(&temp)
            .map_err(|source| StorageError::Io {
                op: "create",
                path: temp.clone(),
                source,
            })?;
        Ok(Incoming::new(
            self.disk.clone(),
            file,
            Prepared {
                temp,
                path,
                meta: meta.clone(),
            },
            len,
            head_len,
        ))
    }

    /// The current snapshot's meta and data, the data a range of the open file, read as it is
    /// sent (it stays readable once a newer snapshot replaces the file). The file is verified
    /// first, a buffer at a time: its record's checksum, and the data record's version and
    /// checksum. Blocks on the disk.
    pub fn open_current(&self) -> Result<Option<(Meta, SnapshotData)>, StorageError> {
        let (path, file) = {
            let current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
            let Some((_, path)) = current.as_ref() else {
                return Ok(None);
            };
            let file = self
                .disk
                .open_read(path)
                .map_err(|source| StorageError::Io {
                    op: "open",
                    path: path.clone(),
                    source,
                })?;
            (path.clone(), file)
        };
        verify_file(file, path).map(Some)
    }

    /// Reads and verifies the current snapshot file. Blocks on the disk. Tests: a node reads it
    /// a buffer at a time ([`SnapshotDir::open_current`]).
    #[cfg(test)]
    pub fn read_current(&self) -> Result<Option<SnapshotFile>, StorageError> {
        let current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        match current.as_ref() {
            None => Ok(None),
            Some((_, path)) => read_file(&self.disk, path).map(Some),
        }
    }
}

/// Verifies the snapshot file `file` (named `path`) a buffer at a time, never whole in memory:
/// its record's checksum, and the data record's version and checksum. Answers its meta and its
/// data, a range of the open file.
fn verify_file(file: DiskFile, path: PathBuf) -> Result<(Meta, SnapshotData), StorageError> {
    let io = |op| io_error(op, &path);
    let corrupt = |record: &str, source| StorageError::Corrupt {
        record: record.to_string(),
        path: path.clone(),
        source,
    };
    let file_len = file.len().map_err(io("stat"))?;
    if file_len > (SNAPSHOT_BYTES_MAX + 1024) as u64 {
        return Err(StorageError::TooLarge {
            record: format!("snapshot file {}", path.display()),
            len: usize::try_from(file_len).unwrap_or(usize::MAX),
            max: SNAPSHOT_BYTES_MAX + 1024,
        });
    }
    // The head: the record's header, the meta and the data's length.
    let mut head = vec![0u8; usize::try_from(file_len.min(HEAD_READ_MAX)).unwrap_or(0)];
    file.read_exact_at(&mut head, 0).map_err(io("read"))?;
    let Some((header, payload)) = head.split_first_chunk::<{ codec::HEADER_LEN }>() else {
        return Err(corrupt(
            "snapshot file",
            CodecError::Truncated { len: head.len() },
        ));
    };
    let [version, crc @ ..] = *header;
    if version != codec::FORMAT_VERSION {
        return Err(corrupt(
            "snapshot file",
            CodecError::Version { found: version },
        ));
    }
    let (meta, rest): (Meta, &[u8]) = postcard::take_from_bytes(payload)
        .map_err(|e| corrupt("snapshot file", CodecError::Payload(e)))?;
    let (data_len, rest): (u64, &[u8]) = postcard::take_from_bytes(rest)
        .map_err(|e| corrupt("snapshot file", CodecError::Payload(e)))?;
    let head_len = (head.len() - rest.len()) as u64;
    if head_len.checked_add(data_len) != Some(file_len) {
        return Err(corrupt(
            "snapshot file",
            CodecError::Payload(postcard::Error::DeserializeBadEncoding),
        ));
    }
    // The checksums: the file's over all after its header, the data's over all after the
    // data's own header.
    let mut file_crc = crc32fast::Hasher::new();
    let mut data_crc = crc32fast::Hasher::new();
    let data_payload_at = head_len + codec::HEADER_LEN as u64;
    let mut data_header = [0u8; codec::HEADER_LEN];
    let mut buffer = vec![0u8; STREAM_BUFFER];
    let mut at = codec::HEADER_LEN as u64;
    while at < file_len {
        let n = usize::try_from(file_len - at).map_or(buffer.len(), |left| left.min(buffer.len()));
        let chunk = &mut buffer[..n];
        file.read_exact_at(chunk, at).map_err(io("read"))?;
        file_crc.update(chunk);
        let end = at + n as u64;
        if end > data_payload_at {
            let from = data_payload_at.saturating_sub(at) as usize;
            data_crc.update(&chunk[from..]);
        }
        if at < data_payload_at && end > head_len {
            // Some of the data's header is in this chunk.
            for i in at.max(head_len)..end.min(data_payload_at) {
                data_header[(i - head_len) as usize] = chunk[(i - at) as usize];
            }
        }
        at = end;
    }
    let stored = u32::from_le_bytes(crc);
    let computed = file_crc.finalize();
    if stored != computed {
        return Err(corrupt(
            "snapshot file",
            CodecError::Checksum { stored, computed },
        ));
    }
    if data_len < codec::HEADER_LEN as u64 {
        return Err(corrupt(
            "snapshot data",
            CodecError::Truncated {
                len: data_len as usize,
            },
        ));
    }
    let [data_version, data_stored @ ..] = data_header;
    if !DATA_VERSIONS.contains(&data_version) {
        return Err(corrupt(
            "snapshot data",
            CodecError::Version {
                found: data_version,
            },
        ));
    }
    let (stored, computed) = (u32::from_le_bytes(data_stored), data_crc.finalize());
    if stored != computed {
        return Err(corrupt(
            "snapshot data",
            CodecError::Checksum { stored, computed },
        ));
    }
    Ok((meta, SnapshotData::file(file, path, head_len, data_len)))
}

/// The paths of the entries of `dir`.
fn list(disk: &Disk, dir: &Path) -> Result<Vec<PathBuf>, StorageError> {
    let names = disk.list_dir(dir).map_err(|source| StorageError::Io {
        op: "list",
        path: dir.to_path_buf(),
        source,
    })?;
    Ok(names.into_iter().map(|name| dir.join(name)).collect())
}

fn remove_file(disk: &Disk, path: &Path) -> Result<(), StorageError> {
    match disk.remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(StorageError::Io {
            op: "remove",
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// The bytes of the snapshot file of `meta` and `data` that come before `data`: the codec
/// header, the encoded meta and the data's length. The file is these followed by `data`, byte
/// for byte the codec record of a [`SnapshotFile`], without copying `data` into it.
#[cfg(test)]
fn file_head(meta: &Meta, data: &[u8]) -> Result<Vec<u8>, postcard::Error> {
    let mut crc = crc32fast::Hasher::new();
    crc.update(data);
    file_head_of(meta, data.len() as u64, crc)
}

/// [`file_head`] of data known by its length and its CRC (a hasher that has seen exactly the
/// data's bytes): what a build writes before data it has not encoded yet.
pub(crate) fn file_head_of(
    meta: &Meta,
    data_len: u64,
    data_crc: crc32fast::Hasher,
) -> Result<Vec<u8>, postcard::Error> {
    // postcard writes a `Vec<u8>` as its length (a varint, as it writes any `u64`), then the
    // bytes.
    let mut head = postcard::to_extend(meta, vec![codec::FORMAT_VERSION, 0, 0, 0, 0])?;
    head = postcard::to_extend(&data_len, head)?;
    let mut crc = crc32fast::Hasher::new();
    crc.update(&head[codec::HEADER_LEN..]);
    crc.combine(&data_crc);
    head[1..codec::HEADER_LEN].copy_from_slice(&crc.finalize().to_le_bytes());
    Ok(head)
}

/// Reads and verifies one snapshot file, and the data record inside it, whole into memory
/// (tests: a node verifies a file a buffer at a time, [`verify_file`]).
#[cfg(test)]
fn read_file(disk: &Disk, path: &Path) -> Result<SnapshotFile, StorageError> {
    let io = |op| io_error(op, path);
    let len = disk.len(path).map_err(io("stat"))?;
    // The frame around the data adds a few bytes; allow them.
    let max = SNAPSHOT_BYTES_MAX + 1024;
    let too_large = |len: u64| StorageError::TooLarge {
        record: format!("snapshot file {}", path.display()),
        len: usize::try_from(len).unwrap_or(usize::MAX),
        max,
    };
    if len > max as u64 {
        return Err(too_large(len));
    }
    let bytes = disk.read(path).map_err(io("read"))?;
    // A snapshot file is never rewritten in place, but check what was read, not the stat.
    if bytes.len() > max {
        return Err(too_large(bytes.len() as u64));
    }
    let file = split_file(bytes).map_err(|source| StorageError::Corrupt {
        record: "snapshot file".to_string(),
        path: path.to_path_buf(),
        source,
    })?;
    codec::verify_versions(&file.data, &DATA_VERSIONS).map_err(|source| StorageError::Corrupt {
        record: "snapshot data".to_string(),
        path: path.to_path_buf(),
        source,
    })?;
    Ok(file)
}

/// Verifies the codec record of a [`SnapshotFile`] (version and checksum, over the data too)
/// and takes it apart in place: the data is the record's tail, so it is kept in the buffer
/// read from the disk (its head moved off) instead of being decoded byte by byte into a
/// second buffer of its size. Reads exactly what `codec::decode::<SnapshotFile>` reads.
#[cfg(test)]
fn split_file(mut record: Vec<u8>) -> Result<SnapshotFile, CodecError> {
    let payload = codec::verify(&record)?;
    let (meta, rest): (Meta, &[u8]) =
        postcard::take_from_bytes(payload).map_err(CodecError::Payload)?;
    // postcard writes a `Vec<u8>` as its length (a varint, as it writes any `u64`), then the
    // bytes; a record holds exactly one value, so they end it.
    let (len, data): (u64, &[u8]) = postcard::take_from_bytes(rest).map_err(CodecError::Payload)?;
    if usize::try_from(len) != Ok(data.len()) {
        return Err(CodecError::Payload(if len > data.len() as u64 {
            postcard::Error::DeserializeUnexpectedEnd
        } else {
            postcard::Error::DeserializeBadEncoding
        }));
    }
    let head = record.len() - data.len();
    record.drain(..head);
    Ok(SnapshotFile { meta, data: record })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::{Command, Rejection, Response};

    /// Limits far tighter than V1 on every bound, so a log applied under them answers
    /// differently from one applied under V1 almost everywhere.
    const TIGHT: ApplyLimits = ApplyLimits {
        ttl_min_ms: 1_000,
        ttl_max_ms: 10_000,
        max_wait_max_ms: 90_000,
        key_len_max: 8,
        owner_id_len_max: 8,
        session_id_len_max: 8,
        operator_len_max: 8,
        reason_len_max: 16,
        waiters_per_key_max: 1,
        locks_per_session_max: 2,
        waits_per_session_max: 1,
        sessions_max: 3,
        audit_log_max: 2,
        request_window: 4,
        batch_max: 3,
        revoke_retry_window_ms: 1_000,
    };

    fn open(session: &str) -> Command {
        Command::OpenSession {
            session_id: session.into(),
            owner_id: format!("o-{session}"),
            ttl_ms: 5_000,
        }
    }

    fn acquire(session: &str, request_id: u64, key: &str, ttl_ms: u64, wait_ms: u64) -> Command {
        Command::Acquire {
            session_id: session.into(),
            request_id,
            key: key.into(),
            ttl_ms,
            wait_ms,
        }
    }

    fn revoke(key: &str, request_id: u64) -> Command {
        Command::ForceRevoke {
            key: key.into(),
            operator: "op".into(),
            reason: "drill".into(),
            request_id,
        }
    }

    /// A log that runs into every bound of [`TIGHT`]: `(stamp, command)` in log order.
    fn log() -> Vec<(u64, Command)> {
        let mut log = vec![
            open("s1"),
            open("s2"),
            open("s3"),
            open("s4"),
            acquire("s1", 1, "longer-than-8", 5_000, 0),
            acquire("s1", 2, "a", 20_000, 0),
            acquire("s1", 3, "a", 5_000, 0),
            acquire("s2", 1, "a", 5_000, 60_000),
            acquire("s3", 1, "a", 5_000, 60_000),
            acquire("s2", 2, "b", 5_000, 60_000),
            acquire("s1", 4, "b", 5_000, 0),
            acquire("s1", 5, "c", 5_000, 0),
            Command::Batch((0..4).map(|i| revoke("d", 100 + i)).collect()),
            revoke("a", 7),
            revoke("b", 8),
            revoke("c", 9),
        ];
        for request_id in 10..16 {
            log.push(Command::Release {
                session_id: "s3".into(),
                request_id,
                key: "zz".into(),
                token: 99,
            });
        }
        log.push(Command::Release {
            session_id: "s3".into(),
            request_id: 11,
            key: "zz".into(),
            token: 99,
        });
        log.push(revoke("c", 9));
        // Stamps 500 ms apart: the last revoke comes after TIGHT's retry window, not V1's.
        log.into_iter()
            .enumerate()
            .map(|(i, c)| (1_000 + 500 * i as u64, c))
            .collect()
    }

    fn replay(table: &mut LockTable, entries: &[(u64, Command)]) -> Vec<Response> {
        let mut events = Vec::new();
        entries
            .iter()
            .map(|(stamp, c)| table.apply(*stamp, c.clone(), &mut events))
            .collect()
    }

    /// Issue 18: a log applied under one set of limits, replayed by a replica that restored the
    /// snapshot taken half-way, or that replays the whole log into a table with the same
    /// recorded limits, ends in the identical table with identical answers — although this
    /// binary's own constants (and so `LockTable::new()`) are V1, which answers the same log
    /// differently.
    #[test]
    fn a_log_replays_alike_under_its_recorded_limits_whatever_the_binary_defaults() {
        let log = log();
        let (first, rest) = log.split_at(12);

        let mut original = LockTable::with_limits(TIGHT).expect("consistent limits");
        let mut answers = replay(&mut original, first);
        let snapshot = encode_table(&original).expect("encodes");
        answers.extend(replay(&mut original, rest));

        let mut restored = decode_table(&snapshot, Path::new("test")).expect("decodes");
        assert_eq!(*restored.limits(), TIGHT, "the snapshot carries its limits");
        let mut restored_answers = replay(&mut LockTable::with_limits(TIGHT).expect("ok"), first);
        restored_answers.extend(replay(&mut restored, rest));
        assert_eq!(restored, original);
        assert_eq!(restored_answers, answers);

        let mut from_scratch = LockTable::with_limits(TIGHT).expect("consistent limits");
        assert_eq!(replay(&mut from_scratch, &log), answers);
        assert_eq!(from_scratch, original);

        // The same log under this binary's defaults is a different history: were `apply` to
        // read the binary's constants, replicas on different releases would diverge like this.
        let mut under_v1 = LockTable::new();
        let v1_answers = replay(&mut under_v1, &log);
        assert_eq!(*under_v1.limits(), ApplyLimits::V1);
        let differing = answers
            .iter()
            .zip(&v1_answers)
            .filter(|(a, b)| a != b)
            .count();
        assert!(
            differing >= 8,
            "only {differing} answers differ: {answers:?}"
        );
        assert_ne!(under_v1.session_count(), original.session_count());
    }

    /// Bound sessions keep their principals through a snapshot (version 3), and a table with
    /// none keeps the old versions; a principal of a session the table lacks is refused.
    #[test]
    fn bound_sessions_keep_their_principals_through_a_snapshot() {
        let mut table = LockTable::new();
        replay(&mut table, &log());
        let unbound = encode_table(&table).expect("encodes");
        assert_eq!(unbound[0], DATA_TABLE_ONLY, "nobody bound: the old format");
        let bound = Command::AsCaller {
            principal: "spiffe://lockd/alice".into(),
            command: Box::new(open("bound")),
        };
        replay(&mut table, &[(9_000, bound)]);
        let data = encode_table(&table).expect("encodes");
        assert_eq!(data[0], DATA_WITH_PRINCIPALS);
        let back = decode_table(&data, Path::new("test")).expect("decodes");
        assert_eq!(back, table);
        assert_eq!(
            back.session("bound").and_then(|s| s.principal()),
            Some("spiffe://lockd/alice")
        );

        let ghost = BTreeMap::from([("ghost".to_owned(), "p".to_owned())]);
        let bad = codec::encode_as(DATA_WITH_PRINCIPALS, &(table.limits(), &ghost, &table))
            .expect("encodes");
        let err = decode_table(&bad, Path::new("test")).expect_err("refused");
        assert!(err.to_string().contains("ghost"), "{err}");
    }

    /// A table under V1 is written as format version 1 with exactly the payload earlier
    /// releases wrote (the table alone; seven zero bytes for an empty table), and snapshot data
    /// of that version decodes under V1.
    #[test]
    fn v1_tables_keep_the_version_1_snapshot_format() {
        let empty = encode_table(&LockTable::new()).expect("encodes");
        assert_eq!(empty[0], 1);
        assert_eq!(&empty[codec::HEADER_LEN..], &[0u8; 7]);
        assert_eq!(
            empty,
            codec::encode(&LockTable::new()).expect("encodes as before")
        );

        let mut table = LockTable::new();
        replay(&mut table, &log());
        let old_format = codec::encode(&table).expect("encodes as before");
        assert_eq!(encode_table(&table).expect("encodes"), old_format);
        let back = decode_table(&old_format, Path::new("test")).expect("decodes");
        assert_eq!(*back.limits(), ApplyLimits::V1);
        assert_eq!(back, table);
    }

    /// A `SetLimits` entry moves every replica at the same log index: replayed from scratch on
    /// a V1 table, or from a snapshot taken after it, the log gives the same table and answers,
    /// and after it the log is answered as under those limits from the start. Limits the state
    /// already exceeds are refused and change nothing.
    #[test]
    fn set_limits_is_a_replicated_command_every_replica_applies_at_one_index() {
        let set_tight = Command::SetLimits { limits: TIGHT };
        let mut entries = vec![
            (500, open("s1")),
            (600, open("s2")),
            (700, open("s3")),
            (800, open("s4")),
            (900, set_tight.clone()),
            (
                950,
                Command::CloseSession {
                    session_id: "s4".into(),
                },
            ),
            (960, set_tight),
        ];
        let prefix = entries.len();
        entries.extend(log());

        let mut first = LockTable::new();
        let answers = replay(&mut first, &entries);
        let Response::Rejected(Rejection::InvalidArgument { message }) = &answers[4] else {
            panic!("four open sessions exceed TIGHT's three: {:?}", answers[4]);
        };
        assert!(message.contains("SESSIONS_MAX"), "{message}");
        assert_eq!(answers[6], Response::LimitsSet { limits: TIGHT });
        assert_eq!(*first.limits(), TIGHT);

        let mut before = LockTable::new();
        let mut second = replay(&mut before, &entries[..prefix]);
        let data = encode_table(&before).expect("encodes");
        assert_eq!(data[0], DATA_WITH_LIMITS);
        let mut restored = decode_table(&data, Path::new("test")).expect("decodes");
        second.extend(replay(&mut restored, &entries[prefix..]));
        assert_eq!(second, answers);
        assert_eq!(restored, first);

        let mut tight = LockTable::with_limits(TIGHT).expect("consistent limits");
        assert_eq!(replay(&mut tight, &log()), answers[prefix..]);
    }

    #[test]
    fn other_limits_are_written_as_version_2_and_bad_ones_refused() {
        let table = LockTable::with_limits(TIGHT).expect("consistent limits");
        let data = encode_table(&table).expect("encodes");
        assert_eq!(data[0], DATA_WITH_LIMITS);
        assert_eq!(
            decode_table(&data, Path::new("t"))
                .expect("decodes")
                .limits(),
            &TIGHT
        );

        let mut bad = TIGHT;
        bad.request_window = 1;
        let data = codec::encode_as(DATA_WITH_LIMITS, &(&bad, &LockTable::new())).expect("ok");
        let refused = decode_table(&data, Path::new("t")).expect_err("inconsistent limits");
        assert!(refused.to_string().contains("request_window"), "{refused}");

        let future = codec::encode_as(3, &LockTable::new()).expect("ok");
        assert!(decode_table(&future, Path::new("t")).is_err());
    }

    /// The file is written in two parts without copying the data; together they are exactly
    /// the codec record of the [`SnapshotFile`] earlier releases wrote and read.
    #[test]
    fn the_file_written_in_parts_is_the_old_record() {
        let mut table = LockTable::new();
        replay(&mut table, &log());
        let data = encode_table(&table).expect("encodes");
        let meta = Meta {
            last_log_id: Some(LogId::new(
                crate::LeaderId {
                    term: 2,
                    node_id: 3,
                },
                300,
            )),
            last_membership: Default::default(),
        };
        let mut file = file_head(&meta, &data).expect("encodes");
        file.extend_from_slice(&data);
        let record = codec::encode(&SnapshotFile {
            meta: meta.clone(),
            data: data.clone(),
        })
        .expect("encodes");
        assert_eq!(file, record);
    }

    /// A table of `sessions` sessions holding `locks` locks each and one waiter, under
    /// `limits`, with the first session bound to a principal if `bound`.
    fn big_table(limits: ApplyLimits, sessions: usize, locks: usize, bound: bool) -> LockTable {
        let mut table = LockTable::with_limits(limits).expect("consistent limits");
        let mut log = Vec::new();
        for s in 0..sessions {
            let opening = open(&format!("session-{s:04}"));
            log.push(if bound && s == 0 {
                Command::AsCaller {
                    principal: "spiffe://lockd/alice".into(),
                    command: Box::new(opening),
                }
            } else {
                opening
            });
            for l in 0..locks {
                let key = format!("stream/{s:04}/{l:04}");
                log.push(acquire(
                    &format!("session-{s:04}"),
                    l as u64 + 1,
                    &key,
                    30_000,
                    0,
                ));
            }
        }
        log.push(acquire(
            "session-0001",
            9_999,
            "stream/0000/0000",
            30_000,
            60_000,
        ));
        let stamped: Vec<_> = log.into_iter().map(|c| (1_000, c)).collect();
        replay(&mut table, &stamped);
        table
    }

    /// A build streams its file through a buffer (here of 4 KiB, so the data crosses dozens of
    /// them): the file is byte for byte the one written of the whole data in memory, the codec
    /// record of a [`SnapshotFile`] earlier releases read, for each of the three data versions,
    /// on the operating system's disk and on the power-cut test disk alike. It is so whether
    /// the room left for the head was sized right from the last snapshot (one pass over the
    /// data) or not (a first build, whose data is longer than one varint byte: two passes).
    #[test]
    fn a_streamed_snapshot_file_is_byte_for_byte_the_in_memory_one() {
        let other = ApplyLimits {
            audit_log_max: ApplyLimits::V1.audit_log_max - 1,
            ..ApplyLimits::V1
        };
        let tables = [
            (big_table(ApplyLimits::V1, 60, 40, false), DATA_TABLE_ONLY),
            (big_table(other, 60, 40, false), DATA_WITH_LIMITS),
            (
                big_table(ApplyLimits::V1, 60, 40, true),
                DATA_WITH_PRINCIPALS,
            ),
            (LockTable::new(), DATA_TABLE_ONLY),
        ];
        for (n, (table, version)) in tables.into_iter().enumerate() {
            let meta = Meta {
                last_log_id: Some(LogId::new(
                    crate::LeaderId {
                        term: 7,
                        node_id: 2,
                    },
                    1_000 + n as u64,
                )),
                last_membership: Default::default(),
            };
            let data = encode_table(&table).expect("encodes");
            assert_eq!(data[0], version, "table {n}");
            if n < 3 {
                assert!(
                    data.len() > 20 * STREAM_BUFFER,
                    "table {n}: {} bytes",
                    data.len()
                );
            }
            let mut expected = file_head(&meta, &data).expect("encodes");
            expected.extend_from_slice(&data);
            let record = codec::encode(&SnapshotFile {
                meta: meta.clone(),
                data: data.clone(),
            })
            .expect("encodes");
            assert_eq!(expected, record, "table {n}");

            let temp = tempfile::tempdir().expect("temp dir");
            let disks = [
                (Disk::Os, temp.path().to_path_buf()),
                (
                    Disk::PowerCut(super::super::disk::power_cut::PowerCutDisk::new()),
                    PathBuf::from("/node/snapshots"),
                ),
            ];
            for (disk, dir) in disks {
                let (snapshots, none) = SnapshotDir::open(disk.clone(), &dir).expect("opens");
                assert!(none.is_none());
                // A first build guesses the shortest head; then the last length is right.
                let firsts_passes = if data.len() < 128 { 1 } else { 2 };
                let mut last_len = 0;
                for (build, passes) in [(0, firsts_passes), (1, 1)] {
                    let mut meta = meta.clone();
                    meta.last_log_id.as_mut().expect("an id").index += build;
                    let mut expected = file_head(&meta, &data).expect("encodes");
                    expected.extend_from_slice(&data);
                    let before = snapshots.encodes.load(Ordering::Relaxed);
                    let data_len = snapshots
                        .write_table(&meta, table.clone(), last_len)
                        .expect("writes");
                    assert_eq!(data_len, data.len() as u64, "table {n}");
                    last_len = data_len;
                    assert_eq!(
                        snapshots.encodes.load(Ordering::Relaxed) - before,
                        passes,
                        "table {n}, build {build}: passes over the data"
                    );
                    let path = dir.join(file_name(meta.last_log_id.as_ref()));
                    let written = disk.read(&path).expect("reads");
                    assert!(
                        written == expected,
                        "table {n}, build {build}: the streamed file differs"
                    );
                    assert_eq!(
                        list(&disk, &dir).expect("lists"),
                        vec![path],
                        "no temp left"
                    );
                    let current = snapshots.read_current().expect("reads").expect("current");
                    assert_eq!(current.meta, meta);
                    assert!(current.data == data, "table {n}");
                    let back = decode_table(&current.data, &dir).expect("decodes");
                    assert_eq!(back, table, "table {n}");
                }
            }
        }
    }

    /// A file is taken apart in place into what decoding its record gives; a file cut short,
    /// one with a byte past its data (checksums made to match, so only the layout is wrong)
    /// and every bit flipped in its head or data are refused.
    /// The meta of a snapshot at index 77 of term 4, led by node 2.
    fn meta_4_2_77() -> Meta {
        Meta {
            last_log_id: Some(LogId::new(
                crate::LeaderId {
                    term: 4,
                    node_id: 2,
                },
                77,
            )),
            last_membership: Default::default(),
        }
    }

    #[test]
    fn a_file_is_read_in_place_as_its_record_and_any_damage_is_refused() {
        let mut table = LockTable::new();
        replay(&mut table, &log());
        let data = encode_table(&table).expect("encodes");
        let meta = meta_4_2_77();
        let record = codec::encode(&SnapshotFile {
            meta: meta.clone(),
            data: data.clone(),
        })
        .expect("encodes");
        let file = split_file(record.clone()).expect("reads");
        let decoded: SnapshotFile = codec::decode(&record).expect("decodes");
        assert_eq!(file.meta, meta);
        assert_eq!(file.meta, decoded.meta);
        assert_eq!(file.data, data);
        assert_eq!(file.data, decoded.data);

        let reframe = |mut bytes: Vec<u8>| {
            let crc = crc32fast::hash(&bytes[codec::HEADER_LEN..]);
            bytes[1..codec::HEADER_LEN].copy_from_slice(&crc.to_le_bytes());
            bytes
        };
        let short = reframe(record[..record.len() - 1].to_vec());
        assert!(matches!(split_file(short), Err(CodecError::Payload(_))));
        let mut long = record.clone();
        long.push(0);
        assert!(matches!(
            split_file(reframe(long)),
            Err(CodecError::Payload(_))
        ));
        for byte in (0..record.len()).step_by(7) {
            let mut bad = record.clone();
            bad[byte] ^= 1 << (byte % 8);
            assert!(
                split_file(bad).is_err(),
                "a flip of byte {byte} went unnoticed"
            );
        }
    }

    /// A snapshot received a chunk at a time is committed as the very file a build or an
    /// earlier release writes of its data; the current file is then read back as a range of
    /// the open file, decoded a buffer at a time into the table the in-memory decode gives,
    /// and any damage to it is refused. A received snapshot too short, too long or damaged is
    /// refused and leaves no file behind.
    #[test]
    fn a_received_snapshot_is_the_file_of_its_data_and_is_read_back_in_a_stream() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (snapshots, _) = SnapshotDir::open(Disk::Os, dir.path()).expect("opens");
        let table = big_table(ApplyLimits::V1, 20, 50, true);
        let data = encode_table(&table).expect("encodes");
        assert!(data.len() > 4 * STREAM_BUFFER, "crosses buffers");
        let meta = meta_4_2_77();
        let receive = |chunks: &[&[u8]], len: u64| {
            let mut incoming = snapshots.receive(&meta, len)?;
            for chunk in chunks {
                incoming.write(chunk)?;
            }
            incoming.finish()
        };
        let third = data.len() / 3;
        let mut received = receive(
            &[&data[..third], &data[third..2 * third], &data[2 * third..]],
            data.len() as u64,
        )
        .expect("received");
        assert!(received.is_received());
        assert_eq!(received.to_vec().expect("reads"), data);
        let prepared = received.take_received().expect("a prepared file");
        drop(received);
        snapshots.commit(prepared).expect("commits");
        let path = dir.path().join(file_name(meta.last_log_id.as_ref()));
        let file = std::fs::read(&path).expect("the committed file");
        let record = codec::encode(&SnapshotFile {
            meta: meta.clone(),
            data: data.clone(),
        })
        .expect("encodes");
        assert!(
            file == record,
            "the received file is the record of its data"
        );

        let (current_meta, current) = snapshots.open_current().expect("opens").expect("current");
        assert_eq!(current_meta, meta);
        assert!(!current.is_received());
        assert_eq!(current.to_vec().expect("reads"), data);
        let streamed = decode_table_streamed(&current, &path, None).expect("decodes");
        assert_eq!(streamed, decode_table(&data, &path).expect("decodes"));
        assert_eq!(streamed, table);
        drop(current);

        for byte in (0..file.len()).step_by(97) {
            let mut bad = file.clone();
            bad[byte] ^= 1 << (byte % 8);
            std::fs::write(&path, &bad).expect("damage");
            assert!(
                snapshots.open_current().is_err(),
                "a flip of byte {byte} went unnoticed"
            );
        }
        std::fs::write(&path, &file).expect("restore");

        let mut damaged = data.clone();
        damaged[data.len() / 2] ^= 1;
        for (name, refused) in [
            ("short", receive(&[&data[..third]], data.len() as u64)),
            ("long", receive(&[&data[..]], third as u64)),
            ("damaged", receive(&[&damaged[..]], data.len() as u64)),
            ("no header", receive(&[&data[..3]], 3)),
        ] {
            assert!(refused.is_err(), "{name} was taken in");
        }
        let mut left: Vec<_> = std::fs::read_dir(dir.path())
            .expect("lists")
            .map(|e| e.expect("entry").file_name())
            .collect();
        left.sort();
        assert_eq!(left, [std::ffi::OsString::from("4-2-77.snap")]);
    }

    #[test]
    fn file_names_are_the_log_position() {
        let id = LogId::new(
            crate::LeaderId {
                term: 3,
                node_id: 1,
            },
            120,
        );
        assert_eq!(file_name(Some(&id)), "3-1-120.snap");
        assert_eq!(file_name(None), "empty.snap");
    }
}
