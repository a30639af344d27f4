//! docs/DESIGN.md D-cost: a fault's cost is bounded. While one node is out (the outage
//! nemesis), every survivor retries with backoff and logs the loss once, so its CPU and log
//! rates stay small however long the outage lasts.
//!
//! Checked as: for each outage that took effect, its span from [`OUTAGE_SETTLE`] after the
//! start to the heal is cut into minutes ([`OUTAGE_WINDOW`]; a shorter last piece joins the
//! one before it); in each, every survivor's CPU use and log rate, averaged from its resource
//! samples, must stay at or under [`SURVIVOR_CPU_CORES_MAX`] and
//! [`SURVIVOR_LOG_BYTES_PER_S_MAX`]. Pass if they do (or the run had no outage); fail if one
//! does not; unknown if the run had an outage but no samples to judge it by. The node that is
//! out is not judged: it is dead, or alone and electing itself, which is its right.
//!
//! Reads the history's outage spans and the resource samples ([`crate::resources`]) only.

use std::time::Duration;

use serde::Serialize;

use super::{Analysis, PropertyResult, Status, duration_ns, secs};
use crate::history::F;
use crate::resources::{self, Rate};

/// Most CPU a survivor may use, in cores, averaged over an outage minute. A healthy node with
/// one peer gone serves the workload (a debug build at a few dozen operations per second uses
/// a tenth of a core or so) and heartbeats its remaining peer ten times a second; redialling
/// the lost peer with capped backoff costs nothing measurable. Half a core sustained for a
/// minute is a loop that does not wait: a redial or a resend without backoff.
pub const SURVIVOR_CPU_CORES_MAX: f64 = 0.5;

/// Most log a survivor may write, in bytes per second, averaged over an outage minute. A node
/// states the loss of a peer once and then summarises repeats (docs/DESIGN.md D-observe); the
/// workload's own lines are a few hundred bytes a second. 16 KiB/s is a hundred-odd lines a
/// second — a line per attempt — and more than a gigabyte a day.
pub const SURVIVOR_LOG_BYTES_PER_S_MAX: f64 = 16.0 * 1024.0;

/// Time after an outage starts that is not judged: the election that replaces a lost leader,
/// the new leader's first appends and the clients' failover all happen in it, and are the
/// cost of the fault's first moments, not of its length.
pub const OUTAGE_SETTLE: Duration = Duration::from_secs(5);

/// The span one average covers: a minute, as D-cost speaks of rates however long a fault
/// lasts, and a minute of samples smooths any one burst (a compaction, a snapshot).
pub const OUTAGE_WINDOW: Duration = Duration::from_secs(60);

/// Shortest span averaged: below ten seconds of samples one burst decides the figure. A
/// shorter outage (or the tail piece of a long one, which joins the piece before it) is not
/// judged on its own.
pub const OUTAGE_WINDOW_MIN: Duration = Duration::from_secs(10);

/// One survivor's use over one window of one outage.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SurvivorCost {
    /// The survivor.
    pub node: u64,
    /// What it used over the window (the span its samples cover).
    pub rate: Rate,
}

/// One outage and what its survivors used during it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OutageCost {
    /// The node that was out.
    pub node: u64,
    /// `kill` or `isolate`.
    pub how: String,
    /// When the outage started, ns.
    pub start_t_ns: u64,
    /// When it healed (the history's end if it never did), ns.
    pub heal_t_ns: u64,
    /// Per window, per survivor (empty if the outage was too short to judge).
    pub survivors: Vec<SurvivorCost>,
}

/// The judged windows of `[from, to]`: minutes, the last one taking a remainder shorter than
/// [`OUTAGE_WINDOW_MIN`]; none if the whole span is shorter.
fn windows(from: u64, to: u64) -> Vec<(u64, u64)> {
    let window = duration_ns(OUTAGE_WINDOW);
    let min = duration_ns(OUTAGE_WINDOW_MIN);
    let mut out: Vec<(u64, u64)> = Vec::new();
    let mut start = from;
    while to.saturating_sub(start) >= min {
        let end = (start + window).min(to);
        out.push((start, end));
        start = end;
    }
    if let Some(last) = out.last_mut()
        && to > start
    {
        last.1 = to;
    }
    out
}

