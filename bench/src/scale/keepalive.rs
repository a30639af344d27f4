//! Keeping W5's held locks alive: a heartbeat task that beats every session at a third of its
//! TTL in `HeartbeatBatch` calls (following the leader across a failover), and a renewer that
//! renews each grant once half its TTL has passed (with W5's default one-hour grant TTL that
//! is never within a run; a short `--w5-grant-ttl-secs` exercises it). Both count what they
//! did; a session answered `alive = false` or a renewal answered "lost" is a lost lock.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lock_proto::session::HEARTBEAT_BATCH_SESSIONS_MAX;
use lock_proto::v1::heartbeat_batch_result::Outcome;
use lock_proto::v1::{HeartbeatBatchRequest, RenewRequest};
use serde::Serialize;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinHandle;

use super::held::Held;
use super::router::{CALL_TIMEOUT, Router};

/// Lost sessions and grants named in a report (the rest are counted).
pub const LOST_LISTED_MAX: usize = 10;
/// Heartbeat batches unanswered at once; more wait for one of them.
const BATCHES_IN_FLIGHT_MAX: usize = 16;
/// Most renewer passes per second, however short the TTL.
const RENEW_PASS_MIN: Duration = Duration::from_millis(500);

#[derive(Debug, Default)]
struct Counts {
    beats_ok: AtomicU64,
    batches_failed: AtomicU64,
    renewals: AtomicU64,
    renewals_failed: AtomicU64,
    lost: Mutex<BTreeSet<String>>,
    first_error: Mutex<Option<String>>,
}

impl Counts {
    fn error(&self, what: String) {
        self.first_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert(what);
    }

    fn lost(&self, what: String) {
        self.lost
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(what);
    }
}

/// What keeping the held locks alive did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct KeepAliveReport {
    /// Sessions kept alive.
    pub sessions: usize,
    /// Session TTL, in milliseconds (beats every third of it).
    pub session_ttl_ms: u64,
    /// Session beats answered alive.
    pub beats_ok: u64,
    /// `HeartbeatBatch` calls that failed after their retries.
    pub batches_failed: u64,
    /// Grants renewed.
    pub renewals: u64,
    /// Renewals that failed after their retries (not lost: an error).
    pub renewals_failed: u64,
    /// Sessions answered `alive = false` and grants a renewal found lost.
    pub lost_count: usize,
    /// The first [`LOST_LISTED_MAX`] of them.
    pub lost: Vec<String>,
    /// The first failure.
    pub first_error: Option<String>,
}

/// The running heartbeat and renewal tasks.
#[derive(Debug)]
pub struct KeepAlive {
    counts: Arc<Counts>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    sessions: usize,
    session_ttl: Duration,
}

impl KeepAlive {
    /// Starts beating every session of `held` each `session_ttl / 3` and renewing each of its
    /// granted locks once `grant_ttl / 2` has passed since it was granted or renewed.
    pub fn start(
        router: Arc<Router>,
        held: Arc<Held>,
        session_ttl: Duration,
        grant_ttl: Duration,
    ) -> Self {
        let counts = Arc::new(Counts::default());
        let (stop, stopped) = watch::channel(false);
        let beats = tokio::spawn(beat(
            router.clone(),
            held.clone(),
            session_ttl / 3,
            counts.clone(),
            stopped.clone(),
        ));
        let renewals = tokio::spawn(renew(
            router,
            held.clone(),
            grant_ttl,
            counts.clone(),
            stopped,
        ));
        Self {
            counts,
            stop,
            tasks: vec![beats, renewals],
            sessions: held.sessions.len(),
            session_ttl,
        }
    }

    /// What the tasks did so far.
    pub fn report(&self) -> KeepAliveReport {
        let c = &self.counts;
        let lost = c.lost.lock().unwrap_or_else(|p| p.into_inner());
        KeepAliveReport {
            sessions: self.sessions,
            session_ttl_ms: self.session_ttl.as_millis() as u64,
            beats_ok: c.beats_ok.load(Ordering::Relaxed),
            batches_failed: c.batches_failed.load(Ordering::Relaxed),
            renewals: c.renewals.load(Ordering::Relaxed),
            renewals_failed: c.renewals_failed.load(Ordering::Relaxed),
            lost_count: lost.len(),
            lost: lost.iter().take(LOST_LISTED_MAX).cloned().collect(),
            first_error: c
                .first_error
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        }
    }

    /// Stops both tasks and answers what they did.
    pub async fn stop(mut self) -> KeepAliveReport {
        let _ = self.stop.send(true);
        for task in std::mem::take(&mut self.tasks) {
            let _ = task.await;
        }
        self.report()
    }
}

