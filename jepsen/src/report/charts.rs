//! The report's three pictures of the history: a timeline per key (grants as bars, faults as
//! shaded bands), operation latency over time, and throughput over time. (The nodes' cost is
//! drawn by [`super::cost`], on the same time axis.)
//!
//! Owns what each chart shows and how it is laid out. Reads the paired history and the
//! verdict; must not decide anything (the checker does) and must not read files.

use std::collections::BTreeMap;

use super::svg::{Svg, TimeAxis, esc, nice_step, process_colour};
use crate::checker::{Analysis, Verdict, WindowEnd, secs};
use crate::history::{ERROR_FENCED, F, OpType};

/// Width of every chart, in pixels.
pub(super) const WIDTH: f64 = 1200.0;
/// Left margin (lane labels), in pixels.
pub(super) const LEFT: f64 = 120.0;
/// Right margin, in pixels.
pub(super) const RIGHT: f64 = 20.0;
/// Most points drawn per series in the latency chart; beyond it every n-th is drawn, so a long
/// run's page stays small enough for a browser.
const POINTS_PER_SERIES_MAX: usize = 6000;

/// Every fault kind, in the order of the timeline's lanes and the legend.
const FAULTS: [F; 11] = [
    F::Partition,
    F::Kill,
    F::Pause,
    F::Clock,
    F::PauseClient,
    F::SlowNet,
    F::FlakyNet,
    F::Membership,
    F::Corrupt,
    F::PowerCut,
    F::Outage,
];

/// The colour of a fault kind's band.
fn fault_colour(f: F) -> &'static str {
    match f {
        F::Partition => "#d62728",
        F::Kill => "#7f3c8d",
        F::Pause => "#ff7f0e",
        F::Clock => "#1f77b4",
        F::PauseClient => "#2ca02c",
        F::Outage => "#8c564b",
        F::SlowNet => "#bcbd22",
        F::FlakyNet => "#17becf",
        F::Membership => "#e377c2",
        F::Corrupt => "#000000",
        F::PowerCut => "#7f7f7f",
        _ => "#888888",
    }
}

/// Colour of an operation kind in the latency and throughput charts.
fn op_colour(f: F) -> &'static str {
    match f {
        F::Acquire => "#1f77b4",
        F::Renew => "#2ca02c",
        F::Release => "#9467bd",
        F::Write => "#ff7f0e",
        _ => "#7f7f7f",
    }
}

pub(super) fn axis(analysis: &Analysis) -> TimeAxis {
    TimeAxis {
        left: LEFT,
        width: WIDTH - LEFT - RIGHT,
        t_max_ns: analysis.end_t.max(1),
    }
}

/// Shaded bands for every fault that took effect, between `top` and `bottom`.
pub(super) fn fault_bands(
    svg: &mut Svg,
    analysis: &Analysis,
    axis: &TimeAxis,
    top: f64,
    bottom: f64,
) {
    for fault in analysis.faults.iter().filter(|f| f.took_effect()) {
        let x0 = axis.x(fault.start_t);
        let x1 = axis.x(fault.heal_t.unwrap_or(analysis.end_t));
        let title = format!(
            "{} {} → {} {}",
            fault.f.name(),
            secs(fault.start_t),
            fault.heal_t.map_or("never healed".into(), secs),
            fault.value
        );
        svg.rect(
            x0,
            top,
            x1 - x0,
            bottom - top,
            fault_colour(fault.f),
            0.10,
            Some(&title),
        );
    }
}

