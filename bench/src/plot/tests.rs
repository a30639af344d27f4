//! Tests of the SVG charts and of the plots of a results.json: each chart must be well-formed
//! SVG carrying its title, axis labels and series names, bad input must be refused naming
//! what is wrong, and a results.json of the format before session 10 must parse and say what
//! it lacks.

use super::figures::{self, CDF_FILE, Outcome, Results, THROUGHPUT_FILE};
use super::redraw;
use super::*;

/// Every text of an SVG document, after checking that it is well-formed XML with an `svg`
/// root of the chart's size.
pub(super) fn texts(svg: &str) -> Vec<String> {
    let doc = roxmltree::Document::parse(svg).expect("the chart is well-formed XML");
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "svg");
    assert_eq!(root.attribute("width"), Some(WIDTH.to_string().as_str()));
    assert_eq!(root.attribute("height"), Some(HEIGHT.to_string().as_str()));
    doc.descendants()
        .filter(|n| n.has_tag_name("text"))
        .filter_map(|n| n.text().map(|t| t.trim().to_owned()))
        .collect()
}

/// The stroke colours of the polylines (the series' lines) of an SVG document.
pub(super) fn line_colours(svg: &str) -> Vec<String> {
    let doc = roxmltree::Document::parse(svg).expect("the chart is well-formed XML");
    doc.descendants()
        .filter(|n| n.has_tag_name("polyline"))
        .filter_map(|n| n.attribute("stroke").map(str::to_owned))
        .collect()
}

pub(super) fn hex((r, g, b): (u8, u8, u8)) -> String {
    format!("#{r:02X}{g:02X}{b:02X}")
}

fn chart(series: Vec<Series>) -> LineChart {
    LineChart {
        title: "W1 against held locks".into(),
        x: Axis::log("held locks"),
        y: Axis::linear("pairs/s").zero_based(),
        series,
        markers: true,
    }
}

#[test]
fn a_line_chart_is_svg_with_its_title_axes_and_series() {
    let svg = chart(vec![
        Series::new(
            "lockd & co",
            vec![(1e3, 7000.0), (1e5, 6900.0), (1e6, 6500.0)],
        ),
        Series::new("etcd", vec![(1e3, 1400.0), (1e6, 1300.0)]),
    ])
    .svg()
    .expect("drawn");
    let texts = texts(&svg);
    for want in [
        "W1 against held locks",
        "held locks",
        "pairs/s",
        "lockd & co",
        "etcd",
    ] {
        assert!(
            texts.iter().any(|t| t == want),
            "no text {want:?} in {texts:?}"
        );
    }
    // Tick labels are compact numbers: the log axis has 10k and 1M.
    assert!(texts.iter().any(|t| t == "1M"), "{texts:?}");
    // One line per series (and one per legend entry), in the first two colours.
    let colours = line_colours(&svg);
    for colour in [hex(COLOURS[0]), hex(COLOURS[1])] {
        assert!(colours.contains(&colour), "{colour} not in {colours:?}");
    }
    assert!(!colours.contains(&hex(COLOURS[2])), "{colours:?}");
}

#[test]
fn bad_input_is_refused_naming_the_series_and_point() {
    let error = |series| chart(series).svg().expect_err("refused").to_string();
    assert!(error(vec![]).contains("no series"));
    assert!(error(vec![Series::new("empty", vec![])]).contains("every series is empty"));
    let nan = error(vec![Series::new("nan", vec![(1.0, 1.0), (2.0, f64::NAN)])]);
    assert!(nan.contains("\"nan\", point 1: y is NaN"), "{nan}");
    let zero = error(vec![Series::new("zero", vec![(0.0, 1.0)])]);
    assert!(zero.contains("point 0: x = 0 on a log axis"), "{zero}");
    let many = error(
        (0..13)
            .map(|i| Series::new(&i.to_string(), vec![(1.0, 1.0)]))
            .collect(),
    );
    assert!(many.contains("13 series, at most 12"), "{many}");
    let long = error(vec![Series::new(&"x".repeat(201), vec![(1.0, 1.0)])]);
    assert!(long.contains("longer than 200"), "{long}");
}

#[test]
fn one_point_and_flat_lines_still_draw() {
    let flat = LineChart {
        x: Axis::linear("workers"),
        ..chart(vec![Series::new("one", vec![(4.0, 0.0)])])
    };
    let svg = flat.svg().expect("a single point draws");
    assert!(texts(&svg).iter().any(|t| t == "one"));
}

#[test]
fn log_ticks_are_labelled_at_one_two_and_five() {
    let labels: Vec<String> = [0.1, 0.2, 0.3, 0.5, 0.9, 1.0, 2.0, 7.0, 10.0, 50.0, 99.99999]
        .iter()
        .map(|&v| tick_label(Scale::Log, v))
        .collect();
    assert_eq!(
        labels,
        ["0.1", "0.2", "", "0.5", "", "1", "2", "", "10", "50", "100"]
    );
    assert_eq!(tick_label(Scale::Linear, 3.0), "3");
    let close = |(lo, hi): (f64, f64), want: (f64, f64)| {
        assert!((lo / want.0 - 1.0).abs() < 1e-6, "{lo} for {}", want.0);
        assert!((hi / want.1 - 1.0).abs() < 1e-6, "{hi} for {}", want.1);
        assert!(lo <= want.0, "{lo} must not be above {}", want.0);
    };
    close(Axis::log("l").range(0.43, 31.0), (0.1, 100.0));
    close(Axis::log("l").range(1000.0, 1000.0), (1000.0, 10000.0));
}

