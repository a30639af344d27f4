//! One file's unsynced writes: the pages written since its last sync, kept in memory over the
//! backing file, as a page cache holds them before write-back.
//!
//! Owns the page arithmetic and the file's size as readers see it. Reads see the overlay
//! (read-your-writes); a sync writes every page through; a cut drops a random subset of the
//! pages — whole pages, chosen independently, so what survives is not a prefix — and writes
//! the rest through, as a power cut during a partial write-back would leave the disk. Does IO
//! only through [`Backing`], so its rules are tested on memory; never syncs (the caller does,
//! after [`Overlay::write_back`]).

use std::collections::BTreeMap;
use std::io;

use rand::Rng;
use rand::seq::SliceRandom;

/// The unit of loss: a page cache writes back, and a power cut loses, whole 4 KiB pages.
pub const PAGE_BYTES: usize = 4096;

/// The least probability with which a cut loses each unsynced page of a file (the most is
/// 1). A kernel writes a dirty page back only seconds after it was dirtied (Linux's
/// `dirty_expire_centisecs` is 30 s) unless an fsync pushes it, so of the pages written just
/// before a power cut — the ones a sync in flight was about to cover — most never reach the
/// disk; an fsync already under way may have written any of them, in any order.
pub const LOSS_MIN: f64 = 0.5;

/// [`PAGE_BYTES`] as a file offset.
const PAGE: u64 = PAGE_BYTES as u64;

/// What an overlay reads and writes through: the backing file.
pub trait Backing {
    /// Reads into `buf` from `offset`; returns the bytes read (0 at the end of the file).
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
    /// Writes all of `buf` at `offset`, growing the file if needed.
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// The file's length.
    fn size(&self) -> io::Result<u64>;
    /// Sets the file's length (cutting or extending with zeros).
    fn set_len(&self, len: u64) -> io::Result<()>;
}

impl Backing for std::fs::File {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        std::os::unix::fs::FileExt::read_at(self, buf, offset)
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        std::os::unix::fs::FileExt::write_all_at(self, buf, offset)
    }

    fn size(&self) -> io::Result<u64> {
        self.metadata().map(|m| m.len())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        std::fs::File::set_len(self, len)
    }
}

/// What a cut or a write-back did to one file, in pages.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Pages {
    /// Pages written through to the backing file.
    pub written: u64,
    /// Unsynced pages thrown away.
    pub dropped: u64,
}

/// The unsynced pages of one file and its size as readers see it.
#[derive(Debug)]
pub struct Overlay {
    /// Page index → the page's bytes (all of them: bytes past `size` are zero).
    pages: BTreeMap<u64, Box<[u8]>>,
    /// The file's size with the unsynced writes; never less than the backing file's length
    /// (a truncation goes through at once, so the backing file is never longer).
    size: u64,
}

/// The error of a write past the largest offset a file can have (`EFBIG`).
fn too_big() -> io::Error {
    io::Error::from_raw_os_error(rustix::io::Errno::FBIG.raw_os_error())
}

impl Overlay {
    /// An overlay with no unsynced page over a backing file of `size` bytes.
    pub fn new(size: u64) -> Self {
        Self {
            pages: BTreeMap::new(),
            size,
        }
    }

    /// The file's size as readers see it.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Number of unsynced pages.
    pub fn pages(&self) -> usize {
        self.pages.len()
    }

    /// Unsynced bytes (whole pages).
    pub fn bytes(&self) -> u64 {
        self.pages.len() as u64 * PAGE
    }

