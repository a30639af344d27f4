//! The file-system seam of the storage: every file and directory call the WAL engine and the
//! snapshot store make goes through [`Disk`] and [`DiskFile`], so tests can put a simulated
//! disk under them ([`power_cut`]) without forking the code.
//!
//! Owns nothing but the dispatch: each call is the `std::fs` call of the same name. In a
//! non-test build the enums have one variant, so a `match` compiles to the direct call: no
//! virtual call or allocation per write on the append path. The sled engine keeps its own file
//! handling (sled opens its files itself) and is not behind this seam.

#[cfg(test)]
pub(crate) mod power_cut;

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Where the storage's files live: the operating system's file system, or (in tests) a
/// simulated disk that can lose power.
#[derive(Clone, Debug, Default)]
pub(crate) enum Disk {
    /// `std::fs`.
    #[default]
    Os,
    /// A simulated disk that keeps what each file held at its last sync and loses a random part
    /// of the rest on [`power_cut::PowerCutDisk::power_cut`].
    #[cfg(test)]
    PowerCut(power_cut::PowerCutDisk),
}

/// An open file of a [`Disk`].
#[derive(Debug)]
pub(crate) enum DiskFile {
    /// A `std::fs::File`.
    Os(File),
    /// A file of a [`power_cut::PowerCutDisk`].
    #[cfg(test)]
    PowerCut(power_cut::PowerCutFile),
}

impl Disk {
    /// Whether `path` names a file or directory.
    pub(crate) fn exists(&self, path: &Path) -> bool {
        match self {
            Disk::Os => path.exists(),
            #[cfg(test)]
            Disk::PowerCut(disk) => disk.exists(path),
        }
    }

    /// Creates `path` and its missing parents as directories.
    pub(crate) fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        match self {
            Disk::Os => std::fs::create_dir_all(path),
            #[cfg(test)]
            Disk::PowerCut(disk) => disk.create_dir_all(path),
        }
    }

    /// The names of the entries of directory `dir`, in no particular order.
    pub(crate) fn list_dir(&self, dir: &Path) -> io::Result<Vec<OsString>> {
        match self {
            Disk::Os => std::fs::read_dir(dir)?
                .map(|entry| entry.map(|e| e.file_name()))
                .collect(),
            #[cfg(test)]
            Disk::PowerCut(disk) => disk.list_dir(dir),
        }
    }

    /// Creates the file `path` for reading and writing; fails if it exists.
    pub(crate) fn create_new(&self, path: &Path) -> io::Result<DiskFile> {
        match self {
            Disk::Os => OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(path)
                .map(DiskFile::Os),
            #[cfg(test)]
            Disk::PowerCut(disk) => disk.create_new(path).map(DiskFile::PowerCut),
        }
    }

    /// Opens the existing file `path` for reading.
    pub(crate) fn open_read(&self, path: &Path) -> io::Result<DiskFile> {
        match self {
            Disk::Os => File::open(path).map(DiskFile::Os),
            #[cfg(test)]
            Disk::PowerCut(disk) => disk.open_rw(path).map(DiskFile::PowerCut),
        }
    }

    /// Opens the existing file `path` for reading and writing.
    pub(crate) fn open_rw(&self, path: &Path) -> io::Result<DiskFile> {
        match self {
            Disk::Os => OpenOptions::new()
                .read(true)
                .write(true)
                .open(path)
                .map(DiskFile::Os),
            #[cfg(test)]
            Disk::PowerCut(disk) => disk.open_rw(path).map(DiskFile::PowerCut),
        }
    }

    /// The length of the file `path` (tests: a node reads a length from the open file).
    #[cfg(test)]
    pub(crate) fn len(&self, path: &Path) -> io::Result<u64> {
        match self {
            Disk::Os => std::fs::metadata(path).map(|m| m.len()),
            #[cfg(test)]
            Disk::PowerCut(disk) => disk.len(path),
        }
    }

    /// The whole content of the file `path` (tests: a node reads a snapshot a buffer at a
    /// time).
    #[cfg(test)]
    pub(crate) fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        match self {
            Disk::Os => std::fs::read(path),
            #[cfg(test)]
            Disk::PowerCut(disk) => disk.read(path),
        }
    }

    /// Renames `from` to `to`, replacing `to`.
    pub(crate) fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        match self {
            Disk::Os => std::fs::rename(from, to),
            #[cfg(test)]
            Disk::PowerCut(disk) => disk.rename(from, to),
        }
    }

    /// Removes the file `path`.
    pub(crate) fn remove_file(&self, path: &Path) -> io::Result<()> {
        match self {
            Disk::Os => std::fs::remove_file(path),
            #[cfg(test)]
            Disk::PowerCut(disk) => disk.remove_file(path),
        }
    }

    /// The WAL segment size to use on this disk: [`SEGMENT_BYTES`](super::engine) on the
    /// operating system's; a simulated disk holds every file in memory and copies pages on
    /// each write, so it asks for small segments, which also makes tests rotate and purge
    /// segments often.
    pub(crate) fn wal_segment_bytes(&self) -> u64 {
        match self {
            Disk::Os => super::engine::WAL_SEGMENT_BYTES,
            #[cfg(test)]
            Disk::PowerCut(disk) => disk.wal_segment_bytes(),
        }
    }

    /// fsyncs the directory `dir`, making the creation, rename or removal of its entries
    /// durable.
    pub(crate) fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        match self {
            Disk::Os => File::open(dir).and_then(|d| d.sync_all()),
            #[cfg(test)]
            Disk::PowerCut(disk) => disk.sync_dir(dir),
        }
    }
}

