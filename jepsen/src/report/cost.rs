//! The cost part of the report: what each node used while the run went on — CPU, log rate,
//! resident memory — as three charts under the timeline (on its time axis, faults shaded, the
//! outage bounds drawn as dashed lines), and the figures `results.json` carries: per node per
//! minute, and per outage per survivor.
//!
//! A spinning survivor is a plateau near 100 % of a core during an outage band; a log storm a
//! cliff in the log chart; a leak a ramp in the RSS chart. Reads the samples and the checker's
//! measurements; must not judge (the checker's `outage_cost` does).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use super::charts::{LEFT, RIGHT, WIDTH, axis, fault_bands};
use super::svg::{Svg, nice_step};
use crate::checker::outage_cost::{
    self, OUTAGE_SETTLE, OUTAGE_WINDOW, OUTAGE_WINDOW_MIN, OutageCost, SURVIVOR_CPU_CORES_MAX,
    SURVIVOR_LOG_BYTES_PER_S_MAX,
};
use crate::checker::{Analysis, secs};
use crate::resources::{self, Minute, SAMPLE_EVERY};

/// Most points per node and chart: a long run's samples are averaged into at most this many
/// bins, so an hour's page stays small and a spin still fills its bins.
const BINS_MAX: u64 = 600;

/// Colours of the nodes' lines (node 1 first), distinct from the clients' hues.
const NODE_COLOURS: [&str; 9] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf",
    "#bcbd22",
];

/// The bounds the checker applies, as `results.json` states them.
#[derive(Clone, Debug, Serialize)]
pub struct Bounds {
    /// [`SURVIVOR_CPU_CORES_MAX`].
    pub survivor_cpu_cores_max: f64,
    /// [`SURVIVOR_LOG_BYTES_PER_S_MAX`].
    pub survivor_log_bytes_per_s_max: f64,
    /// [`OUTAGE_SETTLE`], in seconds.
    pub outage_settle_s: f64,
    /// [`OUTAGE_WINDOW`], in seconds.
    pub outage_window_s: f64,
    /// [`OUTAGE_WINDOW_MIN`], in seconds.
    pub outage_window_min_s: f64,
}

/// The nodes' cost in `results.json`.
#[derive(Clone, Debug, Serialize)]
pub struct Cost {
    /// How often each node was sampled, in seconds.
    pub sample_every_s: f64,
    /// Samples taken.
    pub samples: usize,
    /// The outage bounds.
    pub bounds: Bounds,
    /// Per node, per minute: CPU seconds, log bytes, largest RSS.
    pub per_minute: Vec<Minute>,
    /// Per outage, per window and survivor: the averages the checker judged.
    pub outages: Vec<OutageCost>,
}

/// The cost figures of a run; `None` if it has no resource samples.
pub fn figures(analysis: &Analysis) -> Option<Cost> {
    if analysis.resources.is_empty() {
        return None;
    }
    Some(Cost {
        sample_every_s: SAMPLE_EVERY.as_secs_f64(),
        samples: analysis.resources.len(),
        bounds: Bounds {
            survivor_cpu_cores_max: SURVIVOR_CPU_CORES_MAX,
            survivor_log_bytes_per_s_max: SURVIVOR_LOG_BYTES_PER_S_MAX,
            outage_settle_s: OUTAGE_SETTLE.as_secs_f64(),
            outage_window_s: OUTAGE_WINDOW.as_secs_f64(),
            outage_window_min_s: OUTAGE_WINDOW_MIN.as_secs_f64(),
        },
        per_minute: resources::per_minute(&analysis.resources),
        outages: outage_cost::measure(analysis),
    })
}

/// One node's binned series: per bin, the value (none where the node was down).
struct Series {
    cpu_cores: Vec<Option<f64>>,
    log_bytes_per_s: Vec<Option<f64>>,
    rss_bytes: Vec<Option<f64>>,
}

