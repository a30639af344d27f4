//! docs/DESIGN.md §5.1–§5.3 as one model: per key, the history's acquires, renewals, releases
//! and revokes must be linearizable against a mutex with leases and increasing fencing tokens.
//!
//! The per-property modules check one consequence each against windows the client can see;
//! this one asks the stronger question Knossos and Porcupine ask — is there one order of the
//! operations, each taking effect at a single point between its invocation and its completion,
//! that a correct lock server could have produced? Keys are independent (P-compositionality:
//! a history is linearizable iff each key's sub-history is), so each key is searched alone.
//!
//! # The model (one key)
//!
//! State: the grant holding the key, if any (client, token, and the earliest time its lease
//! may end), the highest token granted, and the token floor the last revoke set.
//!
//! - **acquire ok** (token t) at point p: no grant is live at p — the previous holder was
//!   released, revoked, or its lease may have ended by p — and t is above every earlier token
//!   and the floor. The new lease may end from p + ttl − [`LEASE_CLOCK_ERROR`] on.
//! - **renew ok** at p: its grant is the holder at p; its lease may end from p + ttl − error.
//! - **renew lost** / **release ok with `released: false`** at p: its grant is not live at p
//!   (if it still holds the key, p is at or after the earliest end of its lease, and it ends).
//! - **release ok with `released: true`** at p: its grant is the holder; the key is free.
//! - **revoke ok** at p: with `revoked`, the holder at p has `previous_token`; without, no
//!   grant is live at p (as for a lost renew). The floor becomes `new_token_floor`.
//!
//! Why the lease's earliest end is measured from the linearization point and not from the
//! acquire's completion: the server starts a lease when it applies the grant — that *is* the
//! point — and expires it no sooner than its TTL (plus the reaper's safety margin) after that,
//! while the answer may reach the client much later (a slow link, a paused client). Measured
//! from the completion, a legal expiry after a slow answer would be flagged. The search puts
//! every point as early as the history allows, which is the most permissive choice (a later
//! point only starts leases later and raises the time floor of what follows), and the clock
//! error covers the harness's and the nodes' monotonic clocks running at slightly different
//! rates. A lease never *has* to end at its earliest end: a leader change may extend it.
//!
//! Operations whose outcome is unknown (`info`) may take effect at one point after their
//! invocation, or never. Renewals and acquires of unknown outcome are left out (leaving them
//! out is always the more permissive choice: a renewal only extends a lease, an unknown grant
//! only blocks others) — except an acquire whose token a revoke names, which must have taken
//! effect before that revoke completed. A release of unknown outcome may free its grant until
//! its lease may have ended anyway; a revoke of unknown outcome may free the key within
//! [`super::REVOKE_INFO_HORIZON`] of its invocation. Failed operations (`fail`) did not happen
//! and are left out; writes are the fenced register's business ([`super::fenced_writes`]).
//!
//! # The search and its bound
//!
//! Wing & Gong's search with Lowe's memo (as Porcupine does it), per key: an operation may be
//! linearized next at point max(floor, its invocation, what it waits for) if that point is no
//! later than its own completion and the completion of every other operation not yet placed.
//! An operation of unknown outcome only ever frees the key, so it is tried only right before
//! an operation it may let in (or let in earlier), and at a segment's end.
//! The key's history is cut into segments at quiet moments (no operation open); the states
//! each segment may end in carry into the next, so the cut loses nothing. The search of one key
//! stops after [`SEARCH_STEPS_MAX`] steps, or when a segment may end in more than
//! [`END_STATES_MAX`] states: the key is then `unknown`, never passed.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use super::{Analysis, PropertyResult, REVOKE_INFO_HORIZON, Status, duration_ns, secs};
use crate::history::{ERROR_CONTENDED, ERROR_LOST, F, OpType};

/// How far the nodes' lease clocks may run ahead of the harness's over one lease: both are
/// the same machine's monotonic clock, so the rate difference is zero; 100 ms covers the
/// scheduling delay between a node reading its clock and applying the grant, and is the
/// reaper's default safety margin (node/src/config.rs), which a lease never ends before.
pub const LEASE_CLOCK_ERROR: Duration = Duration::from_millis(100);

