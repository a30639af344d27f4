//! The pure lock table: every grant, waiter queue, session, the fencing-token counter and the
//! revocation audit log, and `apply`, the one function that changes them.
//!
//! Pure lock table. Owns grants, sessions, waiters. Never does IO, reads no clock, draws no
//! random number: `apply` is a function of (state, command, the command's stamp), so every
//! replica that applies the same log holds the same table (docs/DESIGN.md D-time). Side effects
//! that others must learn about (a lease to track, a waiting RPC to answer) are appended to an
//! `Event` list in apply order; acting on them is the caller's business.
//!
//! All collections are ordered (`BTreeMap`, `BTreeSet`, `VecDeque`) so iteration, and thus every
//! answer and event list, is deterministic; the whole table is serde-serializable for snapshots.
//!
//! # Rules this module decides (beyond `command.rs`)
//!
//! - **Grants never expire by time here.** A grant's `expires_at_ms` is informational; only
//!   `ExpireLock`, `ExpireSession`, `Release`, `ForceRevoke`, `CloseSession` and
//!   `CancelWait { release_if_granted }` free a key (D-lease: leases are leader-local).
//! - **Waiter deadlines are replicated state and are compared with the stamp.** Before any
//!   command acts, every waiter whose deadline is before the stamp is dropped
//!   (`Event::WaiterDropped`, its acquire's remembered answer becomes `NotGranted`). That is
//!   time passing, not the command acting, so it happens even if the command is then rejected.
//!   Doing it up front, in deadline order, means a lapsed waiter never blocks its session from
//!   waiting again, never fills a queue, and is never handed a key.
//! - **Hand-off in the same apply.** Whatever frees a key grants it to the first waiter of the
//!   key's FIFO queue, with the waiter's TTL and request id.
//! - **Not re-entrant.** An `Acquire` of a key the session already holds answers `NotGranted`,
//!   even with a wait: waiting on oneself would only end when one's own lease does.
//! - **A session belongs to the principal that opened it** (`binding`): a command a caller
//!   made (`Command::AsCaller`) presenting another principal's session, or a grant of one, is
//!   refused before it is even looked up in the session's window of answers.
//! - **Rejections are not remembered.** A `Rejected` answer changed nothing, so a retry with the
//!   same request id is simply tried again.

mod apply_limits;
mod binding;
mod chunked;
mod commands;
mod decoded;
mod held;
mod holder_pool;
mod invariants;
mod session;
mod session_map;
mod shared;

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::command::{Command, Event, Response, Revocation};

use chunked::{ChunkedMap, Cursor, Entry};
use held::Holder;
use session_map::SessionMap;
use shared::Shared;

pub use apply_limits::{ApplyLimits, InvalidLimits};
pub use held::HeldGrant;
pub(crate) use holder_pool::sharing_holders;
pub use invariants::InvariantViolation;
pub use session::{LockSet, Session};

/// One queued `Acquire`, waiting for its key to be freed (D-wait).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Waiter {
    /// Waiting session.
    pub session_id: String,
    /// The `Acquire`'s request id; the hand-off grant carries it.
    pub request_id: u64,
    /// Lease length the grant will get.
    pub ttl_ms: u64,
    /// Stamp after which the waiter is dropped instead of granted (`stamp + wait_ms` of the
    /// acquire). A waiter whose deadline equals the stamp is still live.
    pub deadline_ms: u64,
    /// Stamp of the acquire that queued it.
    pub queued_at_ms: u64,
}

/// A grant is filed under its own key: the grant map stores no second copy of it.
impl Entry for HeldGrant {
    type Value = HeldGrant;
    fn key(&self) -> &str {
        HeldGrant::key(self)
    }
    fn value(&self) -> &HeldGrant {
        self
    }
    fn value_mut(&mut self) -> &mut HeldGrant {
        self
    }
    fn from_parts(key: &str, grant: HeldGrant) -> Result<Self, String> {
        if grant.key() != key {
            return Err(format!(
                "the grant of key {:?} is filed under key {key:?}",
                grant.key()
            ));
        }
        Ok(grant)
    }
}

