//! The promoter: turns "this node leads and its term's blank entry applied" into an applied
//! `Command::Promote`, after which this node's lease deadlines are authoritative
//! (docs/DESIGN.md D-lease, etcd's lessor `Promote`).
//!
//! Owns the leadership watch, the promote retry and the reconcile walk. Never touches a
//! deadline itself: the `Promoted` event restarts every lease through the keeper (in O(1), see
//! `table`), and the walk ([`LeaseKeeper::begin_reconcile`]) then fills in, step by step, what
//! the events did not bring (a snapshot install, a restart) while the term already serves.
//! Until the promote applies, the reaper and leader-local renewals stay off; until the walk
//! ends, the reaper does.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_raft_store::storage::StateReader;
use lock_raft_store::{Command, Raft, Response};
use openraft::ServerState;
use openraft::async_runtime::WatchReceiver;

use super::LeaseKeeper;
use crate::leader::proposer::Proposer;
use crate::log_limit::{LogLimit, Note};

/// Most grants (or sessions) one step of the reconcile walk visits under the state's read lock
/// and the keeper's lock. A step starts with one search and costs about a microsecond per
/// entry it adds to the keeper (a node that installed a snapshot has every lease to add), so
/// a step holds both locks for about a millisecond, and a million grants take ~1,000 steps.
/// Everything that waits on those locks — the apply of each entry, every renewal and
/// heartbeat — waits at most one step, and blocks the runtime's worker it runs on while it
/// does. Steps of 16,384 (~21 ms) made each confirmation round after such a failover take
/// 80–90 ms (issue 23, session 28).
const RECONCILE_STEP: usize = 1_024;

/// How often the promoter re-checks leadership when no metrics change arrives, so a failed
/// promote is retried.
const PROMOTE_RETRY: Duration = Duration::from_millis(200);

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
        } else if keeper.promoted_term() != Some(term)
            && applied_term == Some(term)
            && reader.has_table()
        {
            // The blank entry of this term has applied: every entry of earlier terms is in the
            // state machine, so the promote restarts every lease that exists. First make sure
            // our stamps do not go below the predecessor's (D-time). (A node whose own
            // snapshot still loads may count entries of its log as applied before they reach
            // the table: it promotes once the table is in, at the next retry.)
            proposer.raise_stamp_floor(reader.read(|table| table.last_stamp_ms()));
            match proposer.propose(Command::Promote).await {
                Ok(Response::Promoted { grants, sessions }) => {
                    if let Some(ended) = failing.succeeded(keeper.now()) {
                        tracing::info!(
                            failing_ms = ended.lasted.as_millis() as u64,
                            failed_attempts = ended.total,
                            "promote applied after failing"
                        );
                    }
                    // The promote restarted every lease lazily (O(1)); the term serves now,
                    // and the reconcile walk runs behind it in bounded steps.
                    let seen = keeper.begin_reconcile(grants as usize, sessions as usize);
                    let leading = || {
                        let m = server.borrow_watched();
                        m.state == ServerState::Leader && m.vote.leader_id.term == term
                    };
                    if !leading() {
                        continue;
                    }
                    keeper.set_promoted(term);
                    tracing::info!(term, grants, sessions, "promoted: leases restarted");
                    let started = keeper.now();
                    if let Some(walk) = reconcile(&keeper, &reader, seen, leading).await {
                        keeper.finish_reconcile(seen);
                        tracing::info!(
                            term,
                            took_ms = (keeper.now() - started).as_millis() as u64,
                            steps = walk.steps,
                            longest_step_us = walk.longest.as_micros() as u64,
                            "leases reconciled with the replicated state"
                        );
                    }
                    continue;
                }
                Ok(other) => {
                    let error = format!("promote answered unexpectedly: {other:?}");
                    note_promote_failure(&mut failing, keeper.now(), &error, true);
                }
                Err(err) => {
                    let error = format!("promote not applied: {err}");
                    note_promote_failure(&mut failing, keeper.now(), &error, false);
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

/// How a finished reconcile walk went, for its log line.
#[derive(Default)]
struct Walk {
    /// Steps taken.
    steps: u64,
    /// The longest step, locks held.
    longest: Duration,
}

impl Walk {
    /// Runs one step, timed by the machine's clock (not the keeper's, which tests drive).
    fn step<T>(&mut self, step: impl FnOnce() -> T) -> T {
        let started = Instant::now();
        let out = step();
        self.steps += 1;
        self.longest = self.longest.max(started.elapsed());
        out
    }
}

/// Walks the replicated state's grants, then its sessions, in key order and in steps of
/// [`RECONCILE_STEP`] (each step resumes after the last key of the one before with one search,
/// so the walk is linear in the state, not quadratic), handing each step to the keeper under
/// the state's read lock and yielding between steps, so neither the apply loop nor the
/// renewals and heartbeats wait on more than one step. Returns `None` (the walk abandoned)
/// once `leading` says this node no longer leads in the promoted term.
async fn reconcile(
    keeper: &LeaseKeeper,
    reader: &StateReader,
    seen: u32,
    leading: impl Fn() -> bool,
) -> Option<Walk> {
    let mut walk = Walk::default();
    let mut after: Option<String> = None;
    loop {
        if !leading() {
            return None;
        }
        let last = walk.step(|| {
            reader.read(|table| {
                let step: Vec<_> = table
                    .grants_after(after.as_deref())
                    .take(RECONCILE_STEP)
                    .collect();
                keeper.reconcile_grants(seen, step.iter().map(|g| (g.key(), g.token, g.ttl_ms)));
                (step.len() == RECONCILE_STEP).then(|| step.last().map(|g| g.key().to_owned()))
            })
        });
        match last {
            Some(last) => after = last,
            None => break,
        }
        tokio::task::yield_now().await;
    }
    let mut after: Option<String> = None;
    loop {
        if !leading() {
            return None;
        }
        let last = walk.step(|| {
            reader.read(|table| {
                let step: Vec<(&str, u64, Option<&str>)> = table
                    .sessions_after(after.as_deref())
                    .take(RECONCILE_STEP)
                    .map(|(id, s)| (id, s.ttl_ms, s.principal()))
                    .collect();
                keeper.reconcile_sessions(seen, step.iter().copied());
                (step.len() == RECONCILE_STEP)
                    .then(|| step.last().map(|(id, _, _)| (*id).to_owned()))
            })
        });
        match last {
            Some(last) => after = last,
            None => break,
        }
        tokio::task::yield_now().await;
    }
    Some(walk)
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
