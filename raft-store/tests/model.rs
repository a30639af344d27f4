//! Property test: random command sequences over a few keys and sessions, applied both to
//! `LockTable` and to a small reference model written here from the rules alone, with plain
//! vectors and linear scans and no derived indexes. Every step must give the same response and
//! the same events, the table's invariants must hold, and globally no token may be issued twice
//! and per key tokens must increase in grant order (docs/DESIGN.md §5.1).
//!
//! proptest prints the failing (shrunk) command list and persists its seed under
//! `tests/model.proptest-regressions`, which is replayed first on the next run. `PROPTEST_CASES`
//! overrides the case count (256 by default, to keep CI fast).

use std::collections::{BTreeMap, BTreeSet};

use lock_raft_store::limits::{
    AUDIT_LOG_MAX, BATCH_MAX, LOCKS_PER_SESSION_MAX, REQUEST_WINDOW, REVOKE_RETRY_WINDOW_MS,
    SESSIONS_MAX, WAITERS_PER_KEY_MAX, WAITS_PER_SESSION_MAX,
};
use lock_raft_store::{
    Command, Event, FreeCause, Grant, LockTable, Rejection, Response, Revocation,
};
use proptest::prelude::*;

// ----- the reference model ---------------------------------------------------------------

const TTL_MIN_MS: u64 = 1_000;
const TTL_MAX_MS: u64 = 3_600_000;
const WAIT_MAX_MS: u64 = 300_000;

fn bad(text: &str) -> bool {
    text.trim().is_empty() || text.chars().any(char::is_control)
}

fn invalid() -> Response {
    // Messages are compared by kind only (see `normalize`).
    Response::Rejected(Rejection::InvalidArgument {
        message: String::new(),
    })
}

fn limit() -> Response {
    Response::Rejected(Rejection::LimitExceeded {
        message: String::new(),
    })
}

#[derive(Clone, Debug)]
struct MSession {
    owner: String,
    ttl: u64,
    expires: u64,
    /// request id → (answer, answer of a CancelWait for that id)
    answers: BTreeMap<u64, (Response, Option<Response>)>,
}

#[derive(Clone, Debug)]
struct MWaiter {
    key: String,
    session: String,
    request_id: u64,
    ttl: u64,
    deadline: u64,
}

/// The rules, done the slow, obvious way.
#[derive(Default)]
struct Model {
    sessions: BTreeMap<String, MSession>,
    grants: BTreeMap<String, Grant>,
    /// All waiters of all keys in arrival order; a key's queue is this list filtered by key.
    waiters: Vec<MWaiter>,
    revocations: Vec<Revocation>,
    last_token: u64,
}

impl Model {
    fn locks(&self, session: &str) -> Vec<String> {
        self.grants
            .values()
            .filter(|g| g.session_id == session)
            .map(|g| g.key.clone())
            .collect()
    }

    fn waits(&self, session: &str) -> Vec<MWaiter> {
        let mut w: Vec<MWaiter> = self
            .waiters
            .iter()
            .filter(|w| w.session == session)
            .cloned()
            .collect();
        w.sort_by(|a, b| a.key.cmp(&b.key));
        w
    }

    fn queue_len(&self, key: &str) -> usize {
        self.waiters.iter().filter(|w| w.key == key).count()
    }

    fn settle(&mut self, session: &str, request_id: u64, answer: Response) {
        if let Some(s) = self.sessions.get_mut(session)
            && let Some(entry) = s.answers.get_mut(&request_id)
        {
            entry.0 = answer;
        }
    }

    fn remember(&mut self, session: &str, request_id: u64, answer: Response) {
        let s = self
            .sessions
            .get_mut(session)
            .expect("remember on a live session");
        if let Some(entry) = s.answers.get_mut(&request_id) {
            entry.0 = answer;
        } else {
            s.answers.insert(request_id, (answer, None));
            while s.answers.len() > REQUEST_WINDOW {
                let smallest = *s.answers.keys().next().expect("non-empty");
                s.answers.remove(&smallest);
            }
        }
    }

