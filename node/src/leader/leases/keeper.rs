//! The lease keeper: the node's one [`LeaseTable`], shared between the apply path, the RPC
//! handlers that renew and heartbeat, the promoter and the reaper (docs/DESIGN.md D-lease).
//!
//! Owns the table's lock, the clock every deadline is read on, and the promoted term that says
//! whether this node's leases are authoritative. Never writes a renewal or heartbeat to the
//! log: those are answered from memory after a quorum round (see `backend::raft`). Never decides
//! a lock outcome: it only tells the reaper which leases lapsed.
//!
//! Why the deadlines are monotonic `Instant`s on the leader and not the stamps in the
//! replicated state: a wall-clock step on the leader must not expire a lease early, and the
//! client's deadline is measured on its own monotonic clock from *before* it sent the request,
//! so a leader deadline taken when the request arrives is never earlier than the client's.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use lock_api::LockError;
use lock_raft_store::Event;
use lock_raft_store::storage::StateReader;

use super::table::{GrantLease, Lapsed, LeaseTable, RenewCheck};
use crate::clock::Clock;

#[derive(Debug)]
struct State {
    table: LeaseTable,
    /// The term whose `Promote` applied on this node while it led; `None` when not leading.
    promoted_term: Option<u64>,
    /// The generation of the reconcile walk in progress (see [`LeaseKeeper::begin_reconcile`]):
    /// while it runs, a lease the keeper lacks may still be in the state, and the reaper waits.
    reconciling: Option<u32>,
}

/// The in-memory lease deadlines of one node, fed by applied events on every node and
/// authoritative only on a promoted leader.
#[derive(Debug)]
pub struct LeaseKeeper {
    clock: Arc<dyn Clock>,
    safety_margin: Duration,
    state: Mutex<State>,
}

