//! Smoke test of the benchmark tool: `lock-bench --quick` against lockd (with both client
//! styles, unary calls and the Pipeline stream) and etcd must finish and write a well-formed
//! table, JSON report and SVG plots. It asserts the shape of the output and that the
//! workloads really ran, never any speed. Without etcd (Debian's `etcd-server`, which
//! README's test command `scripts/test` installs) it fails rather than test half the tool.

use std::path::Path;
use std::process::Command;

/// Every row name the table must carry (issue 7's rows).
const ROWS: &[&str] = &[
    "W1 uncontended: pairs/s (32 workers, 100k keys)",
    "W1 acquire p50 (ms)",
    "W1 acquire p99 (ms)",
    "W1 acquire p999 (ms)",
    "W1 release p50 (ms)",
    "W1 release p99 (ms)",
    "W2 hot key: hand-offs/s (16 workers, 1 key)",
    "W2 acquire p50 (ms)",
    "W2 acquire p99 (ms)",
    "W2 token-order violations",
    "W3 one client: acquire p50 (ms)",
    "W3 release p50 (ms)",
    "W4 sessions: W1 pairs/s without them (slices between)",
    "W4 sessions: W1 pairs/s with the sessions",
    "W4 cost to W1 (%)",
];

/// The rows the unary client adds, after the prefix `unary client: ` (W1–W3 only: W4 runs
/// with the Pipeline stream).
const UNARY_ROWS: &[&str] = &[
    "W1 uncontended: pairs/s (32 workers, 100k keys)",
    "W1 acquire p50 (ms)",
    "W1 server CPU per pair (ms, 3 nodes)",
    "W2 hot key: hand-offs/s (16 workers, 1 key)",
    "W2 token-order violations",
    "W3 one client: acquire p50 (ms)",
    "errors (W1–W3 acquire/release)",
];

/// The headline table's header and the start of its three rows.
const HEADLINE: &[&str] = &[
    "| workload | lockd, unary client | lockd, Pipeline stream | etcd | target |",
    "| W1 32 workers, 100k keys: pairs/s | ",
    "| W2 16 workers, one hot key: hand-offs/s | ",
    "| W3 one worker: acquire p50 (ms) | ",
];

/// Every series of both plots.
const SERIES: &[&str] = &["lockd, unary client", "lockd, Pipeline stream", "etcd"];

fn number(value: &serde_json::Value, what: &str) -> f64 {
    value
        .as_f64()
        .unwrap_or_else(|| panic!("{what} is not a number: {value}"))
}

