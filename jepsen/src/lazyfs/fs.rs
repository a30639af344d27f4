//! The FUSE file system: a passthrough to a backing directory whose file data goes through
//! the mount's page [`Cache`] — kept in memory until the file is fsynced, lost in part on a
//! cut.
//!
//! Owns the mapping of FUSE requests onto the backing directory: lookups, attributes, open
//! files (handles), reads and writes (through the cache), syncs (through the [`SyncHold`]).
//! Metadata — create, mkdir, rename, unlink, rmdir, link, symlink, truncate, chmod, chown,
//! times — goes to the backing directory at once: unlike lazyfs, which can also lose unsynced
//! metadata, this layer loses only file data. Every error is an errno to the caller (an
//! `io::Error` keeps its own, an unknown inode is `ENOENT`, a bad handle `EBADF`); nothing a
//! request carries can panic it.
//!
//! Files are opened with direct IO (`FOPEN_DIRECT_IO`) and attributes are never cached: every
//! read and `stat` comes here, so nothing the kernel cached can hide what a cut did. A shared
//! writable `mmap` of a file is therefore refused (lockd uses none).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::{File, Metadata, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    OpenAccMode, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};

use super::cache::Cache;
use super::hold::SyncHold;
use super::inodes::{Inodes, ROOT_INO};

/// How long the kernel may cache an entry or attributes: not at all, since a cut changes
/// sizes and contents behind its back.
const TTL: Duration = Duration::ZERO;

/// Block size reported by `stat` for the mount's files (a page).
const BLKSIZE: u32 = 4096;

/// What the file system and the control socket share.
#[derive(Debug)]
pub struct State {
    backing: PathBuf,
    inodes: Inodes,
    handles: HashMap<u64, Handle>,
    next_fh: u64,
    /// The unsynced pages.
    pub cache: Cache<File>,
    /// Whether the daemon runs as root: then what a caller creates is given to the caller's
    /// uid and gid, as a kernel file system would (node processes run as their own users
    /// inside the harness's namespace).
    as_root: bool,
}

/// What a `setattr` changes (each field if given).
#[derive(Debug)]
struct SetAttr {
    mode: Option<u32>,
    uid: Option<u32>,
    gid: Option<u32>,
    size: Option<u64>,
    atime: Option<TimeOrNow>,
    mtime: Option<TimeOrNow>,
}

/// An open file.
#[derive(Debug)]
struct Handle {
    ino: u64,
    file: File,
}

/// The mounted file system (a handle on the shared [`State`] and the [`SyncHold`]).
#[derive(Debug)]
pub struct LazyFs {
    state: Arc<Mutex<State>>,
    hold: Arc<SyncHold>,
}

impl LazyFs {
    /// A file system over `backing`, keeping at most `unsynced_bytes_max` unsynced bytes.
    pub fn new(backing: &Path, unsynced_bytes_max: u64) -> io::Result<Self> {
        let backing = backing.canonicalize()?;
        let meta = std::fs::metadata(&backing)?;
        if !meta.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::NotADirectory,
                format!("{} is not a directory", backing.display()),
            ));
        }
        Ok(Self {
            state: Arc::new(Mutex::new(State {
                backing,
                inodes: Inodes::new(meta.ino()),
                handles: HashMap::new(),
                next_fh: 1,
                cache: Cache::new(unsynced_bytes_max),
                as_root: rustix::process::geteuid().is_root(),
            })),
            hold: Arc::new(SyncHold::default()),
        })
    }

    /// The state, for the control socket.
    pub fn state(&self) -> Arc<Mutex<State>> {
        Arc::clone(&self.state)
    }

    /// The syncs' gate, for the control socket.
    pub fn hold(&self) -> Arc<SyncHold> {
        Arc::clone(&self.hold)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A time from seconds and nanoseconds since the epoch (`stat`'s form), clamped to the epoch.
fn time(secs: i64, nsecs: i64) -> SystemTime {
    u64::try_from(secs)
        .ok()
        .and_then(|s| UNIX_EPOCH.checked_add(Duration::new(s, u32::try_from(nsecs).unwrap_or(0))))
        .unwrap_or(UNIX_EPOCH)
}

/// FUSE attributes of a backing file, as inode `ino`, with `size` if it has unsynced pages.
fn attr(ino: u64, m: &Metadata, size: Option<u64>) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size: size.unwrap_or(m.size()),
        blocks: m.blocks(),
        atime: time(m.atime(), m.atime_nsec()),
        mtime: time(m.mtime(), m.mtime_nsec()),
        ctime: time(m.ctime(), m.ctime_nsec()),
        crtime: UNIX_EPOCH,
        kind: FileType::from_std(m.file_type()).unwrap_or(FileType::RegularFile),
        perm: (m.mode() & 0o7777) as u16,
        nlink: u32::try_from(m.nlink()).unwrap_or(u32::MAX),
        uid: m.uid(),
        gid: m.gid(),
        rdev: u32::try_from(m.rdev()).unwrap_or(0),
        blksize: BLKSIZE,
        flags: 0,
    }
}

