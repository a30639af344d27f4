//! What one session knows, as plain data: whether it is open, until when it is alive, which
//! grants it holds until when, which it lost, and who to tell.
//!
//! Owns every *change* of that knowledge and the rules that go with it — a lost grant stays
//! lost, a grant is reported lost once, a late answer after the session ended changes
//! nothing, a grant is held until the earlier of its own and the session's deadline. It does
//! no IO, reads no clock (callers pass `now` and send instants) and spawns nothing: the
//! methods answer what the caller must do next (abort a task, fire listeners), so every rule
//! is unit-tested with exact instants. `SessionInner` keeps it behind a mutex.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use lock_api::{LockError, LockHandle};
use tokio::task::AbortHandle;

/// Heartbeats and keep-alive renewals go every `ttl / RENEW_FRACTION`: a third of the lease,
/// so two consecutive attempts can fail (or a failover can happen) before the lease runs out.
pub const RENEW_FRACTION: u32 = 3;

/// How many lost grants a session remembers, so that `check_still_held` on a handle whose loss
/// was reported by the server answers `LockLost` even though the handle's own deadline has not
/// passed. Bounded because a long-lived session may lose many grants; past this, the oldest are
/// forgotten and only their (passed, or soon passing) deadlines speak for them.
const LOST_REMEMBERED_MAX: usize = 1024;

/// A lost-lock listener (see `LockClientSession::on_lock_lost`).
pub(super) type Listener = Arc<dyn Fn(&LockHandle) + Send + Sync + 'static>;

/// `(key, fencing token)`: one grant. A token is unique across the cluster, the key makes
/// the pair readable.
pub(super) type GrantId = (String, u64);

/// The id of `handle`'s grant.
pub(super) fn grant_id(handle: &LockHandle) -> GrantId {
    (handle.key.clone(), handle.fencing_token)
}

/// Whether the session can still be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Life {
    Open,
    /// Closed, dropped or detached by the caller.
    Closed,
    /// The server declared it dead, or its local deadline passed.
    Dead {
        /// Why, for errors.
        reason: String,
        /// The server itself said so (then it holds nothing of the session any more).
        by_server: bool,
    },
}

/// One grant the session holds.
struct Held {
    /// The latest handle of this grant (renewals replace it).
    handle: LockHandle,
    /// When the next renewal is due: a third of the TTL after the request that produced
    /// `handle` was sent. Stored when the answer arrives, because that send instant cannot be
    /// recovered from the handle.
    renew_at: Instant,
    keep_alive: Option<AbortHandle>,
}

/// A grant just marked lost: the caller stops its keep-alive and calls the listeners.
pub(super) struct Lost {
    /// The grant's latest handle, as the listeners receive it.
    pub(super) handle: LockHandle,
    pub(super) listeners: Vec<Listener>,
    pub(super) keep_alive: Option<AbortHandle>,
}

/// What the watchdog must do at `now` (see [`SessionState::watch`]).
pub(super) struct Watch {
    /// The session's own deadline passed: it is dead.
    pub(super) session_passed: bool,
    /// Grants whose own deadline passed.
    pub(super) due: Vec<LockHandle>,
    /// The earliest deadline still ahead: when to look again.
    pub(super) next: Instant,
}

/// The session's knowledge (see the module doc).
pub(super) struct SessionState {
    life: Life,
    /// The session's own local deadline: the instant before the last answered heartbeat (or
    /// the open) was sent, plus the session TTL, minus the safety margin. Every grant of the
    /// session is gone once the session is, so a handle is held only until
    /// `min(handle deadline, session deadline)`.
    deadline: Instant,
    held: HashMap<GrantId, Held>,
    lost: HashSet<GrantId>,
    lost_order: VecDeque<GrantId>,
    listeners: Vec<Listener>,
}

impl SessionState {
    /// An open session alive until `deadline`, holding nothing.
    pub(super) fn new(deadline: Instant) -> Self {
        Self {
            life: Life::Open,
            deadline,
            held: HashMap::new(),
            lost: HashSet::new(),
            lost_order: VecDeque::new(),
            listeners: Vec::new(),
        }
    }

    pub(super) fn life(&self) -> &Life {
        &self.life
    }

    pub(super) fn is_open(&self) -> bool {
        self.life == Life::Open
    }