    /// `Some(answer)` if this is a retry or a stale id.
    fn window(&self, session: &str, request_id: u64) -> Option<Response> {
        let s = &self.sessions[session];
        if let Some((answer, _)) = s.answers.get(&request_id) {
            return Some(answer.clone());
        }
        let smallest = s.answers.keys().next().copied();
        if s.answers.len() >= REQUEST_WINDOW && smallest.is_some_and(|m| request_id < m) {
            return Some(Response::Rejected(Rejection::StaleRequest {
                session_id: session.to_owned(),
                request_id,
            }));
        }
        None
    }

    #[allow(clippy::too_many_arguments)]
    fn grant(
        &mut self,
        stamp: u64,
        key: &str,
        session: &str,
        request_id: u64,
        ttl: u64,
        handed_off: bool,
        ev: &mut Vec<Event>,
    ) -> Grant {
        self.last_token += 1;
        let g = Grant {
            key: key.to_owned(),
            owner_id: self.sessions[session].owner.clone(),
            session_id: session.to_owned(),
            request_id,
            token: self.last_token,
            ttl_ms: ttl,
            acquired_at_ms: stamp,
            expires_at_ms: stamp + ttl,
        };
        self.grants.insert(key.to_owned(), g.clone());
        ev.push(Event::Granted {
            grant: g.clone(),
            shared_key: key.into(),
            handed_off,
        });
        g
    }

    fn hand_off(&mut self, stamp: u64, key: &str, ev: &mut Vec<Event>) {
        while !self.grants.contains_key(key) {
            let Some(i) = self.waiters.iter().position(|w| w.key == key) else {
                return;
            };
            let w = self.waiters.remove(i);
            let live = self.sessions.contains_key(&w.session) && w.deadline >= stamp;
            if live {
                let g = self.grant(stamp, key, &w.session, w.request_id, w.ttl, true, ev);
                self.settle(&w.session, w.request_id, Response::Granted(g));
            } else {
                self.settle(&w.session, w.request_id, Response::NotGranted);
                ev.push(Event::WaiterDropped {
                    session_id: w.session,
                    request_id: w.request_id,
                    key: key.to_owned(),
                });
            }
        }
    }

    fn free(&mut self, stamp: u64, key: &str, cause: FreeCause, ev: &mut Vec<Event>) {
        if let Some(g) = self.grants.remove(key) {
            ev.push(Event::Freed {
                key: key.to_owned(),
                token: g.token,
                cause,
            });
        }
        self.hand_off(stamp, key, ev);
    }

    fn apply(&mut self, stamp: u64, cmd: Command, ev: &mut Vec<Event>) -> Response {
        match cmd {
            Command::Batch(cmds) if cmds.len() > BATCH_MAX => {
                Response::Batch(vec![limit(); cmds.len()])
            }
            Command::Batch(cmds) => Response::Batch(
                cmds.into_iter()
                    .map(|c| match c {
                        Command::Batch(_) => {
                            self.prune(stamp, ev);
                            invalid()
                        }
                        c => self.apply_one(stamp, c, ev),
                    })
                    .collect(),
            ),
            c => self.apply_one(stamp, c, ev),
        }
    }

    fn prune(&mut self, stamp: u64, ev: &mut Vec<Event>) {
        let mut lapsed: Vec<MWaiter> = self
            .waiters
            .iter()
            .filter(|w| w.deadline < stamp)
            .cloned()
            .collect();
        lapsed.sort_by(|a, b| {
            (a.deadline, &a.session, &a.key).cmp(&(b.deadline, &b.session, &b.key))
        });
        self.waiters.retain(|w| w.deadline >= stamp);
        for w in lapsed {
            self.settle(&w.session, w.request_id, Response::NotGranted);
            ev.push(Event::WaiterDropped {
                session_id: w.session,
                request_id: w.request_id,
                key: w.key,
            });
        }
    }