/// Search steps per key before the key is `unknown`. A step tries one operation at one node
/// of the search; a 20 s run of 8 clients on 4 keys takes a few thousand per key.
pub const SEARCH_STEPS_MAX: u64 = 2_000_000;

/// Distinct states one segment may end in before the key is `unknown`.
pub const END_STATES_MAX: usize = 1_024;

/// A grant, by its holder and token.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct GrantId {
    process: u32,
    token: u64,
}

/// What one operation does in the model.
#[derive(Clone, Copy, Debug)]
enum Step {
    /// A grant of `id`, with its lease.
    Acquire { id: GrantId, ttl_ns: u64 },
    /// A renewal of `id` that succeeded.
    Renew { id: GrantId, ttl_ns: u64 },
    /// `id` answered as not live (renew lost, release that removed nothing).
    NotLive { id: GrantId },
    /// A release that removed `id`.
    Release { id: GrantId },
    /// A release of unknown outcome.
    MaybeRelease { id: GrantId },
    /// An acknowledged revoke.
    Revoke {
        previous: Option<u64>,
        floor: Option<u64>,
    },
    /// A revoke of unknown outcome.
    MaybeRevoke,
}

/// One operation of a key, as the search sees it.
#[derive(Clone, Debug)]
struct LinOp {
    step: Step,
    invoke: u64,
    /// Latest point: the completion, or for an optional operation the end of its reach.
    cap: u64,
    /// Must be linearized (it happened); else it may be left out.
    mandatory: bool,
    /// For messages.
    what: String,
}

/// The holder of the key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Holder {
    id: GrantId,
    /// The earliest time its lease may end, on the history's clock.
    may_end: u64,
}

/// The model's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
struct State {
    holder: Option<Holder>,
    max_token: u64,
    floor: u64,
}

impl State {
    /// Applies `step` at the earliest point in `[lo, hi]` where it is legal.
    fn apply(self, step: Step, lo: u64, hi: u64) -> Option<(State, u64)> {
        let error = duration_ns(LEASE_CLOCK_ERROR);
        let mut next = self;
        let point = match step {
            Step::Acquire { id, ttl_ns } => {
                if id.token <= self.max_token || id.token <= self.floor {
                    return None;
                }
                let point = self.holder.map_or(lo, |h| lo.max(h.may_end));
                next.holder = Some(Holder {
                    id,
                    may_end: point.saturating_add(ttl_ns).saturating_sub(error),
                });
                next.max_token = id.token;
                point
            }
            Step::Renew { id, ttl_ns } => {
                let h = self.holder.filter(|h| h.id == id)?;
                next.holder = Some(Holder {
                    id,
                    may_end: h
                        .may_end
                        .max(lo.saturating_add(ttl_ns).saturating_sub(error)),
                });
                lo
            }
            Step::NotLive { id } => match self.holder {
                Some(h) if h.id == id => {
                    next.holder = None;
                    lo.max(h.may_end)
                }
                _ => lo,
            },
            Step::Release { id } | Step::MaybeRelease { id } => {
                self.holder.filter(|h| h.id == id)?;
                next.holder = None;
                lo
            }
            Step::Revoke { previous, floor } => {
                let point = match (previous, self.holder) {
                    (Some(p), Some(h)) if h.id.token == p => lo,
                    (Some(_), _) => return None,
                    (None, Some(h)) => lo.max(h.may_end),
                    (None, None) => lo,
                };
                next.holder = None;
                next.floor = self.floor.max(floor.unwrap_or(0));
                point
            }
            Step::MaybeRevoke => {
                self.holder?;
                next.holder = None;
                lo
            }
        };
        (point <= hi).then_some((next, point))
    }
}

/// The verdict on one key.
#[derive(Debug, PartialEq, Eq)]
enum KeyVerdict {
    Linearizable,
    /// No order exists; the message names where the search got stuck.
    NotLinearizable {
        t_ns: u64,
        message: String,
    },
    /// The bound was hit.
    Unknown(String),
}