#[test]
fn quick_run_writes_a_well_formed_table_and_json() {
    let etcd = Path::new("/usr/bin/etcd").is_file();
    assert!(
        etcd,
        "/usr/bin/etcd is missing: run the tests with `scripts/test` (it installs Debian's \
         etcd-server), or `apt-get install etcd-server`"
    );
    let systems = "lockd,etcd";
    let out = tempfile::tempdir().expect("a temporary output directory");
    let output = Command::new(env!("CARGO_BIN_EXE_lock-bench"))
        .args([
            "--quick",
            "--systems",
            systems,
            "--sweep-workers",
            "1,4",
            "--out",
        ])
        .arg(out.path())
        .output()
        .expect("running lock-bench");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "lock-bench --quick failed ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}",
        output.status
    );

    // The markdown table: on stdout and in results.md, with every row.
    let table = std::fs::read_to_string(out.path().join("results.md")).expect("results.md");
    assert!(
        stdout.contains(table.trim()),
        "stdout does not carry the table:\n{stdout}"
    );
    assert!(
        table.starts_with(HEADLINE[0]),
        "no headline table:\n{table}"
    );
    for line in HEADLINE {
        assert!(
            table.lines().any(|l| l.starts_with(line)),
            "headline misses {line:?}:\n{table}"
        );
    }
    assert!(
        table
            .lines()
            .any(|l| l == "| workload / figure | lockd | etcd | lockd/etcd | target | met |"),
        "no detail table:\n{table}"
    );
    let unary_rows: Vec<String> = UNARY_ROWS
        .iter()
        .map(|row| format!("unary client: {row}"))
        .collect();
    for row in ROWS
        .iter()
        .copied()
        .chain(unary_rows.iter().map(String::as_str))
    {
        assert!(
            table.lines().any(|l| l.starts_with(&format!("| {row} |"))),
            "table misses row {row:?}:\n{table}"
        );
    }
    assert!(
        !table.contains("unary client: W4"),
        "W4 runs with the Pipeline stream only:\n{table}"
    );
    // Both systems are measured over the same transport: TLS by default.
    assert!(
        table.contains("Transport: TLS on both systems"),
        "the table does not say both systems ran TLS:\n{table}"
    );

    // The JSON report: every row, lockd figures that show the workloads ran.
    let json = std::fs::read_to_string(out.path().join("results.json")).expect("results.json");
    let report: serde_json::Value = serde_json::from_str(&json).expect("results.json is JSON");
    assert_eq!(number(&report["format"], "format"), 2.0);
    let rows = report["rows"].as_array().expect("rows is an array");
    for row in ROWS
        .iter()
        .copied()
        .chain(unary_rows.iter().map(String::as_str))
    {
        let found = rows
            .iter()
            .find(|r| r["name"] == *row)
            .unwrap_or_else(|| panic!("JSON misses row {row:?}"));
        number(&found["lockd"], &format!("lockd figure of {row:?}"));
        if etcd {
            number(&found["etcd"], &format!("etcd figure of {row:?}"));
        } else {
            assert!(found["etcd"].is_null(), "etcd figure without etcd: {found}");
        }
    }
    assert_eq!(
        report["plan"]["tls"], true,
        "both systems serve TLS by default"
    );
    assert_eq!(report["lockd"]["client"], "pipeline");
    assert_eq!(report["lockd_unary"]["client"], "unary");
    assert!(report["etcd"]["client"].is_null());
    assert!(
        report["lockd_unary"]["w4"].is_null(),
        "W4 runs with the Pipeline stream only"
    );
    for system in ["lockd", "lockd_unary", "etcd"] {
        let results = &report[system];
        for workload in ["w1", "w2", "w3"] {
            let pairs = number(
                &results[workload]["pairs"],
                &format!("{system} {workload} pairs"),
            );
            assert!(
                pairs > 0.0,
                "{system} {workload} completed no pair: {results}"
            );
        }
        // W3 keeps its acquire latencies as a histogram of every sample, for the CDF plot.
        let buckets = results["w3"]["acquire_histogram"]["buckets"]
            .as_array()
            .unwrap_or_else(|| panic!("{system} W3 has no acquire histogram"));
        let counted: f64 = buckets.iter().map(|b| number(&b["count"], "count")).sum();
        assert_eq!(
            counted,
            number(&results["w3"]["acquire"]["count"], "W3 acquires"),
            "{system}: the histogram holds every W3 acquire"
        );
        assert_eq!(
            number(&results["w2"]["token_order_violations"], "violations"),
            0.0,
            "{system}: W2 tokens out of grant order"
        );
        assert_eq!(number(&results["w2"]["overlaps"], "overlaps"), 0.0);
        if system == "lockd_unary" {
            continue;
        }
        assert!(number(&results["w4"]["w1"]["pairs"], "w4 pairs") > 0.0);
        // W4 alternates W1 slices without and with the sessions, and closes them after each.
        assert!(number(&results["w4"]["baseline"]["pairs"], "w4 baseline pairs") > 0.0);
        assert_eq!(number(&results["w4"]["rounds"], "w4 rounds"), 2.0);
        assert_eq!(
            number(&results["w4"]["keepers"]["close_errors"], "w4 close errors"),
            0.0,
            "{system}: W4 sessions could not be closed: {}",
            results["w4"]["keepers"]
        );
        // The workers ran in this process, so it used CPU for them.
        assert!(
            number(
                &results["w1"]["client_cpu_ms_per_pair"],
                "w1 client CPU per pair"
            ) > 0.0
        );
        assert_eq!(
            number(&results["w4"]["keepers"]["sessions"], "w4 sessions"),
            1000.0,
            "--quick keeps 1,000 sessions alive"
        );
        assert!(
            number(&results["w4"]["keepers"]["keepalives_ok"], "w4 keep-alives") > 0.0,
            "{system}: no W4 keep-alive was answered: {}",
            results["w4"]["keepers"]
        );
    }

    // The sweep: one series per client style and etcd, one point per worker count.
    let sweep = report["sweep"].as_array().expect("sweep is an array");
    let labels: Vec<&str> = sweep.iter().filter_map(|s| s["label"].as_str()).collect();
    assert_eq!(labels, SERIES);
    for series in sweep {
        let workers: Vec<f64> = series["points"]
            .as_array()
            .expect("points")
            .iter()
            .map(|p| {
                assert!(
                    number(&p["pairs_per_sec"], "sweep pairs/s") > 0.0,
                    "{series}"
                );
                number(&p["workers"], "sweep workers")
            })
            .collect();
        assert_eq!(workers, [1.0, 4.0], "{series}");
    }

    // Both plots, drawn into --out, name every series.
    for plot in ["w1-throughput-vs-workers.svg", "w3-acquire-latency-cdf.svg"] {
        let svg = std::fs::read_to_string(out.path().join(plot))
            .unwrap_or_else(|e| panic!("{plot}: {e}"));
        assert!(svg.starts_with("<svg"), "{plot} is not SVG: {svg:.200}");
        for series in SERIES {
            assert!(svg.contains(series), "{plot} does not name {series:?}");
        }
    }
    let floors = &report["floors"];
    assert!(number(&floors["fdatasync"]["p50_ms"], "fdatasync p50") > 0.0);
    assert!(
        number(
            &floors["fdatasync_overwrite"]["p50_ms"],
            "overwrite fdatasync p50"
        ) > 0.0
    );
    assert!(number(&floors["grpc_round_trip"]["p50_ms"], "round-trip p50") > 0.0);
    // Three files, each synced as often as the single-file probe (`--quick`: 50).
    assert_eq!(
        number(
            &floors["fdatasync_overwrite_concurrent"]["count"],
            "concurrent fdatasync samples"
        ),
        3.0 * number(&floors["fdatasync_overwrite"]["count"], "fdatasync samples")
    );
    assert!(
        number(
            &floors["tcp_process_round_trip"]["p50_ms"],
            "process round-trip p50"
        ) > 0.0
    );
}

#[test]
fn plot_redraws_a_run_and_names_what_an_old_results_json_lacks() {
    let out = tempfile::tempdir().expect("a temporary output directory");
    let old = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/plot/testdata/results-format1.json");
    let output = Command::new(env!("CARGO_BIN_EXE_lock-bench"))
        .args(["plot", "--in"])
        .arg(&old)
        .arg("--out")
        .arg(out.path())
        .output()
        .expect("running lock-bench plot");
    assert!(!output.status.success(), "nothing to plot must fail");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("nothing to plot") && stderr.contains("format 1"),
        "stderr does not say what the file lacks: {stderr}"
    );
}

#[test]
fn missing_etcd_is_named_clearly() {
    let out = tempfile::tempdir().expect("a temporary output directory");
    let output = Command::new(env!("CARGO_BIN_EXE_lock-bench"))
        .args([
            "--quick",
            "--systems",
            "etcd",
            "--etcd-bin",
            "/nonexistent/etcd",
            "--out",
        ])
        .arg(out.path())
        .output()
        .expect("running lock-bench");
    assert!(!output.status.success(), "a missing etcd must fail the run");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("etcd is missing") && stderr.contains("etcd-server"),
        "stderr does not say etcd is missing: {stderr}"
    );
}