    fn apply_one(&mut self, stamp: u64, cmd: Command, ev: &mut Vec<Event>) -> Response {
        let expired = matches!(cmd, Command::ExpireSession { .. });
        self.prune(stamp, ev);
        let ttl_ok = |t: u64| (TTL_MIN_MS..=TTL_MAX_MS).contains(&t);
        let unknown = |s: &str| {
            Response::Rejected(Rejection::UnknownSession {
                session_id: s.to_owned(),
            })
        };
        match cmd {
            Command::OpenSession {
                session_id,
                owner_id,
                ttl_ms,
            } => {
                if bad(&session_id) || bad(&owner_id) || !ttl_ok(ttl_ms) {
                    return invalid();
                }
                if let Some(s) = self.sessions.get(&session_id) {
                    if s.owner != owner_id {
                        return invalid();
                    }
                    return Response::SessionOpened {
                        session_id,
                        ttl_ms: s.ttl,
                    };
                }
                if self.sessions.len() >= SESSIONS_MAX {
                    return limit();
                }
                self.sessions.insert(
                    session_id.clone(),
                    MSession {
                        owner: owner_id,
                        ttl: ttl_ms,
                        expires: stamp + ttl_ms,
                        answers: BTreeMap::new(),
                    },
                );
                ev.push(Event::SessionOpened {
                    session_id: session_id.clone(),
                    ttl_ms,
                    principal: None,
                });
                Response::SessionOpened { session_id, ttl_ms }
            }
            Command::CloseSession { session_id } | Command::ExpireSession { session_id } => {
                if !self.sessions.contains_key(&session_id) {
                    return Response::SessionClosed { locks_released: 0 };
                }
                let locks = self.locks(&session_id);
                let waits = self.waits(&session_id);
                self.sessions.remove(&session_id);
                self.waiters.retain(|w| w.session != session_id);
                for w in waits {
                    ev.push(Event::WaiterDropped {
                        session_id: session_id.clone(),
                        request_id: w.request_id,
                        key: w.key,
                    });
                }
                for key in &locks {
                    self.free(stamp, key, FreeCause::SessionEnded, ev);
                }
                ev.push(Event::SessionEnded {
                    session_id: session_id.clone(),
                    expired,
                });
                Response::SessionClosed {
                    locks_released: locks.len() as u32,
                }
            }
            Command::Acquire {
                session_id,
                request_id,
                key,
                ttl_ms,
                wait_ms,
            } => {
                if bad(&key) || !ttl_ok(ttl_ms) || wait_ms > WAIT_MAX_MS {
                    return invalid();
                }
                if !self.sessions.contains_key(&session_id) {
                    return unknown(&session_id);
                }
                if let Some(r) = self.window(&session_id, request_id) {
                    // A retry of a queued acquire answers its position now.
                    if let Response::Queued { .. } = r
                        && let Some(w) = self
                            .waiters
                            .iter()
                            .find(|w| w.session == session_id && w.request_id == request_id)
                    {
                        let position = self
                            .waiters
                            .iter()
                            .filter(|x| x.key == w.key)
                            .position(|x| x.session == session_id)
                            .expect("present")
                            + 1;
                        return Response::Queued {
                            position: position as u32,
                        };
                    }
                    return r;
                }
                if self
                    .waiters
                    .iter()
                    .any(|w| w.session == session_id && w.key == key)
                {
                    return invalid();
                }
                let slots = self.locks(&session_id).len() + self.waits(&session_id).len();
                let answer = match self.grants.get(&key) {
                    Some(g) if g.session_id == session_id => Response::NotGranted,
                    Some(_) if wait_ms == 0 => Response::NotGranted,
                    _ if slots >= LOCKS_PER_SESSION_MAX => return limit(),
                    None => Response::Granted(self.grant(
                        stamp,
                        &key,
                        &session_id,
                        request_id,
                        ttl_ms,
                        false,
                        ev,
                    )),
                    Some(_) => {
                        if self.waits(&session_id).len() >= WAITS_PER_SESSION_MAX
                            || self.queue_len(&key) >= WAITERS_PER_KEY_MAX
                        {
                            return limit();
                        }
                        self.waiters.push(MWaiter {
                            key: key.clone(),
                            session: session_id.clone(),
                            request_id,
                            ttl: ttl_ms,
                            deadline: stamp + wait_ms,
                        });
                        Response::Queued {
                            position: self.queue_len(&key) as u32,
                        }
                    }
                };
                self.remember(&session_id, request_id, answer.clone());
                answer
            }
            Command::Release {
                session_id,
                request_id,
                key,
                token,
            } => {
                if bad(&key) || token == 0 {
                    return invalid();
                }
                if !self.sessions.contains_key(&session_id) {
                    return unknown(&session_id);
                }
                if let Some(r) = self.window(&session_id, request_id) {
                    return r;
                }
                let released = self.grants.get(&key).is_some_and(|g| g.token == token);
                if released {
                    self.free(stamp, &key, FreeCause::Released, ev);
                }
                let answer = Response::Released { released };
                self.remember(&session_id, request_id, answer.clone());
                answer
            }
            Command::Renew {
                session_id,
                request_id,
                key,
                token,
                ttl_ms,
            } => {
                if bad(&key) || token == 0 || !ttl_ok(ttl_ms) {
                    return invalid();
                }
                if !self.sessions.contains_key(&session_id) {
                    return unknown(&session_id);
                }
                if let Some(r) = self.window(&session_id, request_id) {
                    return r;
                }
                let answer = match self.grants.get_mut(&key) {
                    Some(g) if g.token == token => {
                        g.ttl_ms = ttl_ms;
                        g.expires_at_ms = stamp + ttl_ms;
                        Response::Renewed(g.clone())
                    }
                    _ => Response::Lost,
                };
                self.remember(&session_id, request_id, answer.clone());
                answer
            }
            Command::CancelWait {
                session_id,
                request_id,
                key,
                release_if_granted,
            } => {
                if bad(&key) {
                    return invalid();
                }
                let Some(s) = self.sessions.get(&session_id) else {
                    return unknown(&session_id);
                };
                if let Some((_, Some(c))) = s.answers.get(&request_id) {
                    return c.clone();
                }
                let waiter = self
                    .waiters
                    .iter()
                    .position(|w| w.session == session_id && w.request_id == request_id);
                let granted = self
                    .grants
                    .values()
                    .find(|g| g.session_id == session_id && g.request_id == request_id)
                    .cloned();
                let nothing = Response::WaitCancelled {
                    removed: false,
                    grant: None,
                    released: false,
                };
                let (acquire_answer, answer) = if let Some(i) = waiter {
                    if self.waiters[i].key != key {
                        return invalid();
                    }
                    self.waiters.remove(i);
                    ev.push(Event::WaiterDropped {
                        session_id: session_id.clone(),
                        request_id,
                        key: key.clone(),
                    });
                    let answer = Response::WaitCancelled {
                        removed: true,
                        grant: None,
                        released: false,
                    };
                    (Response::NotGranted, answer)
                } else if let Some(g) = granted {
                    if g.key != key {
                        return invalid();
                    }
                    if release_if_granted {
                        self.free(stamp, &key, FreeCause::Released, ev);
                    }
                    let answer = Response::WaitCancelled {
                        removed: false,
                        grant: Some(g.clone()),
                        released: release_if_granted,
                    };
                    (Response::Granted(g), answer)
                } else {
                    match self.window(&session_id, request_id) {
                        Some(Response::Rejected(r)) => return Response::Rejected(r),
                        Some(a) => (a, nothing),
                        None => (Response::NotGranted, nothing),
                    }
                };
                self.remember(&session_id, request_id, acquire_answer);
                if let Some(entry) = self
                    .sessions
                    .get_mut(&session_id)
                    .and_then(|s| s.answers.get_mut(&request_id))
                {
                    entry.1 = Some(answer.clone());
                }
                answer
            }
            Command::ForceRevoke {
                key,
                operator,
                reason,
                request_id,
            } => {
                if bad(&key) || bad(&operator) || bad(&reason) {
                    return invalid();
                }
                // A retry (same key, operator and non-zero id within the window) answers the
                // first outcome: scan every remembered revoke, not just the recent ones.
                if request_id != 0
                    && let Some(first) = self.revocations.iter().rev().find(|r| {
                        r.request_id == request_id
                            && r.key == key
                            && r.operator == operator
                            && stamp <= r.at_ms + REVOKE_RETRY_WINDOW_MS
                    })
                {
                    return Response::Revoked(first.clone());
                }
                let previous = self.grants.remove(&key);
                if let Some(g) = &previous {
                    ev.push(Event::Freed {
                        key: key.clone(),
                        token: g.token,
                        cause: FreeCause::Revoked,
                    });
                }
                self.last_token += 1;
                let rev = Revocation {
                    key: key.clone(),
                    operator,
                    reason,
                    previous_owner_id: previous.as_ref().map(|g| g.owner_id.clone()),
                    previous_token: previous.as_ref().map(|g| g.token),
                    new_token_floor: self.last_token,
                    at_ms: stamp,
                    request_id,
                };
                self.revocations.push(rev.clone());
                if self.revocations.len() > AUDIT_LOG_MAX {
                    self.revocations.remove(0);
                }
                self.hand_off(stamp, &key, ev);
                Response::Revoked(rev)
            }
            Command::ExpireLock { key, token } => {
                let expired = self.grants.get(&key).is_some_and(|g| g.token == token);
                if expired {
                    self.free(stamp, &key, FreeCause::Expired, ev);
                }
                Response::LockExpired { expired }
            }
            Command::Promote => {
                for g in self.grants.values_mut() {
                    g.expires_at_ms = stamp + g.ttl_ms;
                }
                for s in self.sessions.values_mut() {
                    s.expires = stamp + s.ttl;
                }
                ev.push(Event::Promoted { stamp_ms: stamp });
                Response::Promoted {
                    grants: self.grants.len() as u32,
                    sessions: self.sessions.len() as u32,
                }
            }
            Command::Batch(_) => invalid(),
            // The model runs under V1 only; the operations below never change the limits.
            Command::SetLimits { .. } => panic!("the model generates no SetLimits"),
            // Principals are tested in `table::binding`; the model calls as nobody.
            Command::AsCaller { .. } => panic!("the model generates no AsCaller"),
        }
    }
}