    /// `Ok` while open; otherwise the error every call on an ended session answers.
    pub(super) fn check_open(&self, session_id: &str) -> Result<(), LockError> {
        match &self.life {
            Life::Open => Ok(()),
            Life::Closed => Err(LockError::invalid(format!(
                "session {session_id} is closed; open a new session"
            ))),
            Life::Dead { reason, .. } => Err(LockError::invalid(format!(
                "session {session_id} is dead ({reason}); its locks are gone — open a new session"
            ))),
        }
    }

    /// The session's local deadline while it is open (the next heartbeat must be answered
    /// before it); `None` once it is closed or dead.
    pub(super) fn heartbeat_deadline(&self) -> Option<Instant> {
        self.is_open().then_some(self.deadline)
    }

    /// A heartbeat was answered: the session lives until `deadline`. `false` (and no change)
    /// if the session already ended, so a late answer never revives it.
    pub(super) fn heartbeat_answered(&mut self, deadline: Instant) -> bool {
        if !self.is_open() {
            return false;
        }
        self.deadline = deadline;
        true
    }

    pub(super) fn add_listener(&mut self, listener: Listener) {
        self.listeners.push(listener);
    }

    /// Records (or refreshes) a held grant from the answer to a request sent at `sent_at`.
    /// A grant already known lost stays lost and an ended session tracks nothing: a late
    /// renewal answer never revives either. An older answer than the one recorded (an
    /// earlier deadline) is ignored. `true` if something changed.
    pub(super) fn track(&mut self, handle: &LockHandle, sent_at: Instant) -> bool {
        let id = grant_id(handle);
        if self.lost.contains(&id) || !self.is_open() {
            return false;
        }
        let renew_at = sent_at + handle.ttl / RENEW_FRACTION;
        match self.held.get_mut(&id) {
            Some(held) => {
                if handle.client_deadline <= held.handle.client_deadline {
                    return false;
                }
                held.handle = handle.clone();
                held.renew_at = renew_at;
            }
            None => {
                self.held.insert(
                    id,
                    Held {
                        handle: handle.clone(),
                        renew_at,
                        keep_alive: None,
                    },
                );
            }
        }
        true
    }

    /// Forgets a grant the caller released (no listener fires); answers its keep-alive task,
    /// to stop.
    pub(super) fn untrack(&mut self, id: &GrantId) -> Option<AbortHandle> {
        self.held.remove(id).and_then(|held| held.keep_alive)
    }

    /// Marks `handle`'s grant lost. `None` if it already was: a grant is reported lost at
    /// most once.
    pub(super) fn mark_lost(&mut self, handle: &LockHandle) -> Option<Lost> {
        let id = grant_id(handle);
        if self.lost.contains(&id) {
            return None;
        }
        let held = self.held.remove(&id);
        self.remember_lost(id);
        let (handle, keep_alive) = match held {
            Some(held) => (held.handle, held.keep_alive),
            None => (handle.clone(), None),
        };
        Some(Lost {
            handle,
            listeners: self.listeners.clone(),
            keep_alive,
        })
    }

    fn remember_lost(&mut self, id: GrantId) {
        if self.lost.insert(id.clone()) {
            self.lost_order.push_back(id);
            if self.lost_order.len() > LOST_REMEMBERED_MAX
                && let Some(oldest) = self.lost_order.pop_front()
            {
                self.lost.remove(&oldest);
            }
        }
    }

    /// Ends the open session as dead and answers the handles it held, each of which the
    /// caller must then [`mark_lost`](Self::mark_lost). `None` if it had already ended.
    pub(super) fn die(&mut self, reason: String, by_server: bool) -> Option<Vec<LockHandle>> {
        if !self.is_open() {
            return None;
        }
        self.life = Life::Dead { reason, by_server };
        Some(self.held.values().map(|h| h.handle.clone()).collect())
    }

    /// Ends the session by the caller's choice (close, drop, detach) and forgets every grant
    /// without reporting it lost; answers the keep-alive tasks to stop. A dead session stays
    /// dead (its reason still answers later calls).
    pub(super) fn finish(&mut self) -> Vec<AbortHandle> {
        if self.is_open() {
            self.life = Life::Closed;
        }
        self.held
            .drain()
            .filter_map(|(_, held)| held.keep_alive)
            .collect()
    }

    /// The instant until which `handle`'s grant is held as far as this process knows: the
    /// latest tracked renewal's deadline, capped by the session's deadline. `Err(LockLost)` if
    /// the grant is known lost, or the session is dead.
    pub(super) fn effective_deadline(&self, handle: &LockHandle) -> Result<Instant, LockError> {
        let id = grant_id(handle);
        if self.lost.contains(&id) || matches!(self.life, Life::Dead { .. }) {
            return Err(LockError::LockLost {
                key: handle.key.clone(),
            });
        }
        let own = self
            .held
            .get(&id)
            .map(|h| h.handle.client_deadline)
            .unwrap_or(handle.client_deadline)
            .max(handle.client_deadline);
        Ok(own.min(self.deadline))
    }

