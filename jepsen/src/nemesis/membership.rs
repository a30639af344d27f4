//! The membership nemesis: membership changes while the clients run, as an operator makes them
//! (docs/NODE_CLI.md "Adding and removing nodes", through [`crate::admin`]).
//!
//! The first fault of a run grows the cluster: a new node (the first spare id) starts on an
//! empty data dir, is added as a learner and promoted to voter. Every fault then removes one
//! voter (the leader half of the time) and leaves it running; while the fault holds, the
//! removed node is asked for its status every [`PROBE_EVERY`], and every time it answers as
//! leader later than [`REMOVED_LEADER_GRACE`] after its removal, or in a term above the one it
//! was removed in, is written into the heal's `leader_answers` (the checker's
//! `removed_not_leader` judges them). The heal adds the node back: learner, then voter. So
//! after the first fault the cluster has one voter more than it started with, and a fault
//! takes it back to the starting size while it holds.
//!
//! Owns those choices and the members' list in [`super::Ctx`] that the other node faults pick
//! their targets from; the processes are [`crate::cluster`]'s.

use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use serde_json::{Value, json};

use super::Ctx;
use crate::admin;
use crate::history::{F, Outcome, Phase};

/// How often the removed node is asked whether it leads.
pub const PROBE_EVERY: Duration = Duration::from_millis(250);

/// How long a removed leader may still say it leads: openraft's `removed_leader_step_down`
/// (lockd leaves it at openraft's 150 ms) counts from the commit of its removal, then it hands
/// leadership over; 2 s covers that and a status answer in flight on a loaded machine.
pub const REMOVED_LEADER_GRACE: Duration = Duration::from_secs(2);

/// A membership fault in force: the node removed, to add back.
#[derive(Debug)]
pub struct Removed {
    node: Option<u64>,
    removed_at: Instant,
    term: u64,
    answers: Vec<Value>,
    probes: u64,
}

/// Grows the cluster if it has not grown yet, then removes a voter.
pub async fn start(ctx: &Ctx, rng: &mut StdRng) -> Removed {
    let mut value = json!({});
    let nothing = |value: Value| {
        ctx.record(F::Membership, Phase::Start, Outcome::Skipped, value);
        Removed {
            node: None,
            removed_at: Instant::now(),
            term: 0,
            answers: Vec::new(),
            probes: 0,
        }
    };
    if !ctx.grown() {
        let Some(id) = ctx.take_spare() else {
            value["reason"] = json!("no spare node id to add");
            return nothing(value);
        };
        value["added"] = json!(id);
        let added = grow(ctx, id).await;
        if let Err(e) = added {
            value["error"] = json!(format!("{e:#}"));
            // The node may or may not be a member now; the leader's view says which.
            ctx.record(F::Membership, Phase::Start, Outcome::Indeterminate, value);
            refresh_members(ctx).await;
            return Removed {
                node: None,
                removed_at: Instant::now(),
                term: 0,
                answers: Vec::new(),
                probes: 0,
            };
        }
        ctx.set_grown();
    }
    let (victim, leader) = ctx.pick_node(rng).await;
    let voters: Vec<u64> = ctx.nodes().into_iter().filter(|&n| n != victim).collect();
    value["removed"] = json!(victim);
    value["leader"] = json!(leader);
    value["voters"] = json!(voters);
    let term = admin::voters(&ctx.probe).await.map_or(0, |(_, t)| t);
    match admin::set_voters(&ctx.probe, &voters).await {
        Ok(()) => {
            ctx.set_members(voters);
            value["term"] = json!(term);
            ctx.record(F::Membership, Phase::Start, Outcome::Installed, value);
            Removed {
                node: Some(victim),
                removed_at: Instant::now(),
                term,
                answers: Vec::new(),
                probes: 0,
            }
        }
        Err(e) => {
            value["error"] = json!(format!("{e:#}"));
            ctx.record(F::Membership, Phase::Start, Outcome::Indeterminate, value);
            refresh_members(ctx).await;
            let removed = !ctx.nodes().contains(&victim);
            Removed {
                node: removed.then_some(victim),
                removed_at: Instant::now(),
                term,
                answers: Vec::new(),
                probes: 0,
            }
        }
    }
}

/// Starts spare node `id`, adds it as a learner and promotes it.
async fn grow(ctx: &Ctx, id: u64) -> anyhow::Result<()> {
    let addr = {
        let mut cluster = ctx.cluster.lock().await;
        cluster.start_new(id).await?;
        cluster
            .addr(id)
            .map(str::to_owned)
            .ok_or_else(|| anyhow::anyhow!("no address for node {id}"))?
    };
    admin::add_learner(&ctx.probe, id, &addr).await?;
    let mut voters = ctx.nodes();
    voters.push(id);
    admin::set_voters(&ctx.probe, &voters).await?;
    ctx.set_members(voters);
    Ok(())
}

/// Holds the fault for `hold`, asking the removed node whether it leads.
pub async fn watch(ctx: &Ctx, removed: &mut Removed, hold: Duration) {
    let Some(node) = removed.node else {
        ctx.sleep(hold).await;
        return;
    };
    let until = Instant::now() + hold;
    while Instant::now() < until {
        if let Some(status) = ctx.probe.status(node).await {
            removed.probes += 1;
            let leads = status.role == lock_proto::v1::Role::Leader as i32;
            let late = removed.removed_at.elapsed() > REMOVED_LEADER_GRACE;
            if leads && (late || status.current_term > removed.term) {
                removed.answers.push(json!({
                    "t_ns": ctx.recorder.now_ns(),
                    "term": status.current_term,
                    "after_removal_ms": removed.removed_at.elapsed().as_millis() as u64,
                }));
            }
        }
        if !ctx.sleep(PROBE_EVERY).await {
            break;
        }
    }
}

/// Adds the removed node back: learner, then voter. A node that cannot be added back is
/// recorded (indeterminate heal) and stays out; the members' list follows the leader's view.
pub async fn heal(ctx: &Ctx, removed: Removed) -> anyhow::Result<()> {
    let Some(node) = removed.node else {
        return Ok(());
    };
    let mut value = json!({
        "node": node,
        "probes": removed.probes,
        "leader_answers": removed.answers,
    });
    let addr = ctx.cluster.lock().await.addr(node).map(str::to_owned);
    let Some(addr) = addr else {
        anyhow::bail!("no address for node {node}");
    };
    let mut voters = ctx.nodes();
    voters.push(node);
    let added = async {
        admin::add_learner(&ctx.probe, node, &addr).await?;
        admin::set_voters(&ctx.probe, &voters).await
    }
    .await;
    match added {
        Ok(()) => {
            ctx.set_members(voters.clone());
            value["voters"] = json!(voters);
            ctx.record(F::Membership, Phase::Heal, Outcome::Installed, value);
        }
        Err(e) => {
            value["error"] = json!(format!("{e:#}"));
            refresh_members(ctx).await;
            ctx.record(F::Membership, Phase::Heal, Outcome::Indeterminate, value);
        }
    }
    Ok(())
}

/// Sets the members' list to the voters the leader reports, if one answers.
pub async fn refresh_members(ctx: &Ctx) {
    if let Some((voters, _)) = admin::voters(&ctx.probe).await {
        ctx.set_members(voters);
    }
}
