//! W5's growth curves, made from a `w5.json` alone (a `--w5` run draws them from the file it
//! has just written, and `lock-bench plot` redraws any run's): W1 pairs/s, W3 acquire p50
//! and p99, every node's resident memory and the idle CPU, each against the locks held at
//! W5's checkpoints. Owns reading the checkpoints and choosing what each plot shows; the
//! drawing is `plot`'s.
//!
//! A checkpoint without a figure (its loads failed, a loop had errors, a node was down) is
//! left out of that line, never drawn as 0, and the line's legend says which and why.

use std::path::Path;

use anyhow::{Context, Result, bail};
use serde::Deserialize;

use super::figures::{Outcome, load_note, write_charts};
use super::{Axis, LineChart, Series, TEXT_MAX, compact};

/// The `"tool"` of a `w5.json`.
pub const TOOL: &str = "lock-bench w5";
/// The `w5.json` format this lock-bench writes (`format` in the file). 1 (also: no `format`
/// field, every file written before session 11) is the first.
pub const FORMAT: u32 = 1;

/// The file name of W1 throughput against held locks.
pub const W1_FILE: &str = "w5-w1-throughput-vs-held.svg";
/// The file name of W3 acquire latency (p50 and p99) against held locks.
pub const W3_FILE: &str = "w5-w3-acquire-latency-vs-held.svg";
/// The file name of every node's resident memory against held locks.
pub const MEMORY_FILE: &str = "w5-memory-vs-held.svg";
/// The file name of the idle CPU against held locks.
pub const IDLE_CPU_FILE: &str = "w5-idle-cpu-vs-held.svg";

/// What of a `w5.json` the plots read; every other field is ignored.
#[derive(Debug, Deserialize)]
struct W5View {
    tool: Option<String>,
    #[serde(default = "format_one")]
    format: u32,
    setup: Option<SetupView>,
    #[serde(default)]
    checkpoints: Vec<CheckpointView>,
}

fn format_one() -> u32 {
    1
}

#[derive(Debug, Deserialize)]
struct SetupView {
    #[serde(default)]
    load_average_at_start: String,
    #[serde(default)]
    load_average_at_end: String,
}

#[derive(Debug, Deserialize)]
struct CheckpointView {
    held: u64,
    #[serde(default)]
    memory: Vec<NodeMemoryView>,
    idle_cpu: Option<IdleCpuView>,
    loads: Option<LoadsView>,
}

#[derive(Debug, Deserialize)]
struct NodeMemoryView {
    #[serde(default)]
    leader: bool,
    memory: Option<MemoryView>,
}

#[derive(Debug, Deserialize)]
struct MemoryView {
    rss_mib: Option<f64>,
    peak_mib: Option<f64>,
}

#[derive(Debug, Deserialize)]
struct IdleCpuView {
    leader_pct: Option<f64>,
}

#[derive(Debug, Deserialize)]
struct LoadsView {
    w1: Option<LoopView>,
    w3: Option<LoopView>,
}

#[derive(Debug, Deserialize)]
struct LoopView {
    workers: Option<u64>,
    pairs_per_sec: Option<f64>,
    #[serde(default)]
    errors: u64,
    acquire: Option<SummaryView>,
}

#[derive(Debug, Deserialize)]
struct SummaryView {
    p50_ms: Option<f64>,
    p99_ms: Option<f64>,
}

/// A parsed `w5.json`, ready to plot.
#[derive(Debug)]
pub struct W5Report(W5View);

/// One line being built: its points, and the checkpoints left out of it with why.
struct Line {
    name: String,
    points: Vec<(f64, f64)>,
    left_out: Vec<String>,
}

impl Line {
    fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            points: Vec::new(),
            left_out: Vec::new(),
        }
    }

    /// Adds the point at `held` locks if `value` is `Ok` and a finite number (and above 0 if
    /// `positive`, for a log axis); else notes the checkpoint as left out, with the reason.
    fn add(&mut self, held: u64, value: Result<f64, String>, positive: bool) {
        let at = compact(held as f64);
        match value {
            Ok(v) if v.is_finite() && (!positive || v > 0.0) => self.points.push((held as f64, v)),
            Ok(v) => self.left_out.push(format!("{at} (value {v})")),
            Err(why) => self.left_out.push(format!("{at} ({why})")),
        }
    }

    /// The series: points in the order of held locks, the name followed by the checkpoints
    /// left out (their count alone if the list would make the name too long).
    fn series(mut self) -> Series {
        self.points.sort_by(|a, b| a.0.total_cmp(&b.0));
        let name = match self.left_out.len() {
            0 => self.name,
            n => {
                let full = format!("{}; left out: {}", self.name, self.left_out.join(", "));
                if full.chars().count() <= TEXT_MAX {
                    full
                } else {
                    format!("{}; {n} checkpoints left out", self.name)
                }
            }
        };
        Series::new(&name, self.points)
    }

    /// The reasons every checkpoint was left out, for the error of a plot with no point.
    fn why_empty(&self) -> String {
        if self.left_out.is_empty() {
            "no checkpoint".to_owned()
        } else {
            self.left_out.join(", ")
        }
    }
}

