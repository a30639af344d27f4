//! The report's plots, made from a `results.json` alone (so `lock-bench plot` redraws any
//! run's): W1 throughput against workers (the worker sweep) and W3's acquire latency CDFs,
//! each for lockd's two client styles and etcd. Owns reading the JSON and choosing what each
//! plot shows; the drawing is `plot`'s.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::Deserialize;

use super::{Axis, LineChart, Series};
use crate::lockd::ClientStyle;
use crate::stats::Histogram;
use crate::sweep::SweepSeries;

/// The `results.json` format this lock-bench writes (`format` in the file). 1 (no `format`
/// field) is every file written before session 10: no unary client, no worker sweep, no
/// histograms. 2 adds `lockd_unary`, `sweep`, each lockd result's `client` and W3's
/// `acquire_histogram`.
pub const FORMAT: u32 = 2;

/// The file name of the throughput-against-workers plot.
pub const THROUGHPUT_FILE: &str = "w1-throughput-vs-workers.svg";
/// The file name of the latency CDF plot.
pub const CDF_FILE: &str = "w3-acquire-latency-cdf.svg";

/// What of a `results.json` the plots read; every other field is ignored.
#[derive(Debug, Deserialize)]
struct ResultsView {
    tool: Option<String>,
    #[serde(default = "format_one")]
    format: u32,
    machine: Option<MachineView>,
    lockd: Option<SystemView>,
    lockd_unary: Option<SystemView>,
    etcd: Option<SystemView>,
    #[serde(default)]
    sweep: Vec<SweepSeries>,
}

fn format_one() -> u32 {
    1
}

#[derive(Debug, Deserialize)]
struct MachineView {
    #[serde(default)]
    load_average_at_start: String,
    #[serde(default)]
    load_average_at_end: String,
}

#[derive(Debug, Deserialize)]
struct SystemView {
    client: Option<ClientStyle>,
    w3: Option<LoopView>,
}

#[derive(Debug, Deserialize)]
struct LoopView {
    acquire: Option<SummaryView>,
    acquire_histogram: Option<Histogram>,
}

#[derive(Debug, Deserialize)]
struct SummaryView {
    p50_ms: Option<f64>,
}

/// A parsed `results.json`, ready to plot.
#[derive(Debug)]
pub struct Results(ResultsView);

impl Results {
    /// Parses the text of a `results.json`; refuses JSON that is not lock-bench's or is of a
    /// newer format, naming which.
    pub fn parse(json: &str) -> Result<Self> {
        let view: ResultsView =
            serde_json::from_str(json).context("not a lock-bench results.json")?;
        if view.tool.as_deref() != Some("lock-bench") {
            bail!(
                "not a lock-bench results.json: its \"tool\" is {:?}, not \"lock-bench\"",
                view.tool
            );
        }
        if view.format > FORMAT {
            bail!(
                "results.json of format {} was written by a newer lock-bench; this one reads \
                 formats 1 to {FORMAT}",
                view.format
            );
        }
        Ok(Self(view))
    }

    /// The run's [`load_note`], or "" without the machine's figures.
    fn load_note(&self) -> String {
        self.0.machine.as_ref().map_or_else(String::new, |m| {
            load_note(&m.load_average_at_start, &m.load_average_at_end)
        })
    }

    /// W1 pairs/s against workers, one series per sweep series; `Err` names why there is
    /// nothing to draw.
    pub fn throughput_chart(&self) -> Result<LineChart> {
        let series: Vec<Series> = self
            .0
            .sweep
            .iter()
            .filter(|s| !s.points.is_empty())
            .map(|s| {
                let mut points: Vec<(f64, f64)> = s
                    .points
                    .iter()
                    .map(|p| (p.workers as f64, p.pairs_per_sec))
                    .collect();
                points.sort_by(|a, b| a.0.total_cmp(&b.0));
                Series::new(&s.label, points)
            })
            .collect();
        if series.is_empty() {
            bail!(
                "no worker sweep in this results.json (format {}): run lock-bench with \
                 --sweep-workers",
                self.0.format
            );
        }
        Ok(LineChart {
            title: format!("W1 throughput against workers{}", self.load_note()),
            x: Axis::linear("workers (each its own connection and session; 100k keys)")
                .zero_based(),
            y: Axis::linear("acquire → release pairs/s").zero_based(),
            series,
            markers: true,
        })
    }