/// The key's operations, in invocation order, and how many unknown outcomes were left out.
fn key_ops(analysis: &Analysis, key: &str) -> (Vec<LinOp>, u64) {
    let mut ops = Vec::new();
    let mut left_out = 0;
    let ttl_of: BTreeMap<GrantId, u64> = analysis
        .client_ops
        .iter()
        .filter(|c| c.key == key && c.f == F::Acquire)
        .filter_map(|c| {
            Some((
                GrantId {
                    process: c.process,
                    token: c.token?,
                },
                c.ttl_ms.unwrap_or(0).saturating_mul(1_000_000),
            ))
        })
        .collect();
    // Each grant's last acknowledged completion (acquire or renewal): an unknown release
    // matters only until the lease may have ended after it.
    let mut last_ack: BTreeMap<GrantId, u64> = BTreeMap::new();
    for c in analysis.client_ops.iter().filter(|c| c.key == key) {
        if let (Some(token), true) = (c.token, c.outcome == OpType::Ok) {
            let id = GrantId {
                process: c.process,
                token,
            };
            if matches!(c.f, F::Acquire | F::Renew) {
                let t = last_ack.entry(id).or_default();
                *t = (*t).max(c.complete_t);
            }
        }
    }
    let named: HashSet<u64> = analysis
        .revokes
        .iter()
        .filter(|r| r.key == key && r.outcome == OpType::Ok)
        .filter_map(|r| r.previous_token)
        .collect();
    let known: HashSet<u64> = ttl_of.keys().map(|id| id.token).collect();
    let mut unknown_acquires: Vec<&super::ClientOp> = Vec::new();
    let mut abandoned_acquires: Vec<&super::ClientOp> = Vec::new();
    for c in analysis.client_ops.iter().filter(|c| c.key == key) {
        let ttl_ns = c.ttl_ms.unwrap_or(0).saturating_mul(1_000_000);
        let id = c.token.map(|token| GrantId {
            process: c.process,
            token,
        });
        let what = format!(
            "client {} {} token {} [{}, {}]",
            c.process,
            c.f.name(),
            c.token.map_or("?".to_owned(), |t| t.to_string()),
            secs(c.invoke_t),
            if c.outcome == OpType::Info {
                "?".to_owned()
            } else {
                secs(c.complete_t)
            }
        );
        let (step, mandatory, cap) = match (c.f, c.outcome, id) {
            (F::Acquire, OpType::Ok, Some(id)) => {
                (Step::Acquire { id, ttl_ns }, true, c.complete_t)
            }
            (F::Acquire, OpType::Info, _) => {
                unknown_acquires.push(c);
                continue;
            }
            // A blocking acquire that gave up ("contended") may still have been granted: the
            // SDK cancels the wait when its max_wait passes, and a grant made meanwhile is
            // released by that cancel. Such a grant never reaches the client, but a revoke can
            // see and name it, so the acquire is a candidate for a token only a revoke names.
            (F::Acquire, OpType::Fail, _) if c.error() == Some(ERROR_CONTENDED) => {
                abandoned_acquires.push(c);
                continue;
            }
            (F::Renew, OpType::Ok, Some(id)) => {
                let ttl_ns = ttl_of.get(&id).copied().unwrap_or(ttl_ns);
                (Step::Renew { id, ttl_ns }, true, c.complete_t)
            }
            (F::Renew, OpType::Fail, Some(id)) if c.error() == Some(ERROR_LOST) => {
                (Step::NotLive { id }, true, c.complete_t)
            }
            (F::Release, OpType::Ok, Some(id)) => {
                let released = c
                    .completion
                    .as_ref()
                    .and_then(|o| o.released)
                    .unwrap_or(false);
                if released {
                    (Step::Release { id }, true, c.complete_t)
                } else {
                    (Step::NotLive { id }, true, c.complete_t)
                }
            }
            (F::Release, OpType::Info, Some(id)) => {
                let ttl = ttl_of.get(&id).copied().unwrap_or(0);
                let reach = last_ack
                    .get(&id)
                    .copied()
                    .unwrap_or(c.invoke_t)
                    .saturating_add(ttl)
                    .max(c.invoke_t);
                (Step::MaybeRelease { id }, false, reach)
            }
            (F::Renew | F::Release, OpType::Info, _) => {
                left_out += 1;
                continue;
            }
            // Failed operations did not happen; writes are not lock operations.
            _ => continue,
        };
        ops.push(LinOp {
            step,
            invoke: c.invoke_t,
            cap,
            mandatory,
            what,
        });
    }
    for r in analysis.revokes.iter().filter(|r| r.key == key) {
        let what = format!(
            "revoke [{}, {}]{}",
            secs(r.invoke_t),
            if r.outcome == OpType::Ok {
                secs(r.complete_t)
            } else {
                "?".to_owned()
            },
            r.previous_token
                .map_or(String::new(), |t| format!(" displacing token {t}"))
        );
        match r.outcome {
            OpType::Ok => ops.push(LinOp {
                step: Step::Revoke {
                    previous: r.revoked.then_some(r.previous_token).flatten(),
                    floor: r.new_token_floor,
                },
                invoke: r.invoke_t,
                cap: r.complete_t,
                mandatory: true,
                what,
            }),
            OpType::Info | OpType::Invoke => ops.push(LinOp {
                step: Step::MaybeRevoke,
                invoke: r.invoke_t,
                cap: r.invoke_t.saturating_add(duration_ns(REVOKE_INFO_HORIZON)),
                mandatory: false,
                what,
            }),
            OpType::Fail => {}
        }
    }
    // An acquire of unknown outcome whose token only a revoke names must have been granted
    // before that revoke completed; the latest acquire invoked before then by the grant's
    // owner (which the revoke names) is given the token. A history without owners on its
    // revokes (recorded before they carried one) lets any client's acquire be the one: the
    // newest, since a revoke displaces the current holder.
    let mut named: Vec<u64> = named.into_iter().collect();
    named.sort_unstable();
    for token in named.iter().filter(|t| !known.contains(t)) {
        let naming = analysis
            .revokes
            .iter()
            .filter(|r| r.key == key && r.previous_token == Some(*token));
        let revoke_done = naming.clone().map(|r| r.complete_t).min().unwrap_or(0);
        let owner = naming
            .filter_map(|r| r.previous_owner.as_deref())
            .next()
            .map(crate::workload::process_of);
        let latest_before = |candidates: &[&super::ClientOp]| {
            candidates
                .iter()
                .enumerate()
                .filter(|(_, c)| c.invoke_t < revoke_done)
                .filter(|(_, c)| owner.is_none_or(|p| p == Some(c.process)))
                .max_by_key(|(_, c)| c.invoke_t)
                .map(|(i, _)| i)
        };
        let abandoned = latest_before(&abandoned_acquires);
        let unknown = latest_before(&unknown_acquires);
        let abandoned_is_later = match (abandoned, unknown) {
            (Some(a), Some(u)) => abandoned_acquires[a].invoke_t > unknown_acquires[u].invoke_t,
            (a, _) => a.is_some(),
        };
        if let (true, Some(i)) = (abandoned_is_later, abandoned) {
            // Granted, then displaced by the revoke, before the client gave up.
            let c = abandoned_acquires.remove(i);
            ops.push(LinOp {
                step: Step::Acquire {
                    id: GrantId {
                        process: c.process,
                        token: *token,
                    },
                    ttl_ns: c.ttl_ms.unwrap_or(0).saturating_mul(1_000_000),
                },
                invoke: c.invoke_t,
                cap: revoke_done.min(c.complete_t),
                mandatory: true,
                what: format!(
                    "client {} acquire that gave up [{}, {}] given token {token}",
                    c.process,
                    secs(c.invoke_t),
                    secs(c.complete_t)
                ),
            });
        } else if let Some(i) = unknown {
            let c = unknown_acquires.remove(i);
            ops.push(LinOp {
                step: Step::Acquire {
                    id: GrantId {
                        process: c.process,
                        token: *token,
                    },
                    ttl_ns: c.ttl_ms.unwrap_or(0).saturating_mul(1_000_000),
                },
                invoke: c.invoke_t,
                cap: revoke_done,
                mandatory: true,
                what: format!(
                    "client {} acquire of unknown outcome [{}, ?] given token {token}",
                    c.process,
                    secs(c.invoke_t)
                ),
            });
        }
    }
    left_out += unknown_acquires.len() as u64;
    ops.sort_by_key(|o| (o.invoke, o.cap));
    (ops, left_out)
}

