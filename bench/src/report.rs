//! The report: the headline table (W1–W3 for lockd's two client styles and etcd), then
//! one table of rows with lockd, etcd, their ratio and the target, printed as markdown and
//! written with every raw figure as JSON. Owns formatting and the target rules; measures
//! nothing.

use std::fmt::Write as _;

use serde::Serialize;

use crate::floors::{CONCURRENT_SYNCERS, Floors};
use crate::lockd::ClientStyle;
use crate::workload::{LoopResult, SessionsResult};

/// Issue 7: lockd's W1 pairs/s must be at least this many times etcd's.
pub const W1_RATIO_TARGET: f64 = 7.0;
/// Issue 7: lockd's W2 hand-offs/s must be at least this many times etcd's.
pub const W2_RATIO_TARGET: f64 = 10.0;
/// Issue 23 (issue 7 had 0.6): lockd's unloaded (W3) acquire p50 must be at most this, in
/// milliseconds.
pub const W3_ACQUIRE_P50_MS_TARGET: f64 = 0.5;
/// Issue 7: the W4 sessions may cost W1 at most this share of its pairs/s, in percent.
pub const W4_COST_PCT_TARGET: f64 = 10.0;

/// Everything measured on one system (for lockd: with one client style).
#[derive(Debug, Clone, Serialize)]
pub struct SystemResults {
    /// lockd's client style for every workload here; `None` for etcd.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client: Option<ClientStyle>,
    /// The leader's client address during the run.
    pub leader_addr: String,
    /// W1 uncontended.
    pub w1: LoopResult,
    /// W2 hot key.
    pub w2: LoopResult,
    /// W3 one client (with its acquire histogram).
    pub w3: LoopResult,
    /// W4 sessions (W1 under background keep-alives); run with one lockd client style only
    /// (the Pipeline stream when it runs), `None` for the other.
    pub w4: Option<SessionsResult>,
}

impl SystemResults {
    /// How much W1 pairs/s the W4 sessions cost, in percent of W1 without them.
    pub fn w4_cost_pct(&self) -> Option<f64> {
        self.w4.as_ref().map(SessionsResult::cost_pct)
    }

    /// Failed operations over every workload.
    pub fn errors(&self) -> u64 {
        self.w1.errors
            + self.w2.errors
            + self.w3.errors
            + self
                .w4
                .as_ref()
                .map_or(0, |w4| w4.w1.errors + w4.baseline.errors)
    }
}

/// One row of the table.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// What the row measures.
    pub name: String,
    /// lockd's figure (with the client style the name says: the Pipeline stream unless it
    /// begins with [`UNARY_PREFIX`]).
    pub lockd: Option<f64>,
    /// etcd's figure.
    pub etcd: Option<f64>,
    /// lockd / etcd.
    pub ratio: Option<f64>,
    /// The target, in words.
    pub target: Option<String>,
    /// Whether lockd meets the target; `None` when there is no target or not enough data.
    pub met: Option<bool>,
}

/// How the rows of lockd's unary client begin; the Pipeline stream's rows keep the names they
/// had before the unary client was measured, so tables of both ages compare row by row.
pub const UNARY_PREFIX: &str = "unary client: ";

/// A target rule: (lockd's figure, lockd/etcd if known) → met.
type Rule<'a> = &'a dyn Fn(f64, Option<f64>) -> bool;

/// Builds the table rows from whichever systems ran: lockd's Pipeline-stream rows (named as
/// before), then its unary client's rows (named with [`UNARY_PREFIX`]) when it ran.
pub fn rows(
    pipeline: Option<&SystemResults>,
    unary: Option<&SystemResults>,
    etcd: Option<&SystemResults>,
) -> Vec<Row> {
    let mut rows = group("", pipeline, etcd, true);
    if let Some(unary) = unary {
        let with_w4 = unary.w4.is_some();
        rows.extend(group(UNARY_PREFIX, Some(unary), etcd, with_w4));
    }
    rows
}

