//! `bench/timeline.py` (session 24): on a fixed `perf script` excerpt of two W3 requests, the
//! steps fall at their median times after the client's request, each wake-up carries how long
//! its thread then waited for a CPU (up to its next switch-in), and the summary counts the
//! wake-ups that found their CPU running another thread. On an excerpt of three W2 entries
//! (session 25), the steps are timed from the leader's log writes and the hand-off's whole time
//! is the median between them. Needs `python3`, which README's test command (`scripts/test`)
//! installs.

use std::ffi::OsString;

mod tool;

/// timeline.py's arguments for the fixture `name` under `tests/data/` (client pid 10, nodes 20,
/// 30 and 40), with `anchor` when one is given.
fn args(name: &str, anchor: Option<&str>) -> Vec<OsString> {
    let mut args = vec![
        tool::bench_path(&format!("tests/data/{name}")).into_os_string(),
        "10".into(),
        "20,30,40".into(),
    ];
    args.extend(anchor.map(OsString::from));
    args
}

/// Runs timeline.py on the two W3 requests' fixture and answers its output.
fn timeline_of_fixture() -> String {
    tool::run_ok("timeline.py", args("timeline-trace.txt", None))
}

/// The first line of `text` that contains `needle`, split on whitespace.
fn line_with<'a>(text: &'a str, needle: &str) -> Vec<&'a str> {
    text.lines()
        .find(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("no line with {needle:?} in:\n{text}"))
        .split_whitespace()
        .collect()
}

#[test]
fn steps_fall_at_their_medians_and_the_node_that_reads_first_leads() {
    let out = timeline_of_fixture();
    assert!(
        out.starts_with("2 requests; leader pid 20, followers [30, 40], client pid 10"),
        "{out}"
    );
    // The follower's read comes 0.160 ms after the request in both requests; the leader's
    // answer to the client is its second `writev` of the request.
    assert_eq!(line_with(&out, "F1 runtime: recvfrom returns")[0], "0.160");
    assert_eq!(line_with(&out, "L runtime: writev (sends) #2")[0], "0.400");
}

#[test]
fn a_wake_up_carries_the_time_its_thread_then_waited_for_a_cpu() {
    let out = timeline_of_fixture();
    // The follower's runtime waited 0.040 ms in the first request and 0.020 in the second,
    // while the client's thread held its CPU.
    let woken = line_with(&out, "F1 runtime: woken (2)");
    assert_eq!(woken[0], "0.110", "{out}");
    assert_eq!(
        woken[woken.len() - 4..],
        ["[waited", "0.030,", "mean", "0.030]"],
        "{out}"
    );
}

#[test]
fn the_summary_counts_wake_ups_onto_a_busy_cpu() {
    let out = timeline_of_fixture();
    // Median, mean, 90th percentile; every follower wake-up found the client's thread on its
    // CPU, and no leader wake-up found its CPU busy (it was idle).
    assert_eq!(
        line_with(&out, "F1 runtime (2;"),
        [
            "0.030", "0.030", "0.040", "F1", "runtime", "(2;", "100", "%)"
        ]
    );
    assert_eq!(
        line_with(&out, "L runtime (2;"),
        ["0.020", "0.020", "0.020", "L", "runtime", "(2;", "0", "%)"]
    );
    assert_eq!(
        line_with(&out, "C runtime (2;"),
        [
            "0.020", "0.020", "0.030", "C", "runtime", "(2;", "100", "%)"
        ]
    );
}

#[test]
fn entries_are_timed_from_the_leaders_log_writes_up_to_the_next() {
    let out = tool::run_ok("timeline.py", args("timeline-entries.txt", Some("entry")));
    // Three log writes by the leader's runtime, 0.8 and 1.0 ms apart: the third has no next, so
    // two whole entries; the flush thread's own pwrite64 (its sync mark) starts none.
    assert!(
        out.starts_with("2 entries; leader pid 20, followers [30, 40], client pid 10"),
        "{out}"
    );
    assert!(
        out.contains("median ms from one of the leader's log writes to its next: 0.900"),
        "{out}"
    );
    assert_eq!(line_with(&out, "L flush thread: pwrite64")[0], "0.300");
    // The follower read the append 0.150 and 0.170 ms after the leader's write; the next
    // holder's release (the client's writev) left 0.720 and 0.920 ms after it.
    assert_eq!(line_with(&out, "F1 runtime: recvfrom returns")[0], "0.160");
    assert_eq!(line_with(&out, "C runtime: writev (sends)")[0], "0.820");
}

#[test]
fn an_unknown_anchor_is_refused() {
    let output = tool::run("timeline.py", args("timeline-entries.txt", Some("entries")));
    assert!(!output.status.success());
    assert!(
        String::from_utf8_lossy(&output.stderr)
            .starts_with("ANCHOR must be request or entry, not entries"),
        "{output:?}"
    );
}
