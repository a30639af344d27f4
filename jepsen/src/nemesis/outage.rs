//! The outage nemesis: one node kept out of the cluster for a long time (`--outage-hold`,
//! [`OUTAGE_HOLD_DEFAULT`]) — killed, or cut off from every peer — then brought back.
//!
//! The short faults test safety; this one tests what a fault costs (docs/DESIGN.md D-cost):
//! while a peer is gone for a minute or more, the survivors must retry with backoff and log
//! the loss once, not spin or log every attempt. The harness samples every node's CPU, RSS
//! and log size ([`crate::resources`]) and [`crate::checker::outage_cost`] judges the
//! survivors over the outage.
//!
//! Outages alternate between a kill and an isolation, starting with a kill ([`How::nth`]), so
//! a run with two outages sees both a peer that refuses connections and one whose packets
//! vanish. Owns nothing but those choices: processes are [`crate::cluster`]'s and cuts are
//! [`crate::net::Firewall`]'s.

use std::time::Duration;

use rand::rngs::StdRng;
use serde_json::json;

use super::Ctx;
use crate::history::{F, Outcome, Phase};

/// How long an outage keeps its node out unless `--outage-hold` says otherwise: a minute is
/// many times every retry and election timeout, so a survivor that does not back off shows it
/// as a rate over a whole minute, not as a burst.
pub const OUTAGE_HOLD_DEFAULT: Duration = Duration::from_secs(60);

/// How the node is taken out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum How {
    /// SIGKILL; its port refuses connections until the heal restarts it on its data.
    Kill,
    /// Every link to its peers cut (clients still reach it); the heal removes the cuts.
    Isolate,
}

impl How {
    /// The way the `n`-th outage of a run (0-based) takes its node out: kill, isolate, kill, …
    pub fn nth(n: u64) -> Self {
        if n.is_multiple_of(2) {
            Self::Kill
        } else {
            Self::Isolate
        }
    }

    /// The name in the history's `value.how`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Kill => "kill",
            Self::Isolate => "isolate",
        }
    }
}

/// An outage in force (or attempted): what to heal.
#[derive(Debug)]
pub struct Out {
    node: Option<u64>,
    how: How,
}

/// Takes a node (the leader half of the time) out of the cluster.
pub async fn start(ctx: &Ctx, rng: &mut StdRng, how: How) -> Out {
    let (node, leader) = ctx.pick_node(rng).await;
    let hold_s = ctx.outage_hold.as_secs_f64();
    let mut value = json!({"node": node, "how": how.name(), "leader": leader, "hold_s": hold_s});
    let result = match how {
        How::Kill => {
            let mut cluster = ctx.cluster.lock().await;
            if !cluster.is_running(node) {
                value["reason"] = json!("not running");
                ctx.record(F::Outage, Phase::Start, Outcome::Skipped, value);
                return Out { node: None, how };
            }
            cluster.kill(node).await
        }
        How::Isolate => {
            let cut: Vec<(u64, u64)> = ctx
                .nodes()
                .iter()
                .filter(|&&peer| peer != node)
                .map(|&peer| (node.min(peer), node.max(peer)))
                .collect();
            value["cut"] = json!(cut);
            ctx.firewall.cut(&cut).await
        }
    };
    match result {
        Ok(()) => ctx.record(F::Outage, Phase::Start, Outcome::Installed, value),
        Err(e) => {
            value["error"] = json!(format!("{e:#}"));
            ctx.record(F::Outage, Phase::Start, Outcome::Indeterminate, value);
        }
    }
    Out {
        node: Some(node),
        how,
    }
}

/// Brings the node back: restarts it on its data, or removes the cuts. A node that will not
/// restart is recorded (indeterminate heal), as the kill nemesis does; cuts that cannot be
/// removed are a harness failure, as the partition nemesis says.
pub async fn heal(ctx: &Ctx, out: Out) -> anyhow::Result<()> {
    let Out {
        node: Some(node),
        how,
    } = out
    else {
        return Ok(());
    };
    let value = json!({"node": node, "how": how.name()});
    match how {
        How::Kill => {
            let mut cluster = ctx.cluster.lock().await;
            if cluster.is_running(node) {
                ctx.record(F::Outage, Phase::Heal, Outcome::Installed, value);
                return Ok(());
            }
            match cluster.restart(node).await {
                Ok(()) => ctx.record(F::Outage, Phase::Heal, Outcome::Installed, value),
                Err(e) => {
                    let mut value = value;
                    value["error"] = json!(format!("{e:#}"));
                    ctx.record(F::Outage, Phase::Heal, Outcome::Indeterminate, value);
                }
            }
        }
        How::Isolate => {
            ctx.firewall.heal().await?;
            ctx.record(F::Outage, Phase::Heal, Outcome::Installed, value);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outages_alternate_starting_with_a_kill() {
        let ways: Vec<How> = (0..4).map(How::nth).collect();
        assert_eq!(ways, [How::Kill, How::Isolate, How::Kill, How::Isolate]);
    }
}