/// The replicated lock state. See the module docs for the rules it applies.
///
/// Cloning it is cheap (`O(chunks + sessions)`, about one `Arc` per 200 grants and two per
/// session): every part is shared with the clone and copied, a chunk or a session at a time,
/// only when one side changes it. The snapshot builder relies on that to encode a clone
/// without holding the state lock. The encoding is the one every earlier release wrote (maps
/// of `(key, value)` in key order).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockTable {
    /// The one grant of each held key.
    grants: ChunkedMap<HeldGrant>,
    /// Waiters per key, oldest first. A key appears only while its queue is non-empty, and a
    /// queue exists only on a held key (a free key is granted at once).
    queues: Shared<BTreeMap<String, VecDeque<Waiter>>>,
    /// Every waiter as `(deadline_ms, session_id, key)`, so lapsed waiters are found in
    /// `O(lapsed · log n)` at the start of each command instead of by scanning every queue.
    /// A session waits at most once per key, so the triple is unique.
    wait_deadlines: Shared<BTreeSet<(u64, String, String)>>,
    /// Live sessions by id (a hash index beside the id order).
    sessions: SessionMap,
    /// The force-revoke audit log, oldest first, at most `limits.audit_log_max`.
    revocations: Shared<VecDeque<Revocation>>,
    /// Highest token ever issued or burned. The next grant takes `last_token + 1`.
    last_token: u64,
    /// Highest stamp applied so far. A new leader stamps its commands no lower than this, so
    /// stamps never go backwards across a leader change even when the new leader's wall clock
    /// is behind (D-time).
    last_stamp_ms: u64,
    /// The bounds `apply` enforces: replicated state, never the binary's constants, so every
    /// binary replaying the same log answers alike (issue 18; `apply_limits`). Not part of the
    /// table's own encoding, which stays the one every earlier snapshot used: the snapshot data
    /// carries the limits beside the table (`storage::snapshot`), and a table decoded without
    /// them holds [`ApplyLimits::V1`].
    #[serde(skip)]
    limits: ApplyLimits,
}

impl LockTable {
    /// An empty table: no grants, no sessions, no token issued yet (the first grant gets 1).
    ///
    /// Its limits are [`ApplyLimits::V1`], not whatever this binary's constants say: a new
    /// replica replaying a cluster's log from the start must apply it under the limits the
    /// cluster's first replica did.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty table that applies under `limits` (refused if they are inconsistent).
    pub fn with_limits(limits: ApplyLimits) -> Result<Self, InvalidLimits> {
        limits.check()?;
        Ok(LockTable {
            limits,
            ..Self::default()
        })
    }

    /// The bounds this table's `apply` enforces.
    pub fn limits(&self) -> &ApplyLimits {
        &self.limits
    }

    /// Replaces the limits of a table decoded from a snapshot with the ones recorded beside it.
    pub(crate) fn set_limits(&mut self, limits: ApplyLimits) -> Result<(), InvalidLimits> {
        limits.check()?;
        self.limits = limits;
        Ok(())
    }

    /// Applies one command stamped `stamp_ms` and returns its answer.
    ///
    /// Pure: no IO, no clock, no randomness. Appends the side-effect events to `events` in the
    /// order they happened. A `Rejected` answer means the command changed nothing (lapsed
    /// waiters may still have been dropped, see the module docs). In debug builds the table's
    /// invariants are checked after every apply (`O(state)` each time) and a violation panics
    /// naming the command; release builds skip the check.
    pub fn apply(&mut self, stamp_ms: u64, command: Command, events: &mut Vec<Event>) -> Response {
        #[cfg(debug_assertions)]
        let what = commands::describe(&command);
        self.last_stamp_ms = self.last_stamp_ms.max(stamp_ms);
        let response = match command {
            Command::Batch(commands) => self.apply_batch(stamp_ms, commands, events),
            command => self.apply_one(stamp_ms, command, events),
        };
        #[cfg(debug_assertions)]
        {
            let checked = self.check_invariants();
            debug_assert!(
                checked.is_ok(),
                "lock table invariant broken after applying {what} at stamp {stamp_ms}: {}",
                checked.err().map(|e| e.to_string()).unwrap_or_default()
            );
        }
        response
    }

    /// The principal of every session bound to one, by session id (for the snapshot, which
    /// carries them beside the table's own encoding).
    pub(crate) fn principals(&self) -> BTreeMap<String, String> {
        self.sessions
            .iter()
            .filter_map(|(h, s)| Some((h.session_id.clone(), s.principal.clone()?)))
            .collect()
    }

