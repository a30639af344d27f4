//! The report in the run's folder: `results.json` (verdict, figures, every property's result,
//! the nodes' cost) and `index.html` (the verdict first, then the timeline per key, the nodes'
//! cost under it, latency and throughput).
//!
//! Owns the results' shape and the page. Reads the history and the verdict; must not decide
//! anything and must not run anything.

pub mod charts;
pub mod cost;
pub mod svg;

use std::fmt::Write as _;
use std::fs;
use std::path::Path;

use anyhow::Context;
use serde::Serialize;

use crate::checker::{Analysis, CheckConfig, Status, Verdict, secs};
use crate::history::Op;
use crate::stats::Stats;
use svg::esc;

/// Name of the history file in a run's folder.
pub const HISTORY_FILE: &str = "history.jsonl";
/// Name of the results file in a run's folder.
pub const RESULTS_FILE: &str = "results.json";
/// Name of the HTML report in a run's folder.
pub const HTML_FILE: &str = "index.html";

/// Everything `results.json` holds.
#[derive(Clone, Debug, Serialize)]
pub struct Results {
    /// pass / fail / unknown over all properties.
    pub status: Status,
    /// The run's parameters (absent for a re-check of an existing history).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run: Option<serde_json::Value>,
    /// The checker's parameters.
    pub check: CheckConfig,
    /// Operation and fault counts.
    pub stats: Stats,
    /// Total violations over all properties.
    pub violations: u64,
    /// One result per property.
    pub properties: Vec<crate::checker::PropertyResult>,
    /// What each node used (absent when the run has no resource samples).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resources: Option<cost::Cost>,
}

/// Builds the results of a checked history (`analysis` is `ops` paired, with its samples).
pub fn results(
    ops: &[Op],
    analysis: &Analysis,
    verdict: &Verdict,
    check: &CheckConfig,
    run: Option<serde_json::Value>,
) -> Results {
    Results {
        status: verdict.status,
        run,
        check: *check,
        stats: Stats::of(ops),
        violations: verdict.properties.iter().map(|p| p.violation_count).sum(),
        properties: verdict.properties.clone(),
        resources: cost::figures(analysis),
    }
}

/// Writes `results.json` and `index.html` into `dir`.
pub fn write(
    dir: &Path,
    analysis: &Analysis,
    verdict: &Verdict,
    results: &Results,
) -> anyhow::Result<()> {
    fs::create_dir_all(dir).with_context(|| format!("creating report folder {}", dir.display()))?;
    let json = serde_json::to_string_pretty(results).context("encoding results.json")?;
    let path = dir.join(RESULTS_FILE);
    fs::write(&path, json).with_context(|| format!("writing {}", path.display()))?;
    let path = dir.join(HTML_FILE);
    fs::write(&path, html(analysis, verdict, results))
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

fn status_badge(status: Status) -> &'static str {
    match status {
        Status::Pass => "<span class=\"pass\">PASS</span>",
        Status::Fail => "<span class=\"fail\">FAIL</span>",
        Status::Unknown => "<span class=\"unknown\">UNKNOWN</span>",
    }
}

