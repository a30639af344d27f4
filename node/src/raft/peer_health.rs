//! One Raft peer's reachability as this node sees it, shared by every client this node has to
//! that peer (replication, heartbeats, snapshots, votes).
//!
//! Owns when the next attempt to reach an unreachable peer may be made ([`Backoff`]) and the
//! log lines about the peer's state: one WARN when it becomes unreachable (with the cause), at
//! most one summary a minute while it stays so, one INFO when it answers again (with how long
//! it was out). Must not dial or carry messages: `raft::network` asks it before each attempt
//! and tells it how each attempt went.
//!
//! Why one per peer and not one per client: openraft makes a client per purpose, and a peer
//! that refuses the replication stream refuses the heartbeat too. One shared schedule means
//! one probe per delay rather than one per purpose, and a heartbeat that gets through wakes a
//! replication stream waiting for its turn, so a returning follower is caught up at once.

use std::fmt::Display;
use std::sync::Mutex;
use std::time::Duration;

use lock_raft_store::NodeId;
use tokio::sync::watch;
use tokio::time::Instant;

use super::backoff::Backoff;
use crate::log_limit::{LogLimit, Note};

/// See the module docs.
#[derive(Debug)]
pub struct PeerHealth {
    target: NodeId,
    state: Mutex<State>,
    /// Counts successes and hints, so a call waiting for its turn ([`PeerHealth::wait_turn`])
    /// goes at once when another client reached the peer or the peer said it is back.
    reached: watch::Sender<u64>,
}

#[derive(Debug)]
struct State {
    backoff: Backoff,
    /// `None` while the peer is reachable; else the earliest time of the next attempt.
    retry_at: Option<Instant>,
    /// Whether a hint ([`PeerHealth::heard_from`]) already brought the current retry forward:
    /// one hint per failed round, so a peer that calls often but cannot be reached adds at
    /// most one attempt per backoff delay.
    hinted: bool,
    log: LogLimit,
}

/// What a peer's `Hello` changed ([`PeerHealth::heard_from`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hinted {
    /// The peer was unreachable and its next attempt not due: it is due now.
    BroughtForward,
    /// The peer was unreachable, and an attempt was already due (or a hello already brought
    /// one forward since the last failure).
    AlreadyDue,
    /// The peer is reachable as far as this node knows: nothing to bring forward.
    Reachable,
}

impl Hinted {
    /// What happened, for the log.
    pub fn as_str(self) -> &'static str {
        match self {
            Hinted::BroughtForward => "retrying it now",
            Hinted::AlreadyDue => "a retry was already due",
            Hinted::Reachable => "it was reachable",
        }
    }
}

/// Why a call was not even attempted: the peer is unreachable and its next attempt is not due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotYet {
    /// How long until an attempt may be made.
    pub retry_in: Duration,
}