#[test]
fn an_axis_covering_a_span_draws_it_even_where_the_values_stop_short() {
    let covering = Axis::linear("held").zero_based().covering(0.0, 1e6);
    let (lo, hi) = covering.range(1e5, 2e5);
    assert_eq!(lo, 0.0);
    assert!(hi >= 1e6, "{hi}");
    // Values beyond the span still widen it.
    assert!(covering.range(0.0, 3e6).1 >= 3e6);
    // A span a log axis cannot draw (0) is ignored rather than breaking the axis.
    let log = Axis::log("ms").covering(0.0, 10.0);
    let (lo, hi) = log.range(1.0, 5.0);
    assert!(lo > 0.0 && lo <= 1.0 && hi >= 5.0, "{lo}..{hi}");
}

#[test]
fn compact_tick_labels() {
    assert_eq!(compact(1_000_000.0), "1M");
    assert_eq!(compact(1_500_000.0), "1.5M");
    assert_eq!(compact(200_000.0), "200k");
    assert_eq!(compact(25_000.0), "25k");
    assert_eq!(compact(7_094.0), "7094");
    assert_eq!(compact(32.0), "32");
    assert_eq!(compact(0.5), "0.5");
    assert_eq!(compact(0.632), "0.632");
    assert_eq!(compact(0.05), "0.05");
    assert_eq!(compact(0.0), "0");
    assert_eq!(compact(-2.5), "-2.5");
}

/// A small results.json of the current format: W3 histograms for both lockd styles and etcd,
/// and a two-point sweep of each.
const FIXED: &str = r#"{
  "tool": "lock-bench",
  "format": 2,
  "machine": {
    "load_average_at_start": "2.50 3.13 3.10 1/82 13022",
    "load_average_at_end": "3.75 3.20 3.12 1/82 13090"
  },
  "lockd": {
    "client": "pipeline",
    "w3": {
      "acquire": { "count": 4, "p50_ms": 0.632 },
      "acquire_histogram": { "growth": 1.01, "buckets": [
        { "upper_ms": 0.5, "count": 1 }, { "upper_ms": 0.64, "count": 2 },
        { "upper_ms": 2.0, "count": 1 } ] }
    }
  },
  "lockd_unary": {
    "client": "unary",
    "w3": {
      "acquire": { "count": 2, "p50_ms": 0.663 },
      "acquire_histogram": { "growth": 1.01, "buckets": [
        { "upper_ms": 0.67, "count": 1 }, { "upper_ms": 3.0, "count": 1 } ] }
    }
  },
  "etcd": {
    "w3": {
      "acquire": { "count": 2, "p50_ms": 1.401 },
      "acquire_histogram": { "growth": 1.01, "buckets": [
        { "upper_ms": 1.41, "count": 1 }, { "upper_ms": 9.0, "count": 1 } ] }
    }
  },
  "sweep": [
    { "label": "lockd, unary client", "points": [
      { "workers": 1, "pairs_per_sec": 700.0, "acquire_p50_ms": 0.66, "acquire_p99_ms": 1.2,
        "server_cpu_ms_per_pair": 2.1, "errors": 0 },
      { "workers": 32, "pairs_per_sec": 5220.0, "acquire_p50_ms": 5.0, "acquire_p99_ms": 9.0,
        "server_cpu_ms_per_pair": 0.3, "errors": 0 } ] },
    { "label": "lockd, Pipeline stream", "points": [
      { "workers": 32, "pairs_per_sec": 7094.0, "acquire_p50_ms": 4.0, "acquire_p99_ms": 8.0,
        "server_cpu_ms_per_pair": 0.26, "errors": 0 },
      { "workers": 1, "pairs_per_sec": 750.0, "acquire_p50_ms": 0.63, "acquire_p99_ms": 1.1,
        "server_cpu_ms_per_pair": 2.0, "errors": 0 } ] },
    { "label": "etcd", "points": [
      { "workers": 1, "pairs_per_sec": 350.0, "acquire_p50_ms": 1.4, "acquire_p99_ms": 3.0,
        "server_cpu_ms_per_pair": 4.0, "errors": 0 },
      { "workers": 32, "pairs_per_sec": 1400.0, "acquire_p50_ms": 20.0, "acquire_p99_ms": 40.0,
        "server_cpu_ms_per_pair": 1.1, "errors": 0 } ] }
  ]
}"#;