/// The lines that have a point, as series; `Err` with every line's reasons when none has.
fn series_of(lines: Vec<Line>, what: &str) -> Result<Vec<Series>> {
    if lines.iter().all(|l| l.points.is_empty()) {
        let why: Vec<String> = lines
            .iter()
            .map(|l| format!("{}: {}", l.name, l.why_empty()))
            .collect();
        bail!(
            "no checkpoint in this w5.json has {what} ({})",
            why.join("; ")
        );
    }
    Ok(lines
        .into_iter()
        .filter(|l| !l.points.is_empty())
        .map(Line::series)
        .collect())
}

/// The figure of a loop at a checkpoint: `Err` naming why there is none (the loads failed,
/// the loop is absent or had errors, or `figure` has no value).
fn loop_figure(
    loads: Option<&LoadsView>,
    which: fn(&LoadsView) -> Option<&LoopView>,
    figure: fn(&LoopView) -> Option<f64>,
) -> Result<f64, String> {
    let loads = loads.ok_or("loads failed")?;
    let result = which(loads).ok_or("not measured")?;
    if result.errors > 0 {
        return Err(format!("{} errors", result.errors));
    }
    figure(result).ok_or_else(|| "no figure".to_owned())
}

impl W5Report {
    /// Parses the text of a `w5.json`; refuses JSON that is not W5's or is of a newer format,
    /// naming which.
    pub fn parse(json: &str) -> Result<Self> {
        let view: W5View = serde_json::from_str(json).context("not a lock-bench w5.json")?;
        if view.tool.as_deref() != Some(TOOL) {
            bail!(
                "not a lock-bench w5.json: its \"tool\" is {:?}, not \"{TOOL}\"",
                view.tool
            );
        }
        if view.format > FORMAT {
            bail!(
                "w5.json of format {} was written by a newer lock-bench; this one reads formats \
                 1 to {FORMAT}",
                view.format
            );
        }
        Ok(Self(view))
    }

    /// The x axis of every W5 plot: from 0 to the most locks held at any checkpoint, so the
    /// plots line up and a checkpoint left out of a line shows as a gap at its end.
    fn held_axis(&self) -> Axis {
        let most = self.0.checkpoints.iter().map(|c| c.held).max().unwrap_or(0);
        Axis::linear("locks held")
            .zero_based()
            .covering(0.0, most as f64)
    }

    /// The run's load note for the titles.
    fn load_note(&self) -> String {
        self.0.setup.as_ref().map_or_else(String::new, |s| {
            load_note(&s.load_average_at_start, &s.load_average_at_end)
        })
    }

    /// W1 pairs/s against held locks, one line; `Err` names why there is nothing to draw.
    pub fn w1_chart(&self) -> Result<LineChart> {
        let workers = self
            .0
            .checkpoints
            .iter()
            .find_map(|c| c.loads.as_ref()?.w1.as_ref()?.workers);
        let name = workers.map_or("W1".to_owned(), |w| {
            format!("W1, {w} workers on random keys")
        });
        let mut line = Line::new(&name);
        for c in &self.0.checkpoints {
            let pairs = loop_figure(c.loads.as_ref(), |l| l.w1.as_ref(), |r| r.pairs_per_sec);
            line.add(c.held, pairs, false);
        }
        Ok(LineChart {
            title: format!("W5: W1 throughput against locks held{}", self.load_note()),
            x: self.held_axis(),
            y: Axis::linear("acquire → release pairs/s").zero_based(),
            series: series_of(vec![line], "a W1 figure")?,
            markers: true,
        })
    }