impl LeaseKeeper {
    /// A keeper measuring time on `clock`; the reaper waits `safety_margin` past a deadline.
    pub fn new(clock: Arc<dyn Clock>, safety_margin: Duration) -> Self {
        Self {
            clock: clock.clone(),
            safety_margin,
            state: Mutex::new(State {
                table: LeaseTable::new(clock.now()),
                promoted_term: None,
                reconciling: None,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every critical section below only moves plain data; a panic inside one cannot leave
        // it half-updated in a way later calls misread, so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The keeper's monotonic clock reading, for callers that log how long something took.
    pub fn now(&self) -> Instant {
        self.clock.now()
    }

    /// Tracks what an applied batch did.
    pub fn on_events(&self, events: &[Event]) {
        let now = self.clock.now();
        let table = &mut self.lock().table;
        for event in events {
            match event {
                Event::Granted {
                    grant, shared_key, ..
                } => table.insert_grant(shared_key.clone(), grant.token, grant.ttl_ms, now),
                Event::Freed { key, token, .. } => table.remove_grant(key, *token),
                Event::SessionOpened {
                    session_id,
                    ttl_ms,
                    principal,
                } => table.insert_session(session_id, *ttl_ms, principal.as_deref(), now),
                Event::SessionEnded { session_id, .. } => table.remove_session(session_id),
                Event::Promoted { .. } => table.restart_all(now),
                Event::WaiterDropped { .. } => {}
            }
        }
    }

    /// Starts reconciling the keeper with the replicated state after a promote, and returns
    /// the walk's generation. Until [`LeaseKeeper::finish_reconcile`]: the reaper takes nothing
    /// (a lease may still carry a lease length older than the state's), and a renewal or
    /// heartbeat the keeper would refuse is first checked against the state
    /// ([`LeaseKeeper::adopt_grant`], [`LeaseKeeper::adopt_session`]).
    ///
    /// `grants` and `sessions` are the state's counts (the promote's answer): the keeper makes
    /// room for them at once, so no step of the walk grows a map (see
    /// [`LeaseTable::reserve`](super::LeaseTable::reserve)).
    pub fn begin_reconcile(&self, grants: usize, sessions: usize) -> u32 {
        let state = &mut *self.lock();
        state.table.reserve(grants, sessions);
        let seen = state.table.begin_reconcile();
        state.reconciling = Some(seen);
        seen
    }

    /// Whether a reconcile walk is in progress.
    pub fn reconciling(&self) -> bool {
        self.lock().reconciling.is_some()
    }

    /// One step of reconcile `seen`'s walk over the state's grants, each as `(key, token, lease
    /// length)`: each gets a lease restarted
    /// at the promote if the keeper lacked it, and the state's lease length if its lease was
    /// untouched since the promote. Called with the state's read lock held (lock order: state,
    /// then keeper), so no apply lands between the reading and the writing.
    pub fn reconcile_grants<'a>(
        &self,
        seen: u32,
        grants: impl IntoIterator<Item = (&'a str, u64, u64)>,
    ) {
        let state = &mut *self.lock();
        if state.reconciling != Some(seen) {
            return;
        }
        for (key, token, ttl_ms) in grants {
            state.table.reconcile_grant(key, token, ttl_ms);
        }
    }

    /// [`LeaseKeeper::reconcile_grants`] for `(session id, lease length, principal)` of the
    /// state's sessions.
    pub fn reconcile_sessions<'a>(
        &self,
        seen: u32,
        sessions: impl IntoIterator<Item = (&'a str, u64, Option<&'a str>)>,
    ) {
        let state = &mut *self.lock();
        if state.reconciling != Some(seen) {
            return;
        }
        for (id, ttl_ms, principal) in sessions {
            state.table.reconcile_session(id, ttl_ms, principal);
        }
    }

    /// Ends reconcile `seen`: leases of grants and sessions the walk did not find in the state
    /// are dropped, and the reaper runs again. One pass over the keeper's leases under its
    /// lock, without allocating.
    pub fn finish_reconcile(&self, seen: u32) {
        let state = &mut *self.lock();
        if state.reconciling == Some(seen) {
            state.table.finish_reconcile(seen);
            state.reconciling = None;
        }
    }

    /// While a reconcile walk runs: if `reader`'s state holds grant `(key, token)`, gives the
    /// keeper its lease as the walk would (restarted at the promote, with the state's lease
    /// length) and returns `true`, so a renewal the keeper refused can be tried once more.
    /// `false` at once when no walk runs. The state is read first and the keeper written
    /// under that read, as the walk does.
    pub fn adopt_grant(&self, reader: &StateReader, key: &str, token: u64) -> bool {
        if !self.reconciling() {
            return false;
        }
        reader.read(|table| {
            let Some(grant) = table.grant(key).filter(|g| g.token == token) else {
                return false;
            };
            let state = &mut *self.lock();
            if state.reconciling.is_none() {
                return false;
            }
            state.table.reconcile_grant(key, token, grant.ttl_ms);
            true
        })
    }

    /// [`LeaseKeeper::adopt_grant`] for session `session_id`.
    pub fn adopt_session(&self, reader: &StateReader, session_id: &str) -> bool {
        if !self.reconciling() {
            return false;
        }
        reader.read(|table| {
            let Some(session) = table.session(session_id) else {
                return false;
            };
            let state = &mut *self.lock();
            if state.reconciling.is_none() {
                return false;
            }
            state
                .table
                .reconcile_session(session_id, session.ttl_ms, session.principal());
            true
        })
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
        self.lock().table.renew_grant(key, token, ttl_ms, now)
    }

    /// Restarts session `session_id`'s lease for `caller` if it is alive, and returns its TTL;
    /// `Ok(None)` if the session is gone, lapsed or expiring (terminal for the client), or this
    /// keeper has no lease of it. `Err(PermissionDenied)`, and the lease untouched, when the
    /// session is bound to another principal (docs/SECURITY.md §3): the keeper holds each
    /// session's principal from the event that opened it, so checking it reads no state.
    pub fn heartbeat_session(
        &self,
        caller: Option<&str>,
        session_id: &str,
    ) -> Result<Option<u64>, LockError> {
        let now = self.clock.now();
        self.lock()
            .table
            .restart_session_as(session_id, caller, now)
    }

    /// [`LeaseKeeper::heartbeat_session`] for each of `session_ids`, in order, under one
    /// acquisition of the lease table and one clock reading (`HeartbeatBatch`). Each answer is
    /// exactly what `heartbeat_session` would have answered for that id at that instant; an id
    /// the caller already refused (`Err`: a malformed one) is answered with that refusal. The
    /// caller bounds the batch (`lock_proto::session::HEARTBEAT_BATCH_SESSIONS_MAX`), which
    /// bounds how long the table stays locked.
    pub fn heartbeat_sessions<'a>(
        &self,
        caller: Option<&str>,
        session_ids: impl IntoIterator<Item = Result<&'a str, LockError>>,
    ) -> Vec<Result<Option<u64>, LockError>> {
        let now = self.clock.now();
        let table = &mut self.lock().table;
        session_ids
            .into_iter()
            .map(|id| table.restart_session_as(id?, caller, now))
            .collect()
    }

    /// The live lease of `key`, if any (for building answers).
    pub fn grant_lease(&self, key: &str) -> Option<GrantLease> {
        self.lock().table.grant_lease(key)
    }

    /// Finds up to `max` leases lapsed for longer than the safety margin, earliest deadline
    /// first, marks them expiring (so a renewal racing the expiry loses) and returns them.
    /// O((taken + 1) · log n) under the lock, so an idle leader's tick is cheap however many
    /// leases it holds. Nothing while a reconcile walk runs (see
    /// [`LeaseKeeper::begin_reconcile`]): expiry is liveness only, and it waits for the
    /// state's lease lengths.
    pub fn take_lapsed(&self, max: usize) -> Lapsed {
        let now = self.clock.now();
        let state = &mut *self.lock();
        if state.reconciling.is_some() {
            return Lapsed::default();
        }
        state.table.take_lapsed(max, self.safety_margin, now)
    }

    /// The expiry of grant `(key, token)` was not applied (the proposal failed): let the
    /// reaper try again. The deadline has passed, so a renewal still loses.
    pub fn expiry_failed(&self, key: &str, token: u64) {
        self.lock().table.grant_expiry_failed(key, token);
    }

    /// The expiry of session `session_id` was not applied: let the reaper try again.
    pub fn session_expiry_failed(&self, session_id: &str) {
        self.lock().table.session_expiry_failed(session_id);
    }

    /// The state machine said `(key, token)` was no longer the grant: forget its lease.
    pub fn forget_grant(&self, key: &str, token: u64) {
        self.lock().table.remove_grant(key, token);
    }

    /// How many grant and session leases are tracked.
    pub fn counts(&self) -> (usize, usize) {
        self.lock().table.counts()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::leader::leases::REAP_PER_TICK_MAX;
    use crate::leader::leases::table::tests::grant;
    use lock_raft_store::FreeCause;

    fn keeper() -> (Arc<ManualClock>, LeaseKeeper) {
        let clock = Arc::new(ManualClock::new(0));
        let keeper = LeaseKeeper::new(clock.clone(), Duration::from_millis(100));
        keeper.on_events(&[Event::Granted {
            shared_key: "k".into(),
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
                shared_key: Arc::from(format!("k{t}")),
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
            principal: None,
        }]);
        clock.advance(Duration::from_millis(5_000));
        keeper.on_events(&[Event::Promoted { stamp_ms: 5_000 }]);
        assert!(matches!(
            keeper.renew_grant("k", 7, 1_000),
            RenewCheck::Extended { .. }
        ));
        assert_eq!(keeper.heartbeat_session(None, "s"), Ok(Some(2_000)));
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
            principal: None,
        }]);
        clock.advance(Duration::from_millis(999));
        assert_eq!(keeper.heartbeat_session(None, "s"), Ok(Some(1_000)));
        clock.advance(Duration::from_millis(1_001));
        assert_eq!(keeper.heartbeat_session(None, "s"), Ok(None));
        assert_eq!(keeper.heartbeat_session(None, "unknown"), Ok(None));
    }