    /// Binds the sessions of a table decoded from a snapshot to the principals recorded
    /// beside it; a principal of a session the table does not hold is corruption.
    pub(crate) fn set_principals(
        &mut self,
        principals: BTreeMap<String, String>,
    ) -> Result<(), String> {
        for (session_id, principal) in principals {
            let Some(session) = self.sessions.get_mut(&session_id) else {
                return Err(format!(
                    "principal {principal:?} recorded for session {session_id:?}, which the table \
                     does not hold"
                ));
            };
            session.principal = Some(principal);
        }
        Ok(())
    }

    /// The highest stamp applied so far (0 before the first command): the floor for the next
    /// leader's stamps.
    pub fn last_stamp_ms(&self) -> u64 {
        self.last_stamp_ms
    }

    /// The grant on `key`, if it is held.
    pub fn grant(&self, key: &str) -> Option<&HeldGrant> {
        self.grants.get(key)
    }

    /// Every grant, in key order.
    pub fn grants(&self) -> impl Iterator<Item = &HeldGrant> {
        self.grants.values()
    }

    /// The grants whose keys are above `after` (every grant for `None`), in key order: a walk
    /// in steps resumes at the cost of one search.
    pub fn grants_after(&self, after: Option<&str>) -> impl Iterator<Item = &HeldGrant> {
        self.grants.values_after(after)
    }

    /// Points every grant at its session's one [`Holder`] and every session's lock set at its
    /// grants' keys, as a table that applied the log holds them: decoded, each has copies of
    /// its own, as the encoding repeats the ids per grant and the keys per session.
    /// Changes no value, only how many copies of the ids are kept; a grant of a session the
    /// table does not hold (corruption, which the invariant check names) keeps its own.
    ///
    /// A decode shares the holders as it goes (`holder_pool`): each grant then finds its
    /// session by its holder's address, and its key at the next place of that session's lock
    /// set (both are in key order), with no search by id or key. The grants whose holder is
    /// not their session's, if any, are then matched by id.
    pub(crate) fn share_holders(&mut self) {
        let grants = &self.grants;
        let mut sets: Vec<(&mut LockSet, Cursor)> = Vec::with_capacity(self.sessions.len());
        let mut by_holder = HashMap::with_capacity(self.sessions.len());
        for (holder, session) in self.sessions.sessions_mut_any_order() {
            by_holder.insert(Arc::as_ptr(holder), sets.len());
            sets.push((&mut session.locks, Cursor::default()));
        }
        let mut unshared = false;
        for grant in grants.values() {
            match by_holder.get(&Arc::as_ptr(grant.holder())) {
                Some(&i) => {
                    let (locks, next) = &mut sets[i];
                    locks.share_key(grant.key_arc(), next);
                }
                None => unshared = true,
            }
        }
        if !unshared {
            return;
        }
        for (_, session) in self.sessions.sessions_mut_any_order() {
            session
                .locks
                .share_keys(|key| grants.get(key).map(HeldGrant::key_arc));
        }
        let sessions = &self.sessions;
        let mut last: Option<&Arc<Holder>> = None;
        for grant in self.grants.values_mut() {
            let holder = match last {
                Some(h) if h.session_id == grant.session_id() => h,
                _ => match sessions.entry(grant.session_id()) {
                    Some((holder, _)) => holder,
                    None => continue,
                },
            };
            grant.share_holder(holder);
            last = Some(holder);
        }
    }

    /// The shared holder of session `session_id`, for a new grant of it.
    fn holder_of(&self, session_id: &str) -> Option<&Arc<Holder>> {
        self.sessions.entry(session_id).map(|(holder, _)| holder)
    }

    /// Number of grants (keys held).
    pub fn grant_count(&self) -> usize {
        self.grants.len()
    }

    /// Number of waiters queued on every key together. One step per key with a queue, so
    /// cheap enough for a metrics scrape, not for the apply path.
    pub fn waiter_total(&self) -> usize {
        self.queues.values().map(|q| q.len()).sum()
    }

    /// Number of waiters queued on `key` (C2 `LockInfo::waiter_count`).
    pub fn waiter_count(&self, key: &str) -> u32 {
        self.queues.get(key).map_or(0, |q| q.len() as u32)
    }

    /// The waiters queued on `key`, next to be granted first.
    pub fn waiters(&self, key: &str) -> impl Iterator<Item = &Waiter> {
        self.queues.get(key).into_iter().flatten()
    }

