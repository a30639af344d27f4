//! `LockTable::check_invariants`: the rules the lock table must keep after every apply, checked
//! from scratch (openraft's `Validate` for `RaftState` is the model). Reads the table only;
//! never repairs anything — a violation is a bug in `apply`, reported with the key or session.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::Arc;

use super::LockTable;
use super::Session;
use super::chunked::Cursor;
use super::held::Holder;

/// A session as the check walks it: its holder and its state.
type Slot<'a> = (&'a Arc<Holder>, &'a Session);

/// A session's address, its holder's: its identity while the table is borrowed (one holder per
/// live session), cheaper to sort and compare than its id.
fn session_address(holder: &Arc<Holder>) -> usize {
    Arc::as_ptr(holder) as usize
}

/// A broken lock-table invariant: which rule, and the key or session that breaks it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvariantViolation {
    /// The rule, e.g. `"one holder per key"`.
    pub invariant: &'static str,
    /// What breaks it, naming the key, session or token.
    pub detail: String,
}

impl fmt::Display for InvariantViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invariant \"{}\" broken: {}",
            self.invariant, self.detail
        )
    }
}

impl std::error::Error for InvariantViolation {}

fn broken(invariant: &'static str, detail: String) -> Result<(), InvariantViolation> {
    Err(InvariantViolation { invariant, detail })
}

macro_rules! ensure {
    ($cond:expr, $invariant:literal, $($detail:tt)+) => {
        if !$cond {
            return broken($invariant, format!($($detail)+));
        }
    };
}

impl LockTable {
    /// Checks every invariant of the table and returns the first one broken:
    ///
    /// - one holder per key, filed under its own key, with the owner of its session;
    /// - the sessions' hash index and their id order hold the same sessions;
    /// - every holder's and every waiter's session is live;
    /// - each session's lock and wait sets agree exactly with the grants and queues;
    /// - no waiter queued twice (same session and key, or same session and request id), none
    ///   on a free key or on a key its own session holds, and the deadline index lists exactly
    ///   the queued waiters;
    /// - every token is at most `last_token` and no two grants share one; the audit log's
    ///   floors increase and are at most `last_token`;
    /// - every bound of the table's own limits (`ApplyLimits`, not the binary's constants)
    ///   holds.
    ///
    /// Costs `O(state · log state)`; `apply` runs it after every command in debug builds.
    pub fn check_invariants(&self) -> Result<(), InvariantViolation> {
        let limits = &self.limits;
        let count = |n: u32| n as usize;
        ensure!(
            self.sessions.len() <= count(limits.sessions_max),
            "sessions within SESSIONS_MAX",
            "{} sessions",
            self.sessions.len()
        );
        // Sorted and compared once at the end: a million grants are checked on every snapshot
        // install, and a sorted `Vec` of their tokens is far cheaper to build than a set.
        let mut tokens = Vec::with_capacity(self.grants.len());
        // Every grant's `(session, request id)`, the session as its entry's address, sorted
        // below: no two acquires of a session share a request id.
        let mut acquires: Vec<(usize, u64)> = Vec::with_capacity(self.grants.len());
        // A grant whose holder is its session's finds the session by the holder's address
        // and its key at the next place of that session's lock set (grants and lock sets are
        // both in key order): no search by id or key for each of a million grants. Any other
        // grant is looked up by id and searched for.
        let Some(slots): Option<Vec<Slot<'_>>> = self.sessions.checked_in_order() else {
            return broken(
                "the session index lists every session",
                "the hash index and the id order of the sessions disagree".to_string(),
            );
        };
        let by_holder: HashMap<*const Holder, usize> = slots
            .iter()
            .enumerate()
            .map(|(i, (holder, _))| (Arc::as_ptr(holder), i))
            .collect();
        let mut next_key = vec![Cursor::default(); slots.len()];
        for (key, grant) in self.grants.iter() {
            ensure!(
                grant.key() == key,
                "one holder per key",
                "grant of key {} filed under key {key}",
                grant.key()
            );
            ensure!(
                grant.token >= 1 && grant.token <= self.last_token,
                "every token is issued",
                "key {key} holds token {} but last_token is {}",
                grant.token,
                self.last_token
            );
            tokens.push(grant.token);
            let (entry, listed) = match by_holder.get(&Arc::as_ptr(grant.holder())) {
                Some(&i) => {
                    let listed = slots[i].1.locks.holds_from(key, &mut next_key[i]);
                    (slots[i], listed)
                }
                None => {
                    let Some(entry) = self.sessions.entry(grant.session_id()) else {
                        return broken(
                            "every holder's session is live",
                            format!(
                                "key {key} is held by unknown session {}",
                                grant.session_id()
                            ),
                        );
                    };
                    (entry, entry.1.locks.contains(key))
                }
            };
            acquires.push((session_address(entry.0), grant.request_id));
            ensure!(
                listed,
                "session lock sets agree with grants",
                "key {key} is held by session {} whose lock set lacks it",
                grant.session_id()
            );
            ensure!(
                entry.1.owner_id == grant.owner_id(),
                "grants carry their session's owner",
                "key {key} names owner {} but session {} is owner {}",
                grant.owner_id(),
                grant.session_id(),
                entry.1.owner_id
            );
        }