/// The rows of one lockd client style against etcd, each name after `prefix`; W4's only with
/// `with_w4`.
fn group(
    prefix: &str,
    lockd: Option<&SystemResults>,
    etcd: Option<&SystemResults>,
    with_w4: bool,
) -> Vec<Row> {
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
            name: format!("{prefix}{name}"),
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
    if with_w4 {
        row(
            "W4 sessions: W1 pairs/s without them (slices between)",
            &|s| s.w4.as_ref().map(|w4| w4.baseline.pairs_per_sec),
            None,
        );
        row(
            "W4 sessions: W1 pairs/s with the sessions",
            &|s| s.w4.as_ref().map(|w4| w4.w1.pairs_per_sec),
            None,
        );
        row(
            "W4 server CPU per pair (ms, 3 nodes)",
            &|s| s.w4.as_ref().and_then(|w4| w4.w1.server_cpu_ms_per_pair),
            None,
        );
        row(
            "W4 keep-alives/s offered",
            &|s| {
                s.w4.as_ref()
                    .map(|w4| w4.keepers.keepalives_offered_per_sec)
            },
            None,
        );
        row(
            "W4 keep-alives/s answered",
            &|s| s.w4.as_ref().map(|w4| w4.keepers.keepalives_per_sec),
            None,
        );
        row(
            "W4 cost to W1 (%)",
            &SystemResults::w4_cost_pct,
            Some((format!("≤ {W4_COST_PCT_TARGET}%"), &|l: f64, _| {
                l <= W4_COST_PCT_TARGET
            })),
        );
        row(
            "W4 keep-alives failed",
            &|s| s.w4.as_ref().map(|w4| w4.keepers.keepalive_errors as f64),
            Some(("0".to_owned(), &|l: f64, _| l == 0.0)),
        );
    }
    row(
        if with_w4 {
            "errors (W1–W4 acquire/release)"
        } else {
            "errors (W1–W3 acquire/release)"
        },
        &|s| Some(s.errors() as f64),
        Some(("0".to_owned(), &|l: f64, _| l == 0.0)),
    );
    rows
}

/// The table: W1, W2 and W3's headline figure for each lockd client style and etcd,
/// each lockd throughput with its ratio to etcd's, and the target.
pub fn headline(
    unary: Option<&SystemResults>,
    pipeline: Option<&SystemResults>,
    etcd: Option<&SystemResults>,
) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| workload | {} | {} | etcd | target |",
        ClientStyle::Unary.label(),
        ClientStyle::Pipeline.label()
    );
    out.push_str("|---|---:|---:|---:|---|\n");
    let line = |out: &mut String,
                name: &str,
                get: fn(&SystemResults) -> Option<f64>,
                with_ratio: bool,
                target| {
        let e = etcd.and_then(get);
        let cell = |s: Option<&SystemResults>| match (s.and_then(get), e) {
            (Some(l), Some(e)) if with_ratio && e != 0.0 => {
                format!("{} ({:.2}×)", grouped(l), l / e)
            }
            (l, _) => grouped_or_dash(l),
        };
        let _ = writeln!(
            out,
            "| {name} | {} | {} | {} | {target} |",
            cell(unary),
            cell(pipeline),
            grouped_or_dash(e)
        );
    };
    line(
        &mut out,
        "W1 32 workers, 100k keys: pairs/s",
        |s| Some(s.w1.pairs_per_sec),
        true,
        format!("≥ {W1_RATIO_TARGET}× etcd for both"),
    );
    line(
        &mut out,
        "W2 16 workers, one hot key: hand-offs/s",
        |s| Some(s.w2.pairs_per_sec),
        true,
        format!("≥ {W2_RATIO_TARGET}× etcd"),
    );
    line(
        &mut out,
        "W3 one worker: acquire p50 (ms)",
        |s| s.w3.acquire.p50_ms,
        false,
        format!("≤ {W3_ACQUIRE_P50_MS_TARGET} ms"),
    );
    out
}

/// `value` with thousands grouped (`5,220`) from 1,000 up, else as [`number`] formats it.
fn grouped(value: f64) -> String {
    if value.abs() < 1000.0 {
        return number(Some(value));
    }
    let digits = format!("{:.0}", value.abs());
    let mut out = String::new();
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(digit);
    }
    if value < 0.0 {
        out.insert(0, '-');
    }
    out
}