/// The timeline: one lane per fault kind on top, then one lane per key with every grant's
/// validity window as a bar coloured by client, writes as ticks (fenced ones red), revokes as
/// purple dots, violations as red lines.
pub fn timeline(analysis: &Analysis, verdict: &Verdict) -> String {
    let kinds: Vec<F> = FAULTS
        .into_iter()
        .filter(|k| analysis.faults.iter().any(|f| f.f == *k))
        .collect();
    let windows = analysis.windows_by_key();
    let fault_lane = 14.0;
    let key_lane = 34.0;
    let top = 10.0;
    let keys_top = top + fault_lane * kinds.len() as f64 + 8.0;
    let bottom = keys_top + key_lane * windows.len().max(1) as f64;
    let height = bottom + 30.0;
    let axis = axis(analysis);
    let mut svg = Svg::new(WIDTH, height);
    axis.draw(&mut svg, bottom, top);
    fault_bands(&mut svg, analysis, &axis, keys_top, bottom);
    for (lane, kind) in kinds.iter().enumerate() {
        let y = top + fault_lane * lane as f64;
        svg.text(LEFT - 6.0, y + 10.0, kind.name(), 11.0, "end", "#333");
        for fault in analysis.faults.iter().filter(|f| f.f == *kind) {
            let x0 = axis.x(fault.start_t);
            let x1 = axis.x(fault.heal_t.unwrap_or(analysis.end_t));
            let opacity = if fault.took_effect() { 0.75 } else { 0.2 };
            let title = format!(
                "{} ({:?}) {} → {}: {}",
                kind.name(),
                fault.start_outcome,
                secs(fault.start_t),
                fault.heal_t.map_or("never healed".into(), secs),
                fault.value
            );
            svg.rect(
                x0,
                y + 1.0,
                x1 - x0,
                fault_lane - 3.0,
                fault_colour(*kind),
                opacity,
                Some(&title),
            );
        }
    }
    let mut lane_of: BTreeMap<&str, f64> = BTreeMap::new();
    for (lane, (key, key_windows)) in windows.iter().enumerate() {
        let y = keys_top + key_lane * lane as f64;
        lane_of.insert(key, y);
        svg.line(LEFT, y, WIDTH - RIGHT, y, "#ddd", 1.0);
        svg.text(
            LEFT - 6.0,
            y + key_lane / 2.0 + 4.0,
            key,
            12.0,
            "end",
            "#000",
        );
        for w in key_windows {
            let g = &analysis.grants[w.grant];
            let x0 = axis.x(w.start);
            let x1 = axis.x(w.end);
            let title = format!(
                "client {} token {}: valid {} → {} (ends: {})",
                g.process,
                g.token,
                secs(w.start),
                secs(w.end),
                serde_json::to_string(&w.end_reason).unwrap_or_default()
            );
            let opacity = if w.end_reason == WindowEnd::Paused {
                0.45
            } else {
                0.85
            };
            svg.rect(
                x0,
                y + 6.0,
                x1 - x0,
                key_lane - 14.0,
                &process_colour(g.process),
                opacity,
                Some(&title),
            );
        }
    }
    for cop in analysis.client_ops.iter().filter(|c| c.f == F::Write) {
        let Some(&y) = lane_of.get(cop.key.as_str()) else {
            continue;
        };
        let x = axis.x(cop.complete_t);
        match cop.outcome {
            OpType::Ok => svg.line(x, y + 3.0, x, y + 9.0, "#000", 1.0),
            OpType::Fail if cop.error() == Some(ERROR_FENCED) => {
                let title = format!(
                    "fenced write: client {} token {} at {}",
                    cop.process,
                    cop.token.unwrap_or(0),
                    secs(cop.complete_t)
                );
                svg.dot(x, y + key_lane - 5.0, 3.0, "#d00", Some(&title));
            }
            _ => {}
        }
    }
    for r in &analysis.revokes {
        if let Some(&y) = lane_of.get(r.key.as_str()) {
            let title = format!(
                "revoke {:?} at {} ({:?}, displaced {:?})",
                r.key,
                secs(r.invoke_t),
                r.outcome,
                r.previous_token
            );
            svg.dot(
                axis.x(r.invoke_t),
                y + key_lane / 2.0,
                3.5,
                "#8e24aa",
                Some(&title),
            );
        }
    }
    for property in &verdict.properties {
        for v in &property.violations {
            let x = axis.x(v.t_ns);
            let (y0, y1) = match v.key.as_deref().and_then(|k| lane_of.get(k)) {
                Some(&y) => (y, y + key_lane),
                None => (keys_top, bottom),
            };
            svg.line(x, y0, x, y1, "#ff0000", 2.5);
        }
    }
    svg.finish()
}