impl PeerHealth {
    /// The health of peer `target` as node `self_id` sees it: reachable until a call fails.
    pub fn new(self_id: NodeId, target: NodeId) -> Self {
        // Each (node, peer) pair draws its own jitter, so the nodes of a cluster do not retry
        // a restarted peer in lockstep; the seed is fixed so a run can be reproduced.
        let seed = self_id.rotate_left(32) ^ target ^ 0x6c6f_636b_642d_6e65;
        Self {
            target,
            state: Mutex::new(State {
                backoff: Backoff::new(seed),
                retry_at: None,
                hinted: false,
                log: LogLimit::default(),
            }),
            reached: watch::Sender::new(0),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // The state is a few fields updated together; a panic elsewhere cannot leave it torn.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether an attempt may be made at `now`: always while the peer is reachable, else once
    /// its retry time has come.
    pub fn turn(&self, now: Instant) -> Result<(), NotYet> {
        match self.state().retry_at {
            Some(at) if at > now => Err(NotYet { retry_in: at - now }),
            _ => Ok(()),
        }
    }

    /// Waits until an attempt may be made: the retry time has come, or another client reached
    /// the peer. Returns at once while the peer is reachable. Cancel-safe.
    pub async fn wait_turn(&self) {
        let mut reached = self.reached.subscribe();
        loop {
            // Read the schedule after subscribing: a success in between is not missed.
            let Err(not_yet) = self.turn(Instant::now()) else {
                return;
            };
            tokio::select! {
                _ = tokio::time::sleep(not_yet.retry_in) => {}
                _ = reached.changed() => {}
            }
        }
    }

    /// Records that a call reached the peer at `now`: the backoff starts over, and if the peer
    /// had been unreachable, that it is back is logged once.
    pub fn succeeded(&self, now: Instant) {
        let ended = {
            let mut state = self.state();
            if state.retry_at.is_none() {
                return;
            }
            state.retry_at = None;
            state.hinted = false;
            state.backoff.reset();
            state.log.succeeded(now.into_std())
        };
        self.reached.send_modify(|n| *n = n.wrapping_add(1));
        if let Some(ended) = ended {
            tracing::info!(
                peer = self.target,
                down_ms = ended.lasted.as_millis() as u64,
                failed_attempts = ended.total,
                "raft peer reachable again"
            );
        }
    }

    /// Records that the peer called this node at `now` to say it is listening (a `Hello`): if
    /// it was unreachable and its next attempt is not due, the attempt becomes due now, once
    /// per failed round, and waiting calls go. Not a success: only a call of this node's that
    /// gets through shows the way to the peer works, and if the attempt fails the backoff goes
    /// on from where it was. Returns what the hello changed.
    pub fn heard_from(&self, now: Instant) -> Hinted {
        {
            let mut state = self.state();
            match state.retry_at {
                None => return Hinted::Reachable,
                Some(at) if at <= now || state.hinted => return Hinted::AlreadyDue,
                Some(_) => {
                    state.retry_at = Some(now);
                    state.hinted = true;
                }
            }
        }
        self.reached.send_modify(|n| *n = n.wrapping_add(1));
        Hinted::BroughtForward
    }

    /// Records that a call to the peer at `addr` failed at `now` with `error`.
    ///
    /// A failure of an attempt that was due pushes the next attempt one backoff delay away; one
    /// that was already under way when another failure set the schedule (a heartbeat and a
    /// replication stream dialling together) is only counted, so the delay grows once per
    /// round of attempts, not once per client.
    pub fn failed(&self, now: Instant, addr: &str, error: &dyn Display) {
        let (note, retry_in) = {
            let mut state = self.state();
            let due = state.retry_at.is_none_or(|at| at <= now);
            if due {
                let delay = state.backoff.next_delay();
                state.retry_at = Some(now + delay);
                state.hinted = false;
            }
            let retry_in = state.retry_at.map_or(Duration::ZERO, |at| at - now);
            (state.log.failed(now.into_std(), error), retry_in)
        };
        match note {
            None => {}
            Some(Note::Began) => tracing::warn!(
                peer = self.target,
                addr,
                %error,
                retry_in_ms = retry_in.as_millis() as u64,
                "raft peer unreachable; retrying with backoff"
            ),
            Some(Note::Summary(summary)) => tracing::warn!(
                peer = self.target,
                addr,
                down_s = summary.lasted.as_secs(),
                failed_attempts = summary.count,
                failed_attempts_total = summary.total,
                last_error = %summary.last_error,
                "raft peer still unreachable"
            ),
        }
    }

    /// Whether the peer is reachable as far as this node knows (no failure since the last
    /// success).
    pub fn is_reachable(&self) -> bool {
        self.state().retry_at.is_none()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::raft::backoff::{BACKOFF_CAP, BACKOFF_INITIAL};

    /// Fails attempts in turn until the delay is at the cap.
    async fn fail_to_the_cap(health: &PeerHealth) {
        for _ in 0..10 {
            health.wait_turn().await;
            health.failed(Instant::now(), "a", &"refused");
        }
    }

    /// A call waiting for its turn in a task: resolves to when it went.
    fn waiting_call(health: &Arc<PeerHealth>) -> tokio::task::JoinHandle<Instant> {
        let health = health.clone();
        tokio::spawn(async move {
            health.wait_turn().await;
            Instant::now()
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_reachable_peer_is_always_its_turn() {
        let health = PeerHealth::new(1, 2);
        assert_eq!(health.turn(Instant::now()), Ok(()));
        health.succeeded(Instant::now());
        assert!(health.is_reachable());
        // Returns at once: paused time does not move.
        let before = Instant::now();
        health.wait_turn().await;
        assert_eq!(Instant::now(), before);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failure_closes_the_gate_for_one_delay_and_delays_grow_to_the_cap() {
        let health = PeerHealth::new(1, 2);
        let mut ceiling = BACKOFF_INITIAL;
        for _ in 0..12 {
            let now = Instant::now();
            health.failed(now, "127.0.0.1:1", &"refused");
            let Err(not_yet) = health.turn(now) else {
                panic!("the gate is open right after a failure");
            };
            assert!(
                not_yet.retry_in >= ceiling / 2 && not_yet.retry_in <= ceiling,
                "{not_yet:?} outside [{:?}, {ceiling:?}]",
                ceiling / 2
            );
            health.wait_turn().await;
            // The timer rounds up to whole milliseconds.
            let waited = Instant::now() - now;
            assert!(
                waited >= not_yet.retry_in && waited <= not_yet.retry_in + Duration::from_millis(1),
                "waited {waited:?} for a delay of {:?}",
                not_yet.retry_in
            );
            assert_eq!(health.turn(Instant::now()), Ok(()));
            ceiling = (ceiling * 2).min(BACKOFF_CAP);
        }
        assert!(!health.is_reachable());
    }

    #[tokio::test(start_paused = true)]
    async fn a_failure_of_an_attempt_that_was_not_due_does_not_push_the_schedule() {
        let health = PeerHealth::new(1, 2);
        let now = Instant::now();
        health.failed(now, "a", &"refused");
        let Err(first) = health.turn(now) else {
            panic!("closed");
        };
        // A second client's attempt, started before the first failure, fails just after it.
        health.failed(now + Duration::from_millis(1), "a", &"refused");
        let Err(second) = health.turn(now) else {
            panic!("closed");
        };
        assert_eq!(first, second);
    }

    #[tokio::test(start_paused = true)]
    async fn a_hello_brings_the_next_attempt_forward_once_per_failed_round() {
        let health = Arc::new(PeerHealth::new(1, 2));
        // Reachable: nothing to bring forward.
        assert_eq!(health.heard_from(Instant::now()), Hinted::Reachable);
        // Push the delay up to the cap, then wait for the turn in a call.
        fail_to_the_cap(&health).await;
        let start = Instant::now();
        let Err(before) = health.turn(start) else {
            panic!("closed");
        };
        assert!(before.retry_in >= BACKOFF_CAP / 2, "{before:?}");
        let waiter = waiting_call(&health);
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(health.heard_from(Instant::now()), Hinted::BroughtForward);
        let woke = waiter.await.unwrap();
        assert!(
            woke - start < Duration::from_millis(20),
            "woke after {:?}",
            woke - start
        );
        // A second hello in the same round changes nothing.
        assert_eq!(health.heard_from(Instant::now()), Hinted::AlreadyDue);
        assert_eq!(health.turn(Instant::now()), Ok(()));
        // The attempt fails: the backoff goes on from the cap, not from the start, and the
        // new round may be brought forward once more.
        health.failed(Instant::now(), "a", &"refused");
        let Err(after) = health.turn(Instant::now()) else {
            panic!("closed");
        };
        assert!(after.retry_in >= BACKOFF_CAP / 2, "{after:?}");
        assert!(!health.is_reachable());
        assert_eq!(health.heard_from(Instant::now()), Hinted::BroughtForward);
        assert_eq!(health.heard_from(Instant::now()), Hinted::AlreadyDue);
        // Once the retry is due by its own schedule, a hello has nothing to bring forward.
        health.failed(Instant::now(), "a", &"refused");
        let Err(due_in) = health.turn(Instant::now()) else {
            panic!("closed");
        };
        tokio::time::advance(due_in.retry_in).await;
        assert_eq!(health.heard_from(Instant::now()), Hinted::AlreadyDue);
    }

    #[tokio::test(start_paused = true)]
    async fn a_success_elsewhere_wakes_a_waiting_call_and_resets_the_backoff() {
        let health = Arc::new(PeerHealth::new(1, 2));
        fail_to_the_cap(&health).await;
        let start = Instant::now();
        let waiter = waiting_call(&health);
        tokio::time::sleep(Duration::from_millis(10)).await;
        health.succeeded(Instant::now());
        let woke = waiter.await.unwrap();
        assert!(
            woke - start < Duration::from_millis(20),
            "woke after {:?}",
            woke - start
        );
        assert!(health.is_reachable());
        // The next failure starts from the initial delay.
        health.failed(Instant::now(), "a", &"refused");
        let Err(not_yet) = health.turn(Instant::now()) else {
            panic!("closed");
        };
        assert!(not_yet.retry_in <= BACKOFF_INITIAL, "{not_yet:?}");
    }
}