/// Rejection messages are prose; compare their kind only.
fn normalize(r: Response) -> Response {
    match r {
        Response::Rejected(Rejection::InvalidArgument { .. }) => invalid(),
        Response::Rejected(Rejection::LimitExceeded { .. }) => limit(),
        Response::Batch(rs) => Response::Batch(rs.into_iter().map(normalize).collect()),
        other => other,
    }
}

// ----- generated operations --------------------------------------------------------------

const KEYS: [&str; 3] = ["a", "b", "c"];
const SESSIONS: [&str; 3] = ["s0", "s1", "s2"];

/// An operation before its tokens and cancel ids are chosen from the current state.
#[derive(Clone, Debug)]
enum Op {
    Open {
        s: usize,
        owner: usize,
        ttl: u64,
    },
    Close {
        s: usize,
        expire: bool,
    },
    Acquire {
        s: usize,
        id: Id,
        key: usize,
        ttl: u64,
        wait: u64,
    },
    Release {
        s: usize,
        id: Id,
        key: usize,
        pick: usize,
    },
    Renew {
        s: usize,
        id: Id,
        key: usize,
        pick: usize,
        ttl: u64,
    },
    Cancel {
        s: usize,
        id: Id,
        pick: Option<usize>,
        key: usize,
        release: bool,
    },
    Revoke {
        key: usize,
        blank_reason: bool,
        /// 0 = no request id; small ids repeat, so retries (same key and id) happen often.
        request_id: u8,
    },
    ExpireLock {
        key: usize,
        pick: usize,
    },
    Promote,
    Batch(Vec<Op>),
    NestedBatch,
}

