//! The power-cut nemesis: a node loses what its file system had not yet synced, and
//! restarts.
//!
//! In a run with this nemesis every node's data dir is a lazyfs mount ([`crate::lazyfs`]):
//! writes stay in the mount's memory until the file is fsynced. A fault:
//!
//! 1. asks the node's mount to hold syncs (`hold-syncs`): the node's next fsync waits, so the
//!    writes before it stay unsynced — a power cut is most telling with a sync in flight,
//!    whose writes were never acknowledged. It waits (at most [`UNSYNCED_WAIT`]) until the
//!    mount holds unsynced pages; a node that writes nothing in that time is cut anyway;
//! 2. SIGKILLs the node (the process can no longer write, as after a power loss);
//! 3. cuts the mount (`cut SEED`, the seed from the run's): each file loses a random subset of
//!    its unsynced pages — whole pages, out of order — and the rest are written through;
//!    the start records how many pages were dropped and written.
//!
//! The heal restarts the node, with the two outcomes the corrupt nemesis accepts
//! ([`super::corrupt`]), recorded as `result`:
//!
//! - `recovered`: the node starts — the WAL's recovery rule cut the torn, unacknowledged tail
//!   (raft-store/src/storage/engine/wal.rs: damage after the last sync boundary) — and catches
//!   up from its peers;
//! - `refused-rebuilt`: the node exits before it is ready; its log should name the file
//!   (`named_file`, judged by the checker's `damage_detected`). It is rebuilt as the corrupt
//!   nemesis rebuilds: removed from the voters, wiped, replaced by a new node under the next
//!   spare id.
//!
//! Whether the node kept what it acknowledged is judged by every other property. A rebuild
//! needs a spare node id; with none left the fault is skipped.

use std::time::{Duration, Instant};

use rand::Rng;
use rand::rngs::StdRng;
use serde_json::{Value, json};

use super::Ctx;
use super::corrupt::{excerpt, rebuild};
use crate::cluster::StartOutcome;
use crate::history::{F, Outcome, Phase};

/// How long the mount holds syncs when asked: longer than [`UNSYNCED_WAIT`] plus the kill, so
/// the hold lasts until the cut releases it; bounded so a harness that fails midway does not
/// stall the node for long.
pub const SYNC_HOLD_MS: u64 = 10_000;

/// Longest wait for the held node to have unsynced pages before it is killed: a node under
/// the workload writes its WAL every few milliseconds.
pub const UNSYNCED_WAIT: Duration = Duration::from_secs(2);

/// How long the held node may go on writing once it has unsynced pages: appends that arrive
/// while a sync is in flight are written before the next sync covers them.
pub const UNSYNCED_GATHER: Duration = Duration::from_millis(300);

/// How often the mount is asked whether it holds unsynced pages while waiting.
const UNSYNCED_POLL: Duration = Duration::from_millis(20);

const _: () = assert!(SYNC_HOLD_MS > 2 * UNSYNCED_WAIT.as_millis() as u64);

/// The node cut (if any), to restart.
#[derive(Debug)]
pub struct Cut {
    node: Option<u64>,
}

