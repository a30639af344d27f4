//! The report: one table of rows with lockd, etcd, their ratio and the issue-7 target, printed
//! as markdown and written with every raw figure as JSON. Owns formatting and the target
//! rules; measures nothing.

use std::fmt::Write as _;

use serde::Serialize;

use crate::floors::{CONCURRENT_SYNCERS, Floors};
use crate::workload::{LoopResult, SessionsResult};

/// Issue 7: lockd's W1 pairs/s must be at least this many times etcd's.
pub const W1_RATIO_TARGET: f64 = 7.0;
/// Issue 7: lockd's W2 hand-offs/s must be at least this many times etcd's.
pub const W2_RATIO_TARGET: f64 = 10.0;
/// Issue 7: lockd's unloaded (W3) acquire p50 must be at most this, in milliseconds.
pub const W3_ACQUIRE_P50_MS_TARGET: f64 = 0.6;
/// Issue 7: the W4 sessions may cost W1 at most this share of its pairs/s, in percent.
pub const W4_COST_PCT_TARGET: f64 = 10.0;

/// Everything measured on one system.
#[derive(Debug, Clone, Serialize)]
pub struct SystemResults {
    /// The leader's client address during the run.
    pub leader_addr: String,
    /// W1 uncontended.
    pub w1: LoopResult,
    /// W2 hot key.
    pub w2: LoopResult,
    /// W3 one client.
    pub w3: LoopResult,
    /// W4 sessions (W1 under background keep-alives).
    pub w4: SessionsResult,
}

impl SystemResults {
    /// How much W1 pairs/s the W4 sessions cost, in percent of W1 without them.
    pub fn w4_cost_pct(&self) -> f64 {
        self.w4.cost_pct()
    }

    /// Failed operations over every workload.
    pub fn errors(&self) -> u64 {
        self.w1.errors
            + self.w2.errors
            + self.w3.errors
            + self.w4.w1.errors
            + self.w4.baseline.errors
    }
}

/// One row of the table.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// What the row measures.
    pub name: String,
    /// lockd's figure.
    pub lockd: Option<f64>,
    /// etcd's figure.
    pub etcd: Option<f64>,
    /// lockd / etcd.
    pub ratio: Option<f64>,
    /// The issue-7 target, in words.
    pub target: Option<String>,
    /// Whether lockd meets the target; `None` when there is no target or not enough data.
    pub met: Option<bool>,
}

/// A target rule: (lockd's figure, lockd/etcd if known) → met.
type Rule<'a> = &'a dyn Fn(f64, Option<f64>) -> bool;

/// Builds the table rows from whichever systems ran.
pub fn rows(lockd: Option<&SystemResults>, etcd: Option<&SystemResults>) -> Vec<Row> {
    let mut rows = Vec::new();
    let mut row = |name: &str,
                   get: &dyn Fn(&SystemResults) -> Option<f64>,
                   target: Option<(String, Rule<'_>)>| {
        let l = lockd.and_then(get);
        let e = etcd.and_then(get);
        let ratio = match (l, e) {
            (Some(l), Some(e)) if e != 0.0 => Some(l / e),
            _ => None,
        };
        let (target, met) = match target {
            Some((text, rule)) => (Some(text), l.map(|l| rule(l, ratio))),
            None => (None, None),
        };
        rows.push(Row {
            name: name.to_owned(),
            lockd: l,
            etcd: e,
            ratio,
            target,
            met,
        });
    };
    let ratio_at_least = |min: f64| move |_: f64, r: Option<f64>| r.is_some_and(|r| r >= min);
    let w1_rule = ratio_at_least(W1_RATIO_TARGET);
    let w2_rule = ratio_at_least(W2_RATIO_TARGET);
    row(
        "W1 uncontended: pairs/s (32 workers, 100k keys)",
        &|s| Some(s.w1.pairs_per_sec),
        Some((format!("≥ {W1_RATIO_TARGET}× etcd"), &w1_rule)),
    );
    row("W1 acquire p50 (ms)", &|s| s.w1.acquire.p50_ms, None);
    row("W1 acquire p99 (ms)", &|s| s.w1.acquire.p99_ms, None);
    row("W1 acquire p999 (ms)", &|s| s.w1.acquire.p999_ms, None);
    row("W1 release p50 (ms)", &|s| s.w1.release.p50_ms, None);
    row("W1 release p99 (ms)", &|s| s.w1.release.p99_ms, None);
    row(
        "W1 server CPU per pair (ms, 3 nodes)",
        &|s| s.w1.server_cpu_ms_per_pair,
        None,
    );
    row(
        "W1 client CPU per pair (ms, lock-bench)",
        &|s| s.w1.client_cpu_ms_per_pair,
        None,
    );
    row(
        "W1 log entries per pair",
        &|s| s.w1.log_entries_per_pair,
        None,
    );
    row(
        "W2 hot key: hand-offs/s (16 workers, 1 key)",
        &|s| Some(s.w2.pairs_per_sec),
        Some((format!("≥ {W2_RATIO_TARGET}× etcd"), &w2_rule)),
    );
    row("W2 acquire p50 (ms)", &|s| s.w2.acquire.p50_ms, None);
    row("W2 acquire p99 (ms)", &|s| s.w2.acquire.p99_ms, None);
    row(
        "W2 token-order violations",
        &|s| Some((s.w2.token_order_violations + s.w2.overlaps) as f64),
        Some(("0".to_owned(), &|l: f64, _| l == 0.0)),
    );
    row(
        "W2 log entries per hand-off",
        &|s| s.w2.log_entries_per_pair,
        None,
    );
    row(
        "W2 server CPU per hand-off (ms, 3 nodes)",
        &|s| s.w2.server_cpu_ms_per_pair,
        None,
    );
    row(
        "W2 client CPU per hand-off (ms, lock-bench)",
        &|s| s.w2.client_cpu_ms_per_pair,
        None,
    );
    row(
        "W3 one client: acquire p50 (ms)",
        &|s| s.w3.acquire.p50_ms,
        Some((
            format!("≤ {W3_ACQUIRE_P50_MS_TARGET} ms"),
            &|l: f64, _| l <= W3_ACQUIRE_P50_MS_TARGET,
        )),
    );
    row("W3 acquire p99 (ms)", &|s| s.w3.acquire.p99_ms, None);
    row("W3 release p50 (ms)", &|s| s.w3.release.p50_ms, None);
    row("W3 release p99 (ms)", &|s| s.w3.release.p99_ms, None);
    row(
        "W4 sessions: W1 pairs/s without them (slices between)",
        &|s| Some(s.w4.baseline.pairs_per_sec),
        None,
    );
    row(
        "W4 sessions: W1 pairs/s with the sessions",
        &|s| Some(s.w4.w1.pairs_per_sec),
        None,
    );
    row(
        "W4 server CPU per pair (ms, 3 nodes)",
        &|s| s.w4.w1.server_cpu_ms_per_pair,
        None,
    );
    row(
        "W4 keep-alives/s offered",
        &|s| Some(s.w4.keepers.keepalives_offered_per_sec),
        None,
    );
    row(
        "W4 keep-alives/s answered",
        &|s| Some(s.w4.keepers.keepalives_per_sec),
        None,
    );
    row(
        "W4 cost to W1 (%)",
        &|s| Some(s.w4_cost_pct()),
        Some((format!("≤ {W4_COST_PCT_TARGET}%"), &|l: f64, _| {
            l <= W4_COST_PCT_TARGET
        })),
    );
    row(
        "W4 keep-alives failed",
        &|s| Some(s.w4.keepers.keepalive_errors as f64),
        Some(("0".to_owned(), &|l: f64, _| l == 0.0)),
    );
    row(
        "errors (W1–W4 acquire/release)",
        &|s| Some(s.errors() as f64),
        Some(("0".to_owned(), &|l: f64, _| l == 0.0)),
    );
    rows
}

