//! Leases (docs/DESIGN.md D-lease): the leader-local deadlines of every grant and session, the
//! promote that restarts them when a node becomes leader, and the reaper that applies expiry.
//!
//! Owns the in-memory deadlines ([`LeaseKeeper`]), the leadership watch that proposes
//! `Command::Promote` ([`run_promoter`]) and the reaper ([`run_reaper`]). Never writes a renewal
//! or heartbeat to the log: those are answered from memory after a quorum round (see
//! `store::raft`). Never decides a lock outcome itself: expiry is proposed as a command,
//! conditional on the token, and the state machine decides.
//!
//! Why the deadlines are monotonic `Instant`s on the leader and not the stamps in the
//! replicated state: a wall-clock step on the leader must not expire a lease early, and the
//! client's deadline is measured on its own monotonic clock from *before* it sent the request,
//! so a leader deadline taken when the request arrives is never earlier than the client's.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use lock_raft_store::storage::{ApplyObserver, StateReader};
use lock_raft_store::{Command, Event, Grant, Raft, Response};
use openraft::ServerState;
use openraft::async_runtime::WatchReceiver;

use crate::clock::Clock;
use crate::log_limit::{LogLimit, Note};
use crate::proposer::Proposer;
use crate::waiters::WaiterRegistry;

/// Most expiries the reaper proposes per tick.
///
/// A mass expiry (a partitioned client fleet, a restarted leader with thousands of stale
/// leases) must not turn into one giant burst of log writes that starves client requests;
/// at [`REAP_TICK`] of 100 ms this still expires 2,560 leases a second.
pub const REAP_PER_TICK_MAX: usize = 256;

/// How often the reaper looks for lapsed leases. Expiry is already true at the deadline (the
/// reaper is liveness only, C2 `reapExpired`), so this only bounds how long a lapsed key stays
/// unavailable to others.
pub const REAP_TICK: Duration = Duration::from_millis(100);

/// How often the promoter re-checks leadership when no metrics change arrives, so a failed
/// promote is retried.
const PROMOTE_RETRY: Duration = Duration::from_millis(200);

/// A grant's live lease on this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrantLease {
    /// The grant's fencing token.
    pub token: u64,
    /// Holder's owner id.
    pub owner_id: String,
    /// Holder's session.
    pub session_id: String,
    /// Lease length in force.
    pub ttl_ms: u64,
    /// Past this instant the lease has lapsed.
    pub deadline: Instant,
    /// The reaper proposed its expiry: it can no longer be renewed.
    pub expiring: bool,
}

/// A session's live lease on this node.
#[derive(Clone, Debug, PartialEq, Eq)]
struct SessionLease {
    ttl_ms: u64,
    deadline: Instant,
    expiring: bool,
}

#[derive(Debug, Default)]
struct Leases {
    grants: HashMap<String, GrantLease>,
    sessions: HashMap<String, SessionLease>,
    /// The term whose `Promote` applied on this node while it led; `None` when not leading.
    promoted_term: Option<u64>,
}

/// What renewing a grant's lease found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RenewCheck {
    /// The lease was alive and now runs to `now + ttl`; `previous_ttl_ms` is the lease length
    /// it had before (a different one must be written to the log, see `store::raft`).
    Extended {
        /// The lease as extended.
        lease: GrantLease,
        /// Its lease length before this renewal.
        previous_ttl_ms: u64,
    },
    /// No live lease of this `(key, token)`: missing, another token, lapsed or expiring.
    Lost,
}

/// Lapsed leases the reaper should expire, already marked expiring.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Lapsed {
    /// `(key, token)` of lapsed grants.
    pub grants: Vec<(String, u64)>,
    /// Ids of lapsed sessions.
    pub sessions: Vec<String>,
}

/// The in-memory lease deadlines of one node, fed by applied events on every node and
/// authoritative only on a promoted leader.
#[derive(Debug)]
pub struct LeaseKeeper {
    clock: Arc<dyn Clock>,
    safety_margin: Duration,
    leases: Mutex<Leases>,
}