/// The HTML page.
pub fn html(analysis: &Analysis, verdict: &Verdict, results: &Results) -> String {
    let mut out = String::new();
    out.push_str(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>lock-jepsen report</title>\
         <style>body{font-family:sans-serif;margin:20px;max-width:1240px}\
         table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ccc;padding:3px 8px;\
         font-size:13px;text-align:left}.pass{color:#fff;background:#2a2;padding:2px 8px}\
         .fail{color:#fff;background:#d22;padding:2px 8px}.unknown{color:#000;background:#fc3;\
         padding:2px 8px}h1 span{font-size:26px}.legend{font-size:13px}li{font-size:13px}\
         </style></head><body>",
    );
    let _ = write!(
        out,
        "<h1>lock-jepsen: {} &nbsp; <small>{} violations, {} operations, {} faults installed, {}</small></h1>",
        status_badge(results.status),
        results.violations,
        results.stats.operations,
        results.stats.faults_installed(),
        secs(results.stats.duration_ns)
    );
    if let Some(run) = &results.run {
        let field = |name: &str| run.get(name).and_then(|n| n.as_str()).unwrap_or("");
        if let Some(net) = run.get("net").and_then(|n| n.as_str()) {
            let _ = write!(
                out,
                "<p><b>network:</b> {} ({}) — {}</p>",
                esc(net),
                esc(field("network")),
                esc(field("net_why"))
            );
        }
        if !field("net_faults").is_empty() {
            let _ = write!(
                out,
                "<p><b>slow/flaky links:</b> {}</p>",
                esc(field("net_faults"))
            );
        }
        if !field("nemesis_note").is_empty() {
            let _ = write!(out, "<p><b>nemeses:</b> {}</p>", esc(field("nemesis_note")));
        }
        if !field("lockd").is_empty() {
            let _ = write!(
                out,
                "<p><b>lockd:</b> <code>{}</code> ({})</p>",
                esc(field("lockd")),
                esc(field("lockd_note"))
            );
        }
        let _ = write!(
            out,
            "<p><b>run:</b> <code>{}</code></p>",
            esc(&run.to_string())
        );
    }
    out.push_str("<p>Files: <a href=\"history.jsonl\">history.jsonl</a> · <a href=\"results.json\">results.json</a></p>");

    out.push_str("<h2>Timeline per key</h2>");
    out.push_str(
        "<p class=\"legend\">Bars: each grant's validity window (acknowledged → deadline / release / \
         loss / revoke / client pause), coloured by client; faded bars end at a client pause. \
         Black ticks: accepted writes. Red dots: fenced writes. Purple dots: revokes. Shaded \
         bands: faults. Red lines: violations. Hover for details.</p>",
    );
    out.push_str(&charts::legend());
    out.push_str(&charts::timeline(analysis, verdict));

    out.push_str("<h2>Cost per node</h2>");
    out.push_str(&cost::charts(analysis));

    out.push_str("<h2>Properties (DESIGN.md §5, D-cost)</h2><table><tr><th>property</th><th>promise</th><th>verdict</th><th>checked</th><th>excused</th><th>violations</th><th>note</th></tr>");
    for p in &verdict.properties {
        let _ = write!(
            out,
            "<tr><td><b>{}</b><br><small>{}</small></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(p.name),
            esc(p.design_ref),
            esc(p.promise),
            status_badge(p.status),
            p.checked,
            p.excused,
            p.violation_count,
            esc(p.note.as_deref().unwrap_or(""))
        );
    }
    out.push_str("</table>");
    for p in verdict
        .properties
        .iter()
        .filter(|p| !p.violations.is_empty())
    {
        let _ = write!(out, "<h3>{} violations</h3><ul>", esc(p.name));
        for v in &p.violations {
            let _ = write!(out, "<li>{}: {}</li>", secs(v.t_ns), esc(&v.message));
        }
        out.push_str("</ul>");
    }

    out.push_str("<h2>Latency over time</h2>");
    out.push_str(&charts::latency(analysis));
    out.push_str("<h2>Throughput over time</h2>");
    out.push_str(&charts::throughput(analysis));

    out.push_str("<h2>Figures</h2><table><tr><th>operation</th><th>invoke</th><th>ok</th><th>fail</th><th>info</th></tr>");
    for (f, c) in &results.stats.ops {
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(f),
            c.invoke,
            c.ok,
            c.fail,
            c.info
        );
    }
    out.push_str("</table><table><tr><th>fault</th><th>installed</th><th>skipped</th><th>indeterminate</th><th>healed</th></tr>");
    for (f, c) in &results.stats.faults {
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(f),
            c.installed,
            c.skipped,
            c.indeterminate,
            c.healed
        );
    }
    let _ = write!(
        out,
        "</table><p>Writes fenced out: {}. Revokes that displaced a grant: {}.</p>",
        results.stats.writes_fenced, results.stats.revokes_displacing
    );
    if let Some(c) = &results.resources {
        out.push_str("<h3>Cost: outages and minutes</h3>");
        out.push_str(&cost::tables(c));
    }
    out.push_str("</body></html>\n");
    out
}
