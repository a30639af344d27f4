//! Membership changes through lockd's `AdminService` (proto/proto/lockd/v1/admin.proto), the
//! way docs/NODE_CLI.md "Adding and removing nodes" does them: at the leader, `AddLearner`
//! then `ChangeMembership`.
//!
//! Owns the calls and their retries: a call goes to whichever node leads now, and is retried
//! (both calls are idempotent: adding a learner that is already one, or setting the voters to
//! what they are, changes nothing) while leaders change, within [`ADMIN_RETRY_FOR`]. Must not
//! decide which nodes to add or remove (the nemeses do).

use std::time::{Duration, Instant};

use anyhow::bail;
use lock_proto::v1;

use crate::cluster::StatusProbe;

/// How long one call may take: `AddLearner` answers once the learner has caught up, which
/// for a few minutes of lock traffic is well under a second on loopback.
pub const ADMIN_CALL_TIMEOUT: Duration = Duration::from_secs(20);

/// How long a change is retried (leader changes, a leader still electing) before it fails.
pub const ADMIN_RETRY_FOR: Duration = Duration::from_secs(30);

/// Pause between two attempts.
const RETRY_PAUSE: Duration = Duration::from_millis(250);

/// One membership call.
#[derive(Clone, Debug)]
enum Call {
    AddLearner { id: u64, addr: String },
    Voters(Vec<u64>),
}

/// Adds node `id` (at `addr`) as a learner; returns once it has caught up.
pub async fn add_learner(probe: &StatusProbe, id: u64, addr: &str) -> anyhow::Result<()> {
    call(
        probe,
        Call::AddLearner {
            id,
            addr: addr.to_owned(),
        },
    )
    .await
}

/// Makes `voters` the set of voters; voters left out leave the cluster (`retain: false`).
pub async fn set_voters(probe: &StatusProbe, voters: &[u64]) -> anyhow::Result<()> {
    call(probe, Call::Voters(voters.to_vec())).await
}

/// The voters as the leader reports them, and its term.
pub async fn voters(probe: &StatusProbe) -> Option<(Vec<u64>, u64)> {
    let leader = probe.leader().await?;
    let status = probe.status(leader).await?;
    let mut voters: Vec<u64> = status
        .members
        .iter()
        .filter(|m| m.voter)
        .map(|m| m.node_id)
        .collect();
    voters.sort_unstable();
    Some((voters, status.current_term))
}

async fn call(probe: &StatusProbe, call: Call) -> anyhow::Result<()> {
    let deadline = Instant::now() + ADMIN_RETRY_FOR;
    let mut last_error = "no leader answered".to_owned();
    while Instant::now() < deadline {
        let Some(leader) = probe.leader().await else {
            tokio::time::sleep(RETRY_PAUSE).await;
            continue;
        };
        let Some(channel) = probe.channel(leader) else {
            bail!("no channel to node {leader}");
        };
        let mut client = v1::admin_service_client::AdminServiceClient::new(channel);
        let answer = match &call {
            Call::AddLearner { id, addr } => {
                let mut request = tonic::Request::new(v1::AddLearnerRequest {
                    member: Some(v1::Member {
                        node_id: *id,
                        addr: addr.clone(),
                        voter: false,
                    }),
                });
                request.set_timeout(ADMIN_CALL_TIMEOUT);
                tokio::time::timeout(ADMIN_CALL_TIMEOUT, client.add_learner(request))
                    .await
                    .map(|r| r.map(|_| ()))
            }
            Call::Voters(voters) => {
                let mut request = tonic::Request::new(v1::ChangeMembershipRequest {
                    voter_ids: voters.clone(),
                    retain: false,
                });
                request.set_timeout(ADMIN_CALL_TIMEOUT);
                tokio::time::timeout(ADMIN_CALL_TIMEOUT, client.change_membership(request))
                    .await
                    .map(|r| r.map(|_| ()))
            }
        };
        match answer {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(status)) => {
                last_error = format!("node {leader}: {}: {}", status.code(), status.message())
            }
            Err(_) => {
                last_error = format!("node {leader}: no answer within {ADMIN_CALL_TIMEOUT:?}")
            }
        }
        tokio::time::sleep(RETRY_PAUSE).await;
    }
    bail!("{call:?} did not succeed within {ADMIN_RETRY_FOR:?}: {last_error}")
}