impl LeaseKeeper {
    /// A keeper measuring time on `clock`; the reaper waits `safety_margin` past a deadline.
    pub fn new(clock: Arc<dyn Clock>, safety_margin: Duration) -> Self {
        Self {
            clock,
            safety_margin,
            leases: Mutex::new(Leases::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Leases> {
        // Every critical section below only moves plain data; a panic inside one cannot leave
        // it half-updated in a way later calls misread, so a poisoned lock is still usable.
        self.leases.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Tracks what an applied batch did.
    pub fn on_events(&self, events: &[Event]) {
        let now = self.clock.now();
        let mut leases = self.lock();
        for event in events {
            match event {
                Event::Granted { grant, .. } => {
                    leases
                        .grants
                        .insert(grant.key.clone(), lease_of(grant, now));
                }
                Event::Freed { key, token, .. } => {
                    if leases.grants.get(key).is_some_and(|l| l.token == *token) {
                        leases.grants.remove(key);
                    }
                }
                Event::SessionOpened { session_id, ttl_ms } => {
                    leases.sessions.insert(
                        session_id.clone(),
                        SessionLease {
                            ttl_ms: *ttl_ms,
                            deadline: now + Duration::from_millis(*ttl_ms),
                            expiring: false,
                        },
                    );
                }
                Event::SessionEnded { session_id } => {
                    leases.sessions.remove(session_id);
                }
                Event::Promoted { .. } => {
                    // etcd's lessor Promote: every lease restarts in full under the new leader,
                    // so no lease ends early because leadership moved.
                    for lease in leases.grants.values_mut() {
                        lease.deadline = now + Duration::from_millis(lease.ttl_ms);
                        lease.expiring = false;
                    }
                    for lease in leases.sessions.values_mut() {
                        lease.deadline = now + Duration::from_millis(lease.ttl_ms);
                        lease.expiring = false;
                    }
                }
                Event::WaiterDropped { .. } => {}
            }
        }
    }

    /// Makes the keeper match the replicated state after a promote: grants and sessions that
    /// the events did not bring (a snapshot install, a restart) start a full lease now; leases
    /// of grants and sessions that no longer exist are dropped. Existing leases keep the later
    /// of their deadline and a full lease from now, with the state's lease length.
    pub fn reconcile(&self, grants: &[Grant], sessions: &[(String, u64)]) {
        let now = self.clock.now();
        let mut leases = self.lock();
        let mut next_grants = HashMap::with_capacity(grants.len());
        for grant in grants {
            let fresh = lease_of(grant, now);
            let lease = match leases.grants.remove(&grant.key) {
                Some(old) if old.token == grant.token => GrantLease {
                    deadline: old.deadline.max(fresh.deadline),
                    ..fresh
                },
                _ => fresh,
            };
            next_grants.insert(grant.key.clone(), lease);
        }
        let mut next_sessions = HashMap::with_capacity(sessions.len());
        for (id, ttl_ms) in sessions {
            let full = now + Duration::from_millis(*ttl_ms);
            let deadline = leases
                .sessions
                .get(id)
                .map_or(full, |old| old.deadline.max(full));
            next_sessions.insert(
                id.clone(),
                SessionLease {
                    ttl_ms: *ttl_ms,
                    deadline,
                    expiring: false,
                },
            );
        }
        leases.grants = next_grants;
        leases.sessions = next_sessions;
    }

    /// Records that `term`'s promote applied on this leader: leases are authoritative now.
    pub fn set_promoted(&self, term: u64) {
        self.lock().promoted_term = Some(term);
    }

    /// Records that this node does not lead (any more).
    pub fn clear_promoted(&self) {
        self.lock().promoted_term = None;
    }

    /// The term whose promote applied on this leader, if any.
    pub fn promoted_term(&self) -> Option<u64> {
        self.lock().promoted_term
    }

    /// Renews the lease of grant `(key, token)` to `ttl_ms` from now, if it is alive: present,
    /// same token, not expiring and its deadline not passed. A lapsed lease is never revived
    /// (D-lease), so a late renewal and the reaper cannot both win.
    ///
    /// The extension happens before the caller confirms leadership: extending a leader's
    /// deadline only ever delays expiry, which is safe, and it closes the window in which the
    /// reaper could pick the lease while the confirmation round is in flight.
    pub fn renew_grant(&self, key: &str, token: u64, ttl_ms: u64) -> RenewCheck {
        let now = self.clock.now();
        let mut leases = self.lock();
        match leases.grants.get_mut(key) {
            Some(lease) if lease.token == token && !lease.expiring && now <= lease.deadline => {
                let previous_ttl_ms = lease.ttl_ms;
                lease.ttl_ms = ttl_ms;
                lease.deadline = now + Duration::from_millis(ttl_ms);
                RenewCheck::Extended {
                    lease: lease.clone(),
                    previous_ttl_ms,
                }
            }
            _ => RenewCheck::Lost,
        }
    }

    /// Restarts session `session_id`'s lease if it is alive; returns its TTL, or `None` if the
    /// session is gone, lapsed or expiring (terminal for the client).
    pub fn heartbeat_session(&self, session_id: &str) -> Option<u64> {
        let now = self.clock.now();
        restart_session(&mut self.lock(), session_id, now)
    }

    /// [`LeaseKeeper::heartbeat_session`] for each of `session_ids`, in order, under one
    /// acquisition of the lease table and one clock reading (`HeartbeatBatch`). Each answer is
    /// exactly what `heartbeat_session` would have answered for that id at that instant; the
    /// caller bounds the batch (`lock_proto::session::HEARTBEAT_BATCH_SESSIONS_MAX`), which
    /// bounds how long the table stays locked.
    pub fn heartbeat_sessions<'a>(
        &self,
        session_ids: impl IntoIterator<Item = &'a str>,
    ) -> Vec<Option<u64>> {
        let now = self.clock.now();
        let mut leases = self.lock();
        session_ids
            .into_iter()
            .map(|id| restart_session(&mut leases, id, now))
            .collect()
    }

    /// The live lease of `key`, if any (for building answers).
    pub fn grant_lease(&self, key: &str) -> Option<GrantLease> {
        self.lock().grants.get(key).cloned()
    }

    /// Finds up to `max` leases lapsed for longer than the safety margin, marks them expiring
    /// (so a renewal racing the expiry loses) and returns them.
    pub fn take_lapsed(&self, max: usize) -> Lapsed {
        let now = self.clock.now();
        let margin = self.safety_margin;
        let mut leases = self.lock();
        let mut lapsed = Lapsed::default();
        for (key, lease) in leases.grants.iter_mut() {
            if lapsed.grants.len() >= max {
                break;
            }
            if !lease.expiring && now > lease.deadline + margin {
                lease.expiring = true;
                lapsed.grants.push((key.clone(), lease.token));
            }
        }
        let room = max.saturating_sub(lapsed.grants.len());
        for (id, lease) in leases.sessions.iter_mut() {
            if lapsed.sessions.len() >= room {
                break;
            }
            if !lease.expiring && now > lease.deadline + margin {
                lease.expiring = true;
                lapsed.sessions.push(id.clone());
            }
        }
        lapsed
    }

    /// The expiry of grant `(key, token)` was not applied (the proposal failed): let the
    /// reaper try again. The deadline has passed, so a renewal still loses.
    pub fn expiry_failed(&self, key: &str, token: u64) {
        if let Some(lease) = self.lock().grants.get_mut(key)
            && lease.token == token
        {
            lease.expiring = false;
        }
    }

    /// The expiry of session `session_id` was not applied: let the reaper try again.
    pub fn session_expiry_failed(&self, session_id: &str) {
        if let Some(lease) = self.lock().sessions.get_mut(session_id) {
            lease.expiring = false;
        }
    }

    /// The state machine said `(key, token)` was no longer the grant: forget its lease.
    pub fn forget_grant(&self, key: &str, token: u64) {
        let mut leases = self.lock();
        if leases.grants.get(key).is_some_and(|l| l.token == token) {
            leases.grants.remove(key);
        }
    }

    /// How many grant and session leases are tracked.
    pub fn counts(&self) -> (usize, usize) {
        let leases = self.lock();
        (leases.grants.len(), leases.sessions.len())
    }
}

/// Restarts session `session_id`'s lease at `now` if it is alive (present, not expiring, its
/// deadline not passed) and returns its TTL; a lapsed lease is never revived (D-lease).
fn restart_session(leases: &mut Leases, session_id: &str, now: Instant) -> Option<u64> {
    let lease = leases.sessions.get_mut(session_id)?;
    if lease.expiring || now > lease.deadline {
        return None;
    }
    lease.deadline = now + Duration::from_millis(lease.ttl_ms);
    Some(lease.ttl_ms)
}

fn lease_of(grant: &Grant, now: Instant) -> GrantLease {
    GrantLease {
        token: grant.token,
        owner_id: grant.owner_id.clone(),
        session_id: grant.session_id.clone(),
        ttl_ms: grant.ttl_ms,
        deadline: now + Duration::from_millis(grant.ttl_ms),
        expiring: false,
    }
}

/// Feeds applied events to the lease keeper and the waiter registry.
#[derive(Debug)]
pub struct Observer {
    /// The lease keeper.
    pub keeper: Arc<LeaseKeeper>,
    /// The waiting acquires.
    pub waiters: Arc<WaiterRegistry>,
}

impl ApplyObserver for Observer {
    fn applied(&self, _log_index: u64, events: &[Event]) {
        if events.is_empty() {
            return;
        }
        self.keeper.on_events(events);
        self.waiters.on_events(events);
    }
}

/// Watches leadership. When this node becomes leader and its term's blank entry has applied,
/// proposes `Promote`; once that applies, reconciles the keeper with the replicated state and
/// marks the term promoted, which lets the reaper and leader-local renewals run. Returns when
/// Raft shuts down.
pub async fn run_promoter(
    raft: Raft,
    proposer: Proposer,
    keeper: Arc<LeaseKeeper>,
    reader: StateReader,
) {
    // Leadership comes from the server metrics, which change only with the vote, the state,
    // the leader or the membership; the applied log id from the data metrics, which change with
    // every entry and are watched only while a promote waits for its term's blank entry. The
    // full `metrics()` channel changes with both and would wake this task several times per
    // entry for nothing once the term is promoted.
    let mut server = raft.server_metrics();
    let mut data = raft.data_metrics();
    // A leader without a quorum fails its promote on every retry: one line, then one a minute.
    let mut failing = LogLimit::default();
    loop {
        let (state, term) = {
            let m = server.borrow_and_update();
            (m.state, m.vote.leader_id.term)
        };
        let applied_term = data
            .borrow_and_update()
            .last_applied
            .map(|id| id.leader_id.term);
        if state == ServerState::Shutdown {
            keeper.clear_promoted();
            return;
        }
        if state != ServerState::Leader {
            keeper.clear_promoted();
        } else if keeper.promoted_term() != Some(term) && applied_term == Some(term) {
            // The blank entry of this term has applied: every entry of earlier terms is in the
            // state machine, so the promote restarts every lease that exists. First make sure
            // our stamps do not go below the predecessor's (D-time).
            proposer.raise_stamp_floor(reader.read(|table| table.last_stamp_ms()));
            match proposer.propose(Command::Promote).await {
                Ok(Response::Promoted { grants, sessions }) => {
                    if let Some(ended) = failing.succeeded(keeper.clock.now()) {
                        tracing::info!(
                            failing_ms = ended.lasted.as_millis() as u64,
                            failed_attempts = ended.total,
                            "promote applied after failing"
                        );
                    }
                    let (grant_list, session_list) = reader.read(|table| {
                        (
                            table.grants().cloned().collect::<Vec<_>>(),
                            table
                                .sessions()
                                .map(|(id, s)| (id.to_owned(), s.ttl_ms))
                                .collect::<Vec<_>>(),
                        )
                    });
                    keeper.reconcile(&grant_list, &session_list);
                    let still = server.borrow_watched().vote.leader_id.term == term;
                    if still {
                        keeper.set_promoted(term);
                        tracing::info!(term, grants, sessions, "promoted: leases restarted");
                    }
                    continue;
                }
                Ok(other) => {
                    let error = format!("promote answered unexpectedly: {other:?}");
                    note_promote_failure(&mut failing, keeper.clock.now(), &error, true);
                }
                Err(err) => {
                    let error = format!("promote not applied: {err}");
                    note_promote_failure(&mut failing, keeper.clock.now(), &error, false);
                }
            }
        }
        let waiting_for_blank =
            state == ServerState::Leader && keeper.promoted_term() != Some(term);
        // `false` once Raft has dropped its metrics: it has stopped, and so does this task.
        let changed = async {
            if waiting_for_blank {
                tokio::select! {
                    r = server.changed() => r.is_ok(),
                    r = data.changed() => r.is_ok(),
                }
            } else {
                server.changed().await.is_ok()
            }
        };
        if let Ok(false) = tokio::time::timeout(PROMOTE_RETRY, changed).await {
            keeper.clear_promoted();
            return;
        }
    }
}

/// Logs a failed promote as `failing` says: the first of a run, then a summary a minute. The
/// first line is a WARN if the answer was `unexpected` (a bug), else INFO: a promote that
/// loses a race with an election is routine.
fn note_promote_failure(failing: &mut LogLimit, now: Instant, error: &str, unexpected: bool) {
    match failing.failed(now, &error) {
        None => {}
        Some(Note::Began) if unexpected => {
            tracing::warn!(error, "promote failed; retrying while leader")
        }
        Some(Note::Began) => tracing::info!(error, "promote failed; retrying while leader"),
        Some(Note::Summary(s)) => tracing::info!(
            failing_s = s.lasted.as_secs(),
            failed_attempts = s.count,
            last_error = %s.last_error,
            "promote still failing; retrying while leader"
        ),
    }
}

/// Every [`REAP_TICK`] while this node is the promoted leader, proposes the expiry of up to
/// [`REAP_PER_TICK_MAX`] lapsed leases. Returns when Raft shuts down.
pub async fn run_reaper(raft: Raft, proposer: Proposer, keeper: Arc<LeaseKeeper>) {
    let mut tick = tokio::time::interval(REAP_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let (state, term) = {
            let m = raft.metrics();
            let m = m.borrow_watched();
            (m.state, m.current_term)
        };
        if state == ServerState::Shutdown {
            return;
        }
        if state != ServerState::Leader || keeper.promoted_term() != Some(term) {
            continue;
        }
        reap_once(&proposer, &keeper, REAP_PER_TICK_MAX).await;
    }
}

/// Proposes the expiry of up to `max` lapsed leases and waits for the answers; returns how many
/// grants and sessions the state machine expired.
pub async fn reap_once(proposer: &Proposer, keeper: &LeaseKeeper, max: usize) -> usize {
    let lapsed = keeper.take_lapsed(max);
    if lapsed.grants.is_empty() && lapsed.sessions.is_empty() {
        return 0;
    }
    let grant_expiries = lapsed.grants.into_iter().map(|(key, token)| async move {
        let answer = proposer
            .propose(Command::ExpireLock {
                key: key.clone(),
                token,
            })
            .await;
        match answer {
            Ok(Response::LockExpired { expired }) => {
                // Not expired: the grant was already gone (released, revoked, a newer token).
                keeper.forget_grant(&key, token);
                usize::from(expired)
            }
            Ok(other) => {
                tracing::warn!(key, token, ?other, "expiry answered unexpectedly");
                keeper.expiry_failed(&key, token);
                0
            }
            Err(err) => {
                tracing::debug!(key, token, %err, "expiry not applied; will retry");
                keeper.expiry_failed(&key, token);
                0
            }
        }
    });
    let session_expiries = lapsed.sessions.into_iter().map(|id| async move {
        match proposer
            .propose(Command::ExpireSession {
                session_id: id.clone(),
            })
            .await
        {
            Ok(Response::SessionClosed { .. }) => 1,
            Ok(other) => {
                tracing::warn!(
                    session_id = id,
                    ?other,
                    "session expiry answered unexpectedly"
                );
                keeper.session_expiry_failed(&id);
                0
            }
            Err(err) => {
                tracing::debug!(session_id = id, %err, "session expiry not applied; will retry");
                keeper.session_expiry_failed(&id);
                0
            }
        }
    });
    let (grants, sessions) = futures::future::join(
        futures::future::join_all(grant_expiries),
        futures::future::join_all(session_expiries),
    )
    .await;
    grants.into_iter().sum::<usize>() + sessions.into_iter().sum::<usize>()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use lock_raft_store::FreeCause;

    fn grant(key: &str, token: u64, ttl_ms: u64) -> Grant {
        Grant {
            key: key.into(),
            owner_id: "o".into(),
            session_id: "s".into(),
            request_id: 1,
            token,
            ttl_ms,
            acquired_at_ms: 0,
            expires_at_ms: ttl_ms,
        }
    }

    fn keeper() -> (Arc<ManualClock>, LeaseKeeper) {
        let clock = Arc::new(ManualClock::new(0));
        let keeper = LeaseKeeper::new(clock.clone(), Duration::from_millis(100));
        keeper.on_events(&[Event::Granted {
            grant: grant("k", 7, 1_000),
            handed_off: false,
        }]);
        (clock, keeper)
    }

    #[test]
    fn renew_before_the_deadline_extends_it() {
        let (clock, keeper) = keeper();
        clock.advance(Duration::from_millis(900));
        let RenewCheck::Extended {
            lease,
            previous_ttl_ms,
        } = keeper.renew_grant("k", 7, 1_000)
        else {
            panic!("expected a renewal");
        };
        assert_eq!(previous_ttl_ms, 1_000);
        assert_eq!(lease.deadline, clock.now() + Duration::from_millis(1_000));
        clock.advance(Duration::from_millis(1_000));
        assert!(matches!(
            keeper.renew_grant("k", 7, 1_000),
            RenewCheck::Extended { .. }
        ));
    }

    #[test]
    fn renew_after_the_deadline_is_lost_and_never_revives() {
        let (clock, keeper) = keeper();
        clock.advance(Duration::from_millis(1_001));
        assert_eq!(keeper.renew_grant("k", 7, 1_000), RenewCheck::Lost);
        // Still lost later, even before the reaper has expired it.
        assert_eq!(keeper.renew_grant("k", 7, 5_000), RenewCheck::Lost);
    }

    #[test]
    fn renew_of_another_token_or_key_is_lost() {
        let (_clock, keeper) = keeper();
        assert_eq!(keeper.renew_grant("k", 6, 1_000), RenewCheck::Lost);
        assert_eq!(keeper.renew_grant("other", 7, 1_000), RenewCheck::Lost);
    }

    #[test]
    fn an_expiring_lease_cannot_be_renewed() {
        let (clock, keeper) = keeper();
        clock.advance(Duration::from_millis(1_101));
        let lapsed = keeper.take_lapsed(REAP_PER_TICK_MAX);
        assert_eq!(lapsed.grants, vec![("k".to_owned(), 7)]);
        assert_eq!(keeper.renew_grant("k", 7, 1_000), RenewCheck::Lost);
        // Taken once: the next tick does not propose it again.
        assert!(keeper.take_lapsed(REAP_PER_TICK_MAX).grants.is_empty());
        // A failed expiry lets the reaper retry, but the renewal still loses.
        keeper.expiry_failed("k", 7);
        assert_eq!(keeper.renew_grant("k", 7, 1_000), RenewCheck::Lost);
        assert_eq!(keeper.take_lapsed(REAP_PER_TICK_MAX).grants.len(), 1);
    }

    #[test]
    fn the_reaper_waits_for_the_safety_margin_and_is_bounded_per_tick() {
        let clock = Arc::new(ManualClock::new(0));
        let keeper = LeaseKeeper::new(clock.clone(), Duration::from_millis(100));
        let events: Vec<Event> = (1..=600)
            .map(|t| Event::Granted {
                grant: grant(&format!("k{t}"), t, 1_000),
                handed_off: false,
            })
            .collect();
        keeper.on_events(&events);
        clock.advance(Duration::from_millis(1_050));
        assert!(
            keeper.take_lapsed(REAP_PER_TICK_MAX).grants.is_empty(),
            "inside the margin"
        );
        clock.advance(Duration::from_millis(100));
        assert_eq!(
            keeper.take_lapsed(REAP_PER_TICK_MAX).grants.len(),
            REAP_PER_TICK_MAX
        );
        assert_eq!(
            keeper.take_lapsed(REAP_PER_TICK_MAX).grants.len(),
            REAP_PER_TICK_MAX
        );
        assert_eq!(
            keeper.take_lapsed(REAP_PER_TICK_MAX).grants.len(),
            600 - 2 * REAP_PER_TICK_MAX
        );
    }

    #[test]
    fn promote_restarts_every_lease_and_freed_drops_only_its_token() {
        let (clock, keeper) = keeper();
        keeper.on_events(&[Event::SessionOpened {
            session_id: "s".into(),
            ttl_ms: 2_000,
        }]);
        clock.advance(Duration::from_millis(5_000));
        keeper.on_events(&[Event::Promoted { stamp_ms: 5_000 }]);
        assert!(matches!(
            keeper.renew_grant("k", 7, 1_000),
            RenewCheck::Extended { .. }
        ));
        assert_eq!(keeper.heartbeat_session("s"), Some(2_000));
        keeper.on_events(&[Event::Freed {
            key: "k".into(),
            token: 6,
            cause: FreeCause::Released,
        }]);
        assert!(
            keeper.grant_lease("k").is_some(),
            "another token's free keeps it"
        );
        keeper.on_events(&[Event::Freed {
            key: "k".into(),
            token: 7,
            cause: FreeCause::Released,
        }]);
        assert!(keeper.grant_lease("k").is_none());
    }

    #[test]
    fn a_lapsed_session_heartbeat_is_terminal() {
        let clock = Arc::new(ManualClock::new(0));
        let keeper = LeaseKeeper::new(clock.clone(), Duration::ZERO);
        keeper.on_events(&[Event::SessionOpened {
            session_id: "s".into(),
            ttl_ms: 1_000,
        }]);
        clock.advance(Duration::from_millis(999));
        assert_eq!(keeper.heartbeat_session("s"), Some(1_000));
        clock.advance(Duration::from_millis(1_001));
        assert_eq!(keeper.heartbeat_session("s"), None);
        assert_eq!(keeper.heartbeat_session("unknown"), None);
    }

    #[test]
    fn a_batch_heartbeat_answers_each_session_as_one_heartbeat_would() {
        let clock = Arc::new(ManualClock::new(0));
        let keeper = LeaseKeeper::new(clock.clone(), Duration::ZERO);
        keeper.on_events(&[
            Event::SessionOpened {
                session_id: "live".into(),
                ttl_ms: 1_000,
            },
            Event::SessionOpened {
                session_id: "lapsed".into(),
                ttl_ms: 500,
            },
            Event::SessionOpened {
                session_id: "expiring".into(),
                ttl_ms: 5_000,
            },
        ]);
        clock.advance(Duration::from_millis(600));
        keeper
            .lock()
            .sessions
            .get_mut("expiring")
            .expect("opened")
            .expiring = true;
        assert_eq!(
            keeper.heartbeat_sessions(["live", "unknown", "lapsed", "expiring", "live"]),
            vec![Some(1_000), None, None, None, Some(1_000)]
        );
        // The live session's lease restarted at the batch's instant: alive 999 ms later, and a
        // lapsed one stays lapsed.
        clock.advance(Duration::from_millis(999));
        assert_eq!(keeper.heartbeat_session("live"), Some(1_000));
        assert_eq!(keeper.heartbeat_sessions(["lapsed"]), vec![None]);
        assert!(keeper.heartbeat_sessions([]).is_empty());
    }

    #[test]
    fn reconcile_adds_missing_and_drops_stale_leases() {
        let (clock, keeper) = keeper();
        clock.advance(Duration::from_millis(500));
        keeper.reconcile(&[grant("other", 9, 3_000)], &[("s2".into(), 1_000)]);
        assert!(keeper.grant_lease("k").is_none(), "no longer in the state");
        let lease = keeper.grant_lease("other").expect("added from the state");
        assert_eq!(lease.deadline, clock.now() + Duration::from_millis(3_000));
        assert_eq!(keeper.heartbeat_session("s2"), Some(1_000));
        assert_eq!(keeper.counts(), (1, 1));
    }
}