/// Cuts `ops` (in invocation order) where no operation is open.
fn segments(ops: &[LinOp]) -> Vec<&[LinOp]> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut reach = 0;
    for (i, op) in ops.iter().enumerate() {
        if i > start && op.invoke > reach {
            out.push(&ops[start..i]);
            start = i;
        }
        reach = reach.max(op.cap);
    }
    if start < ops.len() {
        out.push(&ops[start..]);
    }
    out
}

/// One segment's search.
struct Search<'a> {
    ops: &'a [LinOp],
    steps: &'a mut u64,
    steps_max: u64,
    seen: HashSet<(Vec<u64>, State, u64)>,
    ends: HashSet<State>,
    /// The most operations placed on any path, and what could not be placed next there.
    deepest: (usize, Vec<usize>, u64),
    overflow: bool,
}

impl Search<'_> {
    fn run(&mut self, placed: &mut Vec<u64>, count: usize, state: State, floor: u64) {
        if self.overflow {
            return;
        }
        if !self.seen.insert((placed.clone(), state, floor)) {
            return;
        }
        let is_placed = |placed: &[u64], i: usize| placed[i / 64] & (1 << (i % 64)) != 0;
        // The two earliest completions of mandatory operations not yet placed: an operation
        // placed next must come no later than every other's completion.
        let mut first = (u64::MAX, usize::MAX);
        let mut second = u64::MAX;
        let mut remaining_mandatory = 0;
        for (i, op) in self.ops.iter().enumerate() {
            if op.mandatory && !is_placed(placed, i) {
                remaining_mandatory += 1;
                if op.cap < first.0 {
                    second = first.0;
                    first = (op.cap, i);
                } else if op.cap < second {
                    second = op.cap;
                }
            }
        }
        if remaining_mandatory == 0 {
            // The segment may end here, or with one operation of unknown outcome still freeing
            // the key (its effect outlives the segment; one is enough: it frees the holder).
            self.ends.insert(state);
            for (i, op) in self.ops.iter().enumerate() {
                if !op.mandatory && !is_placed(placed, i) {
                    let lo = floor.max(op.invoke);
                    if let Some((freed, _)) = state.apply(op.step, lo, op.cap) {
                        self.ends.insert(freed);
                    }
                }
            }
            if self.ends.len() > END_STATES_MAX {
                self.overflow = true;
            }
            return;
        }
        let mut stuck = Vec::new();
        for (i, op) in self.ops.iter().enumerate() {
            if !op.mandatory || is_placed(placed, i) {
                continue;
            }
            let others = if first.1 == i { second } else { first.0 };
            let hi = op.cap.min(others);
            let lo = floor.max(op.invoke);
            if lo > hi {
                continue;
            }
            *self.steps += 1;
            if *self.steps > self.steps_max {
                self.overflow = true;
                return;
            }
            let mut placed_any = false;
            if let Some((next, point)) = state.apply(op.step, lo, hi) {
                placed_any = true;
                placed[i / 64] |= 1 << (i % 64);
                self.run(placed, count + 1, next, point);
                placed[i / 64] &= !(1 << (i % 64));
            }
            // An operation of unknown outcome matters only where it frees the key for the
            // next one (earlier it would only end the holder's lease sooner than anything
            // needs), so it is tried only right before a mandatory operation, which it may let
            // in at all or at an earlier point.
            if state.holder.is_some() {
                for (j, maybe) in self.ops.iter().enumerate() {
                    if maybe.mandatory || is_placed(placed, j) {
                        continue;
                    }
                    let maybe_lo = floor.max(maybe.invoke);
                    let Some((freed, at)) = state.apply(maybe.step, maybe_lo, maybe.cap.min(hi))
                    else {
                        continue;
                    };
                    *self.steps += 1;
                    if let Some((next, point)) = freed.apply(op.step, at.max(op.invoke), hi) {
                        placed_any = true;
                        placed[i / 64] |= 1 << (i % 64);
                        placed[j / 64] |= 1 << (j % 64);
                        self.run(placed, count + 2, next, point);
                        placed[i / 64] &= !(1 << (i % 64));
                        placed[j / 64] &= !(1 << (j % 64));
                    }
                }
            }
            if !placed_any {
                stuck.push(i);
            }
        }
        if remaining_mandatory > 0 && count >= self.deepest.0 {
            self.deepest = (count, stuck, floor);
        }
    }
}

