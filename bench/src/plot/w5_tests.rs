//! Tests of W5's growth curves from a hand-made `w5.json`: one line per expected figure, the
//! checkpoints without a figure left out (and named in the legend) rather than drawn as 0,
//! axes that cover the data from the 0 checkpoint on, well-formed SVG files, and `lock-bench
//! plot` telling a w5.json from a results.json and refusing anything else by the file's name.

use super::figures::Outcome;
use super::redraw::{self, Kind};
use super::tests::{hex, line_colours, texts};
use super::w5_figures::{self, IDLE_CPU_FILE, MEMORY_FILE, W1_FILE, W3_FILE, W5Report};
use super::{COLOURS, Scale};

/// A small w5.json of the shape `lock-bench --w5` writes: checkpoints at 0, 100k, 500k and 1M
/// held locks; at 500k the loads failed (an election), at 1M W1 had 600 errors and node 3
/// was down.
const W5: &str = r#"{
  "tool": "lock-bench w5",
  "format": 1,
  "setup": {
    "command": "lock-bench --w5", "cpus": 2,
    "load_average_at_start": "9.30 8.00 7.00 1/82 13022",
    "load_average_at_end": "9.10 8.10 7.10 1/82 13090"
  },
  "nodes_at_start": [],
  "checkpoints": [
    { "held": 100000, "load_average": "11.2", "settle_secs": 1.0,
      "memory": [
        { "node_id": 1, "leader": true, "memory": { "rss_mib": 167.0, "peak_mib": 170.0 } },
        { "node_id": 2, "leader": false, "memory": { "rss_mib": 169.0, "peak_mib": 169.5 } },
        { "node_id": 3, "leader": false, "memory": { "rss_mib": 166.0, "peak_mib": 168.0 } } ],
      "idle_cpu": { "secs": 20.0, "leader_pct": 0.9, "nodes_pct": [[1, 0.9], [2, 0.5], [3, 0.5]] },
      "nodes": [],
      "loads": {
        "w1": { "workers": 32, "pairs_per_sec": 657.0, "errors": 0,
                "acquire": { "count": 3285, "p50_ms": 40.0, "p99_ms": 90.0 } },
        "w3": { "workers": 1, "pairs_per_sec": 160.0, "errors": 0,
                "acquire": { "count": 800, "p50_ms": 6.13, "p99_ms": 108.0 } } },
      "loads_error": null },
    { "held": 0, "load_average": "9.3", "settle_secs": 1.0,
      "memory": [
        { "node_id": 1, "leader": true, "memory": { "rss_mib": 71.0, "peak_mib": 72.0 } },
        { "node_id": 2, "leader": false, "memory": { "rss_mib": 70.0, "peak_mib": 70.0 } },
        { "node_id": 3, "leader": false, "memory": { "rss_mib": 74.0, "peak_mib": 76.0 } } ],
      "idle_cpu": { "secs": 20.0, "leader_pct": 0.8, "nodes_pct": [] },
      "nodes": [],
      "loads": {
        "w1": { "workers": 32, "pairs_per_sec": 1038.0, "errors": 0,
                "acquire": { "count": 5190, "p50_ms": 20.0, "p99_ms": 60.0 } },
        "w3": { "workers": 1, "pairs_per_sec": 900.0, "errors": 0,
                "acquire": { "count": 4500, "p50_ms": 0.83, "p99_ms": 24.4 } } },
      "loads_error": null },
    { "held": 500000, "load_average": "16.3", "settle_secs": 3.0,
      "memory": [
        { "node_id": 1, "leader": false, "memory": { "rss_mib": 416.0, "peak_mib": 417.0 } },
        { "node_id": 2, "leader": true, "memory": { "rss_mib": 408.0, "peak_mib": 418.0 } },
        { "node_id": 3, "leader": false, "memory": { "rss_mib": 407.0, "peak_mib": 420.0 } } ],
      "idle_cpu": { "secs": 20.0, "leader_pct": 0.9, "nodes_pct": [] },
      "nodes": [],
      "loads": null,
      "loads_error": "W3: not the leader" },
    { "held": 1000000, "load_average": "9.1", "settle_secs": 2.0,
      "memory": [
        { "node_id": 1, "leader": true, "memory": { "rss_mib": 671.0, "peak_mib": 687.0 } },
        { "node_id": 2, "leader": false, "memory": { "rss_mib": 667.0, "peak_mib": 684.0 } },
        { "node_id": 3, "leader": false, "memory": null } ],
      "idle_cpu": { "secs": 20.0, "leader_pct": null, "nodes_pct": [] },
      "nodes": [],
      "loads": {
        "w1": { "workers": 32, "pairs_per_sec": 202.0, "errors": 600,
                "acquire": { "count": 1010, "p50_ms": 9.0, "p99_ms": 500.0 } },
        "w3": { "workers": 1, "pairs_per_sec": 7.0, "errors": 0,
                "acquire": { "count": 34, "p50_ms": 5.39, "p99_ms": 502.0 } } },
      "loads_error": null }
  ],
  "errors": []
}"#;

