//! [`SnapshotData`]: a snapshot's data as openraft hands it between the state machine and the
//! transport. The data of a snapshot on disk is a byte range of its open file, read a chunk at
//! a time as it leaves ([`SnapshotData::read_at`]); the data a follower receives is written
//! into a file of its snapshot directory as it arrives ([`Incoming`]), and that file becomes
//! the follower's snapshot when the install commits it. Neither side holds the data whole in
//! memory: at a million held locks that is 125 MiB on the leader while it sends and on the
//! follower while it installs (docs/PERFORMANCE.md, session 14).
//!
//! Owns the data's handle, the incoming file's checks (its length, and the version and
//! checksum of the data record inside it) and the clean-up of a received file no install
//! took. How a snapshot file is laid out is `snapshot`'s business.

use std::fmt;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use super::StorageError;
use super::codec;
use super::disk::{Disk, DiskFile};
use super::snapshot::{self, Prepared};

/// A snapshot's data: none (what a build answers, openraft reads only its meta), bytes in
/// memory (tests and tools), or a byte range of an open snapshot file.
pub struct SnapshotData(Source);

enum Source {
    None,
    Bytes(Vec<u8>),
    File(Box<FileRange>),
}

/// `len` bytes at `offset` of an open file. A received file not yet committed is removed
/// when its data is dropped.
struct FileRange {
    file: DiskFile,
    path: PathBuf,
    offset: u64,
    len: u64,
    received: Option<(Disk, Prepared)>,
}

impl Drop for FileRange {
    fn drop(&mut self) {
        if let Some((disk, prepared)) = self.received.take()
            && let Err(e) = disk.remove_file(prepared.temp())
            && e.kind() != io::ErrorKind::NotFound
        {
            tracing::warn!(%e, path = %prepared.temp().display(),
                "cannot remove a received snapshot no install took (the next open removes it)");
        }
    }
}

impl SnapshotData {
    /// No data.
    pub fn empty() -> Self {
        SnapshotData(Source::None)
    }

    /// `len` bytes at `offset` of `file` (named `path`, for errors).
    pub(crate) fn file(file: DiskFile, path: PathBuf, offset: u64, len: u64) -> Self {
        SnapshotData(Source::File(Box::new(FileRange {
            file,
            path,
            offset,
            len,
            received: None,
        })))
    }

    /// The data's length in bytes.
    pub fn len(&self) -> u64 {
        match &self.0 {
            Source::None => 0,
            Source::Bytes(bytes) => bytes.len() as u64,
            Source::File(range) => range.len,
        }
    }

    /// Whether there is no data.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Fills `buf` with the data from `offset`; `UnexpectedEof` past its end. Blocks on the
    /// disk for file data.
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let end = offset
            .checked_add(buf.len() as u64)
            .filter(|end| *end <= self.len())
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!(
                        "snapshot data: {} bytes at {offset} read past its {} bytes",
                        buf.len(),
                        self.len()
                    ),
                )
            })?;
        match &self.0 {
            Source::None => Ok(()),
            Source::Bytes(bytes) => {
                buf.copy_from_slice(&bytes[offset as usize..end as usize]);
                Ok(())
            }
            Source::File(range) => range.file.read_exact_at(buf, range.offset + offset),
        }
    }

    /// The whole data in memory: for tests and tools, never the serving path. Blocks on the
    /// disk for file data.
    pub fn to_vec(&self) -> io::Result<Vec<u8>> {
        let len = usize::try_from(self.len()).map_err(io::Error::other)?;
        let mut bytes = vec![0u8; len];
        self.read_at(0, &mut bytes)?;
        Ok(bytes)
    }

    /// A reader of the data from its start.
    pub(crate) fn reader(&self) -> DataReader<'_> {
        DataReader { data: self, at: 0 }
    }

    /// The data in memory, if it is there.
    pub(crate) fn bytes(&self) -> Option<&[u8]> {
        match &self.0 {
            Source::None => Some(&[]),
            Source::Bytes(bytes) => Some(bytes),
            Source::File(_) => None,
        }
    }

    /// The file the data is in, for errors; `None` for data in memory.
    pub(crate) fn path(&self) -> Option<&Path> {
        match &self.0 {
            Source::File(range) => Some(&range.path),
            _ => None,
        }
    }

    /// Whether this is the data of a received snapshot file not yet committed.
    pub(crate) fn is_received(&self) -> bool {
        matches!(&self.0, Source::File(range) if range.received.is_some())
    }

    /// Makes the data's file durable (`fdatasync`); nothing for data in memory. A received
    /// snapshot is synced by its install, beside its decode, before the install commits it.
    /// Blocks on the disk.
    pub(crate) fn sync(&self) -> Result<(), StorageError> {
        match &self.0 {
            Source::None | Source::Bytes(_) => Ok(()),
            Source::File(range) => range.file.sync_data().map_err(|source| StorageError::Io {
                op: "fsync snapshot data in",
                path: range.path.clone(),
                source,
            }),
        }
    }

    /// Takes the prepared snapshot file a received data is the data of, for the install to
    /// commit: the data is then the committed file's, which stays.
    pub(crate) fn take_received(&mut self) -> Option<Prepared> {
        match &mut self.0 {
            Source::File(range) => range.received.take().map(|(_, prepared)| prepared),
            _ => None,
        }
    }
}

