//! W5's report: every figure of the run as JSON (`w5.json`) and the tables of
//! bench/PERFORMANCE.md's W5 section as markdown (`w5.md`). Owns formatting; measures nothing.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use super::catchup::CatchUp;
use super::checkpoint::{Checkpoint, NodeState};
use super::failover::{Failover, Probe};
use super::keepalive::KeepAliveReport;
use super::many_sessions::{ManyRound, ManySessions};
use super::router::{RefusalCount, total};
use super::snapshots::SnapshotEvent;

/// Name of the JSON report in `--out`.
pub const JSON_FILE: &str = "w5.json";
/// Name of the markdown tables in `--out`.
pub const MARKDOWN_FILE: &str = "w5.md";

/// Where and how W5 ran.
#[derive(Debug, Clone, Serialize)]
pub struct Setup {
    /// The command line.
    pub command: String,
    /// The lockd binary.
    pub lockd_bin: String,
    /// CPUs of the machine.
    pub cpus: usize,
    /// Load average (1, 5, 15 min) at the start.
    pub load_average_at_start: String,
    /// Load average at the end.
    pub load_average_at_end: String,
    /// Filesystem of the nodes' data.
    pub data_filesystem: String,
    /// Sessions of the fill.
    pub sessions: usize,
    /// Locks per session.
    pub locks_per_session: usize,
    /// `snapshot_logs_since_last` of the nodes.
    pub snapshot_logs_since_last: u64,
    /// Whole run, in seconds.
    pub run_secs: f64,
}

/// The whole fill, all stretches together.
#[derive(Debug, Clone, Serialize)]
pub struct FillSummary {
    /// Locks granted.
    pub locks: usize,
    /// Time spent granting them (the stretches, without the checkpoints), in seconds.
    pub secs: f64,
    /// `locks / secs`.
    pub locks_per_sec: f64,
    /// Every refusal the fill met, by kind (each was retried).
    pub refusals: BTreeMap<String, RefusalCount>,
    /// Locks that could not be granted.
    pub failed: u64,
    /// Each node's term before the fill and after it: equal means no election.
    pub terms: Vec<(u64, Option<u64>, Option<u64>)>,
    /// Leaders each node learned of during the fill (0: no election).
    pub leader_changes: Vec<(u64, Option<u64>)>,
}

/// Snapshots taken during the run.
#[derive(Debug, Clone, Serialize)]
pub struct SnapshotSummary {
    /// Every new snapshot file seen, on every node, in order.
    pub events: Vec<SnapshotEvent>,
    /// Per node: (id, snapshots seen, largest size in bytes).
    pub per_node: Vec<(u64, usize, u64)>,
}

impl SnapshotSummary {
    /// Summarises `events` for the nodes `ids`.
    pub fn new(events: Vec<SnapshotEvent>, ids: &[u64]) -> Self {
        let per_node = ids
            .iter()
            .map(|&id| {
                let mine = events.iter().filter(|e| e.node_id == id);
                let (count, largest) = mine.fold((0, 0), |(c, l), e| (c + 1, l.max(e.bytes)));
                (id, count, largest)
            })
            .collect();
        Self { events, per_node }
    }
}

/// Everything W5 measured.
#[derive(Debug, Clone, Serialize)]
pub struct ScaleReport {
    /// `"lock-bench w5"` (`plot::w5_figures::TOOL`): how `lock-bench plot` knows a w5.json.
    pub tool: &'static str,
    /// The w5.json format (`plot::w5_figures::FORMAT`).
    pub format: u32,
    /// Where and how.
    pub setup: Setup,
    /// Every node before anything ran.
    pub nodes_at_start: Vec<NodeState>,
    /// W1 with and without ~`SESSIONS_MAX` sessions.
    pub many_sessions: Option<ManySessions>,
    /// The fill.
    pub fill: Option<FillSummary>,
    /// The growth curve: one entry per checkpoint.
    pub checkpoints: Vec<Checkpoint>,
    /// Follower catch-up from a snapshot.
    pub catch_up: Option<CatchUp>,
    /// Failover at full size.
    pub failover: Option<Failover>,
    /// What keeping the held locks alive did, the whole run.
    pub keepalive: Option<KeepAliveReport>,
    /// Refusals the keep-alive calls met, by kind.
    pub keepalive_refusals: BTreeMap<String, RefusalCount>,
    /// Snapshots taken.
    pub snapshots: SnapshotSummary,
    /// Every node at the end.
    pub nodes_at_end: Vec<NodeState>,
    /// Steps that failed, with why.
    pub errors: Vec<String>,
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or("–".to_owned(), |v| format!("{v:.digits$}"))
}