        tokens.sort_unstable();
        if let Some(pair) = tokens.windows(2).find(|pair| pair[0] == pair[1]) {
            let token = pair[0];
            let keys: Vec<&str> = self
                .grants
                .iter()
                .filter(|(_, g)| g.token == token)
                .map(|(key, _)| key)
                .collect();
            return broken(
                "no two grants share a token",
                format!("token {token} is held twice (keys {})", keys.join(", ")),
            );
        }

        acquires.sort_unstable();
        if let Some(pair) = acquires.windows(2).find(|pair| pair[0] == pair[1]) {
            let (address, request_id) = pair[0];
            let id = slots
                .iter()
                .find(|(holder, _)| session_address(holder) == address)
                .map_or("?", |(holder, _)| holder.session_id.as_str());
            return broken(
                "no waiter queued twice",
                format!("session {id} has two acquires with request id {request_id}"),
            );
        }
        // Every grant is in its session's lock set (above), so the lock sets list exactly the
        // grants when they are as many: only then is each listed key looked up, to name it.
        let listed: usize = slots.iter().map(|(_, s)| s.locks.len()).sum();
        if listed != self.grants.len() {
            for &(holder, session) in &slots {
                let id = holder.session_id.as_str();
                for key in session.locks.iter() {
                    if self.grants.get(key).is_none_or(|g| g.session_id() != id) {
                        return broken(
                            "session lock sets agree with grants",
                            format!("session {id} lists key {key} which it does not hold"),
                        );
                    }
                }
            }
        }

        let mut waiter_total = 0usize;
        for (key, queue) in self.queues.iter() {
            ensure!(
                !queue.is_empty(),
                "no empty queue is kept",
                "key {key} has an empty queue"
            );
            let Some(grant) = self.grants.get(key) else {
                return broken(
                    "waiters only queue on held keys",
                    format!("key {key} is free but has {} waiters", queue.len()),
                );
            };
            ensure!(
                queue.len() <= count(limits.waiters_per_key_max),
                "waiters per key within WAITERS_PER_KEY_MAX",
                "key {key} has {} waiters",
                queue.len()
            );
            let mut seen = BTreeSet::new();
            for waiter in queue {
                waiter_total += 1;
                ensure!(
                    seen.insert(waiter.session_id.as_str()),
                    "no waiter queued twice",
                    "session {} waits twice on key {key}",
                    waiter.session_id
                );
                ensure!(
                    waiter.session_id != grant.session_id(),
                    "a holder does not wait on its own key",
                    "session {} holds key {key} and waits on it",
                    waiter.session_id
                );
                let Some(session) = self.sessions.get(&waiter.session_id) else {
                    return broken(
                        "every waiter's session is live",
                        format!("unknown session {} waits on key {key}", waiter.session_id),
                    );
                };
                ensure!(
                    session.waits.get(key) == Some(&waiter.request_id),
                    "session wait sets agree with queues",
                    "session {} waits on key {key} with request {} but its wait set says {:?}",
                    waiter.session_id,
                    waiter.request_id,
                    session.waits.get(key)
                );
                ensure!(
                    self.wait_deadlines.contains(&(
                        waiter.deadline_ms,
                        waiter.session_id.clone(),
                        key.clone()
                    )),
                    "the deadline index lists every waiter",
                    "waiter of session {} on key {key} (deadline {}) is not indexed",
                    waiter.session_id,
                    waiter.deadline_ms
                );
            }
        }
        ensure!(
            self.wait_deadlines.len() == waiter_total,
            "the deadline index lists every waiter",
            "{} index entries for {waiter_total} waiters",
            self.wait_deadlines.len()
        );

