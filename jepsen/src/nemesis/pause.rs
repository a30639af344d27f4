//! The pause nemesis: SIGSTOP a node (the leader half of the time) — a process that is alive
//! but not running, as in a long GC or a VM freeze — and SIGCONT it when the fault heals.

use rand::rngs::StdRng;
use serde_json::json;

use super::Ctx;
use crate::history::{F, Outcome, Phase};

/// The node paused (if any), to resume.
#[derive(Debug)]
pub struct Paused(Option<u64>);

/// Pauses a node.
pub async fn start(ctx: &Ctx, rng: &mut StdRng) -> Paused {
    let (node, leader) = ctx.pick_node(rng).await;
    let mut cluster = ctx.cluster.lock().await;
    if !cluster.is_running(node) || cluster.is_paused(node) {
        ctx.record(
            F::Pause,
            Phase::Start,
            Outcome::Skipped,
            json!({"node": node, "reason": "not running"}),
        );
        return Paused(None);
    }
    match cluster.pause(node) {
        Ok(()) => {
            ctx.record(
                F::Pause,
                Phase::Start,
                Outcome::Installed,
                json!({"node": node, "leader": leader}),
            );
            Paused(Some(node))
        }
        Err(e) => {
            ctx.record(
                F::Pause,
                Phase::Start,
                Outcome::Indeterminate,
                json!({"node": node, "error": format!("{e:#}")}),
            );
            Paused(Some(node))
        }
    }
}

/// Resumes the paused node. Failing to is a harness failure.
pub async fn heal(ctx: &Ctx, paused: Paused) -> anyhow::Result<()> {
    let Paused(Some(node)) = paused else {
        return Ok(());
    };
    let mut cluster = ctx.cluster.lock().await;
    if cluster.is_running(node) {
        cluster.resume(node)?;
    }
    ctx.record(
        F::Pause,
        Phase::Heal,
        Outcome::Installed,
        json!({"node": node}),
    );
    Ok(())
}
