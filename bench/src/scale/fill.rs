//! The fill: opens W5's sessions and grants their locks through the `Pipeline` stream, many
//! calls in flight on a few connections (as a busy SDK client would), up to a target count of
//! held locks; measures locks/s and the refusals each stretch of the fill met.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use lock_proto::v1::{OpenSessionRequest, TryAcquireRequest};
use serde::Serialize;
use tokio::task::JoinSet;

use super::held::Held;
use super::router::{CALL_TIMEOUT, RefusalCount, Router};

/// Calls in flight during the fill, over all connections: enough that the leader's proposer
/// gathers full batches.
const FILL_LANES: usize = 512;
/// Concurrent `OpenSession` calls while opening the fill's sessions.
const OPEN_LANES: usize = 64;

/// Opens `count` sessions of `ttl_ms` for owners `<owner>-<i>` through `routers`,
/// concurrently; answers their ids.
pub async fn open_sessions(
    routers: &[Arc<Router>],
    owner: &str,
    count: usize,
    ttl_ms: u64,
) -> Result<Vec<String>> {
    let next = Arc::new(AtomicUsize::new(0));
    let mut lanes = JoinSet::new();
    for lane in 0..OPEN_LANES.min(count) {
        let router = routers[lane % routers.len()].clone();
        let (next, owner) = (next.clone(), owner.to_owned());
        lanes.spawn(async move {
            let mut opened = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    return anyhow::Ok(opened);
                }
                let owner_id = format!("{owner}-{i}");
                let answer = router
                    .call("OpenSession", |node| {
                        let mut sessions = router.session(node);
                        let owner_id = owner_id.clone();
                        async move {
                            sessions
                                .open_session(OpenSessionRequest { owner_id, ttl_ms })
                                .await
                        }
                    })
                    .await?;
                opened.push((i, answer.session_id));
            }
        });
    }
    let mut ids = vec![String::new(); count];
    while let Some(lane) = lanes.join_next().await {
        for (i, id) in lane.context("an OpenSession lane panicked")?? {
            ids[i] = id;
        }
    }
    Ok(ids)
}

/// One stretch of the fill.
#[derive(Debug, Clone, Serialize)]
pub struct FillStretch {
    /// Held locks before it.
    pub from: usize,
    /// Held locks after it.
    pub to: usize,
    /// Its duration, in seconds.
    pub secs: f64,
    /// `(to - from) / secs`.
    pub locks_per_sec: f64,
    /// Every refusal the fill's calls met (each was retried), by kind.
    pub refusals: BTreeMap<String, RefusalCount>,
    /// Locks that could not be granted (a non-retry-safe refusal, or retried too long).
    pub failed: u64,
    /// The first such failure.
    pub first_failure: Option<String>,
}

/// Grants locks `held.filled()..to` through `routers` with [`FILL_LANES`] calls in flight;
/// at `deadline` it stops taking new locks, and the stretch ends where the fill got to.
pub async fn fill_to(
    routers: &[Arc<Router>],
    held: &Arc<Held>,
    to: usize,
    grant_ttl_ms: u64,
    deadline: Instant,
) -> Result<FillStretch> {
    let from = held.filled();
    if to < from || to > held.total() {
        bail!("fill to {to}: outside {from}..={}", held.total());
    }
    let before = routers[0].refusals.counts();
    let started = Instant::now();
    let next = Arc::new(AtomicUsize::new(from));
    let failed = Arc::new(AtomicU64::new(0));
    let first_failure = Arc::new(std::sync::Mutex::new(None::<String>));
    let mut lanes = JoinSet::new();
    for lane in 0..FILL_LANES.min(to - from) {
        let router = routers[lane % routers.len()].clone();
        let (held, next, failed, first_failure) = (
            held.clone(),
            next.clone(),
            failed.clone(),
            first_failure.clone(),
        );
        lanes.spawn(async move {
            loop {
                if Instant::now() > deadline {
                    return;
                }
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= to {
                    return;
                }
                let session = held.session_of(n);
                let request = TryAcquireRequest {
                    session_id: held.sessions[session].clone(),
                    request_id: held.request_id(session),
                    key: held.key(n),
                    ttl_ms: grant_ttl_ms,
                };
                let answer = router
                    .call("TryAcquire", |node| {
                        let pipeline = router.pipeline(node);
                        let request = request.clone();
                        async move { pipeline.try_acquire(request, CALL_TIMEOUT).await }
                    })
                    .await;
                let outcome = match answer {
                    Ok(answer) => match answer.grant {
                        Some(grant) => {
                            held.granted(n, grant.fencing_token);
                            continue;
                        }
                        None => {
                            format!("TryAcquire {}: not granted (held by another)", request.key)
                        }
                    },
                    Err(e) => format!("{e:#}"),
                };
                failed.fetch_add(1, Ordering::Relaxed);
                first_failure
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get_or_insert(outcome);
            }
        });
    }
    while let Some(lane) = lanes.join_next().await {
        lane.context("a fill lane panicked")?;
    }
    // Every lock a lane took is answered once the lanes are done: the ones below `reached`.
    let reached = next.load(Ordering::Relaxed).min(to);
    held.set_filled(reached);
    let to = reached;
    let secs = started.elapsed().as_secs_f64();
    let first_failure = first_failure
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    Ok(FillStretch {
        from,
        to,
        secs,
        locks_per_sec: if secs > 0.0 {
            (to - from) as f64 / secs
        } else {
            0.0
        },
        refusals: routers[0].refusals.since(&before),
        failed: failed.load(Ordering::Relaxed),
        first_failure,
    })
}
