//! The lease table: every grant's and session's leader-local deadline, with a deadline index so
//! the reaper finds what lapsed without scanning what did not, and a promote that restarts
//! every lease in O(1) (docs/DESIGN.md D-lease).
//!
//! Owns the lease records, the two deadline indexes, the keys handed to the reaper, and the
//! promote instant, and keeps them in step. A pure data structure: no lock, no clock, no IO.
//! Every operation that needs the time takes `now`, so the tests drive it with made-up
//! `Instant`s. It never decides a lock outcome; it only says which leases are alive and which
//! have lapsed.
//!
//! # The lazy restart
//!
//! A promote restarts every lease in full (etcd's lessor `Promote`): no lease ends early because
//! leadership moved. Walking a million leases to do that held the table for over a second on a
//! new leader (issue 23). Instead [`LeaseTable::restart_all`] only records the promote instant
//! `P` and starts a new epoch. A record of an older epoch has not been touched since the
//! promote, and its *effective* deadline is `max(deadline, P + ttl)`; a record of the current
//! epoch has its effective deadline stored. Every read goes through the effective deadline, and
//! a record is rewritten to the current epoch ("materialised") when it is next touched: a
//! renewal, a heartbeat, the reconcile walk, or the reaper reaching it in the index.
//!
//! # The lazy heartbeat
//!
//! A session beats three times a TTL. A heartbeat only moves the session's stored deadline and
//! leaves its index entry where it was, behind it; the reaper, reaching that entry, finds the
//! session alive and moves the entry to the stored deadline. The entry then moves once a TTL
//! instead of at every beat, and a heartbeat is one hash lookup. A grant's renewal still moves
//! its entry: renewals come once per half TTL, so nothing would be saved.
//!
//! A session's record also carries the principal it is bound to, from the event that opened it
//! or the state the reconcile walk read, so that one lookup checks a heartbeat's caller
//! ([`LeaseTable::restart_session_as`]) and restarts its lease. A session's principal is fixed
//! when it opens and its id is never reused, so the record's copy is the state's answer for as
//! long as the record lives.
//!
//! # Invariant ([`LeaseTable::check_invariants`])
//!
//! For each kind: a key is in the expiring set, or the index holds `(indexed, key)` with the
//! record's indexed position, never both, and nothing else is in either. A grant is indexed at
//! its stored deadline; a session at or before it, and at it while expiring. The stored
//! deadline is never later than the effective one, so the index front is a lower bound of
//! every lease's effective deadline; an expiring record is always of the current epoch. An
//! expiring lease has been handed to the reaper, so it leaves the index until its expiry fails
//! and it may be taken again, or a promote gives it a fresh lease.

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_api::LockError;
#[cfg(test)]
use lock_raft_store::Grant;

use super::shards::ShardedMap;

/// Most index entries one [`LeaseTable::take_lapsed`] call rewrites to the current epoch
/// (materialises) or moves to the deadline a heartbeat gave its session, before it returns.
/// After a promote every entry of an untouched lease may lie
/// before `now` in the index; rewriting them in bounded steps keeps each call's hold of the
/// table short, and [`Lapsed::more`] tells the reaper to call again without waiting a tick.
/// A rewrite moves an index entry (about a microsecond at a million leases), so a call holds
/// the keeper for about two milliseconds at most: renewals, heartbeats and the apply's events
/// wait on that lock, each blocking a runtime worker while it waits.
pub const MATERIALISE_PER_CALL_MAX: usize = 2_048;

/// An instant as nanoseconds since the table's base instant: half the size of an `Instant`,
/// exact for every instant at or after the base.
type Tick = u64;

/// A grant's live lease on this node, as the table answers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GrantLease {
    /// The grant's fencing token.
    pub token: u64,
    /// Lease length in force.
    pub ttl_ms: u64,
    /// Past this instant the lease has lapsed.
    pub deadline: Instant,
}

/// The time part of one lease record: 20 bytes.
///
/// `ttl_ms` is a `u32`: every TTL is validated to at most an hour (`lock_api::limits::TTL_MAX`)
/// before it reaches the log; a longer one is kept as `u32::MAX` ms (49 days), which can only
/// make a lease longer, never shorter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Life {
    /// The stored deadline; the effective one is later for a record of an older epoch.
    deadline: Tick,
    ttl_ms: u32,
    /// The promote epoch this record was last written in.
    epoch: u32,
    /// The reconcile generation that last saw this record in the replicated state (or in an
    /// applied event).
    seen: u32,
}

/// A grant's record: 32 bytes, next to its 16-byte key. The holder's owner and session ids are
/// not kept here: whoever needs them reads the replicated state, which holds them anyway.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct GrantRecord {
    token: u64,
    life: Life,
}

/// What renewing a grant's lease found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RenewCheck {
    /// The lease was alive and now runs to `now + ttl`; `previous_ttl_ms` is the lease length
    /// it had before (a different one must be written to the log, see `backend::raft`).
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
    /// `(key, token)` of lapsed grants, earliest deadline first.
    pub grants: Vec<(String, u64)>,
    /// Ids of lapsed sessions, earliest deadline first.
    pub sessions: Vec<String>,
    /// The call stopped after [`MATERIALISE_PER_CALL_MAX`] rewrites: more may have lapsed, call
    /// again soon.
    pub more: bool,
}

/// The deadline index of one kind of lease: `(indexed, key)` of every lease that is not
/// expiring, earliest first: at the record's stored deadline, or for a session that beat since
/// it was placed, before it ([`HasLife`]).
///
/// Why a `BTreeSet<(Tick, Arc<str>)>` (the shape of mini-redis's `db.rs` expirations):
/// - The reaper's question is "the earliest deadlines, while they are past", which an ordered
///   set answers from its front in O(log n) per lapsed lease; an idle leader with a million
///   held locks pays O(log n) a tick, not a walk over every lease under the mutex heartbeats
///   take (issue 23: 21-24 % of a core spent in that walk).
/// - Every renewal moves a deadline (a heartbeat moves it lazily, see the module docs), and a
///   release removes one. An ordered set removes an arbitrary entry in O(log n); a `BinaryHeap`
///   cannot, and with lazy deletion it would grow by one stale entry per renewal until
///   compacted.
/// - Pairing the deadline with the key makes every entry unique, so two leases with the same
///   deadline (one clock reading for a whole heartbeat batch) are both kept, and the order is
///   total, which makes `take_lapsed` deterministic.
/// - The key is an `Arc<str>` shared with the lease map, so the index costs 24 bytes plus tree
///   overhead per lease and no second copy of the key.
type DeadlineIndex = BTreeSet<(Tick, Arc<str>)>;

/// A record that has a [`Life`]: grants and sessions share every index operation.
///
/// A record is indexed at [`HasLife::indexed`]. For a grant that is always its stored
/// deadline: a renewal moves the index entry (`LAZY` is false). A session's entry may lag
/// behind its stored deadline (`LAZY`): a heartbeat only moves the deadline, and the entry
/// is moved when the reaper reaches it (see [`Leases::pop_lapsed`]). Sessions beat three
/// times a TTL and their entries move once a TTL; a beat is then one hash lookup instead of
/// three and a B-tree remove and insert (docs/PERFORMANCE.md, "Session 19").
trait HasLife {
    /// Whether a later deadline leaves the index entry where it is.
    const LAZY: bool;
    fn life(&self) -> &Life;
    fn life_mut(&mut self) -> &mut Life;
    /// Where the index holds the record (or held it, for an expiring one): never after its
    /// stored deadline.
    fn indexed(&self) -> Tick;
    /// Records that the index now holds the record at its stored deadline.
    fn indexed_at_deadline(&mut self);
}

impl HasLife for GrantRecord {
    const LAZY: bool = false;
    fn life(&self) -> &Life {
        &self.life
    }
    fn life_mut(&mut self) -> &mut Life {
        &mut self.life
    }
    fn indexed(&self) -> Tick {
        self.life.deadline
    }
    fn indexed_at_deadline(&mut self) {}
}

/// A session's record: its [`Life`], where its index entry is, which a heartbeat leaves
/// behind, and the principal it is bound to (`None`: unbound), 48 bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
struct SessionRecord {
    life: Life,
    indexed: Tick,
    principal: Option<Arc<str>>,
}