        for &(holder, session) in &slots {
            let id = holder.session_id.as_str();
            let mut request_ids = BTreeSet::new();
            for (key, request_id) in &session.waits {
                ensure!(
                    self.queues
                        .get(key)
                        .is_some_and(|q| q.iter().any(|w| w.session_id == *id)),
                    "session wait sets agree with queues",
                    "session {id} lists a wait on key {key} that is not queued"
                );
                ensure!(
                    request_ids.insert(*request_id)
                        && acquires
                            .binary_search(&(session_address(holder), *request_id))
                            .is_err(),
                    "no waiter queued twice",
                    "session {id} has two acquires with request id {request_id}"
                );
            }
            ensure!(
                session.locks.len() + session.waits.len() <= count(limits.locks_per_session_max),
                "locks per session within LOCKS_PER_SESSION_MAX",
                "session {id} holds {} and waits for {}",
                session.locks.len(),
                session.waits.len()
            );
            ensure!(
                session.waits.len() <= count(limits.waits_per_session_max),
                "waits per session within WAITS_PER_SESSION_MAX",
                "session {id} waits on {} keys",
                session.waits.len()
            );
            ensure!(
                session.answers.len() <= count(limits.request_window),
                "request window within REQUEST_WINDOW",
                "session {id} remembers {} answers",
                session.answers.len()
            );
        }