/// Beats every session of `held` each `period`: the sessions in `HeartbeatBatch` calls of at
/// most [`HEARTBEAT_BATCH_SESSIONS_MAX`], spread evenly over the period (as many sessions'
/// own timers would be), at most [`BATCHES_IN_FLIGHT_MAX`] unanswered at once.
async fn beat(
    router: Arc<Router>,
    held: Arc<Held>,
    period: Duration,
    counts: Arc<Counts>,
    mut stop: watch::Receiver<bool>,
) {
    let chunks: Vec<Vec<String>> = held
        .sessions
        .chunks(HEARTBEAT_BATCH_SESSIONS_MAX)
        .map(<[String]>::to_vec)
        .collect();
    let slot = period / chunks.len().max(1) as u32;
    let in_flight = Arc::new(Semaphore::new(BATCHES_IN_FLIGHT_MAX));
    let mut next = Instant::now() + period;
    'beat: loop {
        for ids in &chunks {
            tokio::select! {
                _ = tokio::time::sleep_until(next.into()) => {}
                _ = stop.changed() => break 'beat,
            }
            // A beat that fell behind goes out at once, not twice.
            next = (next + slot).max(Instant::now());
            let Ok(permit) = in_flight.clone().acquire_owned().await else {
                break 'beat;
            };
            let (router, counts, ids) = (router.clone(), counts.clone(), ids.clone());
            tokio::spawn(async move {
                beat_batch(&router, &counts, &ids).await;
                drop(permit);
            });
        }
    }
    // Every batch in flight answered before the report is read.
    let _ = in_flight.acquire_many(BATCHES_IN_FLIGHT_MAX as u32).await;
}

/// One `HeartbeatBatch` of `ids`, retried as the router does, counted into `counts`.
async fn beat_batch(router: &Router, counts: &Counts, ids: &[String]) {
    let answer = router
        .call("HeartbeatBatch", |node| {
            let mut sessions = router.session(node);
            let session_ids = ids.to_vec();
            async move {
                sessions
                    .heartbeat_batch(HeartbeatBatchRequest { session_ids })
                    .await
            }
        })
        .await;
    let results = match answer {
        Ok(answer) => answer.results,
        Err(e) => {
            counts.batches_failed.fetch_add(1, Ordering::Relaxed);
            counts.error(format!("{e:#}"));
            return;
        }
    };
    for (id, result) in ids.iter().zip(results) {
        match result.outcome {
            Some(Outcome::Heartbeat(h)) if h.alive => {
                counts.beats_ok.fetch_add(1, Ordering::Relaxed);
            }
            Some(Outcome::Heartbeat(_)) => counts.lost(format!("session {id}: alive=false")),
            Some(Outcome::Error(detail)) => counts.error(format!(
                "HeartbeatBatch of {id}: {}",
                lock_proto::error::lock_error_from_detail(detail)
            )),
            None => counts.error("HeartbeatBatch: a result without an outcome".into()),
        }
    }
}

/// Renews each granted lock of `held` whose grant is older than half of `ttl`.
async fn renew(
    router: Arc<Router>,
    held: Arc<Held>,
    ttl: Duration,
    counts: Arc<Counts>,
    mut stop: watch::Receiver<bool>,
) {
    let half_ms = ttl.as_millis() as u64 / 2;
    let pass = (ttl / 4).max(RENEW_PASS_MIN);
    loop {
        tokio::select! {
            _ = tokio::time::sleep(pass) => {}
            _ = stop.changed() => return,
        }
        for n in 0..held.filled() {
            if *stop.borrow() {
                return;
            }
            let token = held.token(n);
            if token == 0 || held.age_ms(n) < half_ms {
                continue;
            }
            let session = held.session_of(n);
            let request = RenewRequest {
                session_id: held.sessions[session].clone(),
                request_id: held.request_id(session),
                key: held.key(n),
                fencing_token: token,
                ttl_ms: ttl.as_millis() as u64,
            };
            let answer = router
                .call("Renew", |node| {
                    let pipeline = router.pipeline(node);
                    let request = request.clone();
                    async move { pipeline.renew(request, CALL_TIMEOUT).await }
                })
                .await;
            match answer {
                Ok(answer) if answer.grant.is_some() => {
                    held.granted(n, token);
                    counts.renewals.fetch_add(1, Ordering::Relaxed);
                }
                Ok(_) => counts.lost(format!(
                    "grant {} token {token}: renewal answered lost",
                    request.key
                )),
                Err(e) => {
                    counts.renewals_failed.fetch_add(1, Ordering::Relaxed);
                    counts.error(format!("{e:#}"));
                }
            }
        }
    }
}

impl KeepAliveReport {
    /// One report for keep-alive loads that ran side by side: counts add up.
    pub fn combine(loads: Vec<KeepAliveReport>) -> KeepAliveReport {
        let mut all = KeepAliveReport::default();
        for l in loads {
            all.session_ttl_ms = l.session_ttl_ms;
            all.sessions += l.sessions;
            all.beats_ok += l.beats_ok;
            all.batches_failed += l.batches_failed;
            all.renewals += l.renewals;
            all.renewals_failed += l.renewals_failed;
            all.lost_count += l.lost_count;
            let room = LOST_LISTED_MAX.saturating_sub(all.lost.len());
            all.lost.extend(l.lost.into_iter().take(room));
            if all.first_error.is_none() {
                all.first_error = l.first_error;
            }
        }
        all
    }
}
