//! The mount's page cache: an [`Overlay`] per file that has unsynced writes, the bound on
//! unsynced bytes, and the mount-wide operations the control socket asks for — a power cut
//! (`cut SEED`) and a write-back of everything (`flush`).
//!
//! Owns which files are dirty and how many bytes they hold. Files are keyed by the mount's
//! inode number, not by path: a page cache belongs to the inode, so a rename keeps a file's
//! unsynced pages and an unlink of its last name drops them. Does IO only through
//! [`Backing`]; never syncs (the file system syncs the backing file after [`Cache::sync`]).

use std::collections::BTreeMap;
use std::io;

use rand::SeedableRng;
use rand::rngs::StdRng;

use super::overlay::{Backing, Overlay, Pages};

/// Most unsynced bytes the mount keeps by default. Beyond the bound the cache writes files
/// back (without syncing), biggest first, as the kernel writes dirty pages back under memory
/// pressure: those writes then survive a cut, as they would survive a real one. A lockd node
/// syncs every WAL group and snapshot, so it holds far less; the bound is for a runaway
/// writer, not for the workload.
pub const UNSYNCED_BYTES_MAX_DEFAULT: u64 = 64 * 1024 * 1024;

/// The smallest bound accepted: one page (a smaller one would write back every write).
pub const UNSYNCED_BYTES_MAX_MIN: u64 = super::overlay::PAGE_BYTES as u64;

/// What a mount-wide cut or flush did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Report {
    /// Files that had unsynced pages.
    pub files: u64,
    /// Pages written through to the backing files.
    pub pages_written: u64,
    /// Unsynced pages thrown away.
    pub pages_dropped: u64,
}

impl Report {
    fn add(&mut self, pages: Pages) {
        self.files += 1;
        self.pages_written += pages.written;
        self.pages_dropped += pages.dropped;
    }
}

/// One dirty file: where its pages go, and the pages.
#[derive(Debug)]
struct Dirty<B> {
    backing: B,
    overlay: Overlay,
    /// Its path in the mount, for the order of a cut (inode numbers differ between runs,
    /// paths do not, so a seed replays the same loss).
    name: String,
}

/// The unsynced pages of every file of a mount.
#[derive(Debug)]
pub struct Cache<B: Backing> {
    files: BTreeMap<u64, Dirty<B>>,
    unsynced_bytes_max: u64,
    /// Pages written back because of the bound, over the mount's life.
    pages_written_back: u64,
}

impl<B: Backing> Cache<B> {
    /// An empty cache that keeps at most `unsynced_bytes_max` unsynced bytes (at least
    /// [`UNSYNCED_BYTES_MAX_MIN`]).
    pub fn new(unsynced_bytes_max: u64) -> Self {
        Self {
            files: BTreeMap::new(),
            unsynced_bytes_max: unsynced_bytes_max.max(UNSYNCED_BYTES_MAX_MIN),
            pages_written_back: 0,
        }
    }

    /// The size of file `ino` as readers see it, if it has unsynced pages.
    pub fn size(&self, ino: u64) -> Option<u64> {
        self.files.get(&ino).map(|d| d.overlay.size())
    }

    /// Keeps a write to file `ino` (path `name`) in memory. The first unsynced write of a
    /// file opens its backing file with `open` (read and write: a partial page is read
    /// first).
    pub fn write(
        &mut self,
        ino: u64,
        name: &str,
        open: impl FnOnce() -> io::Result<B>,
        offset: u64,
        data: &[u8],
    ) -> io::Result<()> {
        let dirty = match self.files.entry(ino) {
            std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::btree_map::Entry::Vacant(e) => {
                let backing = open()?;
                let size = backing.size()?;
                e.insert(Dirty {
                    backing,
                    overlay: Overlay::new(size),
                    name: name.to_owned(),
                })
            }
        };
        dirty.overlay.write(&dirty.backing, offset, data)?;
        self.bound()
    }

    /// Reads file `ino` through its unsynced pages; `None` if it has none (the caller reads
    /// the backing file).
    pub fn read(&self, ino: u64, offset: u64, len: usize) -> Option<io::Result<Vec<u8>>> {
        self.files
            .get(&ino)
            .map(|d| d.overlay.read(&d.backing, offset, len))
    }