fn errno(e: &io::Error) -> Errno {
    e.raw_os_error().map_or(Errno::EIO, Errno::from_i32)
}

impl State {
    fn full(&self, rel: &Path) -> PathBuf {
        self.backing.join(rel)
    }

    fn path(&self, ino: INodeNo) -> Result<PathBuf, Errno> {
        self.inodes
            .path(ino.0)
            .map(Path::to_path_buf)
            .ok_or(Errno::ENOENT)
    }

    /// The relative path of `name` in directory `parent`.
    fn child(&self, parent: INodeNo, name: &OsStr) -> Result<PathBuf, Errno> {
        let bytes = name.as_encoded_bytes();
        if bytes.is_empty() || bytes == b"." || bytes == b".." || bytes.contains(&b'/') {
            return Err(Errno::EINVAL);
        }
        Ok(self.path(parent)?.join(name))
    }

    /// Looks `rel` up in the backing directory and notes its inode.
    fn entry(&mut self, rel: PathBuf) -> Result<FileAttr, Errno> {
        let m = std::fs::symlink_metadata(self.full(&rel)).map_err(|e| errno(&e))?;
        let ino = self.inodes.ino(m.ino());
        self.inodes.insert(ino, rel);
        Ok(attr(ino, &m, self.cache.size(ino)))
    }

    /// Attributes of inode `ino` (through handle `fh` if given: the file may have no name).
    fn getattr(&self, ino: INodeNo, fh: Option<FileHandle>) -> Result<FileAttr, Errno> {
        let m = match fh.and_then(|fh| self.handles.get(&fh.0)) {
            Some(h) => h.file.metadata(),
            None => std::fs::symlink_metadata(self.full(&self.path(ino)?)),
        }
        .map_err(|e| errno(&e))?;
        Ok(attr(ino.0, &m, self.cache.size(ino.0)))
    }

    /// Gives a created file to the caller (as root only; otherwise it is the daemon's).
    fn give(&self, rel: &Path, req: &Request) -> Result<(), Errno> {
        if self.as_root {
            std::os::unix::fs::lchown(self.full(rel), Some(req.uid()), Some(req.gid()))
                .map_err(|e| errno(&e))?;
        }
        Ok(())
    }

    fn add_handle(&mut self, ino: u64, file: File) -> u64 {
        let fh = self.next_fh;
        self.next_fh += 1;
        self.handles.insert(fh, Handle { ino, file });
        fh
    }

    /// Forgets the unsynced pages of the file at `rel` if removing that name removes its last
    /// link (`nlink` of 1 before the removal).
    fn forget_if_last(&mut self, rel: &Path) {
        if let Ok(m) = std::fs::symlink_metadata(self.full(rel))
            && m.is_file()
            && m.nlink() <= 1
        {
            let ino = self.inodes.ino(m.ino());
            self.cache.forget(ino);
        }
    }

