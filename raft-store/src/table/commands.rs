//! What each command does to the lock table. Owns the command semantics (validation, limits,
//! idempotent replay, hand-off); must not do IO or read a clock — every time comes from the
//! stamp passed in — and must not read a limit from the binary's constants: every bound comes
//! from the table's replicated [`ApplyLimits`](super::ApplyLimits) (issue 18).

use std::collections::VecDeque;
use std::sync::Arc;

use lock_api::{LockError, validate};

use super::session::{Session, WindowCheck};
use super::{ApplyLimits, HeldGrant, Holder, LockTable, Waiter};
use crate::command::{Command, Event, FreeCause, Grant, Rejection, Response, Revocation};

/// A short name of a command for assertion messages (a batch's contents may be huge).
#[cfg(debug_assertions)]
pub(super) fn describe(command: &Command) -> String {
    match command {
        Command::Batch(commands) => format!("a Batch of {} commands", commands.len()),
        other => format!("{other:?}"),
    }
}

fn invalid(error: LockError) -> Response {
    let message = match error {
        LockError::InvalidArgument { message } => message,
        other => other.to_string(),
    };
    Response::Rejected(Rejection::InvalidArgument { message })
}

fn invalid_msg(message: String) -> Response {
    Response::Rejected(Rejection::InvalidArgument { message })
}

fn limit(message: String) -> Response {
    Response::Rejected(Rejection::LimitExceeded { message })
}

fn unknown_session(session_id: &str) -> Response {
    Response::Rejected(Rejection::UnknownSession {
        session_id: session_id.to_owned(),
    })
}

fn stale(session_id: &str, request_id: u64) -> Response {
    Response::Rejected(Rejection::StaleRequest {
        session_id: session_id.to_owned(),
        request_id,
    })
}

/// Runs the listed checks in order and turns the first failure into `Rejected(InvalidArgument)`.
macro_rules! check {
    ($($e:expr),+ $(,)?) => {
        $( if let Err(e) = $e { return invalid(e); } )+
    };
}

impl LockTable {
    /// A batch: each command in order with the batch's stamp (D-batch).
    pub(super) fn apply_batch(
        &mut self,
        stamp_ms: u64,
        commands: Vec<Command>,
        events: &mut Vec<Event>,
    ) -> Response {
        let batch_max = self.limits.batch_max;
        if commands.len() > batch_max as usize {
            // Refusing the whole batch (rather than applying a prefix) keeps "a batch changes
            // the state exactly as its commands proposed one by one would" true: a proposer bug
            // is answered on every element and nothing happens.
            let message = format!(
                "a batch holds {} commands; the limit BATCH_MAX is {batch_max}",
                commands.len()
            );
            return Response::Batch(vec![limit(message); commands.len()]);
        }
        Response::Batch(
            commands
                .into_iter()
                .map(|command| self.apply_one(stamp_ms, command, events))
                .collect(),
        )
    }

    /// One command that is not a batch (a nested batch is rejected).
    pub(super) fn apply_one(
        &mut self,
        stamp_ms: u64,
        command: Command,
        events: &mut Vec<Event>,
    ) -> Response {
        self.drop_lapsed_waiters(stamp_ms, events);
        match command {
            Command::OpenSession {
                session_id,
                owner_id,
                ttl_ms,
            } => self.open_session(stamp_ms, session_id, owner_id, None, ttl_ms, events),
            Command::CloseSession { session_id } => {
                self.end_session(stamp_ms, &session_id, false, events)
            }
            Command::ExpireSession { session_id } => {
                self.end_session(stamp_ms, &session_id, true, events)
            }
            Command::Acquire {
                session_id,
                request_id,
                key,
                ttl_ms,
                wait_ms,
            } => self.acquire(
                stamp_ms,
                &session_id,
                request_id,
                key,
                ttl_ms,
                wait_ms,
                events,
            ),
            Command::Release {
                session_id,
                request_id,
                key,
                token,
            } => self.release(stamp_ms, &session_id, request_id, &key, token, events),
            Command::Renew {
                session_id,
                request_id,
                key,
                token,
                ttl_ms,
            } => self.renew(stamp_ms, &session_id, request_id, &key, token, ttl_ms),
            Command::CancelWait {
                session_id,
                request_id,
                key,
                release_if_granted,
            } => self.cancel_wait(
                stamp_ms,
                &session_id,
                request_id,
                &key,
                release_if_granted,
                events,
            ),
            Command::ForceRevoke {
                key,
                operator,
                reason,
                request_id,
            } => self.force_revoke(stamp_ms, key, operator, reason, request_id, events),
            Command::ExpireLock { key, token } => {
                let expired = self.grants.get(&key).is_some_and(|g| g.token == token);
                if expired {
                    self.free(stamp_ms, &key, FreeCause::Expired, events);
                }
                Response::LockExpired { expired }
            }
            Command::Promote => self.promote(stamp_ms, events),
            Command::Batch(_) => invalid_msg("a Batch must not contain a Batch".to_owned()),
            Command::SetLimits { limits } => self.apply_set_limits(limits),
            Command::AsCaller { principal, command } => {
                self.apply_as_caller(stamp_ms, principal, *command, events)
            }
        }
    }