/// Searches one key.
fn check_key(ops: &[LinOp], steps_max: u64) -> (KeyVerdict, u64) {
    let mut steps = 0;
    let mut states: HashSet<State> = HashSet::from([State::default()]);
    for segment in segments(ops) {
        let mut ends = HashSet::new();
        let mut deepest = (0, Vec::new(), 0);
        for &start in &states {
            let mut search = Search {
                ops: segment,
                steps: &mut steps,
                steps_max,
                seen: HashSet::new(),
                ends: HashSet::new(),
                deepest: (0, Vec::new(), 0),
                overflow: false,
            };
            let mut placed = vec![0u64; segment.len().div_ceil(64)];
            search.run(&mut placed, 0, start, 0);
            if search.overflow {
                return (
                    KeyVerdict::Unknown(format!(
                        "search bound hit in the segment from {} ({} operations): over \
                         {steps_max} steps or {END_STATES_MAX} end states",
                        secs(segment[0].invoke),
                        segment.len()
                    )),
                    steps,
                );
            }
            if search.deepest.0 >= deepest.0 {
                deepest = search.deepest;
            }
            ends.extend(search.ends);
            if ends.len() > END_STATES_MAX {
                return (
                    KeyVerdict::Unknown(format!(
                        "more than {END_STATES_MAX} end states after the segment from {}",
                        secs(segment[0].invoke)
                    )),
                    steps,
                );
            }
        }
        if ends.is_empty() {
            let (placed, stuck, floor) = deepest;
            let blocked: Vec<&str> = stuck
                .iter()
                .map(|&i| segment[i].what.as_str())
                .take(4)
                .collect();
            let t_ns = segment
                .iter()
                .filter(|o| o.mandatory)
                .map(|o| o.cap)
                .min()
                .unwrap_or(floor)
                .max(floor);
            return (
                KeyVerdict::NotLinearizable {
                    t_ns,
                    message: format!(
                        "no order of the {} operations from {} fits a lease mutex: at most {placed} \
                         can be placed (up to {}); none of the rest can go next, e.g. {}",
                        segment.len(),
                        secs(segment[0].invoke),
                        secs(floor),
                        if blocked.is_empty() {
                            "(every remaining one completes before the others could)".to_owned()
                        } else {
                            blocked.join("; ")
                        }
                    ),
                },
                steps,
            );
        }
        states = ends;
    }
    (KeyVerdict::Linearizable, steps)
}