    fn setattr(
        &mut self,
        ino: INodeNo,
        fh: Option<FileHandle>,
        change: SetAttr,
    ) -> Result<FileAttr, Errno> {
        let SetAttr {
            mode,
            uid,
            gid,
            size,
            atime,
            mtime,
        } = change;
        let io_err = |e: io::Error| errno(&e);
        let by_handle = fh.is_some_and(|fh| self.handles.contains_key(&fh.0));
        let full = if by_handle {
            None
        } else {
            Some(self.full(&self.path(ino)?))
        };
        let open = |state: &Self, write: bool| -> Result<File, Errno> {
            match (fh.and_then(|fh| state.handles.get(&fh.0)), &full) {
                (Some(h), _) => h.file.try_clone().map_err(io_err),
                (None, Some(path)) => OpenOptions::new()
                    .read(true)
                    .write(write)
                    .open(path)
                    .map_err(io_err),
                (None, None) => Err(Errno::EBADF),
            }
        };
        if let Some(mode) = mode {
            let file = open(self, false)?;
            file.set_permissions(std::fs::Permissions::from_mode(mode & 0o7777))
                .map_err(io_err)?;
        }
        if uid.is_some() || gid.is_some() {
            match &full {
                Some(path) => std::os::unix::fs::lchown(path, uid, gid).map_err(io_err)?,
                None => std::os::unix::fs::fchown(&open(self, false)?, uid, gid).map_err(io_err)?,
            }
        }
        if let Some(size) = size {
            match self.cache.truncate(ino.0, size) {
                Some(done) => done.map_err(io_err)?,
                None => open(self, true)?.set_len(size).map_err(io_err)?,
            }
        }
        if atime.is_some() || mtime.is_some() {
            let when = |t: TimeOrNow| match t {
                TimeOrNow::SpecificTime(t) => t,
                TimeOrNow::Now => SystemTime::now(),
            };
            let mut times = std::fs::FileTimes::new();
            if let Some(t) = atime {
                times = times.set_accessed(when(t));
            }
            if let Some(t) = mtime {
                times = times.set_modified(when(t));
            }
            open(self, false)?.set_times(times).map_err(io_err)?;
        }
        self.getattr(ino, fh)
    }

    fn open(&mut self, ino: INodeNo, flags: OpenFlags) -> Result<u64, Errno> {
        let full = self.full(&self.path(ino)?);
        let writes = flags.acc_mode() != OpenAccMode::O_RDONLY;
        // Read access always, write access for a writer (a partial page is read before it
        // is written); never O_APPEND (the kernel gives each write its offset), and O_TRUNC
        // goes through the cache, which may hold pages of the file.
        let file = OpenOptions::new()
            .read(true)
            .write(writes)
            .open(&full)
            .map_err(|e| errno(&e))?;
        if flags.0 & libc::O_TRUNC != 0 && writes {
            match self.cache.truncate(ino.0, 0) {
                Some(done) => done.map_err(|e| errno(&e))?,
                None => file.set_len(0).map_err(|e| errno(&e))?,
            }
        }
        Ok(self.add_handle(ino.0, file))
    }

    fn create(
        &mut self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
    ) -> Result<(FileAttr, u64), Errno> {
        let rel = self.child(parent, name)?;
        let mut options = OpenOptions::new();
        options.read(true).write(true).mode(mode & !umask & 0o7777);
        if flags & libc::O_EXCL != 0 {
            options.create_new(true);
        } else {
            options.create(true);
        }
        let file = options.open(self.full(&rel)).map_err(|e| errno(&e))?;
        self.give(&rel, req)?;
        let attr = self.entry(rel)?;
        if flags & libc::O_TRUNC != 0 {
            match self.cache.truncate(attr.ino.0, 0) {
                Some(done) => done.map_err(|e| errno(&e))?,
                None => file.set_len(0).map_err(|e| errno(&e))?,
            }
        }
        let fh = self.add_handle(attr.ino.0, file);
        Ok((attr, fh))
    }