    #[test]
    fn a_batch_heartbeat_answers_each_session_as_one_heartbeat_would() {
        let clock = Arc::new(ManualClock::new(0));
        let keeper = LeaseKeeper::new(clock.clone(), Duration::ZERO);
        keeper.on_events(&[
            Event::SessionOpened {
                session_id: "live".into(),
                ttl_ms: 1_000,
                principal: None,
            },
            Event::SessionOpened {
                session_id: "lapsed".into(),
                ttl_ms: 500,
                principal: None,
            },
            Event::SessionOpened {
                session_id: "expiring".into(),
                ttl_ms: 5_000,
                principal: None,
            },
        ]);
        clock.advance(Duration::from_millis(600));
        keeper.lock().table.mark_session_expiring("expiring");
        assert_eq!(
            keeper.heartbeat_sessions(
                None,
                ["live", "unknown", "lapsed", "expiring", "live"].map(Ok)
            ),
            vec![
                Ok(Some(1_000)),
                Ok(None),
                Ok(None),
                Ok(None),
                Ok(Some(1_000))
            ]
        );
        // The live session's lease restarted at the batch's instant: alive 999 ms later, and a
        // lapsed one stays lapsed.
        clock.advance(Duration::from_millis(999));
        assert_eq!(keeper.heartbeat_session(None, "live"), Ok(Some(1_000)));
        assert_eq!(
            keeper.heartbeat_sessions(None, ["lapsed"].map(Ok)),
            vec![Ok(None)]
        );
        assert!(keeper.heartbeat_sessions(None, []).is_empty());
    }