impl SessionRecord {
    fn new(life: Life, principal: Option<Arc<str>>) -> Self {
        SessionRecord {
            indexed: life.deadline,
            life,
            principal,
        }
    }
}

impl HasLife for SessionRecord {
    const LAZY: bool = true;
    fn life(&self) -> &Life {
        &self.life
    }
    fn life_mut(&mut self) -> &mut Life {
        &mut self.life
    }
    fn indexed(&self) -> Tick {
        self.indexed
    }
    fn indexed_at_deadline(&mut self) {
        self.indexed = self.life.deadline;
    }
}

/// One kind of lease: the records by key, their deadline index, and the keys handed to the
/// reaper (which are not in the index).
#[derive(Debug)]
struct Leases<R> {
    records: ShardedMap<R>,
    index: DeadlineIndex,
    expiring: HashSet<Arc<str>>,
}

impl<R> Default for Leases<R> {
    fn default() -> Self {
        Self {
            records: ShardedMap::default(),
            index: DeadlineIndex::new(),
            expiring: HashSet::new(),
        }
    }
}

/// The promote the table is in: its epoch and instant.
#[derive(Clone, Copy, Debug)]
struct Promote {
    epoch: u32,
    at: Tick,
}

impl Promote {
    /// The deadline `life` has now: its stored one, or for a record untouched since the promote,
    /// the later of that and a full lease from the promote.
    fn effective(&self, life: &Life) -> Tick {
        if life.epoch == self.epoch {
            life.deadline
        } else {
            life.deadline
                .max(self.at.saturating_add(ms_ticks(life.ttl_ms)))
        }
    }
}

impl<R: HasLife> Leases<R> {
    /// Adds `record` under `key`, replacing (and unindexing) any record the key had.
    fn insert(&mut self, key: Arc<str>, mut record: R) {
        self.remove(&key);
        record.indexed_at_deadline();
        self.index.insert((record.indexed(), key.clone()));
        self.records.insert(key, record);
    }

    /// Removes `key`'s record and its index entry or expiring mark.
    fn remove(&mut self, key: &str) -> Option<R> {
        let (key, record) = self.records.remove_entry(key)?;
        if !self.expiring.remove(&key) {
            self.index.remove(&(record.indexed(), key));
        }
        Some(record)
    }

    /// Sets `key`'s stored deadline to `deadline` in the current epoch and moves its index
    /// entry there, unless the record is `LAZY` and the entry is not after `deadline` (then
    /// the reaper moves it when it reaches it). The key must be present and not expiring.
    fn set_deadline(&mut self, key: &str, promote: Promote, deadline: Tick) {
        let Some(record) = self.records.get_mut(key) else {
            return;
        };
        if let Some(old) = Self::set_record_deadline(record, promote, deadline) {
            self.move_entry(key, old, deadline);
        }
    }

    /// Sets `record`'s stored deadline to `deadline` in the current epoch. Answers where its
    /// index entry is when the entry must move to `deadline` (then it is recorded there), and
    /// `None` when it stays: at `deadline` already, or `LAZY` and not after it.
    fn set_record_deadline(record: &mut R, promote: Promote, deadline: Tick) -> Option<Tick> {
        // Read first: a grant's entry is where its stored deadline is.
        let old = record.indexed();
        let life = record.life_mut();
        life.deadline = deadline;
        life.epoch = promote.epoch;
        if old == deadline || (R::LAZY && old < deadline) {
            return None;
        }
        record.indexed_at_deadline();
        Some(old)
    }

    /// Moves `key`'s index entry from `old` to `deadline`.
    fn move_entry(&mut self, key: &str, old: Tick, deadline: Tick) {
        if let Some((key, _)) = self.records.get_key_value(key) {
            let key = key.clone();
            self.index.remove(&(old, key.clone()));
            self.index.insert((deadline, key));
        }
    }

    /// A promote: every expiring key goes back to the index at its stored deadline (its record
    /// is now of an older epoch, so its effective deadline is a full lease from the promote).
    fn unmark_expiring(&mut self) {
        for key in self.expiring.drain() {
            if let Some(record) = self.records.get(&key) {
                self.index.insert((record.indexed(), key));
            }
        }
    }

    /// Pops the key whose lease lapsed earliest, if its effective deadline is more than
    /// `margin` before `now`, and marks it expiring. Entries met on the way that lag behind
    /// their record (an older epoch's, materialised first, or a `LAZY` record's, which a
    /// heartbeat extended) are put back at the record's deadline, at most `budget` of them:
    /// `Err(())` once the budget is spent.
    fn pop_lapsed(
        &mut self,
        promote: Promote,
        margin: Tick,
        now: Tick,
        budget: &mut usize,
    ) -> Result<Option<Arc<str>>, ()> {
        loop {
            let Some((deadline, _)) = self.index.first() else {
                return Ok(None);
            };
            if now <= deadline.saturating_add(margin) {
                return Ok(None);
            }
            let Some((deadline, key)) = self.index.pop_first() else {
                return Ok(None);
            };
            let Some(record) = self.records.get_mut(&key) else {
                // Unreachable while the invariant holds; dropping the stray entry keeps it.
                continue;
            };
            let life = record.life_mut();
            if life.epoch != promote.epoch || life.deadline != deadline {
                if *budget == 0 {
                    self.index.insert((deadline, key));
                    return Err(());
                }
                *budget -= 1;
                life.deadline = promote.effective(life);
                life.epoch = promote.epoch;
                record.indexed_at_deadline();
                self.index.insert((record.indexed(), key));
                continue;
            }
            self.expiring.insert(key.clone());
            return Ok(Some(key));
        }
    }

    /// The expiry of `key` was not applied: back in the index so the reaper may take it again.
    fn expiry_failed(&mut self, key: &str) {
        if let Some(key) = self.expiring.take(key)
            && let Some(record) = self.records.get(&key)
        {
            self.index.insert((record.indexed(), key));
        }
    }

    /// Drops every record not seen in reconcile generation `seen`.
    fn sweep(&mut self, seen: u32) {
        let Self {
            records,
            index,
            expiring,
        } = self;
        records.retain(|key, record| {
            if record.life().seen == seen {
                return true;
            }
            if !expiring.remove(key) {
                index.remove(&(record.indexed(), key.clone()));
            }
            false
        });
    }

    /// Panics unless the index and the expiring set hold exactly what the invariant says.
    fn check(&self, promote: Promote, what: &str) {
        let expected: DeadlineIndex = self
            .records
            .iter()
            .filter(|(key, _)| !self.expiring.contains(*key))
            .map(|(key, record)| (record.indexed(), key.clone()))
            .collect();
        assert_eq!(expected, self.index, "{what} deadline index");
        for key in &self.expiring {
            let record = self
                .records
                .get(key)
                .unwrap_or_else(|| panic!("{what} {key:?} is expiring but has no record"));
            assert_eq!(
                record.life().epoch,
                promote.epoch,
                "{what} {key:?} is expiring in an older epoch"
            );
        }
        for (key, record) in self.records.iter() {
            let life = record.life();
            assert!(
                life.deadline <= promote.effective(life),
                "{what} {key:?}: stored deadline after the effective one"
            );
            assert!(
                record.indexed() <= life.deadline,
                "{what} {key:?}: indexed after its stored deadline"
            );
            if !R::LAZY || self.expiring.contains(key) {
                assert_eq!(
                    record.indexed(),
                    life.deadline,
                    "{what} {key:?}: indexed away from its stored deadline"
                );
            }
        }
    }
}

/// Every grant and session lease this node tracks, indexed by deadline.
#[derive(Debug)]
pub struct LeaseTable {
    /// Tick 0.
    base: Instant,
    promote: Promote,
    /// The reconcile generation: records written from now on are "seen" in it.
    seen: u32,
    /// Grants and sessions have separate indexes so the reaper keeps taking grants first and
    /// fills the rest of a tick with sessions, as it always has.
    grants: Leases<GrantRecord>,
    sessions: Leases<SessionRecord>,
    /// The principal of the session recorded last, shared by the next one of the same
    /// principal: a service's sessions are mostly opened by one principal, and then its
    /// sessions hold one allocation of it, which every heartbeat's check reads from cache.
    last_principal: Option<Arc<str>>,
}

impl Default for LeaseTable {
    /// A table whose base instant is now.
    fn default() -> Self {
        Self::new(Instant::now())
    }
}