fn report() -> W5Report {
    W5Report::parse(W5).expect("the hand-made w5.json parses")
}

fn names(chart: &super::LineChart) -> Vec<&str> {
    chart.series.iter().map(|s| s.name.as_str()).collect()
}

/// Checks that the drawn x range of `chart` starts at 0 and covers every point's x, and its
/// drawn y range covers every point's y.
fn axes_cover_the_data(chart: &super::LineChart) {
    let points = chart.series.iter().flat_map(|s| s.points.iter().copied());
    let (xs, ys): (Vec<f64>, Vec<f64>) = points.unzip();
    let extreme = |v: &[f64]| {
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        (lo, v.iter().copied().fold(f64::NEG_INFINITY, f64::max))
    };
    let (x_lo, x_hi) = extreme(&xs);
    let (y_lo, y_hi) = extreme(&ys);
    let (ax_lo, ax_hi) = chart.x.range(x_lo, x_hi);
    assert_eq!(ax_lo, 0.0, "{}: the held axis starts at 0", chart.title);
    assert!(ax_hi >= x_hi, "{}: x up to {ax_hi} < {x_hi}", chart.title);
    let (ay_lo, ay_hi) = chart.y.range(y_lo, y_hi);
    assert!(
        ay_lo <= y_lo && ay_hi >= y_hi,
        "{}: y {ay_lo}..{ay_hi} does not cover {y_lo}..{y_hi}",
        chart.title
    );
}

#[test]
fn the_w1_curve_skips_the_failed_checkpoint_and_the_one_with_errors() {
    let chart = report().w1_chart().expect("has W1 figures");
    assert_eq!(
        names(&chart),
        ["W1, 32 workers on random keys; left out: 500k (loads failed), 1M (600 errors)"]
    );
    // Sorted by held locks, the 0 checkpoint drawn, no 0 standing in for a failure.
    assert_eq!(
        chart.series[0].points,
        vec![(0.0, 1038.0), (100_000.0, 657.0)]
    );
    assert_eq!(chart.x.scale, Scale::Linear);
    // The held axis still reaches 1M, where the line has no point: the gap shows.
    let (_, x_hi) = chart.x.range(0.0, 100_000.0);
    assert!(x_hi >= 1_000_000.0, "the held axis ends at {x_hi}");
    assert!(
        chart.title.ends_with("(load average 9.30 → 9.10)"),
        "{}",
        chart.title
    );
    axes_cover_the_data(&chart);
    let svg = chart.svg().expect("drawn");
    let texts = texts(&svg);
    for want in [
        "locks held",
        "acquire → release pairs/s",
        chart.series[0].name.as_str(),
    ] {
        assert!(texts.iter().any(|t| t == want), "no {want:?} in {texts:?}");
    }
    assert!(texts.iter().any(|t| t == "0"), "a tick at 0: {texts:?}");
}

