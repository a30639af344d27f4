//! The client-pause nemesis: one or two workload clients sleep between their
//! `check_still_held` and their write, as a GC pause would, for longer than their lease — so
//! the lease runs out, another client may take the key, and the late write must be fenced out
//! by the register (C2 §2.4). The deadline cannot prevent this; only the fence can.
//!
//! The start line is recorded when the pause is armed (before the client reaches it), which
//! is conservative for the checker: a client's validity window is cut at the start. The heal
//! line says which clients actually paused.

use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use serde_json::json;

use super::{Ctx, QUIET_MS, between};
use crate::history::{F, Outcome, Phase};

/// How long an armed client has to reach its pause point before the pause is called off: a
/// cycle is at most an acquire wait plus a long hold, both a few seconds.
pub const REACH_TIMEOUT: Duration = Duration::from_secs(20);

/// Runs client pauses until stopped.
pub async fn run(ctx: Arc<Ctx>, mut rng: StdRng) -> anyhow::Result<()> {
    let mut all: Vec<u32> = (0..ctx.clients).collect();
    loop {
        if !ctx.sleep(between(&mut rng, QUIET_MS)).await {
            return Ok(());
        }
        all.shuffle(&mut rng);
        let count = rng.gen_range(1..=2usize).min(all.len());
        let chosen: Vec<u32> = all[..count].to_vec();
        let pause = ctx.ttl * 2 + Duration::from_millis(rng.gen_range(0..1000));
        let mut waits = Vec::new();
        for &p in &chosen {
            waits.push((p, ctx.shared.pauses.arm(p, pause)));
        }
        ctx.record(
            F::PauseClient,
            Phase::Start,
            Outcome::Installed,
            json!({"processes": chosen, "pause_ms": pause.as_millis() as u64}),
        );
        let mut paused = Vec::new();
        let mut missed = Vec::new();
        for (p, began) in waits {
            match tokio::time::timeout(REACH_TIMEOUT, began).await {
                Ok(Ok(_)) => paused.push(p),
                _ => {
                    ctx.shared.pauses.disarm(p);
                    missed.push(p);
                }
            }
        }
        // Heal once the last pause is over: the clients are running again.
        if !paused.is_empty() {
            tokio::time::sleep(pause).await;
        }
        let outcome = if paused.is_empty() {
            Outcome::Skipped
        } else {
            Outcome::Installed
        };
        ctx.record(
            F::PauseClient,
            Phase::Heal,
            outcome,
            json!({"processes": chosen, "paused": paused, "missed": missed}),
        );
    }
}