impl From<Vec<u8>> for SnapshotData {
    fn from(bytes: Vec<u8>) -> Self {
        SnapshotData(Source::Bytes(bytes))
    }
}

impl fmt::Debug for SnapshotData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Source::None => f.write_str("SnapshotData(none)"),
            Source::Bytes(bytes) => write!(f, "SnapshotData({} bytes in memory)", bytes.len()),
            Source::File(range) => write!(
                f,
                "SnapshotData({} bytes at {} of {})",
                range.len,
                range.offset,
                range.path.display()
            ),
        }
    }
}

/// Reads a [`SnapshotData`] in order; wrap it in a `BufReader`, each read is a `pread`.
pub(crate) struct DataReader<'d> {
    data: &'d SnapshotData,
    at: u64,
}

impl Read for DataReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.data.len().saturating_sub(self.at);
        let n = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        self.data.read_at(self.at, &mut buf[..n])?;
        self.at += n as u64;
        Ok(n)
    }
}

/// A snapshot arriving from a leader, written into a temporary file of the snapshot directory
/// as its chunks come: the file's head first (its checksum patched in at the end), then the
/// data. [`Incoming::finish`] checks it is whole and sound and hands it over as the
/// [`SnapshotData`] of the install, which syncs the file while it decodes it and commits it as
/// the node's snapshot once both are done. Dropped unfinished, or finished and never
/// committed, the file is removed.
pub struct Incoming {
    range: FileRange,
    written: u64,
    data_crc: crc32fast::Hasher,
    /// The data record's own header (version and checksum), its first bytes.
    record_head: Vec<u8>,
    record_crc: crc32fast::Hasher,
}

impl fmt::Debug for Incoming {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Incoming({} of {} bytes into {})",
            self.written,
            self.range.len,
            self.range.path.display()
        )
    }
}

impl Incoming {
    /// An incoming snapshot of `len` data bytes, into `file` (the temp file of `prepared`, on
    /// `disk`), after a head of `head_len` bytes (the file's head for `prepared`'s meta and
    /// this length; its checksum is written once the data's is known).
    pub(crate) fn new(
        disk: Disk,
        file: DiskFile,
        prepared: Prepared,
        len: u64,
        head_len: usize,
    ) -> Self {
        Incoming {
            range: FileRange {
                file,
                path: prepared.temp().to_path_buf(),
                offset: head_len as u64,
                len,
                received: Some((disk, prepared)),
            },
            written: 0,
            data_crc: crc32fast::Hasher::new(),
            record_head: Vec::with_capacity(codec::HEADER_LEN),
            record_crc: crc32fast::Hasher::new(),
        }
    }

