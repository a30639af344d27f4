//! W5's failover figure at full size: SIGKILL the leader while every lock is held, and time,
//! from the kill, the first grant of a new key and the first answer of every other kind of
//! call — a heartbeat, a renewal, a leader-confirmed read — from the new leader; then check
//! that a sample of the held keys kept its holder and token (no lease ended early).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use lock_proto::v1::{HeartbeatBatchRequest, InspectRequest, RenewRequest, TryAcquireRequest};
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::index::sample;
use serde::Serialize;
use tokio::task::JoinSet;

use super::cluster::Cluster;
use super::held::Held;
use super::router::{CALL_TIMEOUT, RefusalCount, Refusals, Router, kind_of};

/// Longest a probe keeps trying after the kill.
const PROBE_MAX: Duration = Duration::from_secs(60);
/// Pause between two attempts of a probe.
const PROBE_PAUSE: Duration = Duration::from_millis(10);
/// Sampled keys checked at once.
const CHECK_LANES: usize = 32;
/// Attempts each probe keeps in its timeline (the last ones).
pub const TIMELINE_KEPT: usize = 12;
/// Seed of the key sample.
const SAMPLE_SEED: u64 = 0x5ca1e;

/// When one kind of call was served again after the kill.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Probe {
    /// From the kill to the first success, in seconds.
    pub served_secs: Option<f64>,
    /// The same, from the first grant on.
    pub after_first_grant_secs: Option<f64>,
    /// Attempts made.
    pub attempts: u64,
    /// Refusals met before the success, by kind.
    pub refusals: BTreeMap<String, RefusalCount>,
    /// Set if an answer said a lock or session was lost (never expected).
    pub lost: Option<String>,
    /// The last attempts ([`TIMELINE_KEPT`] at most), oldest first: where the time went.
    pub timeline: Vec<Attempt>,
}

/// One attempt of a probe.
#[derive(Debug, Clone, Serialize)]
pub struct Attempt {
    /// The node asked (index into the cluster's nodes).
    pub node: usize,
    /// From the kill to the call's start, in seconds.
    pub start_secs: f64,
    /// How long the call took, in milliseconds.
    pub call_ms: f64,
    /// `served`, or the refusal's kind.
    pub answer: String,
}

/// What the failover measured.
#[derive(Debug, Clone, Serialize)]
pub struct Failover {
    /// Locks held when the leader was killed.
    pub held: usize,
    /// The killed leader.
    pub killed_node_id: u64,
    /// The new leader.
    pub new_leader_node_id: Option<u64>,
    /// The term before and after.
    pub term_before: Option<u64>,
    /// The new leader's term.
    pub term_after: Option<u64>,
    /// A grant of a new key (`TryAcquire`).
    pub grant: Probe,
    /// `HeartbeatBatch` of a held session.
    pub heartbeat: Probe,
    /// `Renew` of a held grant.
    pub renew: Probe,
    /// `Inspect` with `leader_confirmed`.
    pub confirmed_read: Probe,
    /// From the kill until every kind above was served.
    pub all_served_secs: Option<f64>,
    /// The same, from the first grant on.
    pub all_served_after_first_grant_secs: Option<f64>,
    /// Held keys sampled and checked after the failover.
    pub sampled: usize,
    /// Of those, the ones whose holder and token were unchanged.
    pub kept: usize,
    /// The first few that were not, and how.
    pub not_kept: Vec<String>,
}

#[derive(Clone, Copy)]
enum Kind {
    Grant,
    Heartbeat,
    Renew,
    Read,
}