    /// The live session `session_id`, if any.
    pub fn session(&self, session_id: &str) -> Option<&Session> {
        self.sessions.get(session_id)
    }

    /// Every live session, in id order.
    pub fn sessions(&self) -> impl Iterator<Item = (&str, &Session)> {
        self.sessions_after(None)
    }

    /// The live sessions whose ids are above `after` (every one for `None`), in id order: a
    /// walk in steps resumes at the cost of one search.
    pub fn sessions_after(&self, after: Option<&str>) -> impl Iterator<Item = (&str, &Session)> {
        self.sessions
            .iter_after(after)
            .map(|(holder, session)| (holder.session_id.as_str(), session))
    }

    /// Number of live sessions.
    pub fn session_count(&self) -> usize {
        self.sessions.len()
    }

    /// Keys the session holds (C2 `SessionRegistry::locksOf`); empty for an unknown session.
    pub fn locks_of(&self, session_id: &str) -> BTreeSet<String> {
        self.sessions
            .get(session_id)
            .map(|s| s.locks.iter().map(str::to_owned).collect())
            .unwrap_or_default()
    }

    /// The force-revoke audit log, oldest first; at most the limits' `audit_log_max` records
    /// (older ones are evicted).
    pub fn revocations(&self) -> impl Iterator<Item = &Revocation> {
        self.revocations.iter()
    }