#[test]
fn the_throughput_plot_has_a_line_per_style_and_etcd_sorted_by_workers() {
    let chart = Results::parse(FIXED)
        .expect("parses")
        .throughput_chart()
        .expect("has a sweep");
    let names: Vec<&str> = chart.series.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names,
        ["lockd, unary client", "lockd, Pipeline stream", "etcd"]
    );
    assert_eq!(chart.series[1].points, vec![(1.0, 750.0), (32.0, 7094.0)]);
    assert!(
        chart.title.ends_with("(load average 2.50 → 3.75)"),
        "{}",
        chart.title
    );
    let texts = texts(&chart.svg().expect("drawn"));
    for want in names.iter().copied().chain(["acquire → release pairs/s"]) {
        assert!(texts.iter().any(|t| t == want), "no {want:?} in {texts:?}");
    }
    assert!(texts.iter().any(|t| t.starts_with("workers")), "{texts:?}");
}

#[test]
fn the_cdf_plot_rises_to_one_for_each_style_and_etcd() {
    let chart = Results::parse(FIXED)
        .expect("parses")
        .latency_cdf_chart()
        .expect("has histograms");
    let names: Vec<&str> = chart.series.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "lockd, unary client: p50 0.663 ms",
            "lockd, Pipeline stream: p50 0.632 ms",
            "etcd: p50 1.401 ms"
        ]
    );
    let pipeline = &chart.series[1].points;
    assert_eq!(pipeline[0].1, 0.0);
    assert_eq!(pipeline[1], (0.5, 0.25));
    assert_eq!(pipeline.last(), Some(&(2.0, 1.0)));
    assert_eq!(chart.x.scale, Scale::Log);
    let texts = texts(&chart.svg().expect("drawn"));
    assert!(
        texts.iter().any(|t| t == "acquire latency (ms)"),
        "{texts:?}"
    );
    assert!(texts.iter().any(|t| t == "etcd: p50 1.401 ms"), "{texts:?}");
}

#[test]
fn write_all_writes_both_plots_and_plot_file_answers_them() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let input = dir.path().join("results.json");
    std::fs::write(&input, FIXED).expect("written");
    let out = dir.path().join("plots");
    let written = redraw::plot_file(&input, &out).expect("plots drawn");
    assert_eq!(written, vec![out.join(THROUGHPUT_FILE), out.join(CDF_FILE)]);
    for path in written {
        let svg = std::fs::read_to_string(&path).expect("read back");
        assert!(!texts(&svg).is_empty());
    }
}

/// The results.json of the last run before session 10 (bench/results/ at `71666df`).
const FORMAT_ONE: &str = include_str!("testdata/results-format1.json");

#[test]
fn a_results_json_of_the_previous_format_parses_and_says_what_it_lacks() {
    let results = Results::parse(FORMAT_ONE).expect("format 1 parses");
    let dir = tempfile::tempdir().expect("a temporary directory");
    let outcomes = figures::write_all(&results, dir.path()).expect("nothing fails");
    assert_eq!(outcomes.len(), 2);
    for outcome in &outcomes {
        let Outcome::Skipped(_, why) = outcome else {
            panic!("format 1 has nothing to draw: {outcome:?}");
        };
        assert!(why.contains("format 1"), "{why}");
    }
    let input = dir.path().join("old.json");
    std::fs::write(&input, FORMAT_ONE).expect("written");
    let error = redraw::plot_file(&input, dir.path())
        .expect_err("nothing to plot")
        .to_string();
    assert!(error.contains("nothing to plot"), "{error}");
    assert!(error.contains("--sweep-workers"), "{error}");
    assert!(error.contains("no W3 acquire histogram"), "{error}");
}

#[test]
fn other_json_and_newer_formats_are_refused_by_name() {
    let other = Results::parse(r#"{"tool": "fio"}"#).expect_err("not ours");
    assert!(format!("{other:#}").contains("not a lock-bench results.json"));
    let broken = Results::parse("{").expect_err("not JSON");
    assert!(format!("{broken:#}").contains("not a lock-bench results.json"));
    let newer = Results::parse(r#"{"tool": "lock-bench", "format": 3}"#).expect_err("newer");
    assert!(format!("{newer:#}").contains("format 3 was written by a newer lock-bench"));
    let wrong = Results::parse(r#"{"tool": "lock-bench", "sweep": [{"label": 1}]}"#)
        .expect_err("a sweep of the wrong shape");
    assert!(format!("{wrong:#}").contains("invalid type"), "{wrong:#}");
}

#[test]
fn the_legend_goes_where_the_lines_are_not() {
    let line = |points| LineChart {
        x: Axis::linear("x"),
        y: Axis::linear("y"),
        ..chart(vec![Series::new("a", points)])
    };
    let corner = |chart: LineChart| chart.legend_corner((0.0, 1.0), (0.0, 1.0));
    // Rising through the lower left and upper right: the upper left is free.
    assert_eq!(
        corner(line(vec![(0.0, 0.0), (1.0, 1.0)])),
        Corner::UpperLeft
    );
    // Falling through the upper left and lower right: the upper right is free.
    assert_eq!(
        corner(line(vec![(0.0, 1.0), (1.0, 0.0)])),
        Corner::UpperRight
    );
    // Along the top: a lower corner.
    assert_eq!(
        corner(line(vec![(0.0, 0.95), (1.0, 0.95)])),
        Corner::LowerRight
    );
}
