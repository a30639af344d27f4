//! `lock-lazyfs` mounted for real: files written through the mount are read back from memory
//! and reach the backing directory only when fsynced; a cut loses only unsynced pages; the
//! control socket answers every command, good or bad; metadata goes through at once.
//!
//! Needs FUSE (`/dev/fuse`, and as a non-root user fusermount3 from the fuse3 package, which
//! README's test command installs): where it cannot mount, the test fails saying why.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::Value;

const PAGE: usize = 4096;

/// A mounted lock-lazyfs, unmounted on drop.
struct Mount {
    child: Child,
    control: PathBuf,
    backing: PathBuf,
    mnt: PathBuf,
    _dir: tempfile::TempDir,
}

impl Mount {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let (backing, mnt, control) = (
            dir.path().join("backing"),
            dir.path().join("mnt"),
            dir.path().join("control.sock"),
        );
        std::fs::create_dir(&backing).unwrap();
        std::fs::create_dir(&mnt).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_lock-lazyfs"))
            .arg("mount")
            .arg("--backing")
            .arg(&backing)
            .arg("--mountpoint")
            .arg(&mnt)
            .arg("--control")
            .arg(&control)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("lock-lazyfs starts");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        if !line.starts_with("lock-lazyfs ready") {
            let out = child.wait_with_output().unwrap();
            panic!(
                "lock-lazyfs could not mount ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Self {
            child,
            control,
            backing,
            mnt,
            _dir: dir,
        }
    }

    fn command(&self, line: &str) -> Value {
        let mut stream = UnixStream::connect(&self.control).unwrap();
        writeln!(stream, "{line}").unwrap();
        let mut answer = String::new();
        BufReader::new(stream).read_line(&mut answer).unwrap();
        serde_json::from_str(&answer).unwrap()
    }

    fn backing(&self, name: &str) -> Vec<u8> {
        std::fs::read(self.backing.join(name)).unwrap_or_default()
    }

    fn path(&self, name: &str) -> PathBuf {
        self.mnt.join(name)
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = self.command("unmount");
        let _ = self.child.wait();
    }
}

fn open_rw(path: &Path) -> std::fs::File {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .unwrap()
}

#[test]
fn unsynced_writes_live_in_memory_until_fsync_and_a_cut_loses_only_them() {
    let m = Mount::new();
    std::fs::create_dir(m.path("raft")).unwrap();
    assert!(
        m.backing.join("raft").is_dir(),
        "mkdir goes through at once"
    );
    let f = open_rw(&m.path("raft/log"));
    f.write_all_at(&[b's'; 2 * PAGE], 0).unwrap();
    assert_eq!(
        m.backing("raft/log"),
        b"",
        "nothing reaches the disk before fsync"
    );
    let mut back = vec![0u8; 10];
    f.read_exact_at(&mut back, PAGE as u64).unwrap();
    assert_eq!(back, [b's'; 10], "reads see unsynced writes");
    f.sync_data().unwrap();
    assert_eq!(
        m.backing("raft/log"),
        vec![b's'; 2 * PAGE],
        "fsync writes through"
    );

    // Forty unsynced pages over and after the synced two.
    for i in 0..40u64 {
        f.write_all_at(&[b'u'; PAGE], i * PAGE as u64).unwrap();
    }
    assert_eq!(f.metadata().unwrap().len(), 40 * PAGE as u64);
    let stats = m.command("stats");
    assert_eq!(stats["unsynced_pages"], 40, "{stats}");
    let cut = m.command("cut 7");
    assert_eq!(cut["ok"], true, "{cut}");
    let dropped = cut["pages_dropped"].as_u64().unwrap();
    assert_eq!(
        dropped + cut["pages_written"].as_u64().unwrap(),
        40,
        "{cut}"
    );
    assert!(
        dropped >= 1,
        "a cut loses at least half the pages on average: {cut}"
    );
    let disk = m.backing("raft/log");
    let mut lost = 0;
    for (i, page) in disk.chunks(PAGE).enumerate() {
        if page.iter().all(|&b| b == b'u') {
            continue;
        }
        lost += 1;
        let synced = if i < 2 { b's' } else { 0 };
        assert!(
            page.iter().all(|&b| b == synced),
            "page {i}: {:?}",
            &page[..8]
        );
    }
    assert!(lost <= dropped, "{lost} pages differ, {dropped} dropped");
    // The mount shows the disk now.
    let mut now = Vec::new();
    std::io::Read::read_to_end(
        &mut std::fs::File::open(m.path("raft/log")).unwrap(),
        &mut now,
    )
    .unwrap();
    assert_eq!(now, disk);

    // Metadata: renames and removals go through; a renamed file keeps its unsynced pages.
    f.write_all_at(b"tail", 0).unwrap();
    std::fs::rename(m.path("raft/log"), m.path("raft/log2")).unwrap();
    assert!(m.backing.join("raft/log2").is_file());
    assert_eq!(m.command("flush")["pages_written"], 1);
    assert_eq!(&m.backing("raft/log2")[..4], b"tail");
    std::fs::remove_file(m.path("raft/log2")).unwrap();
    std::fs::remove_dir(m.path("raft")).unwrap();
    assert!(!m.backing.join("raft").exists());
}

#[test]
fn held_syncs_wait_for_the_cut_and_bad_commands_get_errors() {
    let m = Mount::new();
    // A seed that loses a file's one unsynced page (each seed does with probability at least
    // 1/2, and a cut of one page of one file draws the same numbers whatever the file).
    let probe = open_rw(&m.path("probe"));
    let seed = (0..64u64)
        .find(|seed| {
            probe.write_all_at(b"p", 0).unwrap();
            m.command(&format!("cut {seed}"))["pages_dropped"] == 1
        })
        .expect("some seed drops the page");
    let f = open_rw(&m.path("wal"));
    f.write_all_at(b"frame", 0).unwrap();
    assert_eq!(m.command("hold-syncs 20000")["ok"], true);
    let syncer = std::thread::spawn(move || f.sync_data());
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert!(
        !syncer.is_finished(),
        "the fsync waits while syncs are held"
    );
    assert_eq!(m.command("stats")["syncs_held"], true);
    let cut = m.command(&format!("cut {seed}"));
    assert_eq!(cut["pages_dropped"], 1, "{cut}");
    syncer.join().unwrap().unwrap();
    assert_eq!(m.command("stats")["syncs_held"], false);
    assert_eq!(
        m.backing("wal"),
        b"",
        "the lost write never reached the disk"
    );
    assert_eq!(std::fs::metadata(m.path("wal")).unwrap().len(), 0);
    for bad in ["", "cut", "cut -1", "cut 1 2", "nonsense", "hold-syncs x"] {
        let answer = m.command(bad);
        assert_eq!(answer["ok"], false, "{bad:?}: {answer}");
        assert!(answer["error"].is_string());
    }
}