    /// Bytes of data written so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    fn io(&self, op: &'static str, source: io::Error) -> StorageError {
        StorageError::Io {
            op,
            path: self.range.path.clone(),
            source,
        }
    }

    /// Appends `chunk` to the data; more than the announced length is refused. Blocks on the
    /// disk.
    pub fn write(&mut self, chunk: &[u8]) -> Result<(), StorageError> {
        if self.written + chunk.len() as u64 > self.range.len {
            return Err(StorageError::Layout {
                path: self.range.path.clone(),
                message: format!(
                    "snapshot: more than the {} bytes announced arrived",
                    self.range.len
                ),
            });
        }
        self.range
            .file
            .write_all_at(chunk, self.range.offset + self.written)
            .map_err(|e| self.io("write a received snapshot into", e))?;
        self.data_crc.update(chunk);
        let head_missing = codec::HEADER_LEN.saturating_sub(self.record_head.len());
        let (to_head, payload) = chunk.split_at(head_missing.min(chunk.len()));
        self.record_head.extend_from_slice(to_head);
        self.record_crc.update(payload);
        self.written += chunk.len() as u64;
        Ok(())
    }

    /// Checks that the whole data arrived and that its record's version and checksum hold, and
    /// writes the file's head: the [`SnapshotData`] of an install, which syncs the file
    /// (`SnapshotData::sync`) beside its decode and commits it. Blocks on the disk.
    pub fn finish(self) -> Result<SnapshotData, StorageError> {
        let layout = |path: &Path, message: String| StorageError::Layout {
            path: path.to_path_buf(),
            message,
        };
        if self.written != self.range.len {
            return Err(layout(
                &self.range.path,
                format!(
                    "snapshot: {} of the {} bytes announced arrived",
                    self.written, self.range.len
                ),
            ));
        }
        let corrupt = |source| StorageError::Corrupt {
            record: "received snapshot data".to_string(),
            path: self.range.path.clone(),
            source,
        };
        let Some([version, crc @ ..]) = self.record_head.first_chunk::<{ codec::HEADER_LEN }>()
        else {
            return Err(corrupt(codec::CodecError::Truncated {
                len: self.record_head.len(),
            }));
        };
        if !snapshot::DATA_VERSIONS.contains(version) {
            return Err(corrupt(codec::CodecError::Version { found: *version }));
        }
        let (stored, computed) = (u32::from_le_bytes(*crc), self.record_crc.clone().finalize());
        if stored != computed {
            return Err(corrupt(codec::CodecError::Checksum { stored, computed }));
        }
        let Some((_, prepared)) = &self.range.received else {
            return Err(layout(
                &self.range.path,
                "snapshot: an incoming snapshot without its prepared file".to_string(),
            ));
        };
        let head = snapshot::file_head_of(prepared.meta(), self.range.len, self.data_crc.clone())
            .map_err(|source| StorageError::Encode {
            record: format!("snapshot file {}", self.range.path.display()),
            source,
        })?;
        if head.len() as u64 != self.range.offset {
            return Err(layout(
                &self.range.path,
                format!(
                    "snapshot: the file's head came out {} bytes, not the {} written around",
                    head.len(),
                    self.range.offset
                ),
            ));
        }
        self.range
            .file
            .write_all_at(&head, 0)
            .map_err(|e| self.io("write a received snapshot's head into", e))?;
        Ok(SnapshotData(Source::File(Box::new(self.range))))
    }
}

/// Where a node's transport writes the snapshots a leader sends: the state machine's snapshot
/// directory ([`StateMachineStore::inbox`](super::StateMachineStore::inbox)). Cheap to clone.
#[derive(Clone, Debug)]
pub struct SnapshotInbox(pub(crate) std::sync::Arc<snapshot::SnapshotDir>);

impl SnapshotInbox {
    /// A snapshot of `meta` with `len` bytes of data arriving: write its chunks into the
    /// [`Incoming`] as they come, then [`Incoming::finish`] it for the install. Blocks on the
    /// disk.
    pub fn receive(&self, meta: &snapshot::Meta, len: u64) -> Result<Incoming, StorageError> {
        self.0.receive(meta, len)
    }
}