fn mib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / (1024.0 * 1024.0))
}

fn kinds(refusals: &BTreeMap<String, RefusalCount>) -> String {
    if refusals.is_empty() {
        return "none".to_owned();
    }
    refusals
        .iter()
        .map(|(k, c)| format!("{k} {}", c.count))
        .collect::<Vec<_>>()
        .join(", ")
}

fn probe_row(out: &mut String, name: &str, p: &Probe) {
    let _ = writeln!(
        out,
        "| {name} | {} | {} | {} | {} |",
        opt(p.served_secs, 3),
        opt(p.after_first_grant_secs, 3),
        kinds(&p.refusals),
        p.lost.as_deref().unwrap_or("no"),
    );
}

/// The last attempts of the kind of call served last after the failover: whether the time after
/// the first grant went into refusals, into calls the new leader held, or into the probe's own
/// rotation over the nodes.
fn last_attempts(f: &Failover) -> String {
    let kinds = [
        ("the first grant", &f.grant),
        ("the heartbeat", &f.heartbeat),
        ("the renewal", &f.renew),
        ("the confirmed read", &f.confirmed_read),
    ];
    let Some((name, last, _)) = kinds
        .iter()
        .filter_map(|&(name, p)| p.served_secs.map(|secs| (name, p, secs)))
        .max_by(|a, b| a.2.total_cmp(&b.2))
    else {
        return String::new();
    };
    let attempts = last
        .timeline
        .iter()
        .rev()
        .take(4)
        .rev()
        .map(|a| {
            format!(
                "node index {} at {:.3} s: {} in {:.1} ms",
                a.node, a.start_secs, a.answer, a.call_ms
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    format!("\nLast attempts of {name}, served last: {attempts}.\n")
}

/// The many-sessions step's paragraph. W1's costs are shown as W1's change (a cost of 5 % is
/// "-5.0 %"), as the step's figure always was: combined, then each round's against the slices
/// without the sessions on either side, and their median.
fn many_sessions_paragraph(m: &ManySessions) -> String {
    let k = &m.keepalive;
    let list = |secs: &dyn Fn(&ManyRound) -> f64| {
        m.rounds
            .iter()
            .map(|r| format!("{:.1}", secs(r)))
            .collect::<Vec<_>>()
            .join(" / ")
    };
    let per_round = m
        .rounds
        .iter()
        .map(|r| format!("{:+.1} %", -r.w1_cost_pct))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "\nMany sessions: {} round{} of {} fresh sessions kept alive at TTL/3 (TTL {} s, {:.0} \
         beats/s due; {} live at the peak, {} before), opened in {} s, closed in {} s: W1 {:.0} \
         pairs/s with them, {:.0} without (**{:+.1} %** combined; per round, against the slices \
         without them on either side, {per_round}: median **{:+.1} %**); {} beats answered, {} \
         batches failed, **{} sessions lost**; refusals {}. The beats alone, with no lock \
         traffic, cost the leader {} % of a core over {:.0} s ({} µs per beat due).\n",
        m.rounds.len(),
        if m.rounds.len() == 1 { "" } else { "s" },
        m.sessions,
        m.session_ttl_ms / 1000,
        m.beats_offered_per_sec,
        m.live_peak,
        m.live_before,
        list(&|r| r.open_secs),
        list(&|r| r.close_secs),
        m.w1_with.pairs_per_sec,
        m.w1_without.pairs_per_sec,
        -m.w1_cost_pct,
        -m.w1_cost_pct_median,
        k.beats_ok,
        k.batches_failed,
        k.lost_count,
        kinds(&m.refusals),
        m.beats_only
            .leader_pct
            .map_or("–".to_owned(), |p| format!("{p:.1}")),
        m.beats_only.secs,
        m.leader_us_per_beat
            .map_or("–".to_owned(), |us| format!("{us:.1}")),
    )
}

impl ScaleReport {
    /// The markdown tables.
    pub fn markdown(&self) -> String {
        let mut out = String::new();
        let s = &self.setup;
        let _ = writeln!(
            out,
            "W5: {} sessions × {} locks, {} CPUs, data on {}, load average {} at the start and {} \
             at the end, {:.0} s in all.\n\n`{}`\n",
            s.sessions,
            s.locks_per_session,
            s.cpus,
            s.data_filesystem,
            s.load_average_at_start,
            s.load_average_at_end,
            s.run_secs,
            s.command
        );
        out.push_str(
            "| held locks | fill locks/s | RSS leader / followers (MiB) | peak (MiB) | idle CPU leader (% core) | \
             W1 pairs/s | W3 acquire p50 / p99 (ms) | fill refusals | leader snapshot (MiB) | load avg |\n",
        );
        out.push_str("|---:|---:|---|---|---:|---:|---|---|---:|---|\n");
        for c in &self.checkpoints {
            let leader = c.memory.iter().find(|m| m.leader);
            let rss: Vec<String> = c
                .memory
                .iter()
                .map(|m| opt(m.memory.map(|m| m.rss_mib), 0))
                .collect();
            let peak: Vec<String> = c
                .memory
                .iter()
                .map(|m| opt(m.memory.map(|m| m.peak_mib), 0))
                .collect();
            let snapshot = leader
                .and_then(|l| c.nodes.iter().find(|n| n.node_id == l.node_id))
                .and_then(|n| n.snapshot.as_ref())
                .map_or("–".to_owned(), |f| mib(f.bytes));
            let _ = writeln!(
                out,
                "| {} | {} | {} (node {}) | {} | {} | {} | {} / {} | {} | {} | {} |",
                c.held,
                opt(c.fill.as_ref().map(|f| f.locks_per_sec), 0),
                rss.join(" / "),
                leader.map_or(0, |l| l.node_id),
                peak.join(" / "),
                opt(c.idle_cpu.leader_pct, 1),
                opt(c.loads.as_ref().map(|l| l.w1.pairs_per_sec), 0),
                opt(c.loads.as_ref().and_then(|l| l.w3.acquire.p50_ms), 3),
                opt(c.loads.as_ref().and_then(|l| l.w3.acquire.p99_ms), 3),
                c.fill
                    .as_ref()
                    .map_or("–".to_owned(), |f| kinds(&f.refusals)),
                snapshot,
                c.load_average,
            );
        }
        out.push_str("\n(RSS and peak are in node order 1 / 2 / 3.)\n");
        if let Some(f) = &self.fill {
            let elections = f
                .leader_changes
                .iter()
                .any(|(_, c)| c.is_some_and(|c| c > 0))
                || f.terms.iter().any(|(_, a, b)| a != b);
            let _ = writeln!(
                out,
                "\nFill: {} locks in {:.1} s, **{:.0} locks/s**; refusals {} ({} in all, each \
                 retried); {} locks not granted; {}.",
                f.locks,
                f.secs,
                f.locks_per_sec,
                kinds(&f.refusals),
                total(&f.refusals),
                f.failed,
                if elections {
                    "**the term changed during the fill (an election)**"
                } else {
                    "term unchanged on every node (no election)"
                }
            );
        }
        let snapshot_list: Vec<String> = self
            .snapshots
            .per_node
            .iter()
            .map(|(id, count, largest)| {
                format!(
                    "node {id}: {count} snapshots, largest {} MiB",
                    mib(*largest)
                )
            })
            .collect();
        let _ = writeln!(
            out,
            "\nSnapshots during the run: {}.",
            snapshot_list.join("; ")
        );
        if let Some(c) = &self.catch_up {
            let _ = writeln!(
                out,
                "\nCatch-up ({}): node {} stopped at index {}, {} entries written in {:.1} s, \
                 leader's snapshot at {} ({} MiB, past the follower: {}; the leader's log purged \
                 up to {}); after the restart it was up in {} s, \
                 **caught up in {} s** (applied ≥ {}), matched by the leader in {} s; its snapshot \
                 then at {}, {} built by itself; RSS after {} MiB (peak {}); the leader's RSS \
                 after {} MiB (peak since its start, the sending included, {}).",
                if c.from_snapshot {
                    "from the leader's snapshot: the leader had purged the log it lacked"
                } else {
                    "**from the log**: the leader had not purged the log it lacked"
                },
                c.node_id,
                c.stopped_at_index,
                c.entries_written,
                c.write_secs,
                c.leader_snapshot_index
                    .map_or("–".to_owned(), |i| i.to_string()),
                c.leader_snapshot_bytes.map_or("–".to_owned(), mib),
                c.snapshot_past_follower,
                c.leader_purged_index
                    .map_or("–".to_owned(), |i| i.to_string()),
                opt(c.up_secs, 2),
                opt(c.caught_up_secs, 2),
                c.target_index,
                opt(c.leader_matched_secs, 2),
                c.follower_snapshot_index_after
                    .map_or("–".to_owned(), |i| i.to_string()),
                c.follower_snapshot_builds_after
                    .map_or("–".to_owned(), |b| b.to_string()),
                opt(c.follower_memory_after.map(|m| m.rss_mib), 0),
                opt(c.follower_memory_after.map(|m| m.peak_mib), 0),
                opt(c.leader_memory_after.map(|m| m.rss_mib), 0),
                opt(c.leader_memory_after.map(|m| m.peak_mib), 0),
            );
        }
        if let Some(f) = &self.failover {
            let _ = writeln!(
                out,
                "\nFailover with {} locks held: node {} killed (SIGKILL), node {} leads (term {} → {}).\n",
                f.held,
                f.killed_node_id,
                f.new_leader_node_id
                    .map_or("–".to_owned(), |i| i.to_string()),
                f.term_before.map_or("–".to_owned(), |t| t.to_string()),
                f.term_after.map_or("–".to_owned(), |t| t.to_string()),
            );
            out.push_str("| call | served after the kill (s) | after the first grant (s) | refusals before | lost |\n");
            out.push_str("|---|---:|---:|---|---|\n");
            probe_row(&mut out, "first grant of a new key (TryAcquire)", &f.grant);
            probe_row(&mut out, "heartbeat (HeartbeatBatch)", &f.heartbeat);
            probe_row(&mut out, "renew", &f.renew);
            probe_row(
                &mut out,
                "confirmed read (Inspect leader_confirmed)",
                &f.confirmed_read,
            );
            let _ = writeln!(
                out,
                "\nEvery kind served {} s after the kill, {} s after the first grant. Sampled held \
                 keys that kept their holder and token: **{} of {}**.",
                opt(f.all_served_secs, 3),
                opt(f.all_served_after_first_grant_secs, 3),
                f.kept,
                f.sampled
            );
            for what in &f.not_kept {
                let _ = writeln!(out, "- not kept: {what}");
            }
            out.push_str(&last_attempts(f));
        }
        if let Some(m) = &self.many_sessions {
            out.push_str(&many_sessions_paragraph(m));
        }
        if let Some(k) = &self.keepalive {
            let _ = writeln!(
                out,
                "\nHeld locks kept alive: {} session beats answered, {} batches failed, {} renewals \
                 ({} failed), {} sessions or grants lost; keep-alive refusals {}.",
                k.beats_ok,
                k.batches_failed,
                k.renewals,
                k.renewals_failed,
                k.lost_count,
                kinds(&self.keepalive_refusals)
            );
        }
        for e in &self.errors {
            let _ = writeln!(out, "\n**step failed**: {e}");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scale::idle_cpu::IdleCpu;
    use crate::workload::LoopResult;

    fn round(open_secs: f64, close_secs: f64, w1_cost_pct: f64) -> ManyRound {
        ManyRound {
            open_secs,
            close_secs,
            w1_with_pairs_per_sec: 0.0,
            w1_cost_pct,
            beats_ok: 0,
            batches_failed: 0,
            lost_count: 0,
        }
    }

    fn many(rounds: Vec<ManyRound>) -> ManySessions {
        ManySessions {
            sessions: 99_000,
            session_ttl_ms: 15_000,
            open_secs: 11.5,
            close_secs: 4.0,
            live_before: 1,
            live_peak: 99_001,
            beats_offered_per_sec: 19_800.0,
            beats_only: IdleCpu {
                secs: 10.0,
                leader_pct: Some(40.0),
                nodes_pct: Vec::new(),
            },
            leader_us_per_beat: Some(20.2),
            keepalive: KeepAliveReport::default(),
            refusals: BTreeMap::new(),
            w1_with: LoopResult::for_test(900, 1),
            w1_without: LoopResult::for_test(1_000, 1),
            w1_cost_pct: 10.0,
            w1_without_pairs_per_sec: vec![1_000.0; rounds.len() + 1],
            w1_cost_pct_median: 5.0,
            w1_cost_pct_min: -10.0,
            w1_cost_pct_max: 20.0,
            rounds,
        }
    }

    #[test]
    fn the_many_sessions_paragraph_shows_the_combined_cost_each_round_and_the_median() {
        let text = many_sessions_paragraph(&many(vec![
            round(11.5, 4.0, 5.0),
            round(10.0, 3.5, -10.0),
            round(12.3, 4.3, 20.0),
        ]));
        for part in [
            "3 rounds of 99000 fresh sessions",
            "opened in 11.5 / 10.0 / 12.3 s, closed in 4.0 / 3.5 / 4.3 s",
            "W1 900 pairs/s with them, 1000 without (**-10.0 %** combined",
            "-5.0 %, +10.0 %, -20.0 %: median **-5.0 %**",
        ] {
            assert!(text.contains(part), "lacks {part:?}: {text}");
        }
    }

    #[test]
    fn one_round_is_named_in_the_singular() {
        let text = many_sessions_paragraph(&many(vec![round(1.0, 1.0, 5.0)]));
        assert!(text.contains("1 round of 99000"), "{text}");
    }
}