/// Latency of every completed client operation against its completion time, log scale.
pub fn latency(analysis: &Analysis) -> String {
    let height = 320.0;
    let top = 10.0;
    let bottom = height - 30.0;
    let axis = axis(analysis);
    let mut svg = Svg::new(WIDTH, height);
    fault_bands(&mut svg, analysis, &axis, top, bottom);
    let mut series: BTreeMap<F, Vec<(u64, f64, OpType)>> = BTreeMap::new();
    let mut max_ms: f64 = 1.0;
    for cop in &analysis.client_ops {
        if cop.completion.is_none() {
            continue;
        }
        let ms = (cop.complete_t.saturating_sub(cop.invoke_t)) as f64 / 1e6;
        max_ms = max_ms.max(ms);
        series
            .entry(cop.f)
            .or_default()
            .push((cop.complete_t, ms, cop.outcome));
    }
    let lo = 0.1f64.log10();
    let hi = (max_ms * 1.2).log10();
    let y_of = |ms: f64| bottom - (bottom - top) * ((ms.max(0.1).log10() - lo) / (hi - lo));
    let mut decade = 0.1f64;
    while decade <= max_ms * 1.2 {
        let y = y_of(decade);
        svg.line(LEFT, y, WIDTH - RIGHT, y, "#e4e4e4", 1.0);
        svg.text(
            LEFT - 6.0,
            y + 4.0,
            &format!("{decade} ms"),
            11.0,
            "end",
            "#333",
        );
        decade *= 10.0;
    }
    axis.draw(&mut svg, bottom, top);
    for (f, points) in &series {
        let stride = points.len().div_ceil(POINTS_PER_SERIES_MAX).max(1);
        for (t, ms, outcome) in points.iter().step_by(stride) {
            let colour = match outcome {
                OpType::Info => "#d00",
                OpType::Fail if *f == F::Acquire => "#999",
                _ => op_colour(*f),
            };
            svg.dot(axis.x(*t), y_of(*ms), 1.6, colour, None);
        }
    }
    svg.finish()
}

/// Completed client operations per second, one line per kind (ok only) plus all
/// indeterminate (`info`) outcomes.
pub fn throughput(analysis: &Analysis) -> String {
    let height = 260.0;
    let top = 10.0;
    let bottom = height - 30.0;
    let axis = axis(analysis);
    let bin_ns: u64 = 1_000_000_000;
    let bins = (analysis.end_t / bin_ns + 1) as usize;
    let mut counts: BTreeMap<&'static str, Vec<u64>> = BTreeMap::new();
    for cop in &analysis.client_ops {
        let series = match cop.outcome {
            OpType::Ok => cop.f.name(),
            OpType::Info => "info",
            _ => continue,
        };
        let bin = (cop.complete_t / bin_ns) as usize;
        let row = counts.entry(series).or_insert_with(|| vec![0; bins]);
        if let Some(slot) = row.get_mut(bin) {
            *slot += 1;
        }
    }
    let max = counts
        .values()
        .flat_map(|v| v.iter().copied())
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let step = nice_step(max / 5.0);
    let y_of = |v: f64| bottom - (bottom - top) * (v / (max * 1.1));
    let mut svg = Svg::new(WIDTH, height);
    fault_bands(&mut svg, analysis, &axis, top, bottom);
    let mut v = 0.0;
    while v <= max * 1.1 {
        let y = y_of(v);
        svg.line(LEFT, y, WIDTH - RIGHT, y, "#e4e4e4", 1.0);
        svg.text(
            LEFT - 6.0,
            y + 4.0,
            &format!("{v:.0}/s"),
            11.0,
            "end",
            "#333",
        );
        v += step;
    }
    axis.draw(&mut svg, bottom, top);
    for (name, row) in &counts {
        let colour = match *name {
            "acquire" => op_colour(F::Acquire),
            "renew" => op_colour(F::Renew),
            "release" => op_colour(F::Release),
            "write" => op_colour(F::Write),
            _ => "#d00",
        };
        let points: Vec<(f64, f64)> = row
            .iter()
            .enumerate()
            .map(|(i, &c)| (axis.x(i as u64 * bin_ns + bin_ns / 2), y_of(c as f64)))
            .collect();
        svg.polyline(&points, colour, 1.5);
    }
    svg.finish()
}

/// An HTML legend for the charts.
pub fn legend() -> String {
    let mut out = String::from("<p class=\"legend\">");
    for f in [F::Acquire, F::Renew, F::Release, F::Write] {
        out.push_str(&format!(
            "<span style=\"color:{}\">■</span> {} ",
            op_colour(f),
            esc(f.name())
        ));
    }
    out.push_str("<span style=\"color:#d00\">■</span> info (unknown outcome) ");
    out.push_str(
        "<span style=\"color:#999\">■</span> acquire not granted &nbsp; | &nbsp; faults: ",
    );
    for f in FAULTS {
        out.push_str(&format!(
            "<span style=\"color:{}\">■</span> {} ",
            fault_colour(f),
            esc(f.name())
        ));
    }
    out.push_str("</p>");
    out
}