impl DiskFile {
    /// Writes all of `bytes` at `offset` (`pwrite`).
    pub(crate) fn write_all_at(&self, bytes: &[u8], offset: u64) -> io::Result<()> {
        match self {
            DiskFile::Os(file) => file.write_all_at(bytes, offset),
            #[cfg(test)]
            DiskFile::PowerCut(file) => file.write_all_at(bytes, offset),
        }
    }

    /// Fills `buf` from `offset` (`pread`); `UnexpectedEof` if the file ends first.
    pub(crate) fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        match self {
            DiskFile::Os(file) => file.read_exact_at(buf, offset),
            #[cfg(test)]
            DiskFile::PowerCut(file) => file.read_exact_at(buf, offset),
        }
    }

    /// The file's length in bytes.
    pub(crate) fn len(&self) -> io::Result<u64> {
        match self {
            DiskFile::Os(file) => Ok(file.metadata()?.len()),
            #[cfg(test)]
            DiskFile::PowerCut(file) => file.read_all().map(|bytes| bytes.len() as u64),
        }
    }

    /// The whole content of the file.
    pub(crate) fn read_all(&self) -> io::Result<Vec<u8>> {
        match self {
            DiskFile::Os(file) => {
                let len = usize::try_from(file.metadata()?.len()).map_err(io::Error::other)?;
                let mut bytes = vec![0u8; len];
                file.read_exact_at(&mut bytes, 0)?;
                Ok(bytes)
            }
            #[cfg(test)]
            DiskFile::PowerCut(file) => file.read_all(),
        }
    }

    /// Truncates or extends (with zeros) the file to `len` bytes.
    pub(crate) fn set_len(&self, len: u64) -> io::Result<()> {
        match self {
            DiskFile::Os(file) => file.set_len(len),
            #[cfg(test)]
            DiskFile::PowerCut(file) => file.set_len(len),
        }
    }

    /// `fdatasync`: the file's data and length are durable when it returns.
    pub(crate) fn sync_data(&self) -> io::Result<()> {
        match self {
            DiskFile::Os(file) => file.sync_data(),
            #[cfg(test)]
            DiskFile::PowerCut(file) => file.sync_data(),
        }
    }
}