    /// The newest handle of `handle`'s grant, `handle` itself if the session does not track it.
    pub(super) fn latest(&self, handle: &LockHandle) -> LockHandle {
        self.held
            .get(&grant_id(handle))
            .map(|h| h.handle.clone())
            .unwrap_or_else(|| handle.clone())
    }

    /// The grant's current handle and when its next renewal is due; `None` once it is no
    /// longer held (released, lost, or the session ended).
    pub(super) fn renewal(&self, id: &GrantId) -> Option<(LockHandle, Instant)> {
        self.held.get(id).map(|h| (h.handle.clone(), h.renew_at))
    }

    /// Makes sure `handle`'s grant has a keep-alive task, calling `spawn` to start one if it
    /// has none. A grant the session did not track yet is tracked from `handle`, due for
    /// renewal at `now` (its send instant is unknown, and renewing early is always safe).
    /// `Err(LockLost)` for a grant known lost, the ended-session error once ended.
    pub(super) fn ensure_keep_alive(
        &mut self,
        handle: &LockHandle,
        now: Instant,
        session_id: &str,
        spawn: impl FnOnce() -> AbortHandle,
    ) -> Result<(), LockError> {
        let id = grant_id(handle);
        if self.lost.contains(&id) {
            return Err(LockError::LockLost {
                key: handle.key.clone(),
            });
        }
        self.check_open(session_id)?;
        let held = self.held.entry(id).or_insert_with(|| Held {
            handle: handle.clone(),
            renew_at: now,
            keep_alive: None,
        });
        if held.keep_alive.is_none() {
            held.keep_alive = Some(spawn());
        }
        Ok(())
    }

    /// What has passed by `now`: the session's deadline, the grants whose deadline passed,
    /// and the next deadline to wait for.
    pub(super) fn watch(&self, now: Instant) -> Watch {
        let mut due = Vec::new();
        let mut next = self.deadline;
        for held in self.held.values() {
            if held.handle.client_deadline <= now {
                due.push(held.handle.clone());
            } else {
                next = next.min(held.handle.client_deadline);
            }
        }
        Watch {
            session_passed: self.deadline <= now,
            due,
            next,
        }
    }
}