    /// Keeps `data` at `offset` in memory; a page touched for the first time is read from the
    /// backing file first, so a partial write keeps the rest of the page.
    pub fn write(&mut self, backing: &dyn Backing, offset: u64, data: &[u8]) -> io::Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let end = offset
            .checked_add(data.len() as u64)
            .filter(|&e| e <= i64::MAX as u64)
            .ok_or_else(too_big)?;
        let mut at = offset;
        while at < end {
            let index = at / PAGE;
            let page_start = index * PAGE;
            let in_page = (at - page_start) as usize;
            let n = ((PAGE - (at - page_start)) as usize).min((end - at) as usize);
            let page = match self.pages.entry(index) {
                std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::btree_map::Entry::Vacant(e) => {
                    e.insert(load_page(backing, page_start, self.size)?)
                }
            };
            let from = (at - offset) as usize;
            page[in_page..in_page + n].copy_from_slice(&data[from..from + n]);
            at += n as u64;
        }
        self.size = self.size.max(end);
        Ok(())
    }

    /// Reads up to `len` bytes at `offset` as a reader of the file sees them: the backing
    /// file's bytes with the unsynced pages over them; short at the end of the file.
    pub fn read(&self, backing: &dyn Backing, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        let end = offset.saturating_add(len as u64).min(self.size);
        if offset >= end {
            return Ok(Vec::new());
        }
        let mut buf = vec![0u8; (end - offset) as usize];
        read_fully(backing, &mut buf, offset)?;
        for (&index, page) in self.pages.range(offset / PAGE..=(end - 1) / PAGE) {
            let page_start = index * PAGE;
            let from = offset.max(page_start);
            let to = end.min(page_start + PAGE);
            buf[(from - offset) as usize..(to - offset) as usize]
                .copy_from_slice(&page[(from - page_start) as usize..(to - page_start) as usize]);
        }
        Ok(buf)
    }

    /// Sets the file's size: through to the backing file at once (metadata is not cached),
    /// and in the overlay — pages past the end dropped, the rest of the last page zeroed.
    pub fn truncate(&mut self, backing: &dyn Backing, size: u64) -> io::Result<()> {
        backing.set_len(size)?;
        let keep = size.div_ceil(PAGE);
        self.pages.retain(|&index, _| index < keep);
        if !size.is_multiple_of(PAGE)
            && let Some(page) = self.pages.get_mut(&(size / PAGE))
        {
            page[(size % PAGE) as usize..].fill(0);
        }
        self.size = size;
        Ok(())
    }

    /// Writes every unsynced page through (in file order) and forgets them.
    pub fn write_back(&mut self, backing: &dyn Backing) -> io::Result<Pages> {
        let pages = std::mem::take(&mut self.pages);
        let mut done = Pages::default();
        for (index, page) in &pages {
            self.write_page(backing, *index, page)?;
            done.written += 1;
        }
        Ok(done)
    }

    /// A power cut: each unsynced page is lost with one probability drawn for this file
    /// (from [`LOSS_MIN`] to all), the survivors are written through in a random order, and
    /// the overlay is empty afterwards. The backing file keeps what it had where a page was
    /// lost: its last synced bytes, or a hole of zeros past its old end.
    pub fn cut(&mut self, backing: &dyn Backing, rng: &mut impl Rng) -> io::Result<Pages> {
        let pages = std::mem::take(&mut self.pages);
        let loss = rng.gen_range(LOSS_MIN..=1.0);
        let mut kept: Vec<(u64, Box<[u8]>)> = Vec::with_capacity(pages.len());
        let mut done = Pages::default();
        for (index, page) in pages {
            if rng.gen_bool(loss) {
                done.dropped += 1;
            } else {
                kept.push((index, page));
            }
        }
        kept.shuffle(rng);
        for (index, page) in &kept {
            self.write_page(backing, *index, page)?;
            done.written += 1;
        }
        // What a reader sees now is the backing file alone.
        self.size = backing.size()?;
        Ok(done)
    }

    /// Writes page `index` through, up to the file's size (a page past the end is not data).
    fn write_page(&self, backing: &dyn Backing, index: u64, page: &[u8]) -> io::Result<()> {
        let start = index * PAGE;
        let n = self.size.saturating_sub(start).min(PAGE) as usize;
        backing.write_all_at(&page[..n], start)
    }
}

/// A page as the backing file has it, zeros past its end and past the file's `size`.
fn load_page(backing: &dyn Backing, start: u64, size: u64) -> io::Result<Box<[u8]>> {
    let mut page = vec![0u8; PAGE_BYTES].into_boxed_slice();
    let n = size.saturating_sub(start).min(PAGE) as usize;
    read_fully(backing, &mut page[..n], start)?;
    Ok(page)
}

/// Fills `buf` from `offset`, leaving zeros past the backing file's end.
fn read_fully(backing: &dyn Backing, buf: &mut [u8], offset: u64) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match backing.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// A file in memory, for tests of the overlay and the cache.
#[cfg(test)]
#[derive(Debug, Default)]
pub struct MemFile(pub std::cell::RefCell<Vec<u8>>);

