//! A simulated disk that can lose power, for tests: it keeps what each file held at its last
//! sync and, on [`PowerCutDisk::power_cut`], throws away a random part of everything written
//! since, the way a machine that loses power does.
//!
//! The model, and why each rule:
//!
//! - **Reads see every write** (the page cache), synced or not.
//! - **`sync_data` makes the file's content and length durable**; nothing else does. A power
//!   cut leaves every byte below a file's synced content as it was synced.
//! - **Unsynced writes survive by whole pages, in any subset and in no order.** The kernel
//!   writes dirty pages back when it likes, so each page that changed since the last sync ends
//!   up holding its synced content or the content it had after any one of the writes that
//!   touched it (a page written back between two writes keeps the first). One page keeps its
//!   newest content while the page before it reverts; that is how frame k can be torn with
//!   frame k+1 intact.
//! - **The length is journaled apart from the data**: after a cut a file has its synced length
//!   or the length it had after any one of its later writes or truncations. Bytes past the
//!   synced length that no surviving page covers read as zeros (a hole).
//! - **Names are durable only once their directory is fsynced.** A directory's creations,
//!   renames and removals since its last fsync survive as a random prefix, in order (a
//!   journaling file system commits metadata in order). A file whose name did not survive is
//!   gone, whatever was synced in it.
//! - Directories themselves are durable when created (the store fsyncs their parents; the WAL
//!   and the snapshot store never rely on a directory vanishing).
//!
//! After a cut, every handle of the old "boot" fails (`the power is off`), so a store still
//! running on it can change nothing; [`PowerCutDisk::power_cut`] returns the handle of the
//! rebooted disk.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::OsString;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use rand::Rng;

/// The unit in which unsynced data reaches the disk, or not.
pub(crate) const PAGE_BYTES: usize = 4096;

/// A handle to a simulated disk of one boot. Clones share the disk.
#[derive(Clone)]
pub(crate) struct PowerCutDisk {
    sim: Arc<Mutex<Sim>>,
    /// The boot this handle belongs to; a cut starts the next one.
    boot: u64,
}

/// An open file of a [`PowerCutDisk`].
#[derive(Debug)]
pub(crate) struct PowerCutFile {
    disk: PowerCutDisk,
    inode: u64,
}

/// What the last power cut threw away, for tests to check that a cut did cut something.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct CutReport {
    /// Pages that changed since their file's last sync.
    pub pages_pending: usize,
    /// Of those, pages that reverted to their synced content or an older unsynced one.
    pub pages_lost: usize,
    /// Files whose name did not survive.
    pub files_lost: usize,
}

struct Sim {
    boot: u64,
    /// See [`PowerCutDisk::wal_segment_bytes`].
    wal_segment_bytes: u64,
    inodes: HashMap<u64, Inode>,
    next_inode: u64,
    /// File names as the running system sees them.
    names: BTreeMap<PathBuf, u64>,
    /// File names as the disk holds them: as of each directory's last fsync.
    durable_names: BTreeMap<PathBuf, u64>,
    /// Name operations since each directory's last fsync, oldest first.
    dir_ops: BTreeMap<PathBuf, Vec<NameOp>>,
    dirs: BTreeSet<PathBuf>,
}

#[derive(Clone, Debug)]
enum NameOp {
    Link { name: PathBuf, inode: u64 },
    Rename { from: PathBuf, to: PathBuf },
    Unlink { name: PathBuf },
}

impl NameOp {
    fn apply(&self, names: &mut BTreeMap<PathBuf, u64>) {
        match self {
            NameOp::Link { name, inode } => {
                names.insert(name.clone(), *inode);
            }
            NameOp::Rename { from, to } => {
                if let Some(inode) = names.remove(from) {
                    names.insert(to.clone(), inode);
                }
            }
            NameOp::Unlink { name } => {
                names.remove(name);
            }
        }
    }
}