/// Checks every key's lock operations for linearizability against the lease-mutex model,
/// with the search bound [`SEARCH_STEPS_MAX`].
pub fn check(analysis: &Analysis) -> PropertyResult {
    check_bounded(analysis, SEARCH_STEPS_MAX)
}

/// [`check`] with at most `steps_max` search steps per key (a key that needs more is
/// `unknown`).
pub fn check_bounded(analysis: &Analysis, steps_max: u64) -> PropertyResult {
    let mut result = PropertyResult::new(
        "linearizable",
        "DESIGN.md §5.1–§5.3",
        "Per key, acquires, renewals, releases and revokes take effect in one order, each between \
         its invocation and completion, as a mutex with leases (TTL from the grant, minus 100 ms) \
         and increasing tokens allows.",
    );
    let keys: Vec<&str> = {
        let mut keys: Vec<&str> = analysis
            .client_ops
            .iter()
            .map(|c| c.key.as_str())
            .chain(analysis.revokes.iter().map(|r| r.key.as_str()))
            .collect();
        keys.sort_unstable();
        keys.dedup();
        keys
    };
    let mut unknown = Vec::new();
    let mut total_steps = 0;
    for key in keys {
        let (ops, left_out) = key_ops(analysis, key);
        result.checked += ops.len() as u64;
        result.excused += left_out;
        let (verdict, steps) = check_key(&ops, steps_max);
        total_steps += steps;
        match verdict {
            KeyVerdict::Linearizable => {}
            KeyVerdict::NotLinearizable { t_ns, message } => {
                result.violate(t_ns, Some(key), format!("{key:?}: {message}"));
            }
            KeyVerdict::Unknown(why) => unknown.push(format!("{key:?}: {why}")),
        }
    }
    let mut note = format!(
        "{total_steps} search steps (bound {steps_max} per key); operations of unknown \
         outcome that only block others are left out (counted as excused)"
    );
    if !unknown.is_empty() {
        note = format!("undecided: {}; {note}", unknown.join("; "));
        if result.status == Status::Pass {
            result.status = Status::Unknown;
        }
    }
    result.note = Some(note);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn op(step: Step, invoke_ms: u64, cap_ms: u64) -> LinOp {
        LinOp {
            step,
            invoke: invoke_ms * MS,
            cap: cap_ms * MS,
            mandatory: true,
            what: format!("{step:?}"),
        }
    }

    fn id(process: u32, token: u64) -> GrantId {
        GrantId { process, token }
    }

    const TTL: u64 = 2_000 * MS;

    #[test]
    fn a_lease_that_may_have_ended_lets_the_next_grant_in() {
        // Client 0 never releases; client 1's grant completes after 0's lease may have ended.
        let ops = [
            op(
                Step::Acquire {
                    id: id(0, 1),
                    ttl_ns: TTL,
                },
                0,
                10,
            ),
            op(
                Step::Acquire {
                    id: id(1, 2),
                    ttl_ns: TTL,
                },
                100,
                2_000,
            ),
        ];
        assert_eq!(
            check_key(&ops, SEARCH_STEPS_MAX).0,
            KeyVerdict::Linearizable
        );
        // Granted while 0's lease must still be running: not linearizable.
        let early = [
            op(
                Step::Acquire {
                    id: id(0, 1),
                    ttl_ns: TTL,
                },
                0,
                10,
            ),
            op(
                Step::Acquire {
                    id: id(1, 2),
                    ttl_ns: TTL,
                },
                100,
                1_500,
            ),
        ];
        assert!(matches!(
            check_key(&early, SEARCH_STEPS_MAX).0,
            KeyVerdict::NotLinearizable { .. }
        ));
    }

    #[test]
    fn a_renewal_after_another_grant_is_not_linearizable() {
        let ops = [
            op(
                Step::Acquire {
                    id: id(0, 1),
                    ttl_ns: TTL,
                },
                0,
                10,
            ),
            op(
                Step::Acquire {
                    id: id(1, 2),
                    ttl_ns: TTL,
                },
                100,
                2_500,
            ),
            op(
                Step::Renew {
                    id: id(0, 1),
                    ttl_ns: TTL,
                },
                2_600,
                2_700,
            ),
        ];
        assert!(matches!(
            check_key(&ops, SEARCH_STEPS_MAX).0,
            KeyVerdict::NotLinearizable { .. }
        ));
    }

    #[test]
    fn segments_cut_only_where_nothing_is_open() {
        let ops = [
            op(Step::MaybeRevoke, 0, 100),
            op(Step::MaybeRevoke, 50, 60),
            op(Step::MaybeRevoke, 101, 200),
        ];
        let cut = segments(&ops);
        assert_eq!(cut.iter().map(|s| s.len()).collect::<Vec<_>>(), [2, 1]);
    }
}