impl LeaseTable {
    /// An empty table measuring time from `base`: every `now` given later must be at or after
    /// it (an earlier one reads as `base`).
    pub fn new(base: Instant) -> Self {
        Self {
            base,
            promote: Promote { epoch: 0, at: 0 },
            seen: 0,
            grants: Leases::default(),
            sessions: Leases::default(),
            last_principal: None,
        }
    }

    /// `principal` as an `Arc`, the last one recorded when it is the same.
    fn shared_principal(&mut self, principal: Option<&str>) -> Option<Arc<str>> {
        let principal = principal?;
        match &self.last_principal {
            Some(last) if **last == *principal => Some(last.clone()),
            _ => Some(self.last_principal.insert(Arc::from(principal)).clone()),
        }
    }

    fn tick(&self, at: Instant) -> Tick {
        u64::try_from(at.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX)
    }

    fn instant(&self, tick: Tick) -> Instant {
        self.base + Duration::from_nanos(tick)
    }

    fn fresh(&self, ttl_ms: u64, now: Instant) -> Life {
        let ttl_ms = ttl_u32(ttl_ms);
        Life {
            deadline: self.tick(now).saturating_add(ms_ticks(ttl_ms)),
            ttl_ms,
            epoch: self.promote.epoch,
            seen: self.seen,
        }
    }

    /// Starts a full lease of grant `(key, token)` of `ttl_ms` at `now`, replacing any lease the
    /// key had. `key` is the allocation the lock table holds (an applied `Granted` event's
    /// `shared_key`), kept rather than copied.
    pub fn insert_grant(&mut self, key: Arc<str>, token: u64, ttl_ms: u64, now: Instant) {
        let record = GrantRecord {
            token,
            life: self.fresh(ttl_ms, now),
        };
        self.grants.insert(key, record);
    }

    /// [`LeaseTable::insert_grant`] of `grant`, with a key of its own (tests).
    #[cfg(test)]
    pub fn insert_grant_copied(&mut self, grant: &Grant, now: Instant) {
        self.insert_grant(grant.key.as_str().into(), grant.token, grant.ttl_ms, now);
    }

    /// Drops the lease of grant `(key, token)`; a lease of another token stays.
    pub fn remove_grant(&mut self, key: &str, token: u64) {
        if self
            .grants
            .records
            .get(key)
            .is_some_and(|r| r.token == token)
        {
            self.grants.remove(key);
        }
    }

    /// Starts a full lease of session `session_id`, bound to `principal`, at `now`, replacing
    /// any it had.
    pub fn insert_session(
        &mut self,
        session_id: &str,
        ttl_ms: u64,
        principal: Option<&str>,
        now: Instant,
    ) {
        let life = self.fresh(ttl_ms, now);
        let principal = self.shared_principal(principal);
        self.sessions
            .insert(Arc::from(session_id), SessionRecord::new(life, principal));
    }

    /// Drops the lease of session `session_id`.
    pub fn remove_session(&mut self, session_id: &str) {
        self.sessions.remove(session_id);
    }

    /// etcd's lessor `Promote`: every lease restarts in full at `now` and none is expiring, so
    /// no lease ends early because leadership moved. O(expiring leases): the restart of the
    /// others is lazy (see the module docs). A lease already running past `now + ttl` keeps its
    /// later deadline.
    pub fn restart_all(&mut self, now: Instant) {
        self.promote = Promote {
            epoch: self.promote.epoch.wrapping_add(1),
            at: self.tick(now),
        };
        self.grants.unmark_expiring();
        self.sessions.unmark_expiring();
    }

    /// Makes room for `grants` grant leases and `sessions` session leases in all, so that
    /// filling the table up to those counts never grows a map. Growing a hash map moves every
    /// entry into a new one at once: at ~917,000 grants that is a quarter of a second with the
    /// keeper locked (measured in session 28, the longest step of a million-grant reconcile
    /// walk after a snapshot install: 263 ms, and 3 ms with the room made first). Does
    /// nothing where there is room already.
    pub fn reserve(&mut self, grants: usize, sessions: usize) {
        let grants = grants.saturating_sub(self.grants.records.len());
        let sessions = sessions.saturating_sub(self.sessions.records.len());
        self.grants.records.reserve(grants);
        self.sessions.records.reserve(sessions);
    }

    /// Starts a reconcile with the replicated state and returns its generation: records that
    /// [`LeaseTable::reconcile_grant`], [`LeaseTable::reconcile_session`] or an insert touch
    /// from now on count as seen, and [`LeaseTable::finish_reconcile`] drops the others.
    pub fn begin_reconcile(&mut self) -> u32 {
        self.seen = self.seen.wrapping_add(1);
        self.seen
    }

    /// The replicated state holds grant `(key, token)` with lease length `ttl_ms`: a lease of
    /// another token, or none, is replaced by a full lease from the last promote; a lease of
    /// this token untouched since the promote takes the state's lease length (renewals that
    /// changed it were applied here without an event) and restarts from the promote with it.
    /// Either way it is no longer expiring and counts as seen.
    pub fn reconcile_grant(&mut self, key: &str, token: u64, ttl_ms: u64) {
        let promote = self.promote;
        let ttl_ms = ttl_u32(ttl_ms);
        let restarted = promote.at.saturating_add(ms_ticks(ttl_ms));
        match self.grants.records.get_mut(key) {
            Some(record) if record.token == token => {
                record.life.seen = self.seen;
                if record.life.epoch != promote.epoch {
                    record.life.ttl_ms = ttl_ms;
                    let deadline = record.life.deadline.max(restarted);
                    self.grants.expiry_failed(key);
                    self.grants.set_deadline(key, promote, deadline);
                }
            }
            _ => {
                let record = GrantRecord {
                    token,
                    life: Life {
                        deadline: restarted,
                        ttl_ms,
                        epoch: promote.epoch,
                        seen: self.seen,
                    },
                };
                self.grants.insert(Arc::from(key), record);
            }
        }
    }

    /// [`LeaseTable::reconcile_grant`] for session `session_id` with lease length `ttl_ms`,
    /// bound to `principal` (a record the keeper already had keeps its own: the same one).
    pub fn reconcile_session(&mut self, session_id: &str, ttl_ms: u64, principal: Option<&str>) {
        let promote = self.promote;
        let ttl_ms = ttl_u32(ttl_ms);
        let restarted = promote.at.saturating_add(ms_ticks(ttl_ms));
        match self.sessions.records.get_mut(session_id) {
            Some(SessionRecord { life, .. }) => {
                life.seen = self.seen;
                if life.epoch != promote.epoch {
                    life.ttl_ms = ttl_ms;
                    let deadline = life.deadline.max(restarted);
                    self.sessions.expiry_failed(session_id);
                    self.sessions.set_deadline(session_id, promote, deadline);
                }
            }
            None => {
                let life = Life {
                    deadline: restarted,
                    ttl_ms,
                    epoch: promote.epoch,
                    seen: self.seen,
                };
                let principal = self.shared_principal(principal);
                self.sessions
                    .insert(Arc::from(session_id), SessionRecord::new(life, principal));
            }
        }
    }

    /// Ends reconcile generation `seen`: drops the lease of every grant and session the walk
    /// did not find in the state and no event brought since it began. O(leases), once per
    /// promote. A stale generation (another reconcile began since) drops nothing.
    pub fn finish_reconcile(&mut self, seen: u32) {
        if seen != self.seen {
            return;
        }
        self.grants.sweep(seen);
        self.sessions.sweep(seen);
    }

    /// Renews the lease of grant `(key, token)` to `ttl_ms` from `now`, if it is alive:
    /// present, same token, not expiring and its deadline not passed. A lapsed lease is never
    /// revived (D-lease), so a late renewal and the reaper cannot both win.
    pub fn renew_grant(&mut self, key: &str, token: u64, ttl_ms: u64, now: Instant) -> RenewCheck {
        let now = self.tick(now);
        let promote = self.promote;
        let Some(record) = self.grants.records.get_mut(key) else {
            return RenewCheck::Lost;
        };
        if record.token != token
            || now > promote.effective(&record.life)
            || self.grants.expiring.contains(key)
        {
            return RenewCheck::Lost;
        }
        let previous_ttl_ms = u64::from(record.life.ttl_ms);
        record.life.ttl_ms = ttl_u32(ttl_ms);
        let deadline = now.saturating_add(ms_ticks(record.life.ttl_ms));
        self.grants.set_deadline(key, promote, deadline);
        RenewCheck::Extended {
            lease: GrantLease {
                token,
                ttl_ms,
                deadline: self.instant(deadline),
            },
            previous_ttl_ms,
        }
    }