fn grouped_or_dash(value: Option<f64>) -> String {
    value.map_or_else(|| "–".to_owned(), grouped)
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

/// The tables as markdown: `headline` (see [`headline`]), the comparison rows, then the
/// floors.
pub fn markdown(headline: &str, rows: &[Row], floors: &Floors) -> String {
    let mut out = String::new();
    if !headline.is_empty() {
        out.push_str(headline);
        out.push('\n');
    }
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

/// The line under the tables that says how both systems were reached: TLS alike (the
/// default) or plaintext alike (`--insecure`).
pub fn transport_note(tls: bool) -> String {
    if tls {
        "\nTransport: TLS on both systems: client and peer connections, a client certificate \
         required on each (`--insecure`: plaintext on both).\n"
            .to_owned()
    } else {
        "\nTransport: plaintext on both systems (`--insecure`).\n".to_owned()
    }
}

/// The line under the tables that says how busy the machine of `cpus` CPUs was: the 1-minute
/// load average (the first field of /proc/loadavg) at the start and at the end of the run.
pub fn load_note(cpus: usize, at_start: &str, at_end: &str) -> String {
    let first = |l: &str| l.split_whitespace().next().unwrap_or("?").to_owned();
    format!(
        "\nLoad average (1 min) on this {cpus}-CPU machine: {} at the start, {} at the end.\n",
        first(at_start),
        first(at_end)
    )
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

    #[test]
    fn grouped_puts_a_comma_every_three_digits() {
        assert_eq!(grouped(5220.4), "5,220");
        assert_eq!(grouped(1_234_567.0), "1,234,567");
        assert_eq!(grouped(-7094.0), "-7,094");
        assert_eq!(grouped(999.0), "999");
        assert_eq!(grouped(0.632), "0.632");
        assert_eq!(grouped_or_dash(None), "–");
        assert_eq!(
            load_note(2, "2.50 3.13 3.10 1/82 13022", ""),
            "\nLoad average (1 min) on this 2-CPU machine: 2.50 at the start, ? at the end.\n"
        );
    }

    fn system(pairs: u64, latency_ms: u64, w4: bool) -> SystemResults {
        let result = || LoopResult::for_test(pairs, latency_ms);
        SystemResults {
            client: None,
            leader_addr: "127.0.0.1:1".into(),
            w1: result(),
            w2: result(),
            w3: result(),
            w4: w4.then(|| SessionsResult {
                keepers: Default::default(),
                session_ttl_ms: 15_000,
                rounds: 2,
                w1: result(),
                baseline: result(),
            }),
        }
    }

    #[test]
    fn the_unary_rows_follow_the_pipeline_rows_under_their_prefix_without_w4() {
        let (pipeline, unary, etcd) = (
            system(700, 1, true),
            system(500, 1, false),
            system(100, 2, true),
        );
        let plain = rows(Some(&pipeline), None, Some(&etcd));
        assert!(plain.iter().all(|r| !r.name.starts_with(UNARY_PREFIX)));
        let all = rows(Some(&pipeline), Some(&unary), Some(&etcd));
        let (ours, theirs) = all.split_at(plain.len());
        let names = |rows: &[Row]| rows.iter().map(|r| r.name.clone()).collect::<Vec<_>>();
        assert_eq!(
            names(ours),
            names(&plain),
            "the Pipeline rows keep their names"
        );
        assert!(theirs.iter().all(|r| r.name.starts_with(UNARY_PREFIX)));
        assert!(theirs.iter().all(|r| !r.name.contains("W4")));
        let w1 = |rows: &[Row]| {
            rows.iter()
                .find(|r| r.name.contains("W1 uncontended"))
                .cloned()
        };
        let unary_w1 = w1(theirs).expect("a unary W1 row");
        assert_eq!(
            (unary_w1.lockd, unary_w1.etcd, unary_w1.ratio),
            (Some(500.0), Some(100.0), Some(5.0))
        );
        assert_eq!(unary_w1.met, Some(false), "5× is short of 7×");
        assert_eq!(w1(ours).and_then(|r| r.ratio), Some(7.0));
        assert_eq!(w1(ours).and_then(|r| r.met), Some(true));
    }

    #[test]
    fn the_headline_has_both_styles_with_ratios_for_throughput_only() {
        let table = headline(
            Some(&system(5220, 1, false)),
            Some(&system(7094, 1, true)),
            Some(&system(1400, 2, true)),
        );
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(
            lines[0],
            "| workload | lockd, unary client | lockd, Pipeline stream | etcd | target |"
        );
        assert_eq!(
            lines[2],
            "| W1 32 workers, 100k keys: pairs/s | 5,220 (3.73×) | 7,094 (5.07×) | 1,400 | ≥ 7× etcd for both |"
        );
        assert_eq!(
            lines[4],
            "| W3 one worker: acquire p50 (ms) | 1 | 1 | 2 | ≤ 0.5 ms |"
        );
        let without_unary = headline(None, Some(&system(7094, 1, true)), None);
        assert!(
            without_unary
                .lines()
                .nth(2)
                .is_some_and(|l| l.contains("| – | 7,094 | – |"))
        );
    }
}
