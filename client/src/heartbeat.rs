//! The heartbeats of every session of one [`crate::LockClient`], coalesced into
//! `SessionService.HeartbeatBatch` calls.
//!
//! Owns the heartbeat *schedule* of a client: when each session is due, which sessions go out
//! together, and which RPC carries them. One task per client (started with its first session,
//! ending with its last) sleeps until the earliest session is due and then sends every session
//! due within [`COALESCE_AHEAD_FRACTION`] of its interval — in `HeartbeatBatch` calls of at most
//! [`HEARTBEAT_BATCH_SESSIONS_MAX`] ids, or as one unary `Heartbeat` when a single session is
//! due. Sessions sent together are next due together, so a client's sessions converge into a
//! few batches per interval however they were opened (etcd's client does the same for its
//! lease keep-alives, over one stream).
//!
//! It decides nothing about a session's life: each answer, per session, goes to
//! `SessionInner::on_heartbeat`, the same rule whether it came in a batch or alone. A batch
//! the server does not know (`Unimplemented`, an older server) switches this client to unary
//! heartbeats; a batch it refuses as a whole (`InvalidArgument`) is re-sent as unary
//! heartbeats, so a refusal of the *call* never kills a session.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use lock_api::LockError;
use lock_proto::session::HEARTBEAT_BATCH_SESSIONS_MAX;
use tokio::sync::Notify;

use crate::session::SessionInner;

/// A session whose next heartbeat is due within `interval / COALESCE_AHEAD_FRACTION` goes out
/// with the sessions due now.
///
/// Sending a heartbeat early is always safe — the server restarts the lease from when it
/// answers, so an early beat only moves the deadline later — and it is what merges sessions
/// opened at different instants into one batch. A quarter bounds the cost: a session beats at
/// worst every `ttl / 4` instead of every `ttl / 3` while it joins a group, then at its own
/// interval again, and a client ends with at most four batch phases per interval.
pub const COALESCE_AHEAD_FRACTION: u32 = 4;

/// Shortest pause between an answered (or failed) heartbeat of a session and its next one, so
/// a node that refuses connections instantly does not turn the heartbeat into a busy loop. It
/// holds against the coalescing allowance too: a retry due in 50 ms is *within* a quarter
/// interval, and without this floor would be sent again at once.
pub(crate) const HEARTBEAT_RETRY_PAUSE: Duration = Duration::from_millis(50);

/// One session's place in the schedule.
struct Entry {
    /// Weak, so a dropped session leaves the schedule instead of being kept alive by it.
    session: Weak<SessionInner>,
    interval: Duration,
    next_due: Instant,
    /// Not sent again before this instant, however due ([`HEARTBEAT_RETRY_PAUSE`] after the
    /// last answer).
    not_before: Instant,
    /// A heartbeat of this session is being sent; it is not due again until answered.
    in_flight: bool,
}

#[derive(Default)]
struct Registry {
    entries: HashMap<u64, Entry>,
    next_key: u64,
    /// The driver task is running.
    running: bool,
}

/// The heartbeat schedule of one client, shared by its clones and all its sessions.
#[derive(Default)]
pub(crate) struct Heartbeats {
    registry: Mutex<Registry>,
    /// Wakes the driver when the schedule changed (a session added, a beat answered).
    wake: Notify,
    /// The server answered `Unimplemented` to `HeartbeatBatch`: unary heartbeats from now on.
    batch_unsupported: AtomicBool,
}

impl std::fmt::Debug for Heartbeats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Heartbeats")
            .field("sessions", &self.lock().entries.len())
            .field(
                "batch_unsupported",
                &self.batch_unsupported.load(Ordering::Relaxed),
            )
            .finish_non_exhaustive()
    }
}

/// A session taken from the schedule to be heartbeated now.
struct Due {
    key: u64,
    session: Arc<SessionInner>,
}

