//! The kill nemesis: SIGKILL a node (the leader half of the time), restart it on its data when
//! the fault heals. Owns nothing but that choice; processes are [`crate::cluster`]'s.

use rand::rngs::StdRng;
use serde_json::json;

use super::Ctx;
use crate::history::{F, Outcome, Phase};

/// The node killed (if any), to restart.
#[derive(Debug)]
pub struct Killed(Option<u64>);

/// Kills a node.
pub async fn start(ctx: &Ctx, rng: &mut StdRng) -> Killed {
    let (node, leader) = ctx.pick_node(rng).await;
    let mut cluster = ctx.cluster.lock().await;
    if !cluster.is_running(node) {
        ctx.record(
            F::Kill,
            Phase::Start,
            Outcome::Skipped,
            json!({"node": node, "reason": "not running"}),
        );
        return Killed(None);
    }
    match cluster.kill(node).await {
        Ok(()) => {
            ctx.record(
                F::Kill,
                Phase::Start,
                Outcome::Installed,
                json!({"node": node, "leader": leader}),
            );
            Killed(Some(node))
        }
        Err(e) => {
            ctx.record(
                F::Kill,
                Phase::Start,
                Outcome::Indeterminate,
                json!({"node": node, "leader": leader, "error": format!("{e:#}")}),
            );
            Killed(Some(node))
        }
    }
}

/// Restarts the killed node. A node that will not come back is recorded (indeterminate heal)
/// rather than aborting: it is a finding about lockd, and the recovery property judges it.
pub async fn heal(ctx: &Ctx, killed: Killed) -> anyhow::Result<()> {
    let Killed(Some(node)) = killed else {
        return Ok(());
    };
    let mut cluster = ctx.cluster.lock().await;
    if cluster.is_running(node) {
        ctx.record(
            F::Kill,
            Phase::Heal,
            Outcome::Installed,
            json!({"node": node, "note": "still running"}),
        );
        return Ok(());
    }
    match cluster.restart(node).await {
        Ok(()) => ctx.record(
            F::Kill,
            Phase::Heal,
            Outcome::Installed,
            json!({"node": node}),
        ),
        Err(e) => ctx.record(
            F::Kill,
            Phase::Heal,
            Outcome::Indeterminate,
            json!({"node": node, "error": format!("{e:#}")}),
        ),
    }
    Ok(())
}