/// Kills the leader with every lock of `held` held, probes until each kind of call is served
/// by the new leader, re-points the cluster at it and checks `sample_size` held keys.
pub async fn measure(
    cluster: &mut Cluster,
    held: Arc<Held>,
    sample_size: usize,
) -> Result<Failover> {
    let filled = held.filled();
    if filled == 0 {
        bail!("failover: no held lock to sample");
    }
    let old = cluster.leader.get();
    let killed_node_id = cluster.nodes[old].id;
    let term_before = cluster.scrape(old).await.ok().and_then(|s| s.view().term);
    let mut rng = StdRng::seed_from_u64(SAMPLE_SEED);
    let sampled: Vec<usize> = sample(&mut rng, filled, sample_size.min(filled)).into_vec();
    // Each probe has its own connections, so no probe waits behind another's.
    let mut probes = JoinSet::new();
    let killed_at = Instant::now();
    cluster
        .lockd
        .node_process_mut(old)
        .context("the leader's process")?
        .kill()
        .await?;
    for kind in [Kind::Grant, Kind::Heartbeat, Kind::Renew, Kind::Read] {
        let router = Router::new(cluster, Arc::new(Refusals::default()))?;
        let (held, n) = (held.clone(), sampled[0]);
        probes.spawn(async move { (kind as u8, probe(kind, &router, &held, n, killed_at).await) });
    }
    let mut results: BTreeMap<u8, Probe> = BTreeMap::new();
    while let Some(done) = probes.join_next().await {
        let (kind, probe) = done.context("a failover probe panicked")?;
        results.insert(kind, probe);
    }
    let mut take = |kind: Kind| results.remove(&(kind as u8)).unwrap_or_default();
    let (mut grant, mut heartbeat, mut renew, mut read) = (
        take(Kind::Grant),
        take(Kind::Heartbeat),
        take(Kind::Renew),
        take(Kind::Read),
    );
    let first_grant = grant.served_secs;
    for p in [&mut grant, &mut heartbeat, &mut renew, &mut read] {
        p.after_first_grant_secs = p.served_secs.zip(first_grant).map(|(s, g)| s - g);
    }
    let all: Option<Vec<f64>> = [&grant, &heartbeat, &renew, &read]
        .iter()
        .map(|p| p.served_secs)
        .collect();
    let all_served_secs = all.map(|v| v.into_iter().fold(0.0, f64::max));
    let new_leader = cluster.await_leader(Some(old), PROBE_MAX).await.ok();
    let term_after = match new_leader {
        Some(index) => cluster.scrape(index).await.ok().and_then(|s| s.view().term),
        None => None,
    };
    let (kept, not_kept) = check_sample(cluster, &held, &sampled).await?;
    Ok(Failover {
        held: filled,
        killed_node_id,
        new_leader_node_id: new_leader.map(|i| cluster.nodes[i].id),
        term_before,
        term_after,
        all_served_after_first_grant_secs: all_served_secs.zip(first_grant).map(|(a, g)| a - g),
        all_served_secs,
        grant,
        heartbeat,
        renew,
        confirmed_read: read,
        sampled: sampled.len(),
        kept,
        not_kept,
    })
}