/// Bins every node's samples: CPU and log as rates over the steps between consecutive
/// samples (CPU only within one process), RSS as the largest sample of the bin.
fn series(analysis: &Analysis, bin_ns: u64, bins: usize) -> BTreeMap<u64, Series> {
    let mut by_node: BTreeMap<u64, Vec<&resources::Sample>> = BTreeMap::new();
    for s in &analysis.resources {
        by_node.entry(s.node).or_default().push(s);
    }
    let bin_of = |t: u64| ((t / bin_ns) as usize).min(bins - 1);
    by_node
        .into_iter()
        .map(|(node, samples)| {
            // Per bin: (cpu seconds, seconds of cpu steps, log bytes, seconds of log steps).
            let mut acc = vec![(0.0f64, 0.0f64, 0.0f64, 0.0f64); bins];
            let mut rss: Vec<Option<f64>> = vec![None; bins];
            for s in &samples {
                if let Some(r) = s.rss_bytes {
                    let slot = &mut rss[bin_of(s.t_ns)];
                    *slot = Some(slot.map_or(r as f64, |m: f64| m.max(r as f64)));
                }
            }
            for pair in samples.windows(2) {
                let (a, b) = (pair[0], pair[1]);
                let dt = b.t_ns.saturating_sub(a.t_ns) as f64 / 1e9;
                if dt <= 0.0 {
                    continue;
                }
                let slot = &mut acc[bin_of(a.t_ns / 2 + b.t_ns / 2)];
                slot.2 += b.log_bytes.saturating_sub(a.log_bytes) as f64;
                slot.3 += dt;
                if a.pid.is_some()
                    && a.pid == b.pid
                    && let (Some(x), Some(y)) = (a.cpu_s, b.cpu_s)
                {
                    slot.0 += (y - x).max(0.0);
                    slot.1 += dt;
                }
            }
            let rate = |sum: f64, secs: f64| (secs > 0.0).then(|| sum / secs);
            (
                node,
                Series {
                    cpu_cores: acc.iter().map(|a| rate(a.0, a.1)).collect(),
                    log_bytes_per_s: acc.iter().map(|a| rate(a.2, a.3)).collect(),
                    rss_bytes: rss,
                },
            )
        })
        .collect()
}

/// One chart: a line per node over the run, fault bands behind, an optional dashed bound.
/// Values and the bound are multiplied by `scale` into the chart's `unit`, so the grid falls
/// on round numbers of that unit.
fn panel(
    analysis: &Analysis,
    lines: &[(u64, &[Option<f64>])],
    bin_ns: u64,
    bound: Option<f64>,
    scale: f64,
    unit: &str,
) -> String {
    let height = 200.0;
    let top = 10.0;
    let bottom = height - 30.0;
    let axis = axis(analysis);
    let bound = bound.map(|b| b * scale);
    let observed = lines
        .iter()
        .flat_map(|(_, v)| v.iter().flatten().map(|v| v * scale))
        .fold(0.0f64, f64::max);
    let y_max = observed.max(bound.unwrap_or(0.0) * 1.25).max(1e-9) * 1.1;
    let y_of = |v: f64| bottom - (bottom - top) * (v / y_max);
    let label = |v: f64| {
        let digits = if y_max < 10.0 { 1 } else { 0 };
        format!("{v:.digits$} {unit}")
    };
    let mut svg = Svg::new(WIDTH, height);
    fault_bands(&mut svg, analysis, &axis, top, bottom);
    let step = nice_step(y_max / 4.0);
    let mut v = 0.0;
    while v <= y_max {
        let y = y_of(v);
        svg.line(LEFT, y, WIDTH - RIGHT, y, "#e4e4e4", 1.0);
        svg.text(LEFT - 6.0, y + 4.0, &label(v), 11.0, "end", "#333");
        v += step;
    }
    axis.draw(&mut svg, bottom, top);
    if let Some(b) = bound {
        let y = y_of(b);
        svg.dashed_line(LEFT, y, WIDTH - RIGHT, y, "#d00", 1.2);
        svg.text(
            WIDTH - RIGHT - 4.0,
            y - 4.0,
            &format!("outage bound {}", label(b)),
            11.0,
            "end",
            "#d00",
        );
    }
    for (node, values) in lines {
        let colour = node_colour(*node);
        // A node that is down has no value: the line breaks there.
        let mut segment: Vec<(f64, f64)> = Vec::new();
        for (i, value) in values.iter().enumerate() {
            match value {
                Some(v) => segment.push((axis.x(i as u64 * bin_ns + bin_ns / 2), y_of(v * scale))),
                None => svg.polyline(&std::mem::take(&mut segment), colour, 1.5),
            }
        }
        svg.polyline(&segment, colour, 1.5);
    }
    svg.finish()
}

fn node_colour(node: u64) -> &'static str {
    let i = usize::try_from(node.saturating_sub(1)).unwrap_or(0) % NODE_COLOURS.len();
    NODE_COLOURS[i]
}