/// Holds the node's syncs, kills it and cuts its mount.
pub async fn start(ctx: &Ctx, rng: &mut StdRng) -> Cut {
    let record = |outcome: Outcome, value: Value| {
        ctx.record(F::PowerCut, Phase::Start, outcome, value);
    };
    let Some(mounts) = ctx.lazyfs.clone() else {
        record(
            Outcome::Skipped,
            json!({"reason": "the data dirs are not on lazyfs mounts"}),
        );
        return Cut { node: None };
    };
    if !ctx.has_spare() {
        record(
            Outcome::Skipped,
            json!({"reason": "no spare node id left for a rebuild"}),
        );
        return Cut { node: None };
    }
    let (node, leader) = ctx.pick_node(rng).await;
    if !ctx.cluster.lock().await.is_running(node) {
        record(
            Outcome::Skipped,
            json!({"node": node, "reason": "not running"}),
        );
        return Cut { node: None };
    }
    let mut value = json!({"node": node, "leader": leader, "what": {"damage": "power-cut"}});
    if let Err(e) = mounts
        .command(node, &format!("hold-syncs {SYNC_HOLD_MS}"))
        .await
    {
        value["error"] = json!(format!("{e:#}"));
        record(Outcome::Indeterminate, value);
        return Cut { node: None };
    }
    let waited = Instant::now();
    let mut unsynced = 0;
    let mut first_unsynced = None;
    while waited.elapsed() < UNSYNCED_WAIT {
        match mounts.command(node, "stats").await {
            Ok(stats) => unsynced = stats["unsynced_pages"].as_u64().unwrap_or(0),
            Err(_) => break,
        }
        if unsynced > 0 {
            let since = *first_unsynced.get_or_insert_with(Instant::now);
            if since.elapsed() >= UNSYNCED_GATHER {
                break;
            }
        }
        tokio::time::sleep(UNSYNCED_POLL).await;
    }
    value["unsynced_pages_at_kill"] = json!(unsynced);
    value["waited_ms"] = json!(waited.elapsed().as_millis() as u64);
    if let Err(e) = ctx.cluster.lock().await.kill(node).await {
        let _ = mounts.command(node, "release-syncs").await;
        value["error"] = json!(format!("{e:#}"));
        record(Outcome::Indeterminate, value);
        return Cut { node: Some(node) };
    }
    let seed: u64 = rng.r#gen();
    value["seed"] = json!(seed);
    match mounts.command(node, &format!("cut {seed}")).await {
        Ok(report) => {
            for field in ["files", "pages_written", "pages_dropped"] {
                value[field] = report[field].clone();
            }
            record(Outcome::Installed, value);
        }
        Err(e) => {
            value["error"] = json!(format!("{e:#}"));
            record(Outcome::Indeterminate, value);
        }
    }
    Cut { node: Some(node) }
}

/// The file a refusing node's log names: the first word that is a WAL segment, a snapshot
/// file or a path inside the Raft storage folder.
fn named_file(log: &str) -> Option<String> {
    log.split(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '=' | ',' | '(' | ')'))
        .map(|w| w.trim_end_matches([':', '.', ';']))
        .find(|w| w.ends_with(".wal") || w.ends_with(".snap") || w.contains("raft/"))
        .map(str::to_owned)
}

/// Restarts the node: recovered, or refused and rebuilt under a new id.
pub async fn heal(ctx: &Ctx, cut: Cut) -> anyhow::Result<()> {
    let Cut { node: Some(node) } = cut else {
        return Ok(());
    };
    let outcome = ctx.cluster.lock().await.restart_or_refuse(node).await;
    let mut value = json!({"node": node});
    match outcome {
        Ok(StartOutcome::Ready) => {
            value["result"] = json!("recovered");
            ctx.record(F::PowerCut, Phase::Heal, Outcome::Installed, value);
        }
        Ok(StartOutcome::Refused { status, log_tail }) => {
            let file = named_file(&log_tail);
            value["named_file"] = json!(file.is_some());
            value["file"] = json!(file);
            value["status"] = json!(status);
            value["log"] = json!(excerpt(&log_tail, file.as_deref().unwrap_or("")));
            match rebuild(ctx, node).await {
                Ok(new_id) => {
                    value["result"] = json!("refused-rebuilt");
                    value["new_id"] = json!(new_id);
                    ctx.record(F::PowerCut, Phase::Heal, Outcome::Installed, value);
                }
                Err(e) => {
                    value["result"] = json!("refused-not-rebuilt");
                    value["error"] = json!(format!("{e:#}"));
                    super::membership::refresh_members(ctx).await;
                    ctx.record(F::PowerCut, Phase::Heal, Outcome::Indeterminate, value);
                }
            }
        }
        Err(e) => {
            value["result"] = json!("no-answer");
            value["error"] = json!(format!("{e:#}"));
            ctx.record(F::PowerCut, Phase::Heal, Outcome::Indeterminate, value);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_names_its_file_when_its_log_has_a_wal_segment_or_a_snapshot() {
        let log = "lockd: storage: WAL /tmp/x/n2/raft/wal/0000000000000003.wal: frame at \
                   offset 4096 failed its checksum before the last sync boundary";
        assert_eq!(
            named_file(log).as_deref(),
            Some("/tmp/x/n2/raft/wal/0000000000000003.wal")
        );
        assert_eq!(
            named_file("snapshot \"1-2-3.snap\": bad crc").as_deref(),
            Some("1-2-3.snap")
        );
        assert_eq!(named_file("lockd: listen address taken"), None);
    }
}