    /// W3's acquire latency CDF for each system and client style that has a histogram;
    /// `Err` names why there is nothing to draw.
    pub fn latency_cdf_chart(&self) -> Result<LineChart> {
        let view = &self.0;
        let mut series = Vec::new();
        for (label, system) in [
            (ClientStyle::Unary.label(), view.lockd_unary.as_ref()),
            (ClientStyle::Pipeline.label(), view.lockd.as_ref()),
        ] {
            let Some(system) = system else { continue };
            // A lockd result of format 2 says its style; trust it over the key it is under.
            let label = system.client.map_or(label, ClientStyle::label);
            series.extend(cdf_series(label, system));
        }
        if let Some(etcd) = &view.etcd {
            series.extend(cdf_series("etcd", etcd));
        }
        if series.is_empty() {
            bail!(
                "no W3 acquire histogram in this results.json (format {}; lock-bench writes one \
                 from format 2 on): rerun lock-bench",
                view.format
            );
        }
        Ok(LineChart {
            title: format!("W3 acquire latency, one worker{}", self.load_note()),
            x: Axis::log("acquire latency (ms)"),
            y: Axis::linear("share of acquires at or below").zero_based(),
            series,
            markers: false,
        })
    }
}

/// " (load average 2.50 → 3.10)" from the machine's 1-minute load at the start (`start`) and
/// the end (`end`) of a run, both as `/proc/loadavg` reads; " (load average 2.50 at the
/// start)" without the end's, or "" without either.
pub fn load_note(start: &str, end: &str) -> String {
    let first = |l: &str| l.split_whitespace().next().map(str::to_owned);
    match (first(start), first(end)) {
        (Some(start), Some(end)) => format!(" (load average {start} → {end})"),
        (Some(start), None) => format!(" (load average {start} at the start)"),
        _ => String::new(),
    }
}

/// The CDF series of `system`'s W3, named `label` and its p50; `None` without a histogram.
fn cdf_series(label: &str, system: &SystemView) -> Option<Series> {
    let w3 = system.w3.as_ref()?;
    let histogram = w3.acquire_histogram.as_ref()?;
    let first = histogram.buckets.first()?;
    let mut points = vec![(first.upper_ms / histogram.growth.max(1.0), 0.0)];
    points.extend(histogram.cdf());
    let name = match w3.acquire.as_ref().and_then(|a| a.p50_ms) {
        Some(p50) => format!("{label}: p50 {p50:.3} ms"),
        None => label.to_owned(),
    };
    Some(Series::new(&name, points))
}

/// What [`write_all`] did with one plot.
#[derive(Debug)]
pub enum Outcome {
    /// Written to this file.
    Written(PathBuf),
    /// Not drawn, and why (the data it needs is not in the file).
    Skipped(&'static str, String),
}

/// Draws every plot `results` has the data for into `dir` (created if missing); a plot
/// without its data is skipped with the reason. Fails on a plot that has its data but
/// cannot be drawn or written.
pub fn write_all(results: &Results, dir: &Path) -> Result<Vec<Outcome>> {
    write_charts(
        dir,
        [
            (THROUGHPUT_FILE, results.throughput_chart()),
            (CDF_FILE, results.latency_cdf_chart()),
        ],
    )
}

/// Writes each chart to its file in `dir` (created if missing), or records why it has none:
/// the one loop behind every kind of run's `write_all`.
pub fn write_charts(
    dir: &Path,
    charts: impl IntoIterator<Item = (&'static str, Result<LineChart>)>,
) -> Result<Vec<Outcome>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut outcomes = Vec::new();
    for (file, chart) in charts {
        match chart {
            Ok(chart) => {
                let path = dir.join(file);
                chart.write(&path)?;
                outcomes.push(Outcome::Written(path));
            }
            Err(why) => outcomes.push(Outcome::Skipped(file, format!("{why:#}"))),
        }
    }
    Ok(outcomes)
}