    fn read(&self, ino: INodeNo, fh: FileHandle, offset: u64, size: u32) -> Result<Vec<u8>, Errno> {
        if let Some(data) = self.cache.read(ino.0, offset, size as usize) {
            return data.map_err(|e| errno(&e));
        }
        let handle = self.handles.get(&fh.0).ok_or(Errno::EBADF)?;
        let mut buf = vec![0u8; size as usize];
        let mut done = 0;
        while done < buf.len() {
            match std::os::unix::fs::FileExt::read_at(
                &handle.file,
                &mut buf[done..],
                offset + done as u64,
            ) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(errno(&e)),
            }
        }
        buf.truncate(done);
        Ok(buf)
    }

    fn write(&mut self, fh: FileHandle, offset: u64, data: &[u8]) -> Result<u32, Errno> {
        let written = u32::try_from(data.len()).map_err(|_| Errno::EINVAL)?;
        let State {
            handles,
            cache,
            inodes,
            ..
        } = self;
        let handle = handles.get(&fh.0).ok_or(Errno::EBADF)?;
        let name = inodes
            .path(handle.ino)
            .map_or_else(String::new, |p| p.to_string_lossy().into_owned());
        cache
            .write(handle.ino, &name, || handle.file.try_clone(), offset, data)
            .map_err(|e| errno(&e))?;
        Ok(written)
    }

    /// An fsync: the file's pages written through, then the backing file synced.
    fn fsync(&mut self, ino: INodeNo, fh: FileHandle, datasync: bool) -> Result<(), Errno> {
        self.cache.sync(ino.0).map_err(|e| errno(&e))?;
        let synced = match self.handles.get(&fh.0) {
            Some(h) if datasync => h.file.sync_data(),
            Some(h) => h.file.sync_all(),
            None => File::open(self.full(&self.path(ino)?)).and_then(|f| f.sync_all()),
        };
        synced.map_err(|e| errno(&e))
    }

    fn release(&mut self, fh: FileHandle) {
        if let Some(handle) = self.handles.remove(&fh.0)
            && handle.file.metadata().is_ok_and(|m| m.nlink() == 0)
        {
            // The last name went while it was open: nothing can ever read its pages.
            self.cache.forget(handle.ino);
        }
    }

    fn readdir(&self, ino: INodeNo) -> Result<Vec<(u64, FileType, std::ffi::OsString)>, Errno> {
        let rel = self.path(ino)?;
        let full = self.full(&rel);
        let parent_ino = match rel.parent() {
            Some(parent) if !rel.as_os_str().is_empty() => std::fs::metadata(self.full(parent))
                .map(|m| self.inodes.ino(m.ino()))
                .unwrap_or(ROOT_INO),
            _ => ROOT_INO,
        };
        let mut entries = vec![
            (ino.0, FileType::Directory, ".".into()),
            (parent_ino, FileType::Directory, "..".into()),
        ];
        let mut names = Vec::new();
        for entry in std::fs::read_dir(&full).map_err(|e| errno(&e))? {
            let entry = entry.map_err(|e| errno(&e))?;
            let kind = entry
                .file_type()
                .ok()
                .and_then(FileType::from_std)
                .unwrap_or(FileType::RegularFile);
            let backing_ino = std::os::unix::fs::DirEntryExt::ino(&entry);
            names.push((self.inodes.ino(backing_ino), kind, entry.file_name()));
        }
        // One order for every call, so offsets into it stay valid between calls.
        names.sort_by(|a, b| a.2.cmp(&b.2));
        entries.extend(names);
        Ok(entries)
    }
}