/// A handle of session `s1` for tests, with the given deadline.
#[cfg(test)]
pub(super) fn test_handle(
    key: &str,
    token: u64,
    ttl: std::time::Duration,
    deadline: Instant,
) -> LockHandle {
    LockHandle {
        key: key.to_owned(),
        owner_id: "owner".into(),
        session_id: "s1".into(),
        fencing_token: token,
        ttl,
        client_deadline: deadline,
        server_expiry: std::time::SystemTime::UNIX_EPOCH,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const TTL: Duration = Duration::from_secs(9);

    fn counting_listener(state: &mut SessionState) -> Arc<std::sync::atomic::AtomicUsize> {
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = Arc::clone(&calls);
        state.add_listener(Arc::new(move |_| {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }));
        calls
    }

    #[test]
    fn a_renewal_moves_the_deadline_and_the_next_renewal_later() {
        let t0 = Instant::now();
        let mut state = SessionState::new(t0 + Duration::from_secs(60));
        let first = test_handle("k", 7, TTL, t0 + TTL);
        assert!(state.track(&first, t0));
        assert_eq!(state.effective_deadline(&first).unwrap(), t0 + TTL);
        assert_eq!(state.renewal(&grant_id(&first)).unwrap().1, t0 + TTL / 3);

        let sent = t0 + Duration::from_secs(3);
        let renewed = test_handle("k", 7, TTL, sent + TTL);
        assert!(state.track(&renewed, sent));
        // The old handle is held until the renewed deadline: the session counts renewals.
        assert_eq!(state.effective_deadline(&first).unwrap(), sent + TTL);
        assert_eq!(state.renewal(&grant_id(&first)).unwrap().1, sent + TTL / 3);

        // A late, older answer does not move the deadline back.
        assert!(!state.track(&first, t0));
        assert_eq!(state.effective_deadline(&first).unwrap(), sent + TTL);
        assert_eq!(state.latest(&first).client_deadline, sent + TTL);
    }

    #[test]
    fn a_grant_is_held_no_longer_than_its_session() {
        let t0 = Instant::now();
        let mut state = SessionState::new(t0 + Duration::from_secs(2));
        let handle = test_handle("k", 1, TTL, t0 + TTL);
        state.track(&handle, t0);
        assert_eq!(
            state.effective_deadline(&handle).unwrap(),
            t0 + Duration::from_secs(2)
        );
        assert!(state.heartbeat_answered(t0 + Duration::from_secs(30)));
        assert_eq!(state.effective_deadline(&handle).unwrap(), t0 + TTL);
    }

    #[test]
    fn a_lost_grant_is_reported_once_and_never_revived() {
        let t0 = Instant::now();
        let mut state = SessionState::new(t0 + Duration::from_secs(60));
        let handle = test_handle("k", 1, TTL, t0 + TTL);
        state.track(&handle, t0);
        let lost = state.mark_lost(&handle).expect("first loss is reported");
        assert_eq!(lost.handle.fencing_token, 1);
        assert!(state.mark_lost(&handle).is_none());
        // A renewal answer arriving after the loss does not bring the grant back.
        let late = test_handle("k", 1, TTL, t0 + TTL * 2);
        assert!(!state.track(&late, t0 + Duration::from_secs(1)));
        assert!(matches!(
            state.effective_deadline(&late),
            Err(LockError::LockLost { .. })
        ));
    }

    #[test]
    fn death_hands_back_every_grant_once_and_ignores_late_heartbeats() {
        let t0 = Instant::now();
        let mut state = SessionState::new(t0 + Duration::from_secs(6));
        let calls = counting_listener(&mut state);
        for token in 1..=3 {
            state.track(&test_handle("k", token, TTL, t0 + TTL), t0);
        }
        let handles = state.die("test".into(), false).expect("open session dies");
        assert_eq!(handles.len(), 3);
        for handle in &handles {
            let lost = state.mark_lost(handle).expect("each grant is lost once");
            for listener in lost.listeners {
                listener(&lost.handle);
            }
        }
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 3);
        assert!(state.die("again".into(), true).is_none());
        assert!(!state.heartbeat_answered(t0 + Duration::from_secs(60)));
        assert_eq!(state.heartbeat_deadline(), None);
        assert!(state.check_open("s1").is_err());
        assert!(matches!(
            state.life(),
            Life::Dead {
                by_server: false,
                ..
            }
        ));
    }

    #[test]
    fn finishing_forgets_grants_without_reporting_them() {
        let t0 = Instant::now();
        let mut state = SessionState::new(t0 + Duration::from_secs(6));
        let handle = test_handle("k", 1, TTL, t0 + TTL);
        state.track(&handle, t0);
        assert!(state.finish().is_empty());
        assert_eq!(*state.life(), Life::Closed);
        assert!(state.renewal(&grant_id(&handle)).is_none());
        // Closed, not dead: the grant was given up, not lost.
        assert!(state.effective_deadline(&handle).is_ok());
        assert!(!state.track(&handle, t0));
    }

    #[test]
    fn the_watch_reports_passed_deadlines_and_the_next_one() {
        let t0 = Instant::now();
        let mut state = SessionState::new(t0 + Duration::from_secs(20));
        state.track(&test_handle("a", 1, TTL, t0 + Duration::from_secs(5)), t0);
        state.track(&test_handle("b", 2, TTL, t0 + Duration::from_secs(10)), t0);
        let early = state.watch(t0);
        assert!(!early.session_passed && early.due.is_empty());
        assert_eq!(early.next, t0 + Duration::from_secs(5));
        let later = state.watch(t0 + Duration::from_secs(5));
        assert_eq!(later.due.len(), 1);
        assert_eq!(later.next, t0 + Duration::from_secs(10));
        assert!(state.watch(t0 + Duration::from_secs(20)).session_passed);
    }

    #[test]
    fn only_the_newest_lost_grants_are_remembered() {
        let t0 = Instant::now();
        let mut state = SessionState::new(t0 + Duration::from_secs(60));
        let total = u64::try_from(LOST_REMEMBERED_MAX).unwrap() + 1;
        for token in 1..=total {
            state.mark_lost(&test_handle("k", token, TTL, t0 + TTL));
        }
        assert_eq!(state.lost.len(), LOST_REMEMBERED_MAX);
        assert!(!state.lost.contains(&("k".to_owned(), 1)));
        assert!(state.lost.contains(&("k".to_owned(), total)));
    }
}
