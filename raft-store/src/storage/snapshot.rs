//! Snapshot files: `<dir>/snapshots/<term>-<node>-<index>.snap` (named after the last log id
//! they cover, `empty.snap` before any), one current snapshot at a time.
//!
//! Owns how a snapshot reaches the disk and comes back. A file is written atomically (write a
//! `.tmp`, `fsync` it, rename it over its final name, `fsync` the directory), so a crash leaves
//! either the old snapshot or the new one, never half of one; only then are older files removed.
//! A file is one codec record (version + checksum) holding the snapshot's openraft metadata and
//! its data; the data is itself a codec record of the [`LockTable`], because it also travels to
//! followers on its own. On open, leftover `.tmp` files are removed, every `.snap` file is
//! verified (a corrupt one refuses to start, naming the file) and the newest one is current.
//!
//! This module stores and loads bytes; it does not decide when to snapshot (openraft does) and
//! never touches the in-memory state machine.

use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use serde::{Deserialize, Serialize};

use super::StorageError;
use super::codec;
use super::engine::sync_dir;
use crate::table::LockTable;
use crate::{LogId, SnapshotMeta};

/// The largest snapshot file or snapshot data accepted. Snapshots are read whole into memory;
/// 1 GiB is far above any table the limits allow on a node with a few GiB of memory, so a
/// larger one is corruption or a misbehaving peer, not a state to load.
pub const SNAPSHOT_BYTES_MAX: usize = 1 << 30;

/// Extension of a complete snapshot file.
const SNAPSHOT_EXT: &str = "snap";
/// Extension of a snapshot file being written.
const TEMP_EXT: &str = "tmp";

/// Snapshot metadata with the cluster's node types.
pub type Meta = SnapshotMeta;

/// The content of a snapshot file.
#[derive(Debug, Serialize, Deserialize)]
pub struct SnapshotFile {
    /// openraft's metadata: last log id and membership (and, in the encoding, the always empty
    /// snapshot id openraft 0.9 had there).
    pub meta: Meta,
    /// The snapshot data as openraft ships it: a codec record of the lock table.
    pub data: Vec<u8>,
}

/// Encodes the lock table as snapshot data.
pub fn encode_table(table: &LockTable) -> Result<Vec<u8>, StorageError> {
    codec::encode(table).map_err(|source| StorageError::Encode {
        record: "snapshot data".to_string(),
        source,
    })
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
    let table: LockTable = codec::decode(data).map_err(|source| StorageError::Corrupt {
        record: "snapshot data".to_string(),
        path: origin.to_path_buf(),
        source,
    })?;
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
    /// The current snapshot's metadata and file. The mutex is held across a whole write, so
    /// writes, clean-ups and reads of "current" never interleave.
    current: Mutex<Option<(Meta, PathBuf)>>,
}