#[derive(Default)]
struct Inode {
    /// The content as of the last sync.
    durable: Vec<u8>,
    /// The content reads see.
    current: Vec<u8>,
    /// For each page changed since the last sync, its content after each change, oldest first.
    page_versions: BTreeMap<usize, Vec<Box<[u8]>>>,
    /// The length after each change since the last sync.
    lengths: Vec<usize>,
}

impl Inode {
    fn record_pages(&mut self, first_byte: usize, end_byte: usize) {
        if end_byte <= first_byte {
            return;
        }
        for page in first_byte / PAGE_BYTES..=(end_byte - 1) / PAGE_BYTES {
            let mut content = vec![0u8; PAGE_BYTES].into_boxed_slice();
            let start = page * PAGE_BYTES;
            let end = (start + PAGE_BYTES).min(self.current.len());
            if start < end {
                content[..end - start].copy_from_slice(&self.current[start..end]);
            }
            self.page_versions.entry(page).or_default().push(content);
        }
        self.lengths.push(self.current.len());
    }

    fn write_at(&mut self, bytes: &[u8], offset: usize) {
        let end = offset + bytes.len();
        if self.current.len() < end {
            self.current.resize(end, 0);
        }
        self.current[offset..end].copy_from_slice(bytes);
        self.record_pages(offset, end);
    }

    fn set_len(&mut self, len: usize) {
        let old = self.current.len();
        self.current.resize(len, 0);
        // Pages between the two lengths change (zeros in, or bytes gone).
        self.record_pages(old.min(len), old.max(len));
        if old == len {
            self.lengths.push(len);
        }
    }

    fn sync(&mut self) {
        self.durable.clone_from(&self.current);
        self.page_versions.clear();
        self.lengths.clear();
    }

    /// The content after a power cut (see the module doc), counting pages into `report`.
    fn cut(&mut self, rng: &mut impl Rng, report: &mut CutReport) {
        if self.lengths.is_empty() {
            self.current.clone_from(&self.durable);
            return;
        }
        let pick = rng.gen_range(0..=self.lengths.len());
        let len = if pick == 0 {
            self.durable.len()
        } else {
            self.lengths[pick - 1]
        };
        let mut content = vec![0u8; len];
        let keep = len.min(self.durable.len());
        content[..keep].copy_from_slice(&self.durable[..keep]);
        for (page, versions) in &self.page_versions {
            report.pages_pending += 1;
            let version = rng.gen_range(0..=versions.len());
            if version < versions.len() {
                report.pages_lost += 1;
            }
            if version == 0 {
                // The synced content (already in place), or a hole past the synced length.
                continue;
            }
            let start = page * PAGE_BYTES;
            if start >= len {
                continue;
            }
            let end = (start + PAGE_BYTES).min(len);
            content[start..end].copy_from_slice(&versions[version - 1][..end - start]);
        }
        self.current = content;
        self.sync();
    }
}

/// The seed of a randomized power-cut test: `SEED` from the environment, or a random one.
/// Printed, so a failure can be rerun with `SEED=<n>`.
pub(crate) fn seed() -> u64 {
    let seed = std::env::var("SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::thread_rng().r#gen());
    println!("SEED={seed}");
    seed
}

/// Rounds of a randomized power-cut test: `CUT_ROUNDS` from the environment, or `default`.
pub(crate) fn rounds(default: usize) -> usize {
    std::env::var("CUT_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn power_off() -> io::Error {
    io::Error::other("the power is off (simulated power cut)")
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{}: no such file", path.display()),
    )
}

fn parent(path: &Path) -> PathBuf {
    path.parent().map(Path::to_path_buf).unwrap_or_default()
}

/// The WAL segment size on a simulated disk: small, so tests rotate and purge segments.
pub(crate) const WAL_SEGMENT_BYTES: u64 = 256 * 1024;

impl Default for PowerCutDisk {
    fn default() -> Self {
        PowerCutDisk::new()
    }
}

impl fmt::Debug for PowerCutDisk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PowerCutDisk")
            .field("boot", &self.boot)
            .finish_non_exhaustive()
    }
}