impl Filesystem for LazyFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let mut state = self.lock();
        match state.child(parent, name).and_then(|rel| state.entry(rel)) {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.lock().getattr(ino, fh) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let change = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime,
            mtime,
        };
        match self.lock().setattr(ino, fh, change) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let state = self.lock();
        match state
            .path(ino)
            .and_then(|rel| std::fs::read_link(state.full(&rel)).map_err(|e| errno(&e)))
        {
            Ok(target) => reply.data(target.as_os_str().as_encoded_bytes()),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let mut state = self.lock();
        let made = state.child(parent, name).and_then(|rel| {
            std::fs::DirBuilder::new()
                .mode(mode & !umask & 0o7777)
                .create(state.full(&rel))
                .map_err(|e| errno(&e))?;
            state.give(&rel, req)?;
            state.entry(rel)
        });
        match made {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut state = self.lock();
        let done = state.child(parent, name).and_then(|rel| {
            state.forget_if_last(&rel);
            std::fs::remove_file(state.full(&rel)).map_err(|e| errno(&e))?;
            state.inodes.remove(&rel);
            Ok(())
        });
        match done {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut state = self.lock();
        let done = state.child(parent, name).and_then(|rel| {
            std::fs::remove_dir(state.full(&rel)).map_err(|e| errno(&e))?;
            state.inodes.remove(&rel);
            Ok(())
        });
        match done {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let mut state = self.lock();
        let made = state.child(parent, link_name).and_then(|rel| {
            std::os::unix::fs::symlink(target, state.full(&rel)).map_err(|e| errno(&e))?;
            state.give(&rel, req)?;
            state.entry(rel)
        });
        match made {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        if !flags.is_empty() {
            // RENAME_NOREPLACE / RENAME_EXCHANGE: std has no call for them.
            reply.error(Errno::EINVAL);
            return;
        }
        let mut state = self.lock();
        let done = state.child(parent, name).and_then(|from| {
            let to = state.child(newparent, newname)?;
            let moved = std::fs::symlink_metadata(state.full(&from)).map_err(|e| errno(&e))?;
            state.forget_if_last(&to);
            std::fs::rename(state.full(&from), state.full(&to)).map_err(|e| errno(&e))?;
            state.inodes.rename(&from, &to);
            let ino = state.inodes.ino(moved.ino());
            state.inodes.insert(ino, to.clone());
            state.cache.rename(ino, &to.to_string_lossy());
            Ok(())
        });
        match done {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let mut state = self.lock();
        let made = state.path(ino).and_then(|from| {
            let to = state.child(newparent, newname)?;
            std::fs::hard_link(state.full(&from), state.full(&to)).map_err(|e| errno(&e))?;
            state.entry(to)
        });
        match made {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        match self.lock().open(ino, flags) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::FOPEN_DIRECT_IO),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyData,
    ) {
        match self.lock().read(ino, fh, offset, size) {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.lock().write(fh, offset, data) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: fuser::LockOwner,
        reply: ReplyEmpty,
    ) {
        // close(2) is not a sync: the pages stay unsynced.
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.lock().release(fh);
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        // Wait outside the state's lock: the control socket cuts while a sync is held.
        self.hold.wait();
        match self.lock().fsync(ino, fh, datasync) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let state = self.lock();
        match state.path(ino).and_then(|rel| {
            std::fs::metadata(state.full(&rel))
                .map_err(|e| errno(&e))?
                .is_dir()
                .then_some(())
                .ok_or(Errno::ENOTDIR)
        }) {
            Ok(()) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let entries = match self.lock().readdir(ino) {
            Ok(entries) => entries,
            Err(e) => {
                reply.error(e);
                return;
            }
        };
        let skip = usize::try_from(offset).unwrap_or(usize::MAX);
        for (i, (ino, kind, name)) in entries.into_iter().enumerate().skip(skip) {
            if reply.add(INodeNo(ino), i as u64 + 1, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.hold.wait();
        let state = self.lock();
        match state.path(ino).and_then(|rel| {
            File::open(state.full(&rel))
                .and_then(|d| d.sync_all())
                .map_err(|e| errno(&e))
        }) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let backing = self.lock().backing.clone();
        match rustix::fs::statvfs(&backing) {
            Ok(s) => reply.statfs(
                s.f_blocks,
                s.f_bfree,
                s.f_bavail,
                s.f_files,
                s.f_ffree,
                u32::try_from(s.f_bsize).unwrap_or(BLKSIZE),
                u32::try_from(s.f_namemax).unwrap_or(255),
                u32::try_from(s.f_frsize).unwrap_or(BLKSIZE),
            ),
            Err(e) => reply.error(Errno::from_i32(e.raw_os_error())),
        }
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        // The kernel checks permissions itself (`default_permissions`); this only says the
        // file exists.
        match self.lock().getattr(ino, None) {
            Ok(_) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        match self.lock().create(req, parent, name, mode, umask, flags) {
            Ok((attr, fh)) => reply.created(
                &TTL,
                &attr,
                Generation(0),
                FileHandle(fh),
                FopenFlags::FOPEN_DIRECT_IO,
            ),
            Err(e) => reply.error(e),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        _length: u64,
        _mode: i32,
        reply: ReplyEmpty,
    ) {
        // Preallocation would change the size under the cache's overlay; callers fall back
        // to writing zeros (posix_fallocate does), which the cache handles.
        reply.error(Errno::EOPNOTSUPP);
    }
}