    /// The token floor: the highest token ever issued or burned by a revoke. Every later grant
    /// gets a greater token; 0 before the first grant.
    pub fn last_token(&self) -> u64 {
        self.last_token
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table with `sessions` open, each of owner `owner-<id>`.
    fn with_sessions(sessions: &[&str], events: &mut Vec<Event>) -> LockTable {
        let mut t = LockTable::new();
        for s in sessions {
            t.apply(
                1000,
                Command::OpenSession {
                    session_id: (*s).into(),
                    owner_id: format!("owner-{s}"),
                    ttl_ms: 10_000,
                },
                events,
            );
        }
        t
    }

    /// A `Granted` event carries the table's own key: one allocation shared by the grant, the
    /// session's lock set and the event (so the lease keeper that keeps it adds no copy), for a
    /// direct grant and for a hand-off alike.
    #[test]
    fn a_granted_event_shares_the_tables_key() {
        let mut events = Vec::new();
        let mut t = with_sessions(&["s1", "s2"], &mut events);
        let acquire = |session: &str, wait_ms| Command::Acquire {
            session_id: session.into(),
            request_id: 1,
            key: "shared/key".into(),
            ttl_ms: 5000,
            wait_ms,
        };
        t.apply(1000, acquire("s1", 0), &mut events);
        t.apply(1000, acquire("s2", 60_000), &mut events);
        t.apply(
            1000,
            Command::Release {
                session_id: "s1".into(),
                request_id: 2,
                key: "shared/key".into(),
                token: 1,
            },
            &mut events,
        );
        let shared: Vec<&Arc<str>> = events
            .iter()
            .filter_map(|e| match e {
                Event::Granted {
                    grant, shared_key, ..
                } => {
                    assert_eq!(&**shared_key, grant.key);
                    Some(shared_key)
                }
                _ => None,
            })
            .collect();
        assert_eq!(shared.len(), 2, "a grant and a hand-off: {events:?}");
        // The hand-off's key: held by the table's grant, s2's lock set and the event.
        assert!(
            Arc::strong_count(shared[1]) >= 3,
            "{}",
            Arc::strong_count(shared[1])
        );
        let held = t.grants.get("shared/key").expect("held by s2");
        assert!(
            Arc::ptr_eq(shared[1], held.key_arc()),
            "the same allocation"
        );
    }

    /// The storage snapshots the table with postcard; a round trip must give the same table.
    #[test]
    fn the_table_round_trips_through_postcard() {
        let mut t = LockTable::new();
        let mut events = Vec::new();
        let commands = [
            Command::OpenSession {
                session_id: "s1".into(),
                owner_id: "o1".into(),
                ttl_ms: 10_000,
            },
            Command::OpenSession {
                session_id: "s2".into(),
                owner_id: "o2".into(),
                ttl_ms: 10_000,
            },
            Command::Acquire {
                session_id: "s1".into(),
                request_id: 1,
                key: "a".into(),
                ttl_ms: 5000,
                wait_ms: 0,
            },
            Command::Acquire {
                session_id: "s2".into(),
                request_id: 1,
                key: "a".into(),
                ttl_ms: 5000,
                wait_ms: 60_000,
            },
            Command::ForceRevoke {
                key: "b".into(),
                operator: "op".into(),
                reason: "drill".into(),
                request_id: 0,
            },
        ];
        for c in commands {
            t.apply(1000, c, &mut events);
        }
        let bytes = postcard::to_allocvec(&t).expect("serializes");
        let back: LockTable = postcard::from_bytes(&bytes).expect("deserializes");
        assert_eq!(back, t);
        assert_eq!(back.waiter_count("a"), 1);
        assert_eq!(back.last_token(), 2);
    }

    /// Every grant of a session points at the session's one holder, and the session's lock set
    /// at the grant's key: after the applies that made them, after a decode once
    /// `share_holders` ran, as every install runs it, and after a decode in the holder pool.
    #[test]
    fn grants_share_their_sessions_holder() {
        let mut events = Vec::new();
        let mut t = with_sessions(&["s1", "s2"], &mut events);
        for s in ["s1", "s2"] {
            for (n, key) in ["a", "b", "c"].into_iter().enumerate() {
                t.apply(
                    1001,
                    Command::Acquire {
                        session_id: s.into(),
                        request_id: n as u64 + 1,
                        key: format!("{s}/{key}"),
                        ttl_ms: 5000,
                        wait_ms: 0,
                    },
                    &mut events,
                );
            }
        }
        let shared = |t: &LockTable| {
            t.grants.entries().all(|g| {
                let (holder, _) = t.sessions.entry(g.session_id()).expect("live session");
                Arc::ptr_eq(g.holder(), holder)
            })
        };
        let keys_shared = |t: &LockTable| {
            t.sessions.iter().all(|(_, s)| {
                s.locks.arcs().all(|key| {
                    let grant = t.grants.get(key).expect("held");
                    Arc::ptr_eq(key, grant.key_arc())
                })
            })
        };
        assert_eq!(t.grant_count(), 6);
        assert!(shared(&t) && keys_shared(&t));
        let bytes = postcard::to_allocvec(&t).expect("serializes");
        let mut back: LockTable = postcard::from_bytes(&bytes).expect("deserializes");
        assert!(!shared(&back), "a decoded grant holds ids of its own");
        assert!(
            !keys_shared(&back),
            "a decoded lock set holds keys of its own"
        );
        back.share_holders();
        assert!(shared(&back) && keys_shared(&back));
        assert_eq!(back, t);
        assert_eq!(back.grant("s2/b").map(|g| g.owner_id()), Some("owner-s2"));
        // Decoded with the holder pool, as a snapshot install decodes, the grants share their
        // session's holder from the start: no holder per grant ever existed.
        let mut pooled: LockTable =
            sharing_holders(|| postcard::from_bytes(&bytes)).expect("deserializes");
        assert!(shared(&pooled), "a pooled decode shares the holders");
        // Then each grant finds its session by its holder and its key by position.
        pooled.share_holders();
        assert!(shared(&pooled) && keys_shared(&pooled));
        assert_eq!(pooled, t);
        pooled
            .check_invariants()
            .expect("the decoded table is valid");
    }

    /// Debug builds check the invariants after every apply and name the command that broke
    /// them.
    #[test]
    #[cfg(debug_assertions)]
    fn a_broken_invariant_panics_naming_the_command() {
        let mut t = LockTable::new();
        let mut events = Vec::new();
        t.apply(
            1,
            Command::OpenSession {
                session_id: "s1".into(),
                owner_id: "o1".into(),
                ttl_ms: 10_000,
            },
            &mut events,
        );
        // A grant of a session that does not exist: corrupt on purpose.
        t.last_token = 1;
        t.grants.insert(HeldGrant::from(crate::command::Grant {
            key: "z".into(),
            owner_id: "o1".into(),
            session_id: "ghost".into(),
            request_id: 1,
            token: 1,
            ttl_ms: 1000,
            acquired_at_ms: 1,
            expires_at_ms: 1001,
        }));
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            t.apply(2, Command::Promote, &mut events);
        }));
        let message = caught
            .expect_err("the corrupt table is caught")
            .downcast::<String>()
            .map(|m| *m)
            .unwrap_or_default();
        assert!(
            message.contains("Promote") && message.contains("ghost"),
            "{message}"
        );
    }
}