fn number(value: Option<f64>) -> String {
    match value {
        None => "–".to_owned(),
        Some(v) if v.fract() == 0.0 => format!("{v:.0}"),
        Some(v) if v.abs() >= 100.0 => format!("{v:.0}"),
        Some(v) if v.abs() >= 10.0 => format!("{v:.1}"),
        Some(v) => format!("{v:.3}"),
    }
}

/// The table as markdown: the comparison rows, then the floors.
pub fn markdown(rows: &[Row], floors: &Floors) -> String {
    let mut out = String::new();
    out.push_str("| workload / figure | lockd | etcd | lockd/etcd | target | met |\n");
    out.push_str("|---|---:|---:|---:|---|---|\n");
    for row in rows {
        let met = match row.met {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "",
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} |",
            row.name,
            number(row.lockd),
            number(row.etcd),
            row.ratio.map_or("–".to_owned(), |r| format!("{r:.2}×")),
            row.target.as_deref().unwrap_or(""),
            met,
        );
    }
    out.push_str("\n| floor (this machine) | p50 (ms) | p99 (ms) |\n|---|---:|---:|\n");
    let _ = writeln!(
        out,
        "| fdatasync, 4 KiB append on the data disk | {} | {} |",
        number(floors.fdatasync.p50_ms),
        number(floors.fdatasync.p99_ms)
    );
    let _ = writeln!(
        out,
        "| fdatasync, 4 KiB overwrite of preallocated space (as lockd's WAL) | {} | {} |",
        number(floors.fdatasync_overwrite.p50_ms),
        number(floors.fdatasync_overwrite.p99_ms)
    );
    let _ = writeln!(
        out,
        "| the same, {CONCURRENT_SYNCERS} files at once (each node of a cluster on this disk) | {} | {} |",
        number(floors.fdatasync_overwrite_concurrent.p50_ms),
        number(floors.fdatasync_overwrite_concurrent.p99_ms)
    );
    let _ = writeln!(
        out,
        "| gRPC unary round trip over loopback | {} | {} |",
        number(floors.grpc_round_trip.p50_ms),
        number(floors.grpc_round_trip.p99_ms)
    );
    let _ = writeln!(
        out,
        "| TCP round trip to another process over loopback (no gRPC) | {} | {} |",
        number(floors.tcp_process_round_trip.p50_ms),
        number(floors.tcp_process_round_trip.p99_ms)
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn number_formats_by_magnitude() {
        assert_eq!(number(None), "–");
        assert_eq!(number(Some(12345.6)), "12346");
        assert_eq!(number(Some(12.34)), "12.3");
        assert_eq!(number(Some(0.1234)), "0.123");
        assert_eq!(number(Some(0.0)), "0");
    }
}