    #[test]
    fn reconcile_adds_missing_and_drops_stale_leases_while_the_reaper_waits() {
        let (clock, keeper) = keeper();
        clock.advance(Duration::from_millis(500));
        keeper.on_events(&[Event::Promoted { stamp_ms: 500 }]);
        let promoted = clock.now();
        let seen = keeper.begin_reconcile(0, 0);
        assert!(keeper.reconciling());
        // "k" restarted at the promote with 1 s and lapsed past the margin: the reaper still
        // waits for the walk, which may bring the state's lease length.
        clock.advance(Duration::from_millis(2_000));
        assert_eq!(keeper.take_lapsed(REAP_PER_TICK_MAX), Lapsed::default());
        keeper.reconcile_grants(seen, [("other", 9, 3_000)]);
        keeper.reconcile_sessions(seen, [("s2", 5_000, None)]);
        // A stale generation changes nothing.
        keeper.reconcile_grants(seen.wrapping_sub(1), [("ghost", 1, 3_000)]);
        keeper.finish_reconcile(seen);
        assert!(!keeper.reconciling());
        assert!(keeper.grant_lease("k").is_none(), "no longer in the state");
        assert!(keeper.grant_lease("ghost").is_none());
        let lease = keeper.grant_lease("other").expect("added from the state");
        assert_eq!(lease.deadline, promoted + Duration::from_millis(3_000));
        assert_eq!(keeper.heartbeat_session(None, "s2"), Ok(Some(5_000)));
        assert_eq!(keeper.counts(), (1, 1));
        // The reaper runs again.
        clock.advance(Duration::from_millis(1_200));
        assert_eq!(
            keeper.take_lapsed(REAP_PER_TICK_MAX).grants,
            vec![("other".to_owned(), 9)]
        );
    }

    /// Forwards what the state machine applies to a keeper, as the node's observer does.
    struct Feed(Arc<LeaseKeeper>);

    impl lock_raft_store::storage::ApplyObserver for Feed {
        fn applied(&self, _log_index: u64, events: &[Event]) {
            self.0.on_events(events);
        }
    }