    /// Truncates file `ino` through its overlay; `None` if it has no unsynced page (the
    /// caller truncates the backing file).
    pub fn truncate(&mut self, ino: u64, size: u64) -> Option<io::Result<()>> {
        self.files
            .get_mut(&ino)
            .map(|d| d.overlay.truncate(&d.backing, size))
    }

    /// Writes file `ino`'s unsynced pages through (an fsync's first half; the caller syncs).
    pub fn sync(&mut self, ino: u64) -> io::Result<Pages> {
        let Some(mut dirty) = self.files.remove(&ino) else {
            return Ok(Pages::default());
        };
        // On an error the pages already written stay written and the rest are lost with it,
        // as a failed write-back loses them in a kernel: the caller's fsync returns EIO.
        dirty.overlay.write_back(&dirty.backing)
    }

    /// Forgets file `ino`'s unsynced pages (its last name was removed); returns how many.
    pub fn forget(&mut self, ino: u64) -> u64 {
        self.files
            .remove(&ino)
            .map_or(0, |d| d.overlay.pages() as u64)
    }

    /// Notes that file `ino` is now called `name`.
    pub fn rename(&mut self, ino: u64, name: &str) {
        if let Some(d) = self.files.get_mut(&ino) {
            name.clone_into(&mut d.name);
        }
    }

    /// Files with unsynced pages, and the pages.
    pub fn unsynced(&self) -> (u64, u64) {
        let pages = self.files.values().map(|d| d.overlay.pages() as u64).sum();
        (self.files.len() as u64, pages)
    }

    /// Pages written back because of the bound on unsynced bytes, over the mount's life.
    pub fn pages_written_back(&self) -> u64 {
        self.pages_written_back
    }