impl PowerCutDisk {
    /// An empty disk.
    pub(crate) fn new() -> PowerCutDisk {
        let sim = Sim {
            boot: 0,
            wal_segment_bytes: WAL_SEGMENT_BYTES,
            inodes: HashMap::new(),
            next_inode: 0,
            names: BTreeMap::new(),
            durable_names: BTreeMap::new(),
            dir_ops: BTreeMap::new(),
            dirs: BTreeSet::new(),
        };
        PowerCutDisk {
            sim: Arc::new(Mutex::new(sim)),
            boot: 0,
        }
    }

    /// The WAL segment size on this disk ([`WAL_SEGMENT_BYTES`]).
    pub(crate) fn wal_segment_bytes(&self) -> u64 {
        self.sim
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .wal_segment_bytes
    }

    /// The disk's state, if this handle's boot is the current one.
    fn sim(&self) -> io::Result<MutexGuard<'_, Sim>> {
        let sim = self.sim.lock().unwrap_or_else(PoisonError::into_inner);
        if sim.boot != self.boot {
            return Err(power_off());
        }
        Ok(sim)
    }

    /// Cuts the power: every file keeps its synced content plus a random part of its later
    /// writes, every directory its synced names plus a random prefix of its later changes (see
    /// the module doc). Handles of this boot fail from now on; the returned handle is the
    /// rebooted disk's.
    pub(crate) fn power_cut(&self, rng: &mut impl Rng) -> (PowerCutDisk, CutReport) {
        let mut sim = self.sim.lock().unwrap_or_else(PoisonError::into_inner);
        let mut report = CutReport::default();
        let dir_ops = std::mem::take(&mut sim.dir_ops);
        for ops in dir_ops.values() {
            let kept = rng.gen_range(0..=ops.len());
            for op in &ops[..kept] {
                op.apply(&mut sim.durable_names);
            }
        }
        let live: BTreeSet<u64> = sim.durable_names.values().copied().collect();
        let before = sim.names.len();
        sim.names = sim.durable_names.clone();
        report.files_lost = before.saturating_sub(sim.names.len());
        sim.inodes.retain(|inode, _| live.contains(inode));
        let mut inodes: Vec<_> = sim.inodes.iter_mut().collect();
        // HashMap order is not seeded: cut the files in inode order so a seed reruns exactly.
        inodes.sort_unstable_by_key(|(inode, _)| **inode);
        for (_, inode) in inodes {
            inode.cut(rng, &mut report);
        }
        sim.boot += 1;
        let disk = PowerCutDisk {
            sim: self.sim.clone(),
            boot: sim.boot,
        };
        (disk, report)
    }

    pub(crate) fn exists(&self, path: &Path) -> bool {
        self.sim()
            .map(|sim| sim.dirs.contains(path) || sim.names.contains_key(path))
            .unwrap_or(false)
    }

    pub(crate) fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        let mut sim = self.sim()?;
        for dir in path.ancestors() {
            if !dir.as_os_str().is_empty() {
                sim.dirs.insert(dir.to_path_buf());
            }
        }
        Ok(())
    }

    pub(crate) fn list_dir(&self, dir: &Path) -> io::Result<Vec<OsString>> {
        let sim = self.sim()?;
        if !sim.dirs.contains(dir) {
            return Err(not_found(dir));
        }
        let files = sim.names.keys().map(PathBuf::as_path);
        let dirs = sim.dirs.iter().map(PathBuf::as_path);
        Ok(files
            .chain(dirs)
            .filter(|p| p.parent() == Some(dir))
            .filter_map(|p| p.file_name().map(OsString::from))
            .collect())
    }

    fn link(sim: &mut Sim, path: &Path) -> io::Result<u64> {
        if !sim.dirs.contains(&parent(path)) {
            return Err(not_found(&parent(path)));
        }
        let inode = sim.next_inode;
        sim.next_inode += 1;
        sim.inodes.insert(inode, Inode::default());
        sim.names.insert(path.to_path_buf(), inode);
        sim.dir_ops
            .entry(parent(path))
            .or_default()
            .push(NameOp::Link {
                name: path.to_path_buf(),
                inode,
            });
        Ok(inode)
    }

    pub(crate) fn create_new(&self, path: &Path) -> io::Result<PowerCutFile> {
        let mut sim = self.sim()?;
        if sim.names.contains_key(path) || sim.dirs.contains(path) {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists", path.display()),
            ));
        }
        let inode = Self::link(&mut sim, path)?;
        Ok(PowerCutFile {
            disk: self.clone(),
            inode,
        })
    }

    pub(crate) fn open_rw(&self, path: &Path) -> io::Result<PowerCutFile> {
        let sim = self.sim()?;
        let inode = *sim.names.get(path).ok_or_else(|| not_found(path))?;
        Ok(PowerCutFile {
            disk: self.clone(),
            inode,
        })
    }

    pub(crate) fn write_synced(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        let mut sim = self.sim()?;
        let inode = match sim.names.get(path) {
            Some(inode) => *inode,
            None => Self::link(&mut sim, path)?,
        };
        let file = sim.inodes.get_mut(&inode).ok_or_else(|| not_found(path))?;
        file.set_len(0);
        file.write_at(bytes, 0);
        file.sync();
        Ok(())
    }

    pub(crate) fn len(&self, path: &Path) -> io::Result<u64> {
        let sim = self.sim()?;
        let inode = sim.names.get(path).ok_or_else(|| not_found(path))?;
        Ok(sim.inodes.get(inode).map_or(0, |f| f.current.len() as u64))
    }

    pub(crate) fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        let sim = self.sim()?;
        let inode = sim.names.get(path).ok_or_else(|| not_found(path))?;
        Ok(sim
            .inodes
            .get(inode)
            .map(|f| f.current.clone())
            .unwrap_or_default())
    }

    pub(crate) fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut sim = self.sim()?;
        if parent(from) != parent(to) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "the simulated disk renames within a directory only",
            ));
        }
        let inode = sim.names.remove(from).ok_or_else(|| not_found(from))?;
        sim.names.insert(to.to_path_buf(), inode);
        sim.dir_ops
            .entry(parent(from))
            .or_default()
            .push(NameOp::Rename {
                from: from.to_path_buf(),
                to: to.to_path_buf(),
            });
        Ok(())
    }

    pub(crate) fn remove_file(&self, path: &Path) -> io::Result<()> {
        let mut sim = self.sim()?;
        sim.names.remove(path).ok_or_else(|| not_found(path))?;
        sim.dir_ops
            .entry(parent(path))
            .or_default()
            .push(NameOp::Unlink {
                name: path.to_path_buf(),
            });
        Ok(())
    }

    pub(crate) fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let mut sim = self.sim()?;
        if !sim.dirs.contains(dir) {
            return Err(not_found(dir));
        }
        let ops = sim.dir_ops.remove(dir).unwrap_or_default();
        for op in &ops {
            op.apply(&mut sim.durable_names);
        }
        Ok(())
    }
}