fn key_of(i: usize) -> String {
    // Index 3 is the invalid blank key, drawn rarely.
    KEYS.get(i).map_or(String::new(), |k| (*k).to_owned())
}

/// A token for `key`: usually the current grant's (so the command can succeed), sometimes an
/// old or never-issued one.
fn token_for(model: &Model, key: &str, pick: usize) -> u64 {
    match (pick % 4, model.grants.get(key)) {
        (0..=2, Some(g)) => g.token,
        (3, _) => (pick as u64) % (model.last_token + 2),
        _ => model.last_token + 1,
    }
}

/// The request-id counter of each session, as a client keeps it.
#[derive(Default)]
struct Ids([u64; SESSIONS.len()]);

impl Ids {
    fn take(&mut self, s: usize, id: Id) -> u64 {
        match id {
            Id::Fresh => {
                self.0[s] += 1;
                self.0[s]
            }
            Id::Retry(back) => self.0[s].saturating_sub(back).max(1),
        }
    }
}

fn concretize(op: &Op, model: &Model, ids: &mut Ids) -> Command {
    match op {
        Op::Open { s, owner, ttl } => Command::OpenSession {
            session_id: SESSIONS[*s].to_owned(),
            owner_id: format!("o{owner}"),
            ttl_ms: *ttl,
        },
        Op::Close { s, expire: false } => Command::CloseSession {
            session_id: SESSIONS[*s].to_owned(),
        },
        Op::Close { s, expire: true } => Command::ExpireSession {
            session_id: SESSIONS[*s].to_owned(),
        },
        Op::Acquire {
            s,
            id,
            key,
            ttl,
            wait,
        } => Command::Acquire {
            session_id: SESSIONS[*s].to_owned(),
            request_id: ids.take(*s, *id),
            key: key_of(*key),
            ttl_ms: *ttl,
            wait_ms: *wait,
        },
        Op::Release { s, id, key, pick } => Command::Release {
            session_id: SESSIONS[*s].to_owned(),
            request_id: ids.take(*s, *id),
            key: key_of(*key),
            token: token_for(model, &key_of(*key), *pick),
        },
        Op::Renew {
            s,
            id,
            key,
            pick,
            ttl,
        } => Command::Renew {
            session_id: SESSIONS[*s].to_owned(),
            request_id: ids.take(*s, *id),
            key: key_of(*key),
            token: token_for(model, &key_of(*key), *pick),
            ttl_ms: *ttl,
        },
        Op::Cancel {
            s,
            id,
            pick,
            key,
            release,
        } => {
            let session = SESSIONS[*s];
            // Usually cancel one of the session's own acquires (queued or granted), on its key.
            let mine: Vec<(u64, String)> = model
                .waiters
                .iter()
                .filter(|w| w.session == session)
                .map(|w| (w.request_id, w.key.clone()))
                .chain(
                    model
                        .grants
                        .values()
                        .filter(|g| g.session_id == session)
                        .map(|g| (g.request_id, g.key.clone())),
                )
                .collect();
            let (request_id, key) = match pick {
                Some(p) if !mine.is_empty() => mine[p % mine.len()].clone(),
                _ => (ids.take(*s, *id), key_of(*key)),
            };
            Command::CancelWait {
                session_id: session.to_owned(),
                request_id,
                key,
                release_if_granted: *release,
            }
        }
        Op::Revoke {
            key,
            blank_reason,
            request_id,
        } => Command::ForceRevoke {
            key: key_of(*key),
            request_id: u64::from(*request_id),
            operator: "op".to_owned(),
            reason: if *blank_reason {
                " ".into()
            } else {
                "drill".into()
            },
        },
        Op::ExpireLock { key, pick } => Command::ExpireLock {
            key: key_of(*key),
            token: token_for(model, &key_of(*key), *pick),
        },
        Op::Promote => Command::Promote,
        Op::Batch(ops) => Command::Batch(ops.iter().map(|o| concretize(o, model, ids)).collect()),
        Op::NestedBatch => Command::Batch(vec![Command::Promote]),
    }
}