/// The cost section's HTML: a legend and three charts (CPU, log rate, RSS), or a sentence if
/// the run has no samples.
pub fn charts(analysis: &Analysis) -> String {
    if analysis.resources.is_empty() {
        return "<p>No resource samples (a re-check without resources.jsonl).</p>".into();
    }
    let sample_ns = u64::try_from(SAMPLE_EVERY.as_nanos()).unwrap_or(1);
    let bin_ns = (analysis.end_t / BINS_MAX).max(sample_ns);
    let bins = usize::try_from(analysis.end_t / bin_ns + 1).unwrap_or(1);
    let by_node = series(analysis, bin_ns, bins);
    let mut out = String::from("<p class=\"legend\">");
    for node in by_node.keys() {
        let _ = write!(
            out,
            "<span style=\"color:{}\">■</span> n{node} ",
            node_colour(*node)
        );
    }
    let _ = write!(
        out,
        "&nbsp; averaged over {}; dashed red: the bound on every survivor during an outage \
         (averaged over each outage minute, after its first {}). Gaps: the node was down.</p>",
        secs(bin_ns),
        secs(u64::try_from(OUTAGE_SETTLE.as_nanos()).unwrap_or(0))
    );
    let lines = |pick: fn(&Series) -> &[Option<f64>]| -> Vec<(u64, &[Option<f64>])> {
        by_node.iter().map(|(n, s)| (*n, pick(s))).collect()
    };
    out.push_str("<h3>CPU (% of one core)</h3>");
    out.push_str(&panel(
        analysis,
        &lines(|s| &s.cpu_cores),
        bin_ns,
        Some(SURVIVOR_CPU_CORES_MAX),
        100.0,
        "%",
    ));
    out.push_str("<h3>Log written (KiB/s)</h3>");
    out.push_str(&panel(
        analysis,
        &lines(|s| &s.log_bytes_per_s),
        bin_ns,
        Some(SURVIVOR_LOG_BYTES_PER_S_MAX),
        1.0 / 1024.0,
        "KiB/s",
    ));
    out.push_str("<h3>Resident memory (MiB)</h3>");
    out.push_str(&panel(
        analysis,
        &lines(|s| &s.rss_bytes),
        bin_ns,
        None,
        1.0 / (1024.0 * 1024.0),
        "MiB",
    ));
    out
}

/// The cost tables' HTML: per outage and survivor the judged averages, then per node per
/// minute.
pub fn tables(cost: &Cost) -> String {
    let mut out = String::new();
    if !cost.outages.is_empty() {
        out.push_str(
            "<table><tr><th>outage</th><th>survivor</th><th>span</th><th>CPU</th>\
             <th>log</th><th>max RSS</th></tr>",
        );
        for o in &cost.outages {
            let what = format!(
                "n{} {} {} → {}",
                o.node,
                o.how,
                secs(o.start_t_ns),
                secs(o.heal_t_ns)
            );
            if o.survivors.is_empty() {
                let _ = write!(
                    out,
                    "<tr><td>{what}</td><td colspan=\"5\">too short to judge</td></tr>"
                );
            }
            for s in &o.survivors {
                let r = &s.rate;
                let cpu_class = if r.cpu_cores > SURVIVOR_CPU_CORES_MAX {
                    " class=\"fail\""
                } else {
                    ""
                };
                let log_class = if r.log_bytes_per_s > SURVIVOR_LOG_BYTES_PER_S_MAX {
                    " class=\"fail\""
                } else {
                    ""
                };
                let _ = write!(
                    out,
                    "<tr><td>{what}</td><td>n{}</td><td>{} → {}</td><td{cpu_class}>{:.1} %</td>\
                     <td{log_class}>{:.2} KiB/s</td><td>{}</td></tr>",
                    s.node,
                    secs(r.from_t_ns),
                    secs(r.to_t_ns),
                    r.cpu_cores * 100.0,
                    r.log_bytes_per_s / 1024.0,
                    r.rss_max_bytes
                        .map_or("-".into(), |b| format!("{:.0} MiB", b as f64 / 1048576.0))
                );
            }
        }
        out.push_str("</table>");
    }
    out.push_str(
        "<table><tr><th>node</th><th>minute</th><th>CPU s</th><th>log bytes</th>\
         <th>max RSS</th></tr>",
    );
    for m in &cost.per_minute {
        let _ = write!(
            out,
            "<tr><td>n{}</td><td>{}</td><td>{:.2}</td><td>{}</td><td>{}</td></tr>",
            m.node,
            m.minute,
            m.cpu_s,
            m.log_bytes,
            m.rss_max_bytes
                .map_or("-".into(), |b| format!("{:.0} MiB", b as f64 / 1048576.0))
        );
    }
    out.push_str("</table>");
    out
}