    /// Restarts session `session_id`'s lease at `now` if it is alive (present, not expiring,
    /// its deadline not passed) and returns its TTL; a lapsed lease is never revived (D-lease).
    /// `Err(PermissionDenied)` and nothing changed when the session is bound to another
    /// principal than `caller` (`lock_api::validate::session_principal`; `None` is never
    /// refused); `Ok(None)` when the table holds no lease of it.
    ///
    /// One hash lookup: the index entry stays behind the new deadline (see the module docs,
    /// "The lazy heartbeat"), and the principal is in the record.
    pub fn restart_session_as(
        &mut self,
        session_id: &str,
        caller: Option<&str>,
        now: Instant,
    ) -> Result<Option<u64>, LockError> {
        let now = self.tick(now);
        let promote = self.promote;
        let Leases {
            records, expiring, ..
        } = &mut self.sessions;
        let Some(record) = records.get_mut(session_id) else {
            return Ok(None);
        };
        lock_api::validate::session_principal(caller, record.principal.as_deref())?;
        if now > promote.effective(&record.life) || expiring.contains(session_id) {
            return Ok(None);
        }
        let ttl_ms = record.life.ttl_ms;
        let deadline = now.saturating_add(ms_ticks(ttl_ms));
        // The entry moves only when a reconcile shortened the lease below where it was placed.
        if let Some(old) = Leases::set_record_deadline(record, promote, deadline) {
            self.sessions.move_entry(session_id, old, deadline);
        }
        Ok(Some(u64::from(ttl_ms)))
    }

    /// [`LeaseTable::restart_session_as`] for an unchecked caller (tests).
    #[cfg(test)]
    pub fn restart_session(&mut self, session_id: &str, now: Instant) -> Option<u64> {
        self.restart_session_as(session_id, None, now)
            .expect("no caller is never refused")
    }

    /// The lease of `key`, if any, with its effective deadline.
    pub fn grant_lease(&self, key: &str) -> Option<GrantLease> {
        let record = self.grants.records.get(key)?;
        Some(GrantLease {
            token: record.token,
            ttl_ms: u64::from(record.life.ttl_ms),
            deadline: self.instant(self.promote.effective(&record.life)),
        })
    }

    /// Takes up to `max` leases lapsed for longer than `margin` at `now`, earliest deadline
    /// first, grants before sessions; marks them expiring (so a renewal racing the expiry
    /// loses) and drops them from the index so the next tick does not take them again.
    ///
    /// Costs O((taken + moved + 1) · log n): it reads the index from its front and stops
    /// at the first deadline that has not lapsed. Index entries of leases untouched since a
    /// promote, and of sessions that beat since they were placed, are moved on the way, at most
    /// [`MATERIALISE_PER_CALL_MAX`] a call
    /// ([`Lapsed::more`] then says to call again).
    pub fn take_lapsed(&mut self, max: usize, margin: Duration, now: Instant) -> Lapsed {
        let now = self.tick(now);
        let margin = u64::try_from(margin.as_nanos()).unwrap_or(u64::MAX);
        let promote = self.promote;
        let mut budget = MATERIALISE_PER_CALL_MAX;
        let mut lapsed = Lapsed::default();
        while lapsed.grants.len() < max {
            match self.grants.pop_lapsed(promote, margin, now, &mut budget) {
                Ok(Some(key)) => {
                    let token = self.grants.records.get(&key).map_or(0, |r| r.token);
                    lapsed.grants.push((key.to_string(), token));
                }
                Ok(None) => break,
                Err(()) => {
                    lapsed.more = true;
                    return lapsed;
                }
            }
        }
        let room = max.saturating_sub(lapsed.grants.len());
        while lapsed.sessions.len() < room {
            match self.sessions.pop_lapsed(promote, margin, now, &mut budget) {
                Ok(Some(id)) => lapsed.sessions.push(id.to_string()),
                Ok(None) => break,
                Err(()) => {
                    lapsed.more = true;
                    return lapsed;
                }
            }
        }
        lapsed
    }

    /// The expiry of grant `(key, token)` was not applied: the reaper may take it again. Its
    /// deadline has passed, so a renewal still loses.
    pub fn grant_expiry_failed(&mut self, key: &str, token: u64) {
        if self
            .grants
            .records
            .get(key)
            .is_some_and(|r| r.token == token)
        {
            self.grants.expiry_failed(key);
        }
    }

    /// The expiry of session `session_id` was not applied: the reaper may take it again.
    pub fn session_expiry_failed(&mut self, session_id: &str) {
        self.sessions.expiry_failed(session_id);
    }

    /// How many grant and session leases are tracked.
    pub fn counts(&self) -> (usize, usize) {
        (self.grants.records.len(), self.sessions.records.len())
    }

    /// Panics with context unless each index holds exactly the `(indexed, key)` of the leases
    /// that are not expiring, every expiring lease is of the current epoch, no stored deadline is
    /// after its effective one, and no entry after its stored deadline (a grant's and an
    /// expiring session's at it). O(n); for tests.
    pub fn check_invariants(&self) {
        self.grants.check(self.promote, "grant");
        self.sessions.check(self.promote, "session");
    }

    /// Marks session `session_id` expiring as if the reaper had taken it.
    #[cfg(test)]
    pub fn mark_session_expiring(&mut self, session_id: &str) {
        let promote = self.promote;
        let Leases {
            records,
            index,
            expiring,
        } = &mut self.sessions;
        if let Some(record) = records.get_mut(session_id) {
            let key: Arc<str> = Arc::from(session_id);
            index.remove(&(record.indexed, key.clone()));
            record.life.deadline = promote.effective(&record.life);
            record.life.epoch = promote.epoch;
            record.indexed = record.life.deadline;
            expiring.insert(key);
        }
    }
}

/// `ttl_ms` as stored: at most `u32::MAX` (49 days), which only lengthens an invalid TTL.
fn ttl_u32(ttl_ms: u64) -> u32 {
    u32::try_from(ttl_ms).unwrap_or(u32::MAX)
}

/// `ms` milliseconds in ticks.
fn ms_ticks(ms: u32) -> Tick {
    u64::from(ms) * 1_000_000
}

#[cfg(test)]
pub(super) mod tests {
    use std::collections::{BTreeMap, HashMap};

    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::leader::leases::REAP_PER_TICK_MAX;