impl SnapshotDir {
    /// Opens (creating if needed) the snapshot directory: removes leftover temp files, verifies
    /// every snapshot file, keeps the newest as current and removes the others. Returns the
    /// current snapshot's content too, for the state machine to start from.
    pub fn open(dir: &Path) -> Result<(SnapshotDir, Option<SnapshotFile>), StorageError> {
        fs::create_dir_all(dir).map_err(|source| StorageError::Io {
            op: "create directory",
            path: dir.to_path_buf(),
            source,
        })?;
        // The directory's own entry must be durable before a snapshot in it lets the log be
        // purged.
        let parent = dir.parent().filter(|p| !p.as_os_str().is_empty());
        sync_dir(parent.unwrap_or(Path::new(".")))?;
        let listing_error = |source| StorageError::Io {
            op: "list",
            path: dir.to_path_buf(),
            source,
        };
        let mut newest: Option<(SnapshotFile, PathBuf)> = None;
        let mut stale = Vec::new();
        let mut paths = Vec::new();
        for entry in fs::read_dir(dir).map_err(listing_error)? {
            paths.push(entry.map_err(listing_error)?.path());
        }
        paths.sort();
        for path in paths {
            match path.extension().and_then(|e| e.to_str()) {
                Some(TEMP_EXT) => stale.push(path),
                Some(SNAPSHOT_EXT) => {
                    let file = read_file(&path)?;
                    let newer = match &newest {
                        None => true,
                        Some((best, _)) => file.meta.last_log_id > best.meta.last_log_id,
                    };
                    if newer {
                        if let Some((_, old)) = newest.replace((file, path)) {
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
            remove_file(path)?;
        }
        if !stale.is_empty() {
            sync_dir(dir)?;
        }
        let current = newest
            .as_ref()
            .map(|(file, path)| (file.meta.clone(), path.clone()));
        let snapshot_dir = SnapshotDir {
            dir: dir.to_path_buf(),
            current: Mutex::new(current),
        };
        Ok((snapshot_dir, newest.map(|(file, _)| file)))
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

    /// Writes a snapshot durably and makes it current (unless a newer one already is, which
    /// only a race between a build and an install can cause), then removes the others.
    /// Blocks on the disk.
    pub fn write(&self, meta: &Meta, data: &[u8]) -> Result<(), StorageError> {
        let path = self.dir.join(file_name(meta.last_log_id.as_ref()));
        let record = codec::encode(&SnapshotFile {
            meta: meta.clone(),
            data: data.to_vec(),
        })
        .map_err(|source| StorageError::Encode {
            record: format!("snapshot file {}", path.display()),
            source,
        })?;
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        write_atomically(&self.dir, &path, &record)?;
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
        let listing_error = |source| StorageError::Io {
            op: "list",
            path: self.dir.clone(),
            source,
        };
        for entry in fs::read_dir(&self.dir).map_err(listing_error)? {
            let other = entry.map_err(listing_error)?.path();
            let is_snapshot = other.extension().and_then(|e| e.to_str()) == Some(SNAPSHOT_EXT);
            if is_snapshot && Some(&other) != keep.as_ref() {
                remove_file(&other)?;
                removed = true;
            }
        }
        if removed {
            sync_dir(&self.dir)?;
        }
        Ok(())
    }

    /// Reads and verifies the current snapshot file. Blocks on the disk.
    pub fn read_current(&self) -> Result<Option<SnapshotFile>, StorageError> {
        let current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        match current.as_ref() {
            None => Ok(None),
            Some((_, path)) => read_file(path).map(Some),
        }
    }
}

fn remove_file(path: &Path) -> Result<(), StorageError> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(StorageError::Io {
            op: "remove",
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// temp file, write, fsync, rename, fsync the directory.
fn write_atomically(dir: &Path, path: &Path, bytes: &[u8]) -> Result<(), StorageError> {
    let temp = path.with_extension(TEMP_EXT);
    let io = |op: &'static str, path: &Path| {
        let path = path.to_path_buf();
        move |source| StorageError::Io { op, path, source }
    };
    let mut file = File::create(&temp).map_err(io("create", &temp))?;
    file.write_all(bytes).map_err(io("write", &temp))?;
    file.sync_all().map_err(io("fsync", &temp))?;
    drop(file);
    fs::rename(&temp, path).map_err(io("rename into place", path))?;
    sync_dir(dir)
}

/// Reads and verifies one snapshot file, and the data record inside it.
fn read_file(path: &Path) -> Result<SnapshotFile, StorageError> {
    let io = |op: &'static str| {
        let path = path.to_path_buf();
        move |source| StorageError::Io { op, path, source }
    };
    let file = File::open(path).map_err(io("open"))?;
    let len = file.metadata().map_err(io("stat"))?.len();
    // The frame around the data adds a few bytes; allow them.
    let max = SNAPSHOT_BYTES_MAX + 1024;
    if len > max as u64 {
        return Err(StorageError::TooLarge {
            record: format!("snapshot file {}", path.display()),
            len: usize::try_from(len).unwrap_or(usize::MAX),
            max,
        });
    }
    let mut bytes = Vec::with_capacity(len as usize);
    file.take(max as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(io("read"))?;
    let file: SnapshotFile = codec::decode(&bytes).map_err(|source| StorageError::Corrupt {
        record: "snapshot file".to_string(),
        path: path.to_path_buf(),
        source,
    })?;
    codec::verify(&file.data).map_err(|source| StorageError::Corrupt {
        record: "snapshot data".to_string(),
        path: path.to_path_buf(),
        source,
    })?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

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
