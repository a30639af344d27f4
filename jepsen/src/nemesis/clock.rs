//! The clock nemesis: a node's wall clock skewed by up to a minute, or jumping back and forth
//! every second, through libfaketime (the monotonic clock is left alone, as NTP steps leave
//! it). lockd stamps commands with the leader's wall clock (D-time) but must never let it
//! decide safety; this fault checks that.
//!
//! Runs on its own schedule, alongside the node-level faults.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::Rng;
use rand::rngs::StdRng;
use serde_json::json;

use super::{Ctx, HOLD_MS, QUIET_MS, between};
use crate::history::{F, Outcome, Phase};

/// Largest skew, in seconds, either way: far beyond any lease, so a node that trusted its wall
/// clock for expiry would visibly expire or keep leases wrongly.
pub const SKEW_S_MAX: i64 = 60;

/// How often a jumping clock jumps.
pub const JUMP_EVERY: Duration = Duration::from_secs(1);

/// Runs clock faults until stopped, healing the last.
pub async fn run(ctx: Arc<Ctx>, mut rng: StdRng) -> anyhow::Result<()> {
    loop {
        if !ctx.sleep(between(&mut rng, QUIET_MS)).await {
            return Ok(());
        }
        let (node, leader) = ctx.pick_node(&mut rng).await;
        let jumping = rng.gen_bool(0.5);
        let offset = rng.gen_range(-SKEW_S_MAX..=SKEW_S_MAX);
        let mode = if jumping { "jumps" } else { "skew" };
        let set = ctx.cluster.lock().await.set_clock_offset(node, offset);
        if let Err(e) = set {
            ctx.record(
                F::Clock,
                Phase::Start,
                Outcome::Skipped,
                json!({"node": node, "mode": mode, "reason": format!("{e:#}")}),
            );
            // Without libfaketime there is nothing this nemesis can do for the rest of the run.
            return Ok(());
        }
        ctx.record(
            F::Clock,
            Phase::Start,
            Outcome::Installed,
            json!({"node": node, "leader": leader, "mode": mode, "offset_s": offset}),
        );
        let hold_until = Instant::now() + between(&mut rng, HOLD_MS);
        let mut jumps = Vec::new();
        while Instant::now() < hold_until {
            if !ctx.sleep(JUMP_EVERY).await {
                break;
            }
            if jumping {
                let offset = rng.gen_range(-SKEW_S_MAX..=SKEW_S_MAX);
                ctx.cluster.lock().await.set_clock_offset(node, offset)?;
                jumps.push(offset);
            }
        }
        ctx.cluster.lock().await.set_clock_offset(node, 0)?;
        ctx.record(
            F::Clock,
            Phase::Heal,
            Outcome::Installed,
            json!({"node": node, "jumps_s": jumps}),
        );
    }
}