    /// Writes every file's unsynced pages through (`flush`).
    pub fn flush_all(&mut self) -> io::Result<Report> {
        let mut report = Report::default();
        let mut first_error = None;
        for (_, mut dirty) in std::mem::take(&mut self.files) {
            match dirty.overlay.write_back(&dirty.backing) {
                Ok(pages) => report.add(pages),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        first_error.map_or(Ok(report), Err)
    }

    /// A power cut (`cut SEED`): each file, in the order of its path, loses a random subset of
    /// its unsynced pages drawn from `seed` ([`Overlay::cut`]); the rest are written through.
    /// Afterwards nothing is unsynced.
    pub fn cut_all(&mut self, seed: u64) -> io::Result<Report> {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut files: Vec<Dirty<B>> = std::mem::take(&mut self.files).into_values().collect();
        files.sort_by(|a, b| a.name.cmp(&b.name));
        let mut report = Report::default();
        let mut first_error = None;
        for mut dirty in files {
            match dirty.overlay.cut(&dirty.backing, &mut rng) {
                Ok(pages) => report.add(pages),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        first_error.map_or(Ok(report), Err)
    }

    /// Writes files back, biggest first, until the unsynced bytes are within half the bound
    /// (write-back in batches, not one page per write).
    fn bound(&mut self) -> io::Result<()> {
        let total = |files: &BTreeMap<u64, Dirty<B>>| -> u64 {
            files.values().map(|d| d.overlay.bytes()).sum()
        };
        if total(&self.files) <= self.unsynced_bytes_max {
            return Ok(());
        }
        while total(&self.files) > self.unsynced_bytes_max / 2 {
            let Some(biggest) = self
                .files
                .iter()
                .max_by_key(|(_, d)| d.overlay.pages())
                .map(|(ino, _)| *ino)
            else {
                break;
            };
            let pages = self.sync(biggest)?;
            self.pages_written_back += pages.written;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lazyfs::overlay::{MemFile, PAGE_BYTES};
    use std::rc::Rc;

    /// A backing file shared between the cache and the test, to look at.
    #[derive(Debug, Clone, Default)]
    struct Shared(Rc<MemFile>);

    impl Backing for Shared {
        fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
            self.0.read_at(buf, offset)
        }
        fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
            self.0.write_all_at(buf, offset)
        }
        fn size(&self) -> io::Result<u64> {
            self.0.size()
        }
        fn set_len(&self, len: u64) -> io::Result<()> {
            self.0.set_len(len)
        }
    }

    fn contents(file: &Shared) -> Vec<u8> {
        file.0.0.borrow().clone()
    }

    #[test]
    fn fsync_writes_one_file_through_and_leaves_the_others_unsynced() {
        let (a, b) = (Shared::default(), Shared::default());
        let mut cache = Cache::new(UNSYNCED_BYTES_MAX_DEFAULT);
        cache.write(1, "a", || Ok(a.clone()), 0, b"aaaa").unwrap();
        cache.write(2, "b", || Ok(b.clone()), 0, b"bbbb").unwrap();
        assert_eq!(cache.read(1, 0, 10).unwrap().unwrap(), b"aaaa");
        assert!(
            contents(&a).is_empty(),
            "nothing reaches the file before a sync"
        );
        assert_eq!(cache.sync(1).unwrap().written, 1);
        assert_eq!(contents(&a), b"aaaa");
        assert!(
            cache.read(1, 0, 10).is_none(),
            "a synced file reads from its backing file"
        );
        assert_eq!(cache.unsynced(), (1, 1));
        let report = cache.cut_all(0).unwrap();
        assert_eq!(report.files, 1);
        assert_eq!(report.pages_written + report.pages_dropped, 1);
        assert_eq!(contents(&a), b"aaaa", "a cut never touches synced data");
        assert_eq!(cache.unsynced(), (0, 0));
    }

    #[test]
    fn a_cut_replays_from_its_seed_and_a_flush_loses_nothing() {
        let run = |seed: u64| {
            let files: Vec<Shared> = (0..4).map(|_| Shared::default()).collect();
            let mut cache = Cache::new(UNSYNCED_BYTES_MAX_DEFAULT);
            for (i, f) in files.iter().enumerate() {
                for p in 0..16u64 {
                    let data = vec![i as u8 + 1; PAGE_BYTES];
                    cache
                        .write(
                            i as u64 + 10,
                            &format!("f{i}"),
                            || Ok(f.clone()),
                            p * 4096,
                            &data,
                        )
                        .unwrap();
                }
            }
            let report = cache.cut_all(seed).unwrap();
            (report, files.iter().map(contents).collect::<Vec<_>>())
        };
        let (first, bytes) = run(42);
        assert_eq!(run(42), (first, bytes));
        assert_eq!(first.files, 4);
        assert_eq!(first.pages_written + first.pages_dropped, 64);

        let f = Shared::default();
        let mut cache = Cache::new(UNSYNCED_BYTES_MAX_DEFAULT);
        cache.write(1, "f", || Ok(f.clone()), 5000, b"xy").unwrap();
        let report = cache.flush_all().unwrap();
        assert_eq!((report.pages_written, report.pages_dropped), (1, 0));
        assert_eq!(&contents(&f)[5000..], b"xy");
    }

    #[test]
    fn unsynced_bytes_stay_within_the_bound_by_writing_back() {
        let f = Shared::default();
        let max = 8 * PAGE_BYTES as u64;
        let mut cache = Cache::new(max);
        for p in 0..100u64 {
            cache
                .write(1, "f", || Ok(f.clone()), p * 4096, &[3u8; PAGE_BYTES])
                .unwrap();
            assert!(cache.unsynced().1 * PAGE_BYTES as u64 <= max);
        }
        assert!(cache.pages_written_back() >= 90);
        // What was written back survives any cut.
        cache.cut_all(9).unwrap();
        let data = contents(&f);
        assert!(data[..90 * PAGE_BYTES].iter().all(|&b| b == 3));
    }

    #[test]
    fn an_unlinked_file_loses_its_pages_and_a_renamed_one_keeps_them() {
        let (a, b) = (Shared::default(), Shared::default());
        let mut cache = Cache::new(UNSYNCED_BYTES_MAX_DEFAULT);
        cache.write(1, "a", || Ok(a.clone()), 0, b"a").unwrap();
        cache.write(2, "b", || Ok(b.clone()), 0, b"b").unwrap();
        assert_eq!(cache.forget(1), 1);
        cache.rename(2, "c");
        assert_eq!(cache.size(2), Some(1));
        assert_eq!(cache.flush_all().unwrap().files, 1);
        assert!(contents(&a).is_empty());
        assert_eq!(contents(&b), b"b");
    }
}
