//! `bench/fsync-stalls.py` (session 23): it syncs for the time asked, with the gap asked, in the
//! directory asked, counts every sync it made, and leaves no file behind. Needs `python3`, which
//! README's test command (`scripts/test`) installs. The figures themselves depend on the disk
//! and are not checked.

use std::ffi::OsStr;

mod tool;

#[test]
fn it_reports_the_syncs_it_made_and_removes_its_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let args = [
        OsStr::new("0.3"),
        OsStr::new("0.01"),
        dir.path().as_os_str(),
    ];
    let stdout = tool::run_ok("fsync-stalls.py", args);
    let summary = stdout.lines().last().expect("a summary line");
    let syncs: u64 = summary
        .split_once(" syncs in 0.3 s (")
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or_else(|| panic!("no sync count in {summary:?}"));
    // A 10 ms gap after each sync allows at most 30 in 0.3 s, and the loop makes at least one.
    assert!((1..=31).contains(&syncs), "{syncs} syncs: {summary}");
    for figure in ["p50 ", "p99.9 ", "max ", "over 100 ms: ", "over 300 ms: "] {
        assert!(
            summary.contains(figure),
            "{figure:?} missing in {summary:?}"
        );
    }
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .expect("read the dir")
        .collect();
    assert!(left.is_empty(), "files left behind: {left:?}");
}

#[test]
fn without_arguments_it_prints_its_usage_and_fails() {
    let output = tool::run("fsync-stalls.py", std::iter::empty::<&OsStr>());
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("Usage: bench/fsync-stalls.py"));
}