#[test]
fn the_w3_curves_are_p50_and_p99_on_a_log_axis_without_the_failed_checkpoint() {
    let chart = report().w3_chart().expect("has W3 figures");
    assert_eq!(
        names(&chart),
        [
            "W3 acquire p50, one worker; left out: 500k (loads failed)",
            "W3 acquire p99, one worker; left out: 500k (loads failed)"
        ]
    );
    assert_eq!(
        chart.series[0].points,
        vec![(0.0, 0.83), (100_000.0, 6.13), (1_000_000.0, 5.39)]
    );
    assert_eq!(
        chart.series[1].points,
        vec![(0.0, 24.4), (100_000.0, 108.0), (1_000_000.0, 502.0)]
    );
    assert_eq!(chart.y.scale, Scale::Log);
    axes_cover_the_data(&chart);
    let svg = chart.svg().expect("drawn");
    let colours = line_colours(&svg);
    for colour in [hex(COLOURS[0]), hex(COLOURS[1])] {
        assert!(colours.contains(&colour), "{colour} not in {colours:?}");
    }
    assert!(!colours.contains(&hex(COLOURS[2])), "{colours:?}");
    assert!(texts(&svg).iter().any(|t| t == "1M"), "a tick at 1M");
}

#[test]
fn the_memory_curves_follow_the_leader_and_skip_a_node_that_was_down() {
    let chart = report().memory_chart().expect("has memory figures");
    let series = &chart.series;
    assert_eq!(series.len(), 4, "{:?}", names(&chart));
    assert_eq!(series[0].name, "leader, resident (VmRSS)");
    // The leader moved to node 2 at 500k: its figure is node 2's there.
    assert_eq!(
        series[0].points,
        vec![
            (0.0, 71.0),
            (100_000.0, 167.0),
            (500_000.0, 408.0),
            (1_000_000.0, 671.0)
        ]
    );
    assert_eq!(series[1].name, "followers, resident, the higher");
    assert_eq!(
        series[1].points,
        vec![
            (0.0, 74.0),
            (100_000.0, 169.0),
            (500_000.0, 416.0),
            (1_000_000.0, 667.0)
        ]
    );
    // Node 3 was down at 1M: one follower, so no "lower" point there.
    assert_eq!(
        series[2].name,
        "followers, resident, the lower; left out: 1M (1 follower)"
    );
    assert_eq!(
        series[2].points,
        vec![(0.0, 70.0), (100_000.0, 166.0), (500_000.0, 407.0)]
    );
    assert_eq!(series[3].name, "peak of any node (VmHWM)");
    assert_eq!(
        series[3].points.iter().map(|p| p.1).collect::<Vec<_>>(),
        [76.0, 170.0, 420.0, 687.0]
    );
    axes_cover_the_data(&chart);
    let texts = texts(&chart.svg().expect("drawn"));
    assert!(
        texts.iter().any(|t| t == "resident memory per node (MiB)"),
        "{texts:?}"
    );
}

#[test]
fn the_idle_cpu_curve_skips_a_checkpoint_without_the_leaders_figure() {
    let chart = report().idle_cpu_chart().expect("has idle CPU figures");
    assert_eq!(chart.series.len(), 1);
    assert!(
        chart.series[0]
            .name
            .ends_with("left out: 1M (not measured)"),
        "{}",
        chart.series[0].name
    );
    assert_eq!(
        chart.series[0].points,
        vec![(0.0, 0.8), (100_000.0, 0.9), (500_000.0, 0.9)]
    );
    axes_cover_the_data(&chart);
}

#[test]
fn only_the_zero_checkpoint_still_draws_every_plot() {
    let mut json: serde_json::Value = serde_json::from_str(W5).expect("JSON");
    let checkpoints = json["checkpoints"].as_array_mut().expect("checkpoints");
    checkpoints.retain(|c| c["held"] == 0);
    assert_eq!(checkpoints.len(), 1);
    let report = W5Report::parse(&json.to_string()).expect("parses");
    let dir = tempfile::tempdir().expect("a temporary directory");
    let outcomes = w5_figures::write_all(&report, dir.path()).expect("drawn");
    assert_eq!(outcomes.len(), 4);
    for outcome in outcomes {
        let Outcome::Written(path) = outcome else {
            panic!("not drawn: {outcome:?}");
        };
        let svg = std::fs::read_to_string(&path).expect("read back");
        assert!(!texts(&svg).is_empty(), "{}", path.display());
    }
}