fn ttl() -> impl Strategy<Value = u64> {
    prop_oneof![16 => Just(5_000u64), 8 => Just(1_000u64), 1 => Just(999u64)]
}

fn key() -> impl Strategy<Value = usize> {
    prop_oneof![60 => 0..3usize, 1 => Just(3usize)]
}

/// How a request id is chosen when the operation is made concrete.
#[derive(Clone, Copy, Debug)]
enum Id {
    /// The session's next id (ids mostly grow, as a client's counter does).
    Fresh,
    /// An id used `back` ids ago: a retry, or (once the window has moved on) a stale request.
    Retry(u64),
}

fn id() -> impl Strategy<Value = Id> {
    prop_oneof![
        7 => Just(Id::Fresh),
        2 => (0..8u64).prop_map(Id::Retry),
        1 => (60..120u64).prop_map(Id::Retry),
    ]
}

/// `close_weight` 0 keeps sessions alive for the whole run, so their request windows fill up
/// and evict (stale requests); 1 closes and reopens them now and then.
fn simple_op(close_weight: u32) -> impl Strategy<Value = Op> {
    // s0 is the busy one: it makes enough requests for its window to fill and evict.
    let s = prop_oneof![3 => Just(0usize), 1 => Just(1usize), 1 => Just(2usize)];
    prop_oneof![
        // Mostly the session's own owner (a retried open); sometimes another (refused).
        2 => (s.clone(), proptest::bool::weighted(0.1), ttl())
            .prop_map(|(s, other, ttl)| Op::Open { s, owner: (s + usize::from(other)) % 2, ttl }),
        close_weight => (s.clone(), any::<bool>()).prop_map(|(s, expire)| Op::Close { s, expire }),
        12 => (s.clone(), id(), key(), ttl(), prop_oneof![6 => Just(0u64), 4 => Just(500), 4 => Just(3_000), 4 => Just(60_000), 1 => Just(300_001)])
            .prop_map(|(s, id, key, ttl, wait)| Op::Acquire { s, id, key, ttl, wait }),
        5 => (s.clone(), id(), key(), any::<usize>())
            .prop_map(|(s, id, key, pick)| Op::Release { s, id, key, pick }),
        3 => (s.clone(), id(), key(), any::<usize>(), ttl())
            .prop_map(|(s, id, key, pick, ttl)| Op::Renew { s, id, key, pick, ttl }),
        3 => (s.clone(), id(), proptest::option::of(any::<usize>()), key(), any::<bool>())
            .prop_map(|(s, id, pick, key, release)| Op::Cancel { s, id, pick, key, release }),
        1 => (key(), proptest::bool::weighted(0.1), 0..3u8)
            .prop_map(|(key, blank_reason, request_id)| Op::Revoke { key, blank_reason, request_id }),
        2 => (key(), any::<usize>()).prop_map(|(key, pick)| Op::ExpireLock { key, pick }),
        1 => Just(Op::Promote),
    ]
}