    #[test]
    fn a_heartbeat_is_checked_against_the_principal_its_session_opened_with() {
        use lock_api::SESSION_OWNER_ROLE;
        use lock_raft_store::{Command, Entry, EntryPayload, LeaderId, LogId, Request};
        let (clock, keeper) = keeper();
        let keeper = Arc::new(keeper);
        let dir = tempfile::tempdir().expect("temp dir");
        let (_log, sm) =
            lock_raft_store::storage::open(dir.path(), Some(Arc::new(Feed(keeper.clone()))))
                .expect("open");
        let mut index = 0;
        let mut apply = |command: Command| {
            index += 1;
            sm.apply_entries([Entry {
                log_id: LogId::new(
                    LeaderId {
                        term: 1,
                        node_id: 1,
                    },
                    index,
                ),
                payload: EntryPayload::Normal(Request {
                    stamp_ms: 1_000 + index,
                    command,
                }),
            }]);
        };
        let open = |id: &str| Command::OpenSession {
            session_id: id.to_owned(),
            owner_id: format!("owner-{id}"),
            ttl_ms: 10_000,
        };
        let (a, b, c) = ("a".repeat(32), "b".repeat(32), "c".repeat(32));
        apply(Command::AsCaller {
            principal: "alice".to_owned(),
            command: Box::new(open(&a)),
        });
        apply(open(&b));
        let denied = |caller: &str| LockError::PermissionDenied {
            principal: caller.to_owned(),
            required_role: SESSION_OWNER_ROLE.to_owned(),
        };

        // The owner, an unchecked caller, and anyone on an unbound session are answered; a
        // session the keeper does not hold is gone for anyone.
        assert_eq!(
            keeper.heartbeat_sessions(Some("alice"), [a.as_str(), b.as_str(), c.as_str()].map(Ok)),
            vec![Ok(Some(10_000)), Ok(Some(10_000)), Ok(None)]
        );
        assert_eq!(keeper.heartbeat_session(None, &a), Ok(Some(10_000)));
        assert_eq!(
            keeper.heartbeat_session(Some("mallory"), &b),
            Ok(Some(10_000))
        );

        // Another principal is refused, entry by entry, and its beats restart nothing: alice's
        // lease lapses 10 s after her last beat however often mallory beats.
        clock.advance(Duration::from_millis(6_000));
        assert_eq!(
            keeper.heartbeat_sessions(Some("mallory"), [a.as_str(), b.as_str()].map(Ok)),
            vec![Err(denied("mallory")), Ok(Some(10_000))]
        );
        clock.advance(Duration::from_millis(4_001));
        assert_eq!(
            keeper.heartbeat_session(Some("mallory"), &a),
            Err(denied("mallory"))
        );
        assert_eq!(
            keeper.heartbeat_session(Some("alice"), &a),
            Ok(None),
            "lapsed"
        );

        // A keeper that never saw the opening (a snapshot install) takes the principal from the
        // state when the reconcile walk or an adoption brings the session.
        let fresh = LeaseKeeper::new(clock.clone(), Duration::from_millis(100));
        fresh.on_events(&[Event::Promoted { stamp_ms: 2_000 }]);
        let seen = fresh.begin_reconcile(0, 2);
        let reader = sm.reader();
        assert_eq!(
            fresh.heartbeat_session(Some("mallory"), &a),
            Ok(None),
            "not met yet"
        );
        assert!(fresh.adopt_session(&reader, &a));
        assert_eq!(
            fresh.heartbeat_session(Some("mallory"), &a),
            Err(denied("mallory"))
        );
        assert_eq!(fresh.heartbeat_session(Some("alice"), &a), Ok(Some(10_000)));
        fresh.reconcile_sessions(
            seen,
            [
                (b.as_str(), 10_000, None),
                (c.as_str(), 10_000, Some("carol")),
            ],
        );
        assert_eq!(
            fresh.heartbeat_session(Some("mallory"), &c),
            Err(denied("mallory"))
        );
        assert_eq!(fresh.heartbeat_session(Some("carol"), &c), Ok(Some(10_000)));

        // An ended session's record goes with its event: gone for anyone.
        apply(Command::CloseSession {
            session_id: b.clone(),
        });
        assert_eq!(keeper.heartbeat_session(Some("alice"), &b), Ok(None));
    }
}