    /// `OpenSession`, bound to `principal` when a caller opened it (`AsCaller`).
    pub(super) fn open_session(
        &mut self,
        stamp_ms: u64,
        session_id: String,
        owner_id: String,
        principal: Option<String>,
        ttl_ms: u64,
        events: &mut Vec<Event>,
    ) -> Response {
        let limits = self.limits;
        check!(
            limits.session_id(&session_id),
            limits.owner_id(&owner_id),
            limits.ttl(ttl_ms)
        );
        if let Some(existing) = self.sessions.get(&session_id) {
            // A retried open (the leader re-proposing after a lost answer) gets the same
            // answer. The same id for another owner is a leader bug, never a reuse.
            if existing.owner_id != owner_id || existing.principal != principal {
                return invalid_msg(format!(
                    "session id {session_id} is already open for another owner"
                ));
            }
            return Response::SessionOpened {
                session_id,
                ttl_ms: existing.ttl_ms,
            };
        }
        let sessions_max = limits.sessions_max;
        if self.sessions.len() >= sessions_max as usize {
            return limit(format!(
                "{} sessions are open; the limit SESSIONS_MAX is {sessions_max}",
                self.sessions.len()
            ));
        }
        events.push(Event::SessionOpened {
            session_id: session_id.clone(),
            ttl_ms,
            principal: principal.clone(),
        });
        self.sessions.insert(
            Holder::new(session_id.clone(), owner_id.clone()),
            Session::new(owner_id, principal, ttl_ms, stamp_ms),
        );
        Response::SessionOpened { session_id, ttl_ms }
    }