impl Heartbeats {
    fn lock(&self) -> MutexGuard<'_, Registry> {
        // Every critical section only inserts, removes or assigns plain fields, so a poisoned
        // lock still holds a consistent schedule.
        self.registry.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A key for a session about to be registered (see [`Heartbeats::register`]).
    pub(crate) fn new_key(&self) -> u64 {
        let mut registry = self.lock();
        registry.next_key += 1;
        registry.next_key
    }

    /// Schedules `session` under `key`: first heartbeat at `first_due`, then every `interval`
    /// after each answered one. Starts the driver on the current Tokio runtime if it is not
    /// running.
    pub(crate) fn register(
        self: &Arc<Self>,
        key: u64,
        session: &Arc<SessionInner>,
        interval: Duration,
        first_due: Instant,
    ) {
        let start = {
            let mut registry = self.lock();
            registry.entries.insert(
                key,
                Entry {
                    session: Arc::downgrade(session),
                    interval,
                    next_due: first_due,
                    not_before: crate::clock::now(),
                    in_flight: false,
                },
            );
            !std::mem::replace(&mut registry.running, true)
        };
        if start {
            tokio::spawn(drive(Arc::clone(self)));
        } else {
            self.wake.notify_one();
        }
    }

    /// Takes `key` off the schedule (the session ended). Its beat in flight, if any, is
    /// answered into a session that ignores it.
    pub(crate) fn deregister(&self, key: u64) {
        self.lock().entries.remove(&key);
        self.wake.notify_one();
    }

    /// How many sessions are scheduled (for tests).
    #[cfg(test)]
    fn scheduled(&self) -> usize {
        self.lock().entries.len()
    }

    /// Takes every session due by `now` plus its coalescing allowance and marks it in flight.
    /// Answers them and the instant the next one not taken is due; `None` when the schedule
    /// is empty, after marking the driver stopped (so the next `register` starts one).
    fn take_due(&self, now: Instant) -> Option<(Vec<Due>, Option<Instant>)> {
        let mut registry = self.lock();
        registry.entries.retain(|_, e| e.session.strong_count() > 0);
        if registry.entries.is_empty() {
            registry.running = false;
            return None;
        }
        let mut due = Vec::new();
        let mut next: Option<Instant> = None;
        for (key, entry) in registry.entries.iter_mut() {
            if entry.in_flight {
                continue;
            }
            let ahead = entry.interval / COALESCE_AHEAD_FRACTION;
            let due_now = entry.next_due <= now + ahead;
            if due_now && entry.not_before <= now {
                if let Some(session) = entry.session.upgrade() {
                    entry.in_flight = true;
                    due.push(Due { key: *key, session });
                }
            } else {
                let wake = match due_now {
                    true => entry.not_before,
                    false => entry.next_due.max(entry.not_before),
                };
                next = Some(next.map_or(wake, |n| n.min(wake)));
            }
        }
        Some((due, next))
    }

    /// Puts `key` back on the schedule, due at `next_due`, or takes it off (`None`: the
    /// session ended).
    fn answered(&self, key: u64, next_due: Option<Instant>) {
        let mut registry = self.lock();
        match next_due {
            Some(at) => {
                if let Some(entry) = registry.entries.get_mut(&key) {
                    entry.next_due = at;
                    entry.not_before = crate::clock::now() + HEARTBEAT_RETRY_PAUSE;
                    entry.in_flight = false;
                }
            }
            None => {
                registry.entries.remove(&key);
            }
        }
    }
}

/// The driver: sleeps until the earliest session is due, sends what is due, repeats while any
/// session is scheduled.
async fn drive(heartbeats: Arc<Heartbeats>) {
    loop {
        let Some((due, next)) = heartbeats.take_due(crate::clock::now()) else {
            return;
        };
        let mut due = due.into_iter().peekable();
        while due.peek().is_some() {
            let chunk: Vec<Due> = due.by_ref().take(HEARTBEAT_BATCH_SESSIONS_MAX).collect();
            tokio::spawn(beat(Arc::clone(&heartbeats), chunk));
        }
        match next {
            Some(at) => tokio::select! {
                _ = tokio::time::sleep_until(at.into()) => {}
                _ = heartbeats.wake.notified() => {}
            },
            None => heartbeats.wake.notified().await,
        }
    }
}