#[test]
fn plot_redraws_a_w5_json_into_four_svg_files() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let input = dir.path().join("w5.json");
    std::fs::write(&input, W5).expect("written");
    let out = dir.path().join("plots");
    let written = redraw::plot_file(&input, &out).expect("plots drawn");
    let files = [W1_FILE, W3_FILE, MEMORY_FILE, IDLE_CPU_FILE];
    assert_eq!(written, files.map(|f| out.join(f)).to_vec());
    for path in written {
        let svg = std::fs::read_to_string(&path).expect("read back");
        let texts = texts(&svg);
        assert!(
            texts.iter().any(|t| t.contains("against locks held")),
            "{}: {texts:?}",
            path.display()
        );
    }
}

#[test]
fn a_w5_json_without_checkpoints_says_what_it_lacks() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let input = dir.path().join("w5.json");
    std::fs::write(&input, r#"{"tool": "lock-bench w5", "checkpoints": []}"#).expect("written");
    let error = format!(
        "{:#}",
        redraw::plot_file(&input, dir.path()).expect_err("nothing to plot")
    );
    assert!(error.contains("nothing to plot in"), "{error}");
    assert!(error.contains(&input.display().to_string()), "{error}");
    assert!(
        error.contains("no checkpoint in this w5.json has a W1 figure"),
        "{error}"
    );
    assert!(
        error.contains(W3_FILE) && error.contains(MEMORY_FILE),
        "{error}"
    );
}

#[test]
fn the_tool_tells_a_w5_json_from_a_results_json() {
    assert_eq!(redraw::kind(W5).expect("known"), Kind::W5);
    assert_eq!(
        redraw::kind(r#"{"tool": "lock-bench", "format": 2}"#).expect("known"),
        Kind::Table
    );
    let other = format!(
        "{:#}",
        redraw::kind(r#"{"tool": "fio"}"#).expect_err("not ours")
    );
    assert!(other.contains(r#"its "tool" is "fio""#), "{other}");
    let none = format!("{:#}", redraw::kind("[1, 2]").expect_err("not an object"));
    assert!(
        none.contains("not a lock-bench results.json nor w5.json"),
        "{none}"
    );
    let missing = format!("{:#}", redraw::kind("{}").expect_err("no tool"));
    assert!(missing.contains(r#""tool" is missing"#), "{missing}");
}

#[test]
fn bad_files_are_refused_naming_the_file_never_a_panic() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let refused = |name: &str, text: &str| {
        let input = dir.path().join(name);
        std::fs::write(&input, text).expect("written");
        let error = format!(
            "{:#}",
            redraw::plot_file(&input, &dir.path().join("out")).expect_err("refused")
        );
        assert!(
            error.contains(&input.display().to_string()),
            "{name}: the error does not name the file: {error}"
        );
        error
    };
    assert!(refused("broken.json", "{\"tool\": ").contains("not a JSON object"));
    assert!(refused("other.json", r#"{"tool": 7}"#).contains(r#""tool" is 7"#));
    let newer = refused("newer.json", r#"{"tool": "lock-bench w5", "format": 2}"#);
    assert!(
        newer.contains("format 2 was written by a newer lock-bench"),
        "{newer}"
    );
    let shape = refused(
        "shape.json",
        r#"{"tool": "lock-bench w5", "checkpoints": [{"held": -1}]}"#,
    );
    assert!(shape.contains("not a lock-bench w5.json"), "{shape}");
    let missing = dir.path().join("absent.json");
    let error = format!(
        "{:#}",
        redraw::plot_file(&missing, dir.path()).expect_err("no file")
    );
    assert!(error.contains(&missing.display().to_string()), "{error}");
}