/// Tries one kind of call at every surviving node in turn until one serves it.
async fn probe(kind: Kind, router: &Router, held: &Held, n: usize, killed_at: Instant) -> Probe {
    let mut out = Probe::default();
    let refusals = Refusals::default();
    let session = held.session_of(n);
    let session_id = held.sessions[session].clone();
    let mut node = 0;
    while killed_at.elapsed() < PROBE_MAX {
        node = (node + 1) % router.node_count();
        out.attempts += 1;
        let started = killed_at.elapsed();
        let answer: Result<bool, tonic::Status> = match kind {
            Kind::Grant => {
                let request = TryAcquireRequest {
                    session_id: session_id.clone(),
                    request_id: held.request_id(session),
                    key: format!("w5/failover/{}", out.attempts),
                    ttl_ms: 60_000,
                };
                router
                    .pipeline(node)
                    .try_acquire(request, CALL_TIMEOUT)
                    .await
                    .map(|a| a.into_inner().grant.is_some())
            }
            Kind::Heartbeat => router
                .session(node)
                .heartbeat_batch(HeartbeatBatchRequest {
                    session_ids: vec![session_id.clone()],
                })
                .await
                .map(|a| {
                    a.into_inner().results.first().is_some_and(|r| {
                        matches!(
                            &r.outcome,
                            Some(lock_proto::v1::heartbeat_batch_result::Outcome::Heartbeat(h)) if h.alive
                        )
                    })
                }),
            Kind::Renew => {
                let request = RenewRequest {
                    session_id: session_id.clone(),
                    request_id: held.request_id(session),
                    key: held.key(n),
                    fencing_token: held.token(n),
                    ttl_ms: held.grant_ttl_ms,
                };
                router
                    .pipeline(node)
                    .renew(request, CALL_TIMEOUT)
                    .await
                    .map(|a| a.into_inner().grant.is_some())
            }
            Kind::Read => router
                .lock(node)
                .inspect(InspectRequest {
                    key: held.key(n),
                    leader_confirmed: true,
                })
                .await
                .map(|a| {
                    a.into_inner()
                        .info
                        .is_some_and(|i| i.fencing_token == held.token(n))
                }),
        };
        let call_ms = (killed_at.elapsed() - started).as_secs_f64() * 1e3;
        let refused = answer.as_ref().err().map(kind_of);
        if out.timeline.len() == TIMELINE_KEPT {
            out.timeline.remove(0);
        }
        out.timeline.push(Attempt {
            node,
            start_secs: started.as_secs_f64(),
            call_ms,
            answer: refused
                .as_ref()
                .map_or_else(|| "served".to_owned(), |(kind, _)| kind.clone()),
        });
        match answer {
            Ok(true) => {
                out.served_secs = Some(killed_at.elapsed().as_secs_f64());
                break;
            }
            Ok(false) => {
                // Served, but the lock or session is gone (or, for a grant, the key is held).
                out.lost = Some(match kind {
                    Kind::Grant => "a new key answered not granted".to_owned(),
                    Kind::Heartbeat => format!("session {session_id} answered alive=false"),
                    Kind::Renew => format!("{} answered lost", held.key(n)),
                    Kind::Read => format!("{} has another holder or none", held.key(n)),
                });
                out.served_secs = Some(killed_at.elapsed().as_secs_f64());
                break;
            }
            Err(_) => {
                if let Some((kind, error)) = &refused {
                    refusals.note(kind, error);
                }
            }
        }
        tokio::time::sleep(PROBE_PAUSE).await;
    }
    out.refusals = refusals.counts();
    out
}

/// Reads every sampled key with `leader_confirmed` at the leader; answers how many kept the
/// session and token they were granted with, and the first few that did not.
async fn check_sample(
    cluster: &Cluster,
    held: &Arc<Held>,
    sampled: &[usize],
) -> Result<(usize, Vec<String>)> {
    let router = Arc::new(Router::new(cluster, Arc::new(Refusals::default()))?);
    let chunks: Vec<Vec<usize>> = sampled
        .chunks(sampled.len().div_ceil(CHECK_LANES).max(1))
        .map(<[usize]>::to_vec)
        .collect();
    let mut lanes = JoinSet::new();
    for chunk in chunks {
        let (router, held) = (router.clone(), held.clone());
        lanes.spawn(async move {
            let mut out = Vec::new();
            for n in chunk {
                let key = held.key(n);
                let answer = router
                    .call("Inspect", |node| {
                        let mut lock = router.lock(node);
                        let key = key.clone();
                        async move {
                            lock.inspect(InspectRequest {
                                key,
                                leader_confirmed: true,
                            })
                            .await
                        }
                    })
                    .await;
                out.push(match answer {
                    Ok(answer) => match answer.info {
                        Some(info)
                            if info.session_id == held.session_id(n)
                                && info.fencing_token == held.token(n) =>
                        {
                            None
                        }
                        Some(info) => Some(format!(
                            "{key}: held by session {} token {} (granted to {} token {})",
                            info.session_id,
                            info.fencing_token,
                            held.session_id(n),
                            held.token(n)
                        )),
                        None => Some(format!("{key}: free (granted token {})", held.token(n))),
                    },
                    Err(e) => Some(format!("{key}: {e:#}")),
                });
            }
            out
        });
    }
    let (mut kept, mut not_kept) = (0, Vec::new());
    while let Some(lane) = lanes.join_next().await {
        for outcome in lane.context("a sample-check lane panicked")? {
            match outcome {
                None => kept += 1,
                Some(what) if not_kept.len() < 10 => not_kept.push(what),
                Some(_) => {}
            }
        }
    }
    Ok((kept, not_kept))
}