/// Every outage that took effect, with its survivors' use per window.
pub fn measure(analysis: &Analysis) -> Vec<OutageCost> {
    let nodes = resources::nodes(&analysis.resources);
    // A window's samples span a little less than the window (the first comes up to a sampling
    // period after its start), and a survivor restarted inside it has fewer: half the shortest
    // window is the least span worth an average.
    let min_span = duration_ns(OUTAGE_WINDOW_MIN) / 2;
    analysis
        .faults
        .iter()
        .filter(|f| f.f == F::Outage && f.took_effect())
        .map(|fault| {
            let out = fault
                .value
                .get("node")
                .and_then(|n| n.as_u64())
                .unwrap_or(0);
            let heal = fault.heal_t.unwrap_or(analysis.end_t);
            let from = fault.start_t.saturating_add(duration_ns(OUTAGE_SETTLE));
            let mut survivors = Vec::new();
            for (a, b) in windows(from, heal) {
                for &node in nodes.iter().filter(|&&n| n != out) {
                    if let Some(rate) =
                        resources::rate_over(&analysis.resources, node, a, b, min_span)
                    {
                        survivors.push(SurvivorCost { node, rate });
                    }
                }
            }
            OutageCost {
                node: out,
                how: fault
                    .value
                    .get("how")
                    .and_then(|h| h.as_str())
                    .unwrap_or("?")
                    .to_owned(),
                start_t_ns: fault.start_t,
                heal_t_ns: heal,
                survivors,
            }
        })
        .collect()
}

/// Checks the survivors' CPU and log rates during every outage.
pub fn check(analysis: &Analysis) -> PropertyResult {
    let mut result = PropertyResult::new(
        "outage_cost",
        "DESIGN.md D-cost",
        "While a node is out, each survivor's CPU and log rate over an outage minute stay under \
         the bounds.",
    );
    let outages = measure(analysis);
    if outages.is_empty() {
        result.note = Some("no outage in this run".into());
        return result;
    }
    if analysis.resources.is_empty() {
        result.status = Status::Unknown;
        result.note = Some(format!(
            "{} outage(s) but no resource samples ({}) to judge them by",
            outages.len(),
            resources::RESOURCES_FILE
        ));
        return result;
    }
    let mut worst_cpu: f64 = 0.0;
    let mut worst_log: f64 = 0.0;
    for outage in &outages {
        if outage.survivors.is_empty() {
            result.excused += 1;
            continue;
        }
        for s in &outage.survivors {
            result.checked += 1;
            let r = &s.rate;
            worst_cpu = worst_cpu.max(r.cpu_cores);
            worst_log = worst_log.max(r.log_bytes_per_s);
            let during = format!(
                "during the outage of n{} ({}, {} → {}), survivor n{} over {} → {}",
                outage.node,
                outage.how,
                secs(outage.start_t_ns),
                secs(outage.heal_t_ns),
                s.node,
                secs(r.from_t_ns),
                secs(r.to_t_ns)
            );
            if r.cpu_cores > SURVIVOR_CPU_CORES_MAX {
                result.violate(
                    r.to_t_ns,
                    None,
                    format!(
                        "{during} used {:.0} % of a core (bound {:.0} %)",
                        r.cpu_cores * 100.0,
                        SURVIVOR_CPU_CORES_MAX * 100.0
                    ),
                );
            }
            if r.log_bytes_per_s > SURVIVOR_LOG_BYTES_PER_S_MAX {
                result.violate(
                    r.to_t_ns,
                    None,
                    format!(
                        "{during} logged {:.1} KiB/s (bound {:.0} KiB/s)",
                        r.log_bytes_per_s / 1024.0,
                        SURVIVOR_LOG_BYTES_PER_S_MAX / 1024.0
                    ),
                );
            }
        }
    }
    result.note = Some(format!(
        "{} outage(s); busiest survivor minute: {:.0} % of a core, {:.2} KiB/s of log (bounds \
         {:.0} %, {:.0} KiB/s){}",
        outages.len(),
        worst_cpu * 100.0,
        worst_log / 1024.0,
        SURVIVOR_CPU_CORES_MAX * 100.0,
        SURVIVOR_LOG_BYTES_PER_S_MAX / 1024.0,
        if result.excused > 0 {
            format!(
                "; {} too short to judge (under {} after the first {})",
                result.excused,
                secs(duration_ns(OUTAGE_WINDOW_MIN)),
                secs(duration_ns(OUTAGE_SETTLE))
            )
        } else {
            String::new()
        }
    ));
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn outage_spans_split_into_minutes_with_short_tails_joined() {
        assert_eq!(windows(0, 9 * S), vec![]);
        assert_eq!(windows(0, 15 * S), vec![(0, 15 * S)]);
        assert_eq!(windows(0, 60 * S), vec![(0, 60 * S)]);
        assert_eq!(windows(0, 65 * S), vec![(0, 65 * S)]);
        assert_eq!(windows(0, 75 * S), vec![(0, 60 * S), (60 * S, 75 * S)]);
        assert_eq!(
            windows(5 * S, 125 * S),
            vec![(5 * S, 65 * S), (65 * S, 125 * S)]
        );
    }
}