    /// W3's acquire p50 and p99 against held locks (a log axis: p99 is often 10–100 × p50);
    /// `Err` names why there is nothing to draw.
    pub fn w3_chart(&self) -> Result<LineChart> {
        let (mut p50, mut p99) = (
            Line::new("W3 acquire p50, one worker"),
            Line::new("W3 acquire p99, one worker"),
        );
        for c in &self.0.checkpoints {
            p50.add(
                c.held,
                loop_figure(
                    c.loads.as_ref(),
                    |l| l.w3.as_ref(),
                    |r| r.acquire.as_ref().and_then(|a| a.p50_ms),
                ),
                true,
            );
            p99.add(
                c.held,
                loop_figure(
                    c.loads.as_ref(),
                    |l| l.w3.as_ref(),
                    |r| r.acquire.as_ref().and_then(|a| a.p99_ms),
                ),
                true,
            );
        }
        Ok(LineChart {
            title: format!(
                "W5: W3 acquire latency against locks held{}",
                self.load_note()
            ),
            x: self.held_axis(),
            y: Axis::log("acquire latency (ms)"),
            series: series_of(vec![p50, p99], "a W3 figure")?,
            markers: true,
        })
    }

    /// Resident memory against held locks: the leader's, the two followers' (the higher and
    /// the lower at each checkpoint, so the lines do not swap with the leadership) and the
    /// highest peak of any node; `Err` names why there is nothing to draw.
    pub fn memory_chart(&self) -> Result<LineChart> {
        let mut leader = Line::new("leader, resident (VmRSS)");
        let mut higher = Line::new("followers, resident, the higher");
        let mut lower = Line::new("followers, resident, the lower");
        let mut peak = Line::new("peak of any node (VmHWM)");
        for c in &self.0.checkpoints {
            let rss = |leading: bool| -> Vec<f64> {
                c.memory
                    .iter()
                    .filter(|m| m.leader == leading)
                    .filter_map(|m| m.memory.as_ref()?.rss_mib)
                    .filter(|v| v.is_finite())
                    .collect()
            };
            let followers = rss(false);
            let lead = match rss(true).first() {
                Some(&v) => Ok(v),
                None if c.memory.iter().any(|m| m.leader) => Err("not running".to_owned()),
                None => Err("no leader".to_owned()),
            };
            leader.add(c.held, lead, false);
            let most = followers.iter().copied().reduce(f64::max);
            let least = followers.iter().copied().reduce(f64::min);
            higher.add(c.held, most.ok_or_else(|| "none".to_owned()), false);
            if followers.len() > 1 {
                lower.add(c.held, least.ok_or_else(|| "none".to_owned()), false);
            } else {
                lower.add(c.held, Err(format!("{} follower", followers.len())), false);
            }
            let peaks = c
                .memory
                .iter()
                .filter_map(|m| m.memory.as_ref()?.peak_mib)
                .filter(|v| v.is_finite())
                .reduce(f64::max);
            peak.add(c.held, peaks.ok_or_else(|| "none".to_owned()), false);
        }
        Ok(LineChart {
            title: format!(
                "W5: resident memory per node against locks held{}",
                self.load_note()
            ),
            x: self.held_axis(),
            y: Axis::linear("resident memory per node (MiB)").zero_based(),
            series: series_of(vec![leader, higher, lower, peak], "a memory figure")?,
            markers: true,
        })
    }

    /// The leader's CPU over the idle window (sessions beating, no lock traffic) against held
    /// locks; `Err` names why there is nothing to draw.
    pub fn idle_cpu_chart(&self) -> Result<LineChart> {
        let mut line = Line::new("leader, sessions beating, no lock traffic");
        for c in &self.0.checkpoints {
            let pct = c.idle_cpu.as_ref().and_then(|i| i.leader_pct);
            line.add(c.held, pct.ok_or_else(|| "not measured".to_owned()), false);
        }
        Ok(LineChart {
            title: format!("W5: idle CPU against locks held{}", self.load_note()),
            x: self.held_axis(),
            y: Axis::linear("CPU (% of one core)").zero_based(),
            series: series_of(vec![line], "an idle CPU figure")?,
            markers: true,
        })
    }
}

/// Draws every plot `report` has the data for into `dir` (created if missing); a plot
/// without its data is skipped with the reason. Fails on a plot that has its data but cannot
/// be drawn or written.
pub fn write_all(report: &W5Report, dir: &Path) -> Result<Vec<Outcome>> {
    write_charts(
        dir,
        [
            (W1_FILE, report.w1_chart()),
            (W3_FILE, report.w3_chart()),
            (MEMORY_FILE, report.memory_chart()),
            (IDLE_CPU_FILE, report.idle_cpu_chart()),
        ],
    )
}
