//! A lazyfs-style file system for the power-cut nemesis: a FUSE passthrough to a backing
//! directory that keeps every file write in memory, per 4 KiB page, until the file is
//! fsynced, and on command (`cut SEED`) loses a seeded random subset of each file's unsynced
//! pages — whole pages, not a prefix — writing the rest through, as a power cut during a
//! partial write-back leaves a disk.
//!
//! # Layout
//!
//! - [`overlay`] — one file's unsynced pages over its backing file (pure: IO through a trait).
//! - [`cache`] — the mount's overlays, the bound on unsynced bytes, the mount-wide cut and
//!   flush.
//! - [`inodes`] — the mount's inode numbers and the backing paths they stand for.
//! - [`hold`] — held syncs, to cut while an fsync is in flight.
//! - [`fs`] — the FUSE requests onto the backing directory and the cache.
//! - [`control`] — the control socket's line protocol.
//! - [`daemon`] — `lock-lazyfs mount`: mount, serve, unmount.
//! - [`mounts`] — the harness's side: a daemon per node, commands to it.
//!
//! # Limits
//!
//! - Only file data is lost. Metadata — create, rename, unlink, mkdir, rmdir, truncate, chmod,
//!   chown, links — reaches the backing directory at once; lazyfs itself can also lose
//!   unsynced metadata (a rename or a create not followed by a directory fsync), which this
//!   layer never does.
//! - Unsynced bytes are bounded ([`cache::UNSYNCED_BYTES_MAX_DEFAULT`], `--unsynced-bytes-max`):
//!   beyond the bound files are written back (not synced), biggest first, as a kernel writes
//!   back under memory pressure, and what was written back survives a cut.
//! - Files are opened with direct IO, so a shared writable `mmap` is refused; `fallocate` is
//!   not supported (callers write zeros instead); `RENAME_NOREPLACE` / `RENAME_EXCHANGE` are
//!   refused (`EINVAL`).

pub mod cache;
pub mod control;
pub mod daemon;
pub mod fs;
pub mod hold;
pub mod inodes;
pub mod mounts;
pub mod overlay;