        ensure!(
            self.revocations.len() <= count(limits.audit_log_max),
            "audit log within AUDIT_LOG_MAX",
            "{} revocations",
            self.revocations.len()
        );
        let mut floor = 0;
        for rev in self.revocations.iter() {
            ensure!(
                rev.new_token_floor > floor && rev.new_token_floor <= self.last_token,
                "token floors only grow",
                "revocation of key {} has floor {} after floor {floor} (last_token {})",
                rev.key,
                rev.new_token_floor,
                self.last_token
            );
            floor = rev.new_token_floor;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    //! `check_invariants` must be able to fail: each test breaks one rule by hand (which `apply`
    //! never does) and expects that rule, and the key or session, to be named.

    use super::*;
    use crate::command::{Command, Event};

    fn table() -> LockTable {
        let mut t = LockTable::new();
        let mut events = Vec::new();
        for s in ["s1", "s2"] {
            t.apply(
                1000,
                Command::OpenSession {
                    session_id: s.into(),
                    owner_id: format!("owner-{s}"),
                    ttl_ms: 10_000,
                },
                &mut events,
            );
        }
        t.apply(
            1000,
            Command::Acquire {
                session_id: "s1".into(),
                request_id: 1,
                key: "a".into(),
                ttl_ms: 5000,
                wait_ms: 0,
            },
            &mut events,
        );
        t.apply(
            1000,
            Command::Acquire {
                session_id: "s2".into(),
                request_id: 1,
                key: "a".into(),
                ttl_ms: 5000,
                wait_ms: 60_000,
            },
            &mut events,
        );
        assert!(matches!(events.last(), Some(Event::Granted { .. })));
        t.check_invariants()
            .expect("a table built by apply is valid");
        t
    }

    /// The rule `t` breaks, as the check names it. A grant put in by hand has a holder of its
    /// own, which the check finds its session for by id; with every holder shared with its
    /// session's (as after a decode), the check finds the sessions by holder and the keys by
    /// position instead: both ways must name the same rule, key and session.
    fn broken_rule(t: &LockTable) -> (&'static str, String) {
        let v = t
            .check_invariants()
            .expect_err("the corruption is detected");
        let mut shared = t.clone();
        shared.share_holders();
        let same = shared
            .check_invariants()
            .expect_err("the corruption is detected with the holders shared");
        assert_eq!(same, v, "both ways of finding a grant's session agree");
        let shown = v.to_string();
        (v.invariant, shown)
    }

    #[test]
    fn a_token_above_the_floor_is_caught() {
        let mut t = table();
        t.last_token = 0;
        let (rule, shown) = broken_rule(&t);
        assert_eq!(rule, "every token is issued");
        assert!(shown.contains("key a"), "{shown}");
    }

    #[test]
    fn two_grants_with_one_token_are_caught() {
        let mut t = table();
        let mut copy = t.grants.get("a").expect("held").to_grant();
        copy.key = "b".into();
        t.grants.insert(copy.into());
        t.sessions
            .get_mut("s1")
            .expect("live")
            .locks
            .insert("b".into());
        assert_eq!(broken_rule(&t).0, "no two grants share a token");
    }

    /// Two acquires of one session with one request id, both granted or one granted and one
    /// waiting, are caught and the session named.
    #[test]
    fn two_acquires_with_one_request_id_are_caught() {
        for (session, key) in [("s1", "b"), ("s2", "c")] {
            let mut t = table();
            let mut copy = t.grants.get("a").expect("held").to_grant();
            t.last_token += 1;
            copy.token = t.last_token;
            copy.key = key.into();
            copy.session_id = session.into();
            copy.owner_id = format!("owner-{session}");
            t.grants.insert(copy.into());
            t.sessions
                .get_mut(session)
                .expect("live")
                .locks
                .insert(key.into());
            let (rule, shown) = broken_rule(&t);
            assert_eq!(rule, "no waiter queued twice", "{shown}");
            assert!(shown.contains(session), "{shown}");
        }
    }

    #[test]
    fn a_holder_without_a_session_is_caught() {
        let mut t = table();
        t.sessions.remove("s1");
        let (rule, shown) = broken_rule(&t);
        assert_eq!(rule, "every holder's session is live");
        assert!(shown.contains("s1"), "{shown}");
    }

    #[test]
    fn a_session_missing_from_the_id_order_is_caught() {
        let mut t = table();
        t.sessions.forget_order_of("s2");
        assert_eq!(broken_rule(&t).0, "the session index lists every session");
    }

    #[test]
    fn a_waiter_on_a_free_key_is_caught() {
        let mut t = table();
        t.grants.remove("a");
        t.sessions.get_mut("s1").expect("live").locks.remove("a");
        assert_eq!(broken_rule(&t).0, "waiters only queue on held keys");
    }

    #[test]
    fn a_session_lock_set_out_of_step_is_caught() {
        let mut t = table();
        t.sessions
            .get_mut("s2")
            .expect("live")
            .locks
            .insert("a".into());
        let (rule, shown) = broken_rule(&t);
        assert_eq!(rule, "session lock sets agree with grants");
        assert!(shown.contains("s2") && shown.contains("key a"), "{shown}");
    }

    /// A grant that shares its session's holder (as every grant applied does) but is missing
    /// from the session's lock set is caught, whatever else the set lists.
    #[test]
    fn a_grant_missing_from_its_sessions_lock_set_is_caught() {
        let mut t = table();
        let locks = &mut t.sessions.get_mut("s1").expect("live").locks;
        locks.remove("a");
        locks.insert("0".into());
        assert!(
            Arc::ptr_eq(
                t.grants.get("a").expect("held").holder(),
                t.sessions.entry("s1").expect("live").0
            ),
            "the grant shares its session's holder"
        );
        let (rule, shown) = broken_rule(&t);
        assert_eq!(rule, "session lock sets agree with grants");
        assert!(shown.contains("s1") && shown.contains("key a"), "{shown}");
    }

    #[test]
    fn a_waiter_queued_twice_is_caught() {
        let mut t = table();
        let again = t.queues["a"][0].clone();
        t.queues
            .make_mut()
            .get_mut("a")
            .expect("queued")
            .push_back(again);
        assert_eq!(broken_rule(&t).0, "no waiter queued twice");
    }

    #[test]
    fn an_unindexed_waiter_is_caught() {
        let mut t = table();
        t.wait_deadlines.make_mut().clear();
        assert_eq!(broken_rule(&t).0, "the deadline index lists every waiter");
    }
}