fn op(close_weight: u32) -> impl Strategy<Value = Op> {
    prop_oneof![
        20 => simple_op(close_weight),
        2 => prop::collection::vec(prop_oneof![10 => simple_op(close_weight), 1 => Just(Op::NestedBatch)], 0..5).prop_map(Op::Batch),
    ]
}

/// (time advance in ms, operation)
fn steps() -> impl Strategy<Value = Vec<(u64, Op)>> {
    (0..2u32).prop_flat_map(|close_weight| {
        prop::collection::vec(
            (
                prop_oneof![3 => Just(0u64), 5 => 0..1_000u64, 1 => 0..5_000u64],
                op(close_weight),
            ),
            50..400,
        )
    })
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

fn check_same_state(table: &LockTable, model: &Model, step: usize) {
    let grants: Vec<Grant> = table.grants().map(|g| g.to_grant()).collect();
    let expected: Vec<Grant> = model.grants.values().cloned().collect();
    assert_eq!(grants, expected, "step {step}: grants differ");
    assert_eq!(
        table.last_token(),
        model.last_token,
        "step {step}: last_token"
    );
    for key in KEYS {
        assert_eq!(
            table.waiter_count(key) as usize,
            model.queue_len(key),
            "step {step}: waiters on {key}"
        );
        let table_queue: Vec<(&str, u64, u64)> = table
            .waiters(key)
            .map(|w| (w.session_id.as_str(), w.request_id, w.deadline_ms))
            .collect();
        let model_queue: Vec<(&str, u64, u64)> = model
            .waiters
            .iter()
            .filter(|w| w.key == key)
            .map(|w| (w.session.as_str(), w.request_id, w.deadline))
            .collect();
        assert_eq!(table_queue, model_queue, "step {step}: queue of {key}");
    }
    let sessions: Vec<(&str, &str, u64)> = table
        .sessions()
        .map(|(id, s)| (id, s.owner_id.as_str(), s.expires_at_ms))
        .collect();
    let model_sessions: Vec<(&str, &str, u64)> = model
        .sessions
        .iter()
        .map(|(id, s)| (id.as_str(), s.owner.as_str(), s.expires))
        .collect();
    assert_eq!(sessions, model_sessions, "step {step}: sessions");
    for (id, s) in &model.sessions {
        let locks: BTreeSet<String> = model.locks(id).into_iter().collect();
        assert_eq!(table.locks_of(id), locks, "step {step}: locks of {id}");
        let ids: Vec<u64> = s.answers.keys().copied().collect();
        let table_ids: Vec<u64> = table
            .session(id)
            .map(|s| s.remembered_ids().collect())
            .unwrap_or_default();
        assert_eq!(table_ids, ids, "step {step}: request window of {id}");
    }
    let revs: Vec<&Revocation> = table.revocations().collect();
    let model_revs: Vec<&Revocation> = model.revocations.iter().collect();
    assert_eq!(revs, model_revs, "step {step}: audit log");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn table_matches_the_model(steps in steps()) {
        let mut table = LockTable::new();
        let mut model = Model::default();
        let mut stamp = 1_000u64;
        let mut issued = BTreeSet::new();
        let mut last_per_key: BTreeMap<String, u64> = BTreeMap::new();
        let mut ids = Ids::default();
        let opens = (0..SESSIONS.len()).map(|s| (0, Op::Open { s, owner: s % 2, ttl: 10_000 }));
        for (step, (advance, op)) in opens.chain(steps.iter().cloned()).enumerate() {
            stamp += advance;
            let command = concretize(&op, &model, &mut ids);
            let (mut events, mut model_events) = (Vec::new(), Vec::new());
            let response = table.apply(stamp, command.clone(), &mut events);
            let expected = model.apply(stamp, command.clone(), &mut model_events);
            prop_assert_eq!(normalize(response), normalize(expected), "step {} {:?}", step, command);
            prop_assert_eq!(&events, &model_events, "step {} {:?}: events", step, command);
            if let Err(violation) = table.check_invariants() {
                prop_assert!(false, "step {} {:?}: {}", step, command, violation);
            }
            for event in &events {
                if let Event::Granted { grant, .. } = event {
                    prop_assert!(issued.insert(grant.token), "token {} issued twice", grant.token);
                    let last = last_per_key.entry(grant.key.clone()).or_default();
                    prop_assert!(grant.token > *last, "key {}: token {} after {}", grant.key, grant.token, *last);
                    *last = grant.token;
                }
            }
            check_same_state(&table, &model, step);
        }
        // The table is what the storage snapshots with postcard: it must round-trip exactly.
        let bytes = postcard::to_allocvec(&table).expect("the table serializes");
        let back: LockTable = postcard::from_bytes(&bytes).expect("the table deserializes");
        prop_assert_eq!(back, table);
    }
}