    /// A grant of `key` with `token` and `ttl_ms`, for the keeper's tests too.
    pub(in crate::leader::leases) fn grant(key: &str, token: u64, ttl_ms: u64) -> Grant {
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

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn indexed<R>(table: &LeaseTable, leases: &Leases<R>) -> Vec<(Instant, String)> {
        leases
            .index
            .iter()
            .map(|(d, k)| (table.instant(*d), k.to_string()))
            .collect()
    }

    #[test]
    fn renew_moves_the_deadline_in_the_index() {
        let t0 = Instant::now();
        let mut table = LeaseTable::new(t0);
        table.insert_grant_copied(&grant("a", 1, 1_000), t0);
        table.insert_grant_copied(&grant("b", 2, 1_000), t0 + ms(10));
        assert_eq!(
            indexed(&table, &table.grants),
            vec![(t0 + ms(1_000), "a".into()), (t0 + ms(1_010), "b".into())]
        );
        let renewed = table.renew_grant("a", 1, 2_000, t0 + ms(500));
        assert!(matches!(
            renewed,
            RenewCheck::Extended {
                previous_ttl_ms: 1_000,
                ..
            }
        ));
        assert_eq!(
            indexed(&table, &table.grants),
            vec![(t0 + ms(1_010), "b".into()), (t0 + ms(2_500), "a".into())],
            "the old entry is gone and the new one sorts after b"
        );
        table.check_invariants();
    }

    /// A heartbeat is checked against its session's principal in the lookup that restarts it:
    /// another principal is refused and restarts nothing, and consecutive sessions of one
    /// principal share one allocation of it.
    #[test]
    fn a_heartbeat_is_checked_against_the_sessions_principal() {
        let t0 = Instant::now();
        let mut table = LeaseTable::new(t0);
        table.insert_session("a1", 1_000, Some("alice"), t0);
        table.insert_session("a2", 1_000, Some("alice"), t0);
        table.insert_session("b", 1_000, Some("bob"), t0);
        table.insert_session("a3", 1_000, Some("alice"), t0);
        table.insert_session("u", 1_000, None, t0);
        let denied = |caller: &str| LockError::PermissionDenied {
            principal: caller.to_owned(),
            required_role: lock_api::SESSION_OWNER_ROLE.to_owned(),
        };
        let at = t0 + ms(600);
        assert_eq!(
            table.restart_session_as("a1", Some("alice"), at),
            Ok(Some(1_000))
        );
        assert_eq!(
            table.restart_session_as("a2", Some("bob"), at),
            Err(denied("bob"))
        );
        assert_eq!(
            table.restart_session_as("b", Some("bob"), at),
            Ok(Some(1_000))
        );
        assert_eq!(table.restart_session_as("a3", None, at), Ok(Some(1_000)));
        assert_eq!(
            table.restart_session_as("u", Some("carol"), at),
            Ok(Some(1_000))
        );
        assert_eq!(
            table.restart_session_as("gone", Some("carol"), at),
            Ok(None)
        );
        // Bob's beat left a2's lease where alice's last one put it: lapsed after 1 s.
        let later = t0 + ms(1_001);
        assert_eq!(
            table.restart_session_as("a2", Some("alice"), later),
            Ok(None)
        );
        assert_eq!(
            table.restart_session_as("a1", Some("alice"), later),
            Ok(Some(1_000))
        );
        table.check_invariants();

        let principal = |id: &str| {
            table
                .sessions
                .records
                .get(id)
                .and_then(|r| r.principal.clone())
        };
        let (a1, a2, b, a3) = (
            principal("a1"),
            principal("a2"),
            principal("b"),
            principal("a3"),
        );
        let shared = |x: &Option<Arc<str>>, y: &Option<Arc<str>>| match (x, y) {
            (Some(x), Some(y)) => Arc::ptr_eq(x, y),
            _ => false,
        };
        assert!(
            shared(&a1, &a2),
            "consecutive sessions of one principal share it"
        );
        assert!(!shared(&a2, &b));
        assert_eq!(a3.as_deref(), Some("alice"));
        assert_eq!(b.as_deref(), Some("bob"));
        assert_eq!(principal("u"), None);
    }

    /// A heartbeat moves a session's deadline and leaves its index entry behind it; the
    /// reaper, reaching the entry, finds the session alive and moves the entry to the
    /// deadline instead of taking it, and takes it only once that deadline has lapsed.
    #[test]
    fn a_heartbeat_leaves_the_index_entry_and_the_reaper_moves_it() {
        let t0 = Instant::now();
        let margin = ms(50);
        let mut table = LeaseTable::new(t0);
        table.insert_session("s", 1_000, None, t0);
        table.insert_session("t", 1_000, None, t0 + ms(10));
        assert_eq!(table.restart_session("s", t0 + ms(700)), Some(1_000));
        assert_eq!(table.restart_session("s", t0 + ms(900)), Some(1_000));
        assert_eq!(
            indexed(&table, &table.sessions),
            vec![(t0 + ms(1_000), "s".into()), (t0 + ms(1_010), "t".into())],
            "both heartbeats left the entry where the open put it"
        );
        table.check_invariants();
        let lapsed = table.take_lapsed(10, margin, t0 + ms(1_100));
        assert_eq!(lapsed.sessions, vec!["t".to_string()], "t lapsed, s beat");
        assert_eq!(
            indexed(&table, &table.sessions),
            vec![(t0 + ms(1_900), "s".into())],
            "the reaper moved s's entry to its deadline"
        );
        table.check_invariants();
        assert!(
            table
                .take_lapsed(10, margin, t0 + ms(1_900) + margin)
                .sessions
                .is_empty(),
            "not before the margin has passed"
        );
        assert_eq!(table.restart_session("s", t0 + ms(1_950)), None, "lapsed");
        let lapsed = table.take_lapsed(10, margin, t0 + ms(1_951) + margin);
        assert_eq!(lapsed.sessions, vec!["s".to_string()]);
        table.check_invariants();
    }

    /// The room a reconcile makes is enough for the state's counts: the walk that follows adds
    /// every lease without growing either map, and a second reserve with the leases in place
    /// changes nothing.
    #[test]
    fn reserve_makes_room_for_the_whole_walk() {
        let t0 = Instant::now();
        let mut table = LeaseTable::new(t0);
        table.insert_grant("held".into(), 1, 1_000, t0);
        table.reserve(5_000, 300);
        let (grants, sessions) = (
            table.grants.records.capacity(),
            table.sessions.records.capacity(),
        );
        assert!(grants >= 5_000 && sessions >= 300, "{grants} {sessions}");
        table.restart_all(t0 + ms(10));
        let seen = table.begin_reconcile();
        for i in 0..5_000u64 {
            table.reconcile_grant(&format!("k{i:05}"), i + 2, 1_000);
        }
        for i in 0..300 {
            table.reconcile_session(&format!("s{i:03}"), 1_000, None);
        }
        // (A removal may leave a tombstone that lowers the reported capacity by one, so the
        // capacities are compared before the sweep.)
        assert_eq!(
            table.grants.records.capacity(),
            grants,
            "no grow during the walk"
        );
        assert_eq!(table.sessions.records.capacity(), sessions);
        table.finish_reconcile(seen);
        table.check_invariants();
        assert_eq!(
            table.grants.records.len(),
            5_000,
            "the unseen grant was dropped"
        );
        let swept = table.grants.records.capacity();
        table.reserve(5_000, 300);
        assert_eq!(
            table.grants.records.capacity(),
            swept,
            "room was there already"
        );
    }

    /// A reconcile that shortens a session's lease length below where its entry lies moves
    /// the entry back on the next heartbeat, so the reaper still finds it in time.
    #[test]
    fn a_heartbeat_that_shortens_a_lease_moves_its_entry_back() {
        let t0 = Instant::now();
        let mut table = LeaseTable::new(t0);
        table.insert_session("s", 30_000, None, t0);
        table.restart_all(t0 + ms(100));
        table.begin_reconcile();
        table.reconcile_session("s", 1_000, None);
        table.check_invariants();
        assert_eq!(table.restart_session("s", t0 + ms(200)), Some(1_000));
        assert_eq!(
            indexed(&table, &table.sessions),
            vec![(t0 + ms(1_200), "s".into())],
            "the entry came back from 30 s to the shorter deadline"
        );
        table.check_invariants();
        let lapsed = table.take_lapsed(10, ms(0), t0 + ms(1_201));
        assert_eq!(lapsed.sessions, vec!["s".to_string()]);
    }

    #[test]
    fn removal_removes_the_index_entry_and_another_token_keeps_it() {
        let t0 = Instant::now();
        let mut table = LeaseTable::new(t0);
        table.insert_grant_copied(&grant("a", 1, 1_000), t0);
        table.insert_session("s", 1_000, None, t0);
        table.remove_grant("a", 9);
        assert_eq!(table.grants.index.len(), 1, "another token's free keeps it");
        table.remove_grant("a", 1);
        table.remove_session("s");
        assert!(table.grants.index.is_empty());
        assert!(table.sessions.index.is_empty());
        assert_eq!(table.counts(), (0, 0));
        // A new grant of the same key replaces the old entry instead of adding a second.
        table.insert_grant_copied(&grant("a", 2, 1_000), t0);
        table.insert_grant_copied(&grant("a", 3, 5_000), t0 + ms(1));
        assert_eq!(
            indexed(&table, &table.grants),
            vec![(t0 + ms(5_001), "a".into())]
        );
        table.check_invariants();
    }

    #[test]
    fn take_lapsed_returns_exactly_the_lapsed_in_deadline_order() {
        let t0 = Instant::now();
        let mut table = LeaseTable::new(t0);
        // Inserted out of deadline order; "c" and "d" share a deadline.
        table.insert_grant_copied(&grant("e", 5, 900), t0);
        table.insert_grant_copied(&grant("d", 4, 300), t0);
        table.insert_grant_copied(&grant("a", 1, 100), t0);
        table.insert_grant_copied(&grant("c", 3, 300), t0);
        table.insert_grant_copied(&grant("b", 2, 200), t0);
        table.insert_session("s2", 150, None, t0);
        table.insert_session("s1", 250, None, t0);
        let margin = ms(50);
        // At 351 ms, deadline + margin < now holds for a, b, c, d (300 + 50 < 351), not e.
        let now = t0 + ms(351);
        let lapsed = table.take_lapsed(3, margin, now);
        assert_eq!(
            lapsed.grants,
            vec![("a".into(), 1), ("b".into(), 2), ("c".into(), 3)]
        );
        assert!(lapsed.sessions.is_empty(), "grants fill the tick first");
        let lapsed = table.take_lapsed(3, margin, now);
        assert_eq!(lapsed.grants, vec![("d".into(), 4)]);
        assert_eq!(lapsed.sessions, vec!["s2".to_owned(), "s1".to_owned()]);
        assert_eq!(table.take_lapsed(3, margin, now), Lapsed::default());
        // Exactly at deadline + margin is not lapsed yet.
        assert_eq!(
            table.take_lapsed(3, margin, t0 + ms(950)),
            Lapsed::default()
        );
        assert_eq!(
            table.take_lapsed(3, margin, t0 + ms(951)).grants,
            vec![("e".into(), 5)]
        );
        table.check_invariants();
        // A failed expiry puts the lease back in the index, still lost for renewals.
        table.grant_expiry_failed("b", 2);
        table.check_invariants();
        assert_eq!(table.renew_grant("b", 2, 1_000, now), RenewCheck::Lost);
        assert_eq!(
            table.take_lapsed(3, margin, now).grants,
            vec![("b".into(), 2)]
        );
        table.check_invariants();
    }

    #[test]
    fn promote_restarts_every_lease_without_touching_it() {
        let t0 = Instant::now();
        let mut table = LeaseTable::new(t0);
        table.insert_grant_copied(&grant("a", 1, 100), t0);
        table.insert_grant_copied(&grant("b", 2, 300), t0);
        table.insert_grant_copied(&grant("c", 3, 9_000), t0);
        table.insert_session("s", 200, None, t0);
        assert_eq!(table.take_lapsed(10, ms(0), t0 + ms(1_000)).grants.len(), 2);
        let later = t0 + ms(5_000);
        table.restart_all(later);
        table.check_invariants();
        // The index still holds the old deadlines (a lower bound); the leases answer the new.
        assert_eq!(table.grants.index.len(), 3, "the expiring ones are back");
        assert_eq!(
            table.grant_lease("a").map(|l| l.deadline),
            Some(later + ms(100))
        );
        assert_eq!(
            table.grant_lease("b").map(|l| l.deadline),
            Some(later + ms(300))
        );
        assert_eq!(
            table.grant_lease("c").map(|l| l.deadline),
            Some(later + ms(9_000))
        );
        // Alive up to the new deadline, not one tick past it, as for any lease.
        assert_eq!(table.restart_session("s", later + ms(201)), None);
        assert!(matches!(
            table.renew_grant("a", 1, 5_000, later + ms(100)),
            RenewCheck::Extended { .. }
        ));
        assert_eq!(
            table.renew_grant("b", 2, 300, later + ms(301)),
            RenewCheck::Lost
        );
        // The reaper rewrites the untouched entries as it meets them and takes what lapsed.
        let lapsed = table.take_lapsed(10, ms(0), later + ms(400));
        assert_eq!(lapsed.grants, vec![("b".into(), 2)]);
        assert_eq!(lapsed.sessions, vec!["s".to_owned()]);
        table.check_invariants();
        assert_eq!(
            indexed(&table, &table.grants),
            vec![
                (t0 + ms(9_000), "c".into()),
                (later + ms(5_100), "a".into())
            ],
            "c is not rewritten before its old deadline lapses"
        );
        assert!(
            table
                .take_lapsed(10, ms(0), later + ms(4_100))
                .grants
                .is_empty()
        );
        assert_eq!(
            indexed(&table, &table.grants),
            vec![
                (later + ms(5_100), "a".into()),
                (later + ms(9_000), "c".into())
            ]
        );
    }

    #[test]
    fn take_lapsed_rewrites_a_bounded_number_of_entries_per_call() {
        let t0 = Instant::now();
        let mut table = LeaseTable::new(t0);
        let leases = MATERIALISE_PER_CALL_MAX as u64 + 10;
        for i in 0..leases {
            table.insert_grant_copied(&grant(&format!("k{i:06}"), i + 1, 100), t0);
        }
        let promote = t0 + ms(1_000);
        table.restart_all(promote);
        // Every entry lies before `now` in the index: the first call rewrites as many as it
        // may and says there is more, the second the rest; nothing has lapsed yet.
        let first = table.take_lapsed(REAP_PER_TICK_MAX, ms(0), promote + ms(50));
        assert!(first.more && first.grants.is_empty(), "{first:?}");
        table.check_invariants();
        let second = table.take_lapsed(REAP_PER_TICK_MAX, ms(0), promote + ms(50));
        assert_eq!(second, Lapsed::default());
        table.check_invariants();
        let at = promote + ms(150);
        let third = table.take_lapsed(REAP_PER_TICK_MAX, ms(0), at);
        assert!(!third.more);
        assert_eq!(third.grants.len(), REAP_PER_TICK_MAX);
        assert_eq!(third.grants[0], ("k000000".into(), 1));
        table.check_invariants();
    }

    #[test]
    fn reconcile_adopts_restarts_and_sweeps() {
        let t0 = Instant::now();
        let mut table = LeaseTable::new(t0);
        table.insert_grant_copied(&grant("kept", 1, 100), t0);
        table.insert_grant_copied(&grant("stale", 2, 100), t0);
        table.insert_grant_copied(&grant("retoken", 3, 100), t0);
        table.insert_session("gone", 100, None, t0);
        let promote = t0 + ms(1_000);
        table.restart_all(promote);
        // Touched after the promote: its lease length is this leader's, not the state's.
        table.insert_grant_copied(&grant("fresh", 9, 100), promote + ms(10));
        let seen = table.begin_reconcile();
        table.reconcile_grant("kept", 1, 5_000);
        table.reconcile_grant("retoken", 4, 200);
        table.reconcile_grant("missing", 5, 300);
        table.reconcile_grant("fresh", 9, 700);
        table.reconcile_session("new", 400, None);
        // An event during the walk counts as seen.
        table.insert_session("opened", 100, None, promote + ms(20));
        table.finish_reconcile(seen);
        table.check_invariants();
        let deadline = |table: &LeaseTable, key: &str| table.grant_lease(key).map(|l| l.deadline);
        assert_eq!(deadline(&table, "kept"), Some(promote + ms(5_000)));
        assert_eq!(table.grant_lease("kept").map(|l| l.ttl_ms), Some(5_000));
        assert_eq!(table.grant_lease("retoken").map(|l| l.token), Some(4));
        assert_eq!(deadline(&table, "retoken"), Some(promote + ms(200)));
        assert_eq!(deadline(&table, "missing"), Some(promote + ms(300)));
        assert_eq!(deadline(&table, "fresh"), Some(promote + ms(110)));
        assert_eq!(table.grant_lease("stale"), None);
        assert_eq!(table.counts(), (4, 2));
        assert_eq!(table.restart_session("gone", promote), None);
        assert_eq!(table.restart_session("new", promote + ms(400)), Some(400));
        // A generation another reconcile replaced drops nothing.
        let old = table.begin_reconcile();
        let _new = table.begin_reconcile();
        table.finish_reconcile(old);
        assert_eq!(table.counts(), (4, 2));
    }

    /// A lease as the model keeps it: `stale` is "untouched since the last promote".
    #[derive(Clone, Debug, PartialEq, Eq)]
    struct ModelLease {
        token: u64,
        ttl_ms: u64,
        deadline: Instant,
        expiring: bool,
        stale: bool,
    }

    /// The behaviour the table must keep: a map scanned in full on every `take_lapsed`, taking
    /// the lapsed in `(deadline, key)` order, with a promote that restarts every lease at once.
    /// Sessions are leases with token 0.
    #[derive(Debug)]
    struct Model {
        grants: BTreeMap<String, ModelLease>,
        sessions: BTreeMap<String, ModelLease>,
        promoted_at: Instant,
        /// A promote applied and its reconcile has not (the keeper's reaper waits meanwhile).
        reconcile_pending: bool,
    }

    impl Model {
        fn new(base: Instant) -> Self {
            Self {
                grants: BTreeMap::new(),
                sessions: BTreeMap::new(),
                promoted_at: base,
                reconcile_pending: false,
            }
        }

        fn effective(&self, l: &ModelLease) -> Instant {
            if l.stale {
                l.deadline.max(self.promoted_at + ms(l.ttl_ms))
            } else {
                l.deadline
            }
        }

        fn lease(token: u64, ttl_ms: u64, deadline: Instant) -> ModelLease {
            ModelLease {
                token,
                ttl_ms,
                deadline,
                expiring: false,
                stale: false,
            }
        }

        fn renew_grant(&mut self, key: &str, token: u64, ttl_ms: u64, now: Instant) -> RenewCheck {
            let Some(l) = self.grants.get(key) else {
                return RenewCheck::Lost;
            };
            if l.token != token || l.expiring || now > self.effective(l) {
                return RenewCheck::Lost;
            }
            let previous_ttl_ms = l.ttl_ms;
            let l = Self::lease(token, ttl_ms, now + ms(ttl_ms));
            self.grants.insert(key.to_owned(), l);
            RenewCheck::Extended {
                lease: GrantLease {
                    token,
                    ttl_ms,
                    deadline: now + ms(ttl_ms),
                },
                previous_ttl_ms,
            }
        }

        fn restart_session(&mut self, id: &str, now: Instant) -> Option<u64> {
            let l = self.sessions.get(id)?;
            if l.expiring || now > self.effective(l) {
                return None;
            }
            let ttl_ms = l.ttl_ms;
            self.sessions
                .insert(id.to_owned(), Self::lease(0, ttl_ms, now + ms(ttl_ms)));
            Some(ttl_ms)
        }

        fn restart_all(&mut self, now: Instant) {
            self.promoted_at = now;
            for l in self.grants.values_mut().chain(self.sessions.values_mut()) {
                l.stale = true;
                l.expiring = false;
            }
            self.reconcile_pending = true;
        }

        fn lapsed_of(
            &self,
            leases: &BTreeMap<String, ModelLease>,
            margin: Duration,
            now: Instant,
        ) -> Vec<(Instant, String)> {
            let mut lapsed: Vec<_> = leases
                .iter()
                .filter(|(_, l)| !l.expiring && now > self.effective(l) + margin)
                .map(|(k, l)| (self.effective(l), k.clone()))
                .collect();
            lapsed.sort();
            lapsed
        }

        fn take_lapsed(&mut self, max: usize, margin: Duration, now: Instant) -> Lapsed {
            let mut grants = self.lapsed_of(&self.grants, margin, now);
            grants.truncate(max);
            let mut sessions = self.lapsed_of(&self.sessions, margin, now);
            sessions.truncate(max - grants.len());
            let mut lapsed = Lapsed::default();
            for (deadline, k) in grants {
                let l = self.grants.get_mut(&k).expect("listed");
                (l.expiring, l.stale, l.deadline) = (true, false, deadline);
                lapsed.grants.push((k, l.token));
            }
            for (deadline, k) in sessions {
                let l = self.sessions.get_mut(&k).expect("listed");
                (l.expiring, l.stale, l.deadline) = (true, false, deadline);
                lapsed.sessions.push(k);
            }
            lapsed
        }

        fn reconcile(&mut self, grants: &[Grant], sessions: &[(String, u64)]) {
            let p = self.promoted_at;
            let mut next = BTreeMap::new();
            for g in grants {
                let lease = match self.grants.remove(&g.key) {
                    Some(old) if old.token == g.token && !old.stale => old,
                    Some(old) if old.token == g.token => {
                        Self::lease(g.token, g.ttl_ms, old.deadline.max(p + ms(g.ttl_ms)))
                    }
                    _ => Self::lease(g.token, g.ttl_ms, p + ms(g.ttl_ms)),
                };
                next.insert(g.key.clone(), lease);
            }
            self.grants = next;
            let mut next = BTreeMap::new();
            for (id, ttl_ms) in sessions {
                let lease = match self.sessions.remove(id) {
                    Some(old) if !old.stale => old,
                    Some(old) => Self::lease(0, *ttl_ms, old.deadline.max(p + ms(*ttl_ms))),
                    None => Self::lease(0, *ttl_ms, p + ms(*ttl_ms)),
                };
                next.insert(id.clone(), lease);
            }
            self.sessions = next;
            self.reconcile_pending = false;
        }
    }

    /// `(token, ttl, effective deadline, expiring)` of every lease of one kind.
    type View = BTreeMap<String, (u64, u64, Instant, bool)>;

    fn table_view(
        table: &LeaseTable,
        leases: &Leases<impl HasLife>,
        token: impl Fn(&str) -> u64,
    ) -> View {
        leases
            .records
            .iter()
            .map(|(k, r)| {
                let life = r.life();
                let deadline = table.instant(table.promote.effective(life));
                let expiring = leases.expiring.contains(k);
                (
                    k.to_string(),
                    (token(k), u64::from(life.ttl_ms), deadline, expiring),
                )
            })
            .collect()
    }

    fn model_view(model: &Model, leases: &BTreeMap<String, ModelLease>) -> View {
        leases
            .iter()
            .map(|(k, l)| {
                let view = (l.token, l.ttl_ms, model.effective(l), l.expiring);
                (k.clone(), view)
            })
            .collect()
    }

    fn assert_same(table: &LeaseTable, model: &Model, context: &str) {
        table.check_invariants();
        let token = |k: &str| table.grants.records.get(k).map_or(0, |r| r.token);
        assert_eq!(
            table_view(table, &table.grants, token),
            model_view(model, &model.grants),
            "grants after {context}"
        );
        assert_eq!(
            table_view(table, &table.sessions, |_| 0),
            model_view(model, &model.sessions),
            "sessions after {context}"
        );
    }

    /// Random operations on the table and on the full-scan model from one seed; every answer
    /// and the whole state must agree after every step. Rerun a failure with `SEED=<seed>`.
    /// The operations follow the keeper's protocol: a reconcile only after a promote, and no
    /// `take_lapsed` between the two.
    #[test]
    fn matches_a_full_scan_model_under_random_operations() {
        const CASES: u64 = 64;
        const STEPS: usize = 400;
        let base: u64 = std::env::var("SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(rand::random);
        println!("SEED={base}");
        for case in 0..CASES {
            let seed = base.wrapping_add(case);
            let mut rng = StdRng::seed_from_u64(seed);
            let mut now = Instant::now();
            let mut table = LeaseTable::new(now);
            let mut model = Model::new(now);
            let ttls = [50, 100, 300, 1_000];
            for step in 0..STEPS {
                // Often no time passes, so equal deadlines are common.
                if rng.gen_bool(0.5) {
                    now += ms(rng.gen_range(0..=400));
                }
                let key = format!("k{}", rng.gen_range(0..6));
                let id = format!("s{}", rng.gen_range(0..5));
                let token = rng.gen_range(1..=3);
                let ttl = ttls[rng.gen_range(0..ttls.len())];
                let op = rng.gen_range(0..11);
                match op {
                    0 => {
                        table.insert_grant_copied(&grant(&key, token, ttl), now);
                        let lease = Model::lease(token, ttl, now + ms(ttl));
                        model.grants.insert(key.clone(), lease);
                    }
                    1 => {
                        table.remove_grant(&key, token);
                        if model.grants.get(&key).is_some_and(|l| l.token == token) {
                            model.grants.remove(&key);
                        }
                    }
                    2 => {
                        table.insert_session(&id, ttl, None, now);
                        let lease = Model::lease(0, ttl, now + ms(ttl));
                        model.sessions.insert(id.clone(), lease);
                    }
                    3 => {
                        table.remove_session(&id);
                        model.sessions.remove(&id);
                    }
                    4 => {
                        table.restart_all(now);
                        model.restart_all(now);
                    }
                    5 if model.reconcile_pending => {
                        let grants: Vec<Grant> = (0..6)
                            .filter_map(|k| {
                                let token = rng.gen_range(1..=3);
                                let ttl = ttls[rng.gen_range(0..ttls.len())];
                                rng.gen_bool(0.5)
                                    .then(|| grant(&format!("k{k}"), token, ttl))
                            })
                            .collect();
                        let sessions: Vec<(String, u64)> = (0..5)
                            .filter(|_| rng.gen_bool(0.5))
                            .map(|s| (format!("s{s}"), ttl))
                            .collect();
                        let seen = table.begin_reconcile();
                        for g in &grants {
                            table.reconcile_grant(&g.key, g.token, g.ttl_ms);
                        }
                        for (id, ttl_ms) in &sessions {
                            table.reconcile_session(id, *ttl_ms, None);
                        }
                        table.finish_reconcile(seen);
                        model.reconcile(&grants, &sessions);
                    }
                    6 => assert_eq!(
                        table.renew_grant(&key, token, ttl, now),
                        model.renew_grant(&key, token, ttl, now),
                        "seed {seed} step {step}: renew {key} {token}"
                    ),
                    7 => assert_eq!(
                        table.restart_session(&id, now),
                        model.restart_session(&id, now),
                        "seed {seed} step {step}: heartbeat {id}"
                    ),
                    8 if !model.reconcile_pending => {
                        let max = rng.gen_range(0..=4);
                        let margin = ms([0, 50][rng.gen_range(0..2)]);
                        assert_eq!(
                            table.take_lapsed(max, margin, now),
                            model.take_lapsed(max, margin, now),
                            "seed {seed} step {step}: take_lapsed({max})"
                        );
                    }
                    9 => {
                        table.grant_expiry_failed(&key, token);
                        if let Some(l) = model.grants.get_mut(&key)
                            && l.token == token
                        {
                            l.expiring = false;
                        }
                    }
                    10 => {
                        table.session_expiry_failed(&id);
                        if let Some(l) = model.sessions.get_mut(&id) {
                            l.expiring = false;
                        }
                    }
                    _ => {}
                }
                assert_same(&table, &model, &format!("seed {seed} step {step} op {op}"));
            }
        }
    }

    /// Not an assertion on speed: prints what one idle `take_lapsed` costs with many leases,
    /// against the full scan it replaced (the old loop over a `HashMap`), and checks both find
    /// nothing and then the same number once everything lapsed; and what a promote costs now
    /// against the walk it replaced. 1M leases in a release build
    /// (`cargo test --release -p lockd --lib idle_take_lapsed -- --nocapture`), fewer in a
    /// debug build so the ordinary test run stays quick.
    #[test]
    fn idle_take_lapsed_cost_at_many_leases() {
        struct Scanned {
            deadline: Instant,
            expiring: bool,
        }
        let leases: u64 = if cfg!(debug_assertions) {
            20_000
        } else {
            1_000_000
        };
        let t0 = Instant::now();
        let mut table = LeaseTable::new(t0);
        let mut scanned: HashMap<String, Scanned> = HashMap::new();
        for i in 0..leases {
            // Deadlines spread over 10 s, as renewals at different moments leave them.
            let g = grant(&format!("key-{i}"), i + 1, 10_000);
            let at = t0 + ms(i % 10_000);
            table.insert_grant_copied(&g, at);
            let lease = Scanned {
                deadline: at + ms(10_000),
                expiring: false,
            };
            scanned.insert(g.key.clone(), lease);
        }
        let margin = ms(100);
        let idle = t0 + ms(5_000);
        let calls = 10_000u32;
        let started = Instant::now();
        for _ in 0..calls {
            assert!(
                table
                    .take_lapsed(REAP_PER_TICK_MAX, margin, idle)
                    .grants
                    .is_empty()
            );
        }
        let indexed_per_call = started.elapsed() / calls;
        let scans = 5u32;
        let started = Instant::now();
        for _ in 0..scans {
            let mut found = 0;
            for lease in scanned.values_mut() {
                if found >= REAP_PER_TICK_MAX {
                    break;
                }
                if !lease.expiring && idle > lease.deadline + margin {
                    lease.expiring = true;
                    found += 1;
                }
            }
            assert_eq!(found, 0);
        }
        let scan_per_call = started.elapsed() / scans;
        println!(
            "take_lapsed, {leases} leases, none lapsed: deadline index {indexed_per_call:?} \
             a call, full scan {scan_per_call:?} a call"
        );
        // The price of the index: each renewal (and heartbeat) moves an entry in the tree.
        let renewals = 100_000u64;
        let at = t0 + ms(6_000);
        let started = Instant::now();
        for i in 0..renewals {
            let key = format!("key-{}", (i * 7_919) % leases);
            let renewed = table.renew_grant(&key, (i * 7_919) % leases + 1, 10_000, at);
            assert!(matches!(renewed, RenewCheck::Extended { .. }));
        }
        let indexed_renew = started.elapsed() / renewals as u32;
        let started = Instant::now();
        for i in 0..renewals {
            let key = format!("key-{}", (i * 7_919) % leases);
            let lease = scanned.get_mut(&key).expect("inserted");
            lease.deadline = at + ms(10_000);
        }
        let map_renew = started.elapsed() / renewals as u32;
        println!(
            "renew_grant, {leases} leases: with the index {indexed_renew:?}, map only {map_renew:?}"
        );
        table.check_invariants();
        // A promote: O(1) now; the walk it replaced rewrote every deadline and rebuilt the index.
        let promote = t0 + ms(20_000);
        let started = Instant::now();
        table.restart_all(promote);
        let lazy = started.elapsed();
        let started = Instant::now();
        for lease in scanned.values_mut() {
            lease.deadline = promote + ms(10_000);
        }
        let rebuilt: BTreeSet<(Instant, &str)> = scanned
            .iter()
            .map(|(k, l)| (l.deadline, k.as_str()))
            .collect();
        let walk = started.elapsed();
        assert_eq!(rebuilt.len(), leases as usize);
        println!("promote, {leases} leases: lazy restart {lazy:?}, walk and rebuild {walk:?}");
        let all = promote + ms(30_000);
        let mut taken = 0;
        loop {
            let lapsed = table.take_lapsed(REAP_PER_TICK_MAX, margin, all);
            taken += lapsed.grants.len();
            if !lapsed.more {
                break;
            }
        }
        assert_eq!(taken, REAP_PER_TICK_MAX);
        table.check_invariants();
    }

    /// Resident bytes of this process (`VmRSS` in /proc/self/status), if the system says.
    fn resident_bytes() -> Option<u64> {
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib * 1024)
    }

    /// Not an assertion on size: prints what the table costs per grant lease (keys as W5 names
    /// them, 32-character session ids, owner ids shared by 1,000 sessions) and per session lease,
    /// measured as the growth of this process's resident memory. 1M grant leases in a release
    /// build (`cargo test --release -p lockd --lib lease_table_memory -- --nocapture`), fewer
    /// in a debug build.
    #[test]
    fn lease_table_memory_per_lease() {
        let leases: u64 = if cfg!(debug_assertions) {
            20_000
        } else {
            1_000_000
        };
        let sessions: u64 = leases / 10;
        let t0 = Instant::now();
        let before = resident_bytes();
        let mut table = LeaseTable::new(t0);
        for i in 0..leases {
            let session = i % 1_000;
            let g = Grant {
                key: format!("w5/{session:04}/{i:07}"),
                owner_id: format!("owner-{session:04}"),
                session_id: format!("{session:032x}"),
                request_id: i,
                token: i + 1,
                ttl_ms: 30_000,
                acquired_at_ms: 0,
                expires_at_ms: 30_000,
            };
            table.insert_grant_copied(&g, t0 + ms(i % 10_000));
        }
        let grants = resident_bytes();
        for i in 0..sessions {
            table.insert_session(&format!("{i:032x}"), 30_000, None, t0 + ms(i % 10_000));
        }
        let all = resident_bytes();
        if let (Some(before), Some(grants), Some(all)) = (before, grants, all) {
            println!(
                "lease table: {leases} grant leases {} bytes each, {sessions} session leases {} bytes each (resident growth)",
                grants.saturating_sub(before) / leases,
                all.saturating_sub(grants) / sessions,
            );
        }
        assert_eq!(table.counts(), (leases as usize, sessions as usize));
    }
}