    /// `CloseSession` and `ExpireSession`: drop the session's waiters (key order), then release
    /// its grants (key order, each handed off), then report the session ended.
    fn end_session(
        &mut self,
        stamp_ms: u64,
        session_id: &str,
        expired: bool,
        events: &mut Vec<Event>,
    ) -> Response {
        // Removed first, so no hand-off below can pick one of its waiters.
        let Some(session) = self.sessions.remove(session_id) else {
            return Response::SessionClosed { locks_released: 0 };
        };
        for (key, request_id) in &session.waits {
            self.unqueue(key, session_id);
            events.push(Event::WaiterDropped {
                session_id: session_id.to_owned(),
                request_id: *request_id,
                key: key.clone(),
            });
        }
        for key in session.locks.iter() {
            self.free(stamp_ms, key, FreeCause::SessionEnded, events);
        }
        events.push(Event::SessionEnded {
            session_id: session_id.to_owned(),
            expired,
        });
        Response::SessionClosed {
            locks_released: session.locks.len() as u32,
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn acquire(
        &mut self,
        stamp_ms: u64,
        session_id: &str,
        request_id: u64,
        key: String,
        ttl_ms: u64,
        wait_ms: u64,
        events: &mut Vec<Event>,
    ) -> Response {
        let limits = self.limits;
        let window = limits.request_window as usize;
        check!(
            limits.key(&key),
            limits.ttl(ttl_ms),
            limits.max_wait(wait_ms)
        );
        let Some(session) = self.sessions.get(session_id) else {
            return unknown_session(session_id);
        };
        match session.check_window(request_id, window) {
            WindowCheck::Seen(r) => {
                // A retry. A queued acquire is answered with its position now, which is what
                // the retrying client wants to know; granted or dropped ones were settled.
                if let Response::Queued { .. } = r.answer
                    && let Some(position) = self.position_of(session_id, session, request_id)
                {
                    return Response::Queued { position };
                }
                return r.answer.clone();
            }
            WindowCheck::Stale => return stale(session_id, request_id),
            WindowCheck::New => {}
        }
        if let Some(&waiting) = session.waits.get(&key) {
            return invalid_msg(format!(
                "session {session_id} already waits on key {key} (request id {waiting}); \
                 cancel that wait before queueing another"
            ));
        }
        let slots_used = session.locks.len() + session.waits.len();
        let waits = session.waits.len();
        // `Some(true)`: held by this session; `Some(false)`: held by another; `None`: free.
        let held_by_self = self.grants.get(&key).map(|g| g.session_id() == session_id);
        let answer = match held_by_self {
            Some(true) => Response::NotGranted,
            Some(false) if wait_ms == 0 => Response::NotGranted,
            _ if slots_used >= limits.locks_per_session_max as usize => {
                return limit(format!(
                    "session {session_id} holds or waits for {slots_used} locks; the limit \
                     LOCKS_PER_SESSION_MAX is {}",
                    limits.locks_per_session_max
                ));
            }
            None => {
                let grant = self.grant_to(
                    stamp_ms, &key, session_id, request_id, ttl_ms, false, events,
                );
                Response::Granted(grant)
            }
            Some(false) => {
                if waits >= limits.waits_per_session_max as usize {
                    return limit(format!(
                        "session {session_id} waits on {waits} keys; the limit \
                         WAITS_PER_SESSION_MAX is {}",
                        limits.waits_per_session_max
                    ));
                }
                let queued = self.waiter_count(&key) as usize;
                if queued >= limits.waiters_per_key_max as usize {
                    return limit(format!(
                        "key {key} has {queued} waiters; the limit WAITERS_PER_KEY_MAX is \
                         {}",
                        limits.waiters_per_key_max
                    ));
                }
                let deadline_ms = stamp_ms.saturating_add(wait_ms);
                self.wait_deadlines.make_mut().insert((
                    deadline_ms,
                    session_id.to_owned(),
                    key.clone(),
                ));
                if let Some(s) = self.sessions.get_mut(session_id) {
                    s.waits.insert(key.clone(), request_id);
                }
                let queue = self.queues.make_mut().entry(key).or_default();
                queue.push_back(Waiter {
                    session_id: session_id.to_owned(),
                    request_id,
                    ttl_ms,
                    deadline_ms,
                    queued_at_ms: stamp_ms,
                });
                Response::Queued {
                    position: queue.len() as u32,
                }
            }
        };
        self.remember(session_id, request_id, answer.clone());
        answer
    }

    fn release(
        &mut self,
        stamp_ms: u64,
        session_id: &str,
        request_id: u64,
        key: &str,
        token: u64,
        events: &mut Vec<Event>,
    ) -> Response {
        check!(self.limits.key(key), validate::fencing_token(token));
        if let Some(early) = self.replay(session_id, request_id) {
            return early;
        }
        // Compare-and-delete on (key, token) and nothing else (C2 §2.5): the token proves the
        // grant, whichever live session presents it.
        let released = self.grants.get(key).is_some_and(|g| g.token == token);
        if released {
            self.free(stamp_ms, key, FreeCause::Released, events);
        }
        let answer = Response::Released { released };
        self.remember(session_id, request_id, answer.clone());
        answer
    }

    fn renew(
        &mut self,
        stamp_ms: u64,
        session_id: &str,
        request_id: u64,
        key: &str,
        token: u64,
        ttl_ms: u64,
    ) -> Response {
        check!(
            self.limits.key(key),
            validate::fencing_token(token),
            self.limits.ttl(ttl_ms)
        );
        if let Some(early) = self.replay(session_id, request_id) {
            return early;
        }
        let answer = match self.grants.get_mut(key) {
            Some(grant) if grant.token == token => {
                grant.ttl_ms = ttl_ms;
                grant.expires_at_ms = stamp_ms.saturating_add(ttl_ms);
                Response::Renewed(grant.to_grant())
            }
            _ => Response::Lost,
        };
        self.remember(session_id, request_id, answer.clone());
        answer
    }

    /// `CancelWait`: withdraws the waiter of acquire `request_id`, or reports (and optionally
    /// releases) the grant it already got.
    ///
    /// The acquire is found by `(session_id, request_id)` on any key; `key` must name the key it
    /// waits on or holds, else the call is `InvalidArgument`. If the acquire is unknown and its
    /// id is new, the cancel is recorded as a tombstone: the acquire's remembered answer becomes
    /// `NotGranted`, so an `Acquire` with that id that reaches the log after its cancel (a
    /// proposal delayed behind it) is answered `NotGranted` and does nothing.
    fn cancel_wait(
        &mut self,
        stamp_ms: u64,
        session_id: &str,
        request_id: u64,
        key: &str,
        release_if_granted: bool,
        events: &mut Vec<Event>,
    ) -> Response {
        check!(self.limits.key(key));
        let window = self.limits.request_window as usize;
        let Some(session) = self.sessions.get(session_id) else {
            return unknown_session(session_id);
        };
        if let Some(cancelled) = session
            .answers
            .get(&request_id)
            .and_then(|r| r.cancel.clone())
        {
            return cancelled;
        }
        let waiting_on = session
            .waits
            .iter()
            .find(|(_, id)| **id == request_id)
            .map(|(k, _)| k.clone());
        let granted_on = session
            .locks
            .iter()
            .find(|k| {
                self.grants
                    .get(k)
                    .is_some_and(|g| g.request_id == request_id)
            })
            .map(str::to_owned);
        let mismatch = |other: &str, what: &str| {
            invalid_msg(format!(
                "acquire {request_id} of session {session_id} {what} key {other}, not {key}"
            ))
        };
        let (acquire_answer, answer) = if let Some(waited) = waiting_on {
            if waited != key {
                return mismatch(&waited, "waits on");
            }
            self.unqueue(key, session_id);
            if let Some(s) = self.sessions.get_mut(session_id) {
                s.waits.remove(key);
            }
            events.push(Event::WaiterDropped {
                session_id: session_id.to_owned(),
                request_id,
                key: key.to_owned(),
            });
            let answer = Response::WaitCancelled {
                removed: true,
                grant: None,
                released: false,
            };
            (Response::NotGranted, answer)
        } else if let Some(held) = granted_on {
            if held != key {
                return mismatch(&held, "holds");
            }
            let Some(grant) = self.grants.get(key).map(HeldGrant::to_grant) else {
                return mismatch(&held, "holds");
            };
            if release_if_granted {
                self.free(stamp_ms, key, FreeCause::Released, events);
            }
            let answer = Response::WaitCancelled {
                removed: false,
                grant: Some(grant.clone()),
                released: release_if_granted,
            };
            (Response::Granted(grant), answer)
        } else {
            let nothing = Response::WaitCancelled {
                removed: false,
                grant: None,
                released: false,
            };
            match session.check_window(request_id, window) {
                // The acquire already ended (its grant is gone, or it was never granted).
                WindowCheck::Seen(r) => (r.answer.clone(), nothing),
                WindowCheck::Stale => return stale(session_id, request_id),
                WindowCheck::New => (Response::NotGranted, nothing),
            }
        };
        if let Some(s) = self.sessions.get_mut(session_id) {
            s.remember_cancel(request_id, acquire_answer, answer.clone(), window);
        }
        answer
    }

    fn force_revoke(
        &mut self,
        stamp_ms: u64,
        key: String,
        operator: String,
        reason: String,
        request_id: u64,
        events: &mut Vec<Event>,
    ) -> Response {
        let limits = self.limits;
        check!(
            limits.key(&key),
            limits.operator(&operator),
            limits.reason(&reason)
        );
        // A retry of a revoke already applied answers the first outcome and changes nothing.
        // The audit log is the memory: newest first, stopping at the retry window's edge.
        if request_id != 0
            && let Some(first) = self
                .revocations
                .iter()
                .rev()
                .take_while(|r| r.at_ms.saturating_add(limits.revoke_retry_window_ms) >= stamp_ms)
                .find(|r| r.request_id == request_id && r.key == key && r.operator == operator)
        {
            return Response::Revoked(first.clone());
        }
        let previous = self.take_grant(&key);
        if let Some(grant) = &previous {
            events.push(Event::Freed {
                key: key.clone(),
                token: grant.token,
                cause: FreeCause::Revoked,
            });
        }
        // Burn one token even when the key was free: the floor the operator is told about is
        // then always a fresh value, greater than anything a displaced holder may present.
        self.last_token += 1;
        let revocation = Revocation {
            key: key.clone(),
            operator,
            reason,
            previous_owner_id: previous.as_ref().map(|g| g.owner_id().to_owned()),
            previous_token: previous.as_ref().map(|g| g.token),
            new_token_floor: self.last_token,
            at_ms: stamp_ms,
            request_id,
        };
        let revocations = self.revocations.make_mut();
        revocations.push_back(revocation.clone());
        while revocations.len() > limits.audit_log_max as usize {
            revocations.pop_front();
        }
        self.hand_off(stamp_ms, &key, events);
        Response::Revoked(revocation)
    }

    /// `SetLimits`: takes the new limits if they are consistent and the table already keeps
    /// them. The check runs the invariants once (`O(state)`): an operator's rare command, and
    /// the one way to be sure no bound the table relies on is broken from the first apply on.
    fn apply_set_limits(&mut self, limits: ApplyLimits) -> Response {
        if let Err(invalid) = limits.check() {
            return invalid_msg(invalid.to_string());
        }
        let previous = std::mem::replace(&mut self.limits, limits);
        if let Err(violation) = self.check_invariants() {
            self.limits = previous;
            return invalid_msg(format!(
                "the current state exceeds the new limits: {violation}"
            ));
        }
        Response::LimitsSet { limits }
    }

    fn promote(&mut self, stamp_ms: u64, events: &mut Vec<Event>) -> Response {
        for grant in self.grants.values_mut() {
            grant.expires_at_ms = stamp_ms.saturating_add(grant.ttl_ms);
        }
        // Every session alike, so the hash index's order cannot show.
        for (_, session) in self.sessions.sessions_mut_any_order() {
            session.expires_at_ms = stamp_ms.saturating_add(session.ttl_ms);
        }
        events.push(Event::Promoted { stamp_ms });
        Response::Promoted {
            grants: self.grants.len() as u32,
            sessions: self.sessions.len() as u32,
        }
    }

    // ----- helpers -----------------------------------------------------------------------

    /// The idempotency gate of `Release` and `Renew`: an unknown session, a retry (answered
    /// from the window) or a stale id end the command here.
    fn replay(&self, session_id: &str, request_id: u64) -> Option<Response> {
        let Some(session) = self.sessions.get(session_id) else {
            return Some(unknown_session(session_id));
        };
        match session.check_window(request_id, self.limits.request_window as usize) {
            WindowCheck::Seen(r) => Some(r.answer.clone()),
            WindowCheck::Stale => Some(stale(session_id, request_id)),
            WindowCheck::New => None,
        }
    }

    fn remember(&mut self, session_id: &str, request_id: u64, answer: Response) {
        if let Some(s) = self.sessions.get_mut(session_id) {
            s.remember(request_id, answer, self.limits.request_window as usize);
        }
    }

    /// 1-based queue position of the session's waiter for acquire `request_id`.
    fn position_of(&self, session_id: &str, session: &Session, request_id: u64) -> Option<u32> {
        let (key, _) = session.waits.iter().find(|(_, id)| **id == request_id)?;
        let index = self
            .queues
            .get(key)?
            .iter()
            .position(|w| w.session_id == session_id)?;
        Some(index as u32 + 1)
    }

    /// Issues the next token to `session_id` for `key` (which must be free).
    #[allow(clippy::too_many_arguments)]
    fn grant_to(
        &mut self,
        stamp_ms: u64,
        key: &str,
        session_id: &str,
        request_id: u64,
        ttl_ms: u64,
        handed_off: bool,
        events: &mut Vec<Event>,
    ) -> Grant {
        self.last_token += 1;
        // Every caller checked the session is live; a missing one (never) gets ids of its own.
        let holder = self
            .holder_of(session_id)
            .cloned()
            .unwrap_or_else(|| Holder::new(session_id.to_owned(), String::new()));
        let key: Arc<str> = key.into();
        if let Some(s) = self.sessions.get_mut(session_id) {
            s.locks.insert(key.clone());
        }
        let held = HeldGrant::new(
            key.clone(),
            holder,
            request_id,
            self.last_token,
            ttl_ms,
            stamp_ms,
        );
        let grant = held.to_grant();
        self.grants.insert(held);
        events.push(Event::Granted {
            grant: grant.clone(),
            shared_key: key,
            handed_off,
        });
        grant
    }

    /// Removes the grant on `key` and detaches it from its holder's session.
    fn take_grant(&mut self, key: &str) -> Option<HeldGrant> {
        let grant = self.grants.remove(key)?;
        if let Some(s) = self.sessions.get_mut(grant.session_id()) {
            s.locks.remove(key);
        }
        Some(grant)
    }

    /// Ends the grant on `key` for `cause` and hands the key to its next waiter.
    fn free(&mut self, stamp_ms: u64, key: &str, cause: FreeCause, events: &mut Vec<Event>) {
        if let Some(grant) = self.take_grant(key) {
            events.push(Event::Freed {
                key: key.to_owned(),
                token: grant.token,
                cause,
            });
        }
        self.hand_off(stamp_ms, key, events);
    }

    /// Grants the free `key` to the first live waiter of its queue, dropping the dead ones met
    /// on the way. Waiters past their deadline were already dropped at the start of the
    /// command and a session's waiters leave with it, so the skips below are defence in depth:
    /// a waiter that cannot be granted is dropped, never granted.
    fn hand_off(&mut self, stamp_ms: u64, key: &str, events: &mut Vec<Event>) {
        // Checked before `make_mut`: most keys freed have no queue, and a shared queue map
        // (a snapshot build running) is copied only when a queue really changes.
        if self.grants.contains_key(key) || !self.queues.contains_key(key) {
            return;
        }
        while let Some(waiter) = self
            .queues
            .make_mut()
            .get_mut(key)
            .and_then(VecDeque::pop_front)
        {
            self.wait_deadlines.make_mut().remove(&(
                waiter.deadline_ms,
                waiter.session_id.clone(),
                key.to_owned(),
            ));
            let live = match self.sessions.get_mut(&waiter.session_id) {
                Some(session) => {
                    session.waits.remove(key);
                    if waiter.deadline_ms < stamp_ms {
                        session.settle(waiter.request_id, Response::NotGranted);
                        false
                    } else {
                        true
                    }
                }
                None => false,
            };
            if !live {
                events.push(Event::WaiterDropped {
                    session_id: waiter.session_id,
                    request_id: waiter.request_id,
                    key: key.to_owned(),
                });
                continue;
            }
            let grant = self.grant_to(
                stamp_ms,
                key,
                &waiter.session_id,
                waiter.request_id,
                waiter.ttl_ms,
                true,
                events,
            );
            if let Some(s) = self.sessions.get_mut(&waiter.session_id) {
                s.settle(waiter.request_id, Response::Granted(grant));
            }
            break;
        }
        if self.queues.get(key).is_some_and(VecDeque::is_empty) {
            self.queues.make_mut().remove(key);
        }
    }

    /// Removes `session_id`'s waiter from `key`'s queue and the deadline index (not from the
    /// session's own wait set: callers own that).
    fn unqueue(&mut self, key: &str, session_id: &str) {
        if !self.queues.contains_key(key) {
            return;
        }
        let queues = self.queues.make_mut();
        let Some(queue) = queues.get_mut(key) else {
            return;
        };
        if let Some(index) = queue.iter().position(|w| w.session_id == session_id)
            && let Some(w) = queue.remove(index)
        {
            self.wait_deadlines
                .make_mut()
                .remove(&(w.deadline_ms, w.session_id, key.to_owned()));
        }
        if queue.is_empty() {
            queues.remove(key);
        }
    }

    /// Drops every waiter whose deadline is before `stamp_ms`, in (deadline, session, key)
    /// order, and settles their acquires as `NotGranted`.
    fn drop_lapsed_waiters(&mut self, stamp_ms: u64, events: &mut Vec<Event>) {
        while self
            .wait_deadlines
            .first()
            .is_some_and(|(deadline_ms, _, _)| *deadline_ms < stamp_ms)
        {
            let Some((_, session_id, key)) = self.wait_deadlines.make_mut().pop_first() else {
                break;
            };
            self.unqueue(&key, &session_id);
            let request_id = self.sessions.get_mut(&session_id).and_then(|s| {
                let id = s.waits.remove(&key)?;
                s.settle(id, Response::NotGranted);
                Some(id)
            });
            if let Some(request_id) = request_id {
                events.push(Event::WaiterDropped {
                    session_id,
                    request_id,
                    key,
                });
            }
        }
    }
}