/// Heartbeats one chunk of due sessions (one batch call, or unary calls) and hands each answer
/// to its session.
async fn beat(heartbeats: Arc<Heartbeats>, chunk: Vec<Due>) {
    let now = crate::clock::now();
    let mut live = Vec::with_capacity(chunk.len());
    for due in chunk {
        match due.session.heartbeat_deadline() {
            None => heartbeats.answered(due.key, None),
            Some(deadline) if now >= deadline => {
                due.session.die(
                    "no heartbeat was answered before the session's local deadline".into(),
                    false,
                );
                heartbeats.answered(due.key, None);
            }
            Some(deadline) => live.push((due, deadline)),
        }
    }
    if !live.is_empty() {
        let sent_at = crate::clock::now();
        let answers = send(&heartbeats, &live).await;
        for ((due, _), answer) in live.into_iter().zip(answers) {
            let next = due.session.on_heartbeat(sent_at, answer);
            heartbeats.answered(due.key, next);
        }
    }
    heartbeats.wake.notify_one();
}

/// Sends the heartbeats of `live` (sessions with their local deadlines); one answer per
/// session, in order.
async fn send(
    heartbeats: &Heartbeats,
    live: &[(Due, Instant)],
) -> Vec<Result<Option<Duration>, LockError>> {
    let Some(((first, _), _)) = live.split_first() else {
        return Vec::new();
    };
    let client = &first.session.client;
    if live.len() > 1 && !heartbeats.batch_unsupported.load(Ordering::Relaxed) {
        let ids: Vec<String> = live
            .iter()
            .map(|(due, _)| due.session.session_id.clone())
            .collect();
        // The earliest local deadline bounds the retries: past it that session is dead, and
        // the others are retried in the next round.
        let until = live
            .iter()
            .map(|(_, d)| *d)
            .min()
            .unwrap_or_else(crate::clock::now);
        match client.heartbeat_batch_until(&ids, until).await {
            Ok(Some(answers)) => return answers,
            Ok(None) => {
                tracing::info!(
                    "the server does not know HeartbeatBatch; heartbeating each session on its own"
                );
                heartbeats.batch_unsupported.store(true, Ordering::Relaxed);
            }
            Err(LockError::InvalidArgument { message }) => {
                tracing::warn!(%message, sessions = ids.len(),
                    "the server refused a heartbeat batch; heartbeating each session on its own");
            }
            Err(err) => return vec![Err(err); live.len()],
        }
    }
    unary_each(live).await
}

/// One unary `Heartbeat` per session, concurrently, each retried within its own deadline.
async fn unary_each(live: &[(Due, Instant)]) -> Vec<Result<Option<Duration>, LockError>> {
    let mut calls = tokio::task::JoinSet::new();
    for (index, (due, deadline)) in live.iter().enumerate() {
        let session = Arc::clone(&due.session);
        let deadline = *deadline;
        calls.spawn(async move {
            let answer = session
                .client
                .heartbeat_until(&session.session_id, deadline)
                .await;
            (index, answer)
        });
    }
    let mut answers: Vec<Result<Option<Duration>, LockError>> = (0..live.len())
        .map(|_| {
            Err(LockError::contention(
                "the heartbeat task stopped before answering",
            ))
        })
        .collect();
    while let Some(joined) = calls.join_next().await {
        if let Ok((index, answer)) = joined
            && let Some(slot) = answers.get_mut(index)
        {
            *slot = answer;
        }
    }
    answers
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_empty_schedule_stops_the_driver() {
        let heartbeats = Arc::new(Heartbeats::default());
        assert!(heartbeats.take_due(crate::clock::now()).is_none());
        assert!(!heartbeats.lock().running);
        assert_eq!(heartbeats.scheduled(), 0);
    }
}