#[cfg(test)]
impl Backing for MemFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let data = self.0.borrow();
        let start = (offset as usize).min(data.len());
        let n = buf.len().min(data.len() - start);
        buf[..n].copy_from_slice(&data[start..start + n]);
        Ok(n)
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let mut data = self.0.borrow_mut();
        let end = offset as usize + buf.len();
        if data.len() < end {
            data.resize(end, 0);
        }
        data[offset as usize..end].copy_from_slice(buf);
        Ok(())
    }

    fn size(&self) -> io::Result<u64> {
        Ok(self.0.borrow().len() as u64)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.borrow_mut().resize(len as usize, 0);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    fn file(bytes: &[u8]) -> MemFile {
        MemFile(std::cell::RefCell::new(bytes.to_vec()))
    }

    #[test]
    fn reads_see_unsynced_writes_and_the_backing_file_does_not() {
        let backing = file(&[1u8; 10_000]);
        let mut overlay = Overlay::new(10_000);
        overlay.write(&backing, 4090, b"0123456789").unwrap();
        overlay.write(&backing, 12_000, b"tail").unwrap();
        assert_eq!(overlay.size(), 12_004);
        assert_eq!(
            overlay.pages(),
            3,
            "pages 0 and 1 (the write spans them) and 2"
        );
        assert_eq!(
            overlay.read(&backing, 4088, 14).unwrap(),
            b"\x01\x010123456789\x01\x01"
        );
        // Past the old end: zeros up to the new write, then it.
        let end = overlay.read(&backing, 9_998, 100_000).unwrap();
        assert_eq!(end.len(), 12_004 - 9_998);
        assert_eq!(&end[..2], &[1, 1]);
        assert!(end[2..2002].iter().all(|&b| b == 0));
        assert_eq!(&end[2002..], b"tail");
        assert_eq!(backing.0.borrow().as_slice(), &[1u8; 10_000][..]);
        assert!(overlay.read(&backing, 12_004, 10).unwrap().is_empty());
    }

    #[test]
    fn a_write_back_writes_every_page_through_up_to_the_size() {
        let backing = file(b"hello");
        let mut overlay = Overlay::new(5);
        overlay.write(&backing, 3, b"p, world").unwrap();
        overlay.write(&backing, 9000, b"!").unwrap();
        let done = overlay.write_back(&backing).unwrap();
        assert_eq!(
            done,
            Pages {
                written: 2,
                dropped: 0
            }
        );
        assert_eq!(overlay.pages(), 0);
        let data = backing.0.borrow();
        assert_eq!(data.len(), 9001);
        assert_eq!(&data[..11], b"help, world");
        assert_eq!(data[9000], b'!');
    }

    #[test]
    fn a_truncation_goes_through_and_zeroes_the_rest_of_its_page() {
        let backing = file(&[7u8; 100]);
        let mut overlay = Overlay::new(100);
        overlay.write(&backing, 0, &[9u8; 9000]).unwrap();
        overlay.truncate(&backing, 50).unwrap();
        assert_eq!(backing.0.borrow().len(), 50);
        assert_eq!(overlay.pages(), 1);
        overlay.truncate(&backing, 80).unwrap();
        let read = overlay.read(&backing, 0, 100).unwrap();
        assert_eq!(read.len(), 80);
        assert!(read[..50].iter().all(|&b| b == 9) && read[50..].iter().all(|&b| b == 0));
    }

    #[test]
    fn a_cut_drops_only_unsynced_pages_and_keeps_what_was_synced() {
        let pages = 64;
        let mut rng = StdRng::seed_from_u64(5);
        let mut dropped_total = 0;
        for round in 0..20u8 {
            let backing = file(&[]);
            let mut overlay = Overlay::new(0);
            // Synced: the first half, each page filled with its index.
            for i in 0..pages / 2 {
                overlay
                    .write(&backing, i * PAGE, &[i as u8; PAGE_BYTES])
                    .unwrap();
            }
            overlay.write_back(&backing).unwrap();
            // Unsynced: the second half, and the first half overwritten.
            for i in 0..pages {
                overlay
                    .write(&backing, i * PAGE, &[0x80 | round; PAGE_BYTES])
                    .unwrap();
            }
            let done = overlay.cut(&backing, &mut rng).unwrap();
            assert_eq!(done.written + done.dropped, pages);
            dropped_total += done.dropped;
            let data = backing.0.borrow();
            let mut seen_dropped = 0;
            for i in 0..pages {
                let at = (i * PAGE) as usize;
                let page = data.get(at..at + PAGE_BYTES);
                match page {
                    Some(p) if p.iter().all(|&b| b == 0x80 | round) => {}
                    // A lost overwrite leaves the synced page; a lost new page, zeros or the
                    // end of the file.
                    Some(p) if i < pages / 2 => {
                        assert!(p.iter().all(|&b| b == i as u8), "page {i}");
                        seen_dropped += 1;
                    }
                    Some(p) => {
                        assert!(p.iter().all(|&b| b == 0), "page {i}");
                        seen_dropped += 1;
                    }
                    None => seen_dropped += 1,
                }
            }
            assert_eq!(seen_dropped, done.dropped, "round {round}");
            assert_eq!(overlay.pages(), 0);
            assert_eq!(overlay.size(), data.len() as u64);
        }
        assert!(dropped_total > 0 && dropped_total < 20 * pages);
    }

    #[test]
    fn a_cut_is_reproducible_from_its_seed() {
        let run = |seed: u64| {
            let backing = file(&[]);
            let mut overlay = Overlay::new(0);
            for i in 0..50u64 {
                overlay
                    .write(&backing, i * PAGE, &[i as u8 + 1; 100])
                    .unwrap();
            }
            let done = overlay
                .cut(&backing, &mut StdRng::seed_from_u64(seed))
                .unwrap();
            (done, backing.0.into_inner())
        };
        assert_eq!(run(11), run(11));
        let outcomes: std::collections::BTreeSet<Vec<u8>> = (0..8).map(|s| run(s).1).collect();
        assert!(outcomes.len() > 1, "different seeds lose different pages");
    }

    /// Random writes, reads, truncations, write-backs and cuts against a plain byte vector:
    /// reads always see every write, a write-back leaves the file as readers saw it, and after
    /// a cut each page is either what readers saw or what the file had before. Rerun with
    /// `SEED=`.
    #[test]
    fn random_operations_match_a_byte_vector_model() {
        let seed = std::env::var("SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(20261201u64);
        eprintln!("SEED={seed}");
        let mut rng = StdRng::seed_from_u64(seed);
        let backing = file(&[]);
        let mut overlay = Overlay::new(0);
        let mut visible: Vec<u8> = Vec::new();
        for step in 0..1500 {
            match rng.gen_range(0..100) {
                0..=49 => {
                    let at = rng.gen_range(0..40_000usize);
                    let len = rng.gen_range(0..9_000usize);
                    let data: Vec<u8> = (0..len).map(|_| rng.r#gen()).collect();
                    overlay.write(&backing, at as u64, &data).unwrap();
                    if !data.is_empty() {
                        if visible.len() < at + len {
                            visible.resize(at + len, 0);
                        }
                        visible[at..at + len].copy_from_slice(&data);
                    }
                }
                50..=79 => {
                    let at = rng.gen_range(0..50_000usize);
                    let len = rng.gen_range(0..20_000usize);
                    let want = visible
                        .get(at..(at + len).min(visible.len()))
                        .unwrap_or(&[]);
                    let got = overlay.read(&backing, at as u64, len).unwrap();
                    assert_eq!(got, want, "step {step}: read {at}+{len}");
                }
                80..=87 => {
                    let size = rng.gen_range(0..45_000usize);
                    overlay.truncate(&backing, size as u64).unwrap();
                    visible.resize(size, 0);
                }
                88..=93 => {
                    overlay.write_back(&backing).unwrap();
                    assert_eq!(*backing.0.borrow(), visible, "step {step}: write-back");
                }
                _ => {
                    let before = backing.0.borrow().clone();
                    overlay.cut(&backing, &mut rng).unwrap();
                    let after = backing.0.borrow().clone();
                    for (i, page) in after.chunks(PAGE_BYTES).enumerate() {
                        let at = i * PAGE_BYTES;
                        let was = |v: &[u8]| -> Vec<u8> {
                            (at..at + page.len())
                                .map(|p| v.get(p).copied().unwrap_or(0))
                                .collect()
                        };
                        assert!(
                            page == was(&visible).as_slice() || page == was(&before).as_slice(),
                            "step {step}: page {i} after a cut is neither the written nor the \
                             synced page"
                        );
                    }
                    assert_eq!(overlay.size(), after.len() as u64);
                    visible = after;
                }
            }
            assert_eq!(overlay.size(), visible.len() as u64, "step {step}");
        }
    }

    #[test]
    fn a_write_past_the_largest_offset_is_an_error_not_a_panic() {
        let backing = file(&[]);
        let mut overlay = Overlay::new(0);
        let err = overlay.write(&backing, u64::MAX - 1, b"xyz").unwrap_err();
        assert_eq!(
            err.raw_os_error(),
            Some(rustix::io::Errno::FBIG.raw_os_error())
        );
        assert!(
            overlay
                .read(&backing, u64::MAX, usize::MAX)
                .unwrap()
                .is_empty()
        );
    }
}