impl PowerCutFile {
    fn with<T>(&self, f: impl FnOnce(&mut Inode) -> io::Result<T>) -> io::Result<T> {
        let mut sim = self.disk.sim()?;
        // An unlinked file stays readable and writable through its open handles until the
        // power goes.
        let inode = sim.inodes.get_mut(&self.inode).ok_or_else(power_off)?;
        f(inode)
    }

    pub(crate) fn write_all_at(&self, bytes: &[u8], offset: u64) -> io::Result<()> {
        let offset = usize::try_from(offset).map_err(io::Error::other)?;
        self.with(|inode| {
            inode.write_at(bytes, offset);
            Ok(())
        })
    }

    pub(crate) fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let offset = usize::try_from(offset).map_err(io::Error::other)?;
        self.with(|inode| {
            let bytes = offset
                .checked_add(buf.len())
                .and_then(|end| inode.current.get(offset..end))
                .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
            buf.copy_from_slice(bytes);
            Ok(())
        })
    }

    pub(crate) fn read_all(&self) -> io::Result<Vec<u8>> {
        self.with(|inode| Ok(inode.current.clone()))
    }

    pub(crate) fn set_len(&self, len: u64) -> io::Result<()> {
        let len = usize::try_from(len).map_err(io::Error::other)?;
        self.with(|inode| {
            inode.set_len(len);
            Ok(())
        })
    }

    pub(crate) fn sync_data(&self) -> io::Result<()> {
        self.with(|inode| {
            inode.sync();
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    use super::*;

    fn disk_with_dir() -> (PowerCutDisk, PathBuf) {
        let disk = PowerCutDisk::new();
        let dir = PathBuf::from("/data");
        disk.create_dir_all(&dir).expect("mkdir");
        (disk, dir)
    }

    #[test]
    fn synced_bytes_survive_every_cut_and_unsynced_pages_survive_some() {
        let mut rng = StdRng::seed_from_u64(7);
        let mut lost_any = false;
        let mut kept_any = false;
        for _ in 0..50 {
            let (disk, dir) = disk_with_dir();
            let path = dir.join("f");
            let file = disk.create_new(&path).expect("create");
            file.write_all_at(&[1u8; 3 * PAGE_BYTES], 0).expect("write");
            file.sync_data().expect("sync");
            disk.sync_dir(&dir).expect("sync dir");
            // Three pages of twos over the ones, one page past the synced end.
            file.write_all_at(&[2u8; 3 * PAGE_BYTES], PAGE_BYTES as u64)
                .expect("write");
            let (disk, report) = disk.power_cut(&mut rng);
            assert_eq!(report.pages_pending, 3);
            let bytes = disk.read(&path).expect("read");
            assert!(bytes.len() == 3 * PAGE_BYTES || bytes.len() == 4 * PAGE_BYTES);
            assert_eq!(bytes[..PAGE_BYTES], [1u8; PAGE_BYTES]);
            for page in 1..bytes.len() / PAGE_BYTES {
                let content = &bytes[page * PAGE_BYTES..(page + 1) * PAGE_BYTES];
                let old = if page < 3 { 1 } else { 0 };
                assert!(
                    content.iter().all(|b| *b == 2) || content.iter().all(|b| *b == old),
                    "page {page} is whole"
                );
                lost_any |= content[0] != 2;
                kept_any |= content[0] == 2;
            }
            assert!(file.write_all_at(b"x", 0).is_err(), "old handles are dead");
        }
        assert!(lost_any && kept_any, "cuts keep some pages and lose others");
    }

    #[test]
    fn a_name_is_durable_only_once_its_directory_is_synced() {
        let mut rng = StdRng::seed_from_u64(1);
        let mut outcomes = BTreeSet::new();
        for _ in 0..40 {
            let (disk, dir) = disk_with_dir();
            let tmp = dir.join("a.tmp");
            disk.write_synced(&tmp, b"snapshot").expect("write");
            disk.rename(&tmp, &dir.join("a.snap")).expect("rename");
            let (disk, _) = disk.power_cut(&mut rng);
            // Creation and rename survive as a prefix: nothing, the temp file, or the final name.
            let names = disk.list_dir(&dir).expect("list");
            outcomes.insert(format!("{names:?}"));
            assert!(names.len() <= 1, "{names:?}");
        }
        assert_eq!(outcomes.len(), 3, "{outcomes:?}");
        let (disk, dir) = disk_with_dir();
        disk.write_synced(&dir.join("b"), b"kept").expect("write");
        disk.sync_dir(&dir).expect("sync dir");
        let (disk, _) = disk.power_cut(&mut rng);
        assert_eq!(disk.read(&dir.join("b")).expect("read"), b"kept");
    }
}
