//! The leader's proposer (docs/DESIGN.md D-batch): one task that stamps commands with the leader's
//! clock (D-time) and writes them to the Raft log, grouping the commands that queue up while
//! earlier entries are in flight into one `Command::Batch` entry.
//!
//! Owns stamping, batching, the bound on entries in flight and routing each answer back to its
//! caller. Does not validate commands (callers do, before proposing) and does not know what a
//! command means.
//!
//! Ordering: the task submits entries one at a time, in queue order, through openraft's
//! fire-and-forget `client_write_ff`, which only enqueues the entry on RaftCore's API channel; so
//! the log order is the submission order even with several entries in flight. A batch is
//! applied command by command in arrival order, so batching changes no answer.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use lock_api::LockError;
use lock_raft_store::{CallbackResponder, Command, Raft, Request, Response, TypeConfig};

use openraft::error::{ClientWriteError, ForwardReason, ForwardToLeader};
use openraft::raft::ClientWriteResult;
use tokio::sync::{Semaphore, mpsc, oneshot};

use crate::clock::Clock;

/// Most commands gathered into one entry: the state machine's own bound on a batch.
pub const BATCH_COMMANDS_MAX: usize = lock_raft_store::limits::BATCH_MAX;

/// Most entries in flight (submitted, not yet applied) at once.
///
/// One: while an entry replicates, every command that arrives waits for the next entry, so the
/// fixed cost of an entry (a `fdatasync` on each node, an append and its answer per follower,
/// the apply's bookkeeping) is shared by more commands. Under openraft 0.9, whose RaftCore
/// awaited the leader's own flush of each entry, one and two measured alike and four worse (W1
/// 2,044, 2,013 and 933 pairs/s); under 0.10 two, four and eight measured alike, with more
/// entries per pair the more in flight. Session 23 measured one against two, six alternated
/// lockd-only rounds each (medians, Pipeline stream / unary client): W1 log entries per pair
/// 0.20 / 0.21 -> 0.125 / 0.127, W1 server CPU per pair 0.176 / 0.212 -> 0.155 / 0.178 ms,
/// W1 7,362 / 5,603 -> 7,282 / 6,216 pairs/s, W2 1,368 / 1,135 -> 1,444 / 1,257 hand-offs/s,
/// W3 acquire p50 0.671 / 0.718 -> 0.643 / 0.716 ms (docs/PERFORMANCE.md, session 23).
pub const ENTRIES_IN_FLIGHT_MAX: usize = 1;

/// Most commands waiting for the proposer. Past this, callers wait for room (backpressure)
/// instead of growing the leader's memory without bound.
pub const PROPOSALS_QUEUED_MAX: usize = 16 * 1024;

/// Longest a batch of deferrable commands only (acquires that will queue behind a holder, see
/// [`Proposer::propose_deferrable`]) waits for a prompt command to ride in the same entry.
///
/// About one hand-off on this machine's hot key (0.7-1.3 ms), so that a waiter's enqueue
/// that reaches the proposer just after the holder's release still meets the next release.
/// It is also the most a mispredicted deferral costs: an acquire whose key an entry already in
/// flight frees waits this long more for its grant. Nothing else waits on a deferred command:
/// its caller is answered by the hand-off, which a release's entry brings.
pub const DEFERRAL_MAX: std::time::Duration = std::time::Duration::from_millis(1);

const _: () = assert!(BATCH_COMMANDS_MAX > 0 && ENTRIES_IN_FLIGHT_MAX > 0);

/// What is done with one submitted entry's answer: called once with it (or with why there is
/// none), on the task that completes the entry, which for an applied entry is the state
/// machine's apply. It must not block. Dropped uncalled when the entry is lost before it is
/// answered (the node stopping): whoever waits on it must take that as an unknown outcome.
pub type OnApplied = Box<dyn FnOnce(Result<Response, LockError>) + Send>;

/// Where the proposer writes entries. The real one is [`RaftWriter`]; tests use a fake.
pub trait LogWriter: Send + Sync + 'static {
    /// Appends `request` to the log after every request submitted before it, and hands its
    /// applied answer, or why it has none, to `on_applied`.
    fn submit(&self, request: Request, on_applied: OnApplied) -> impl Future<Output = ()> + Send;
}

/// openraft's "forward this request" as lockd's answer, both retry-safe:
///
/// - this node does not lead, or hands leadership over: `NotLeader`, naming the leader (or the
///   transfer's target) and its address when this node knows them;
/// - this node leads but no quorum acknowledged it within its leader lease (a loaded machine
///   that delays the followers' answers; openraft then refuses writes until one answers):
///   `Contention`. No other node leads as far as this one knows, so `NotLeader` naming no one
///   would send the client hunting round the cluster for a leader that is still this node.
pub(crate) fn not_leader(f: ForwardToLeader<TypeConfig>) -> LockError {
    if f.reason == ForwardReason::LeaseExpired {
        return LockError::contention(
            "this node leads, but no quorum has acknowledged it within its leader lease; retry",
        );
    }
    LockError::NotLeader {
        leader_id: f.leader_id,
        leader_addr: f.leader_node.map(|n| n.addr),
    }
}

/// Writes entries through openraft's fire-and-forget client write.
#[derive(Clone)]
pub struct RaftWriter {
    raft: Raft,
}

impl std::fmt::Debug for RaftWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RaftWriter").finish_non_exhaustive()
    }
}

impl RaftWriter {
    /// Writes to `raft`.
    pub fn new(raft: Raft) -> Self {
        Self { raft }
    }
}

impl LogWriter for RaftWriter {
    async fn submit(&self, request: Request, on_applied: OnApplied) {
        // Answered on the applying task, with no channel or task in between: see
        // `lock_raft_store::responder`.
        let responder = CallbackResponder::new(move |written| on_applied(written_answer(written)));
        if let Err(fatal) = self.raft.client_write_ff(request, Some(responder)).await {
            // The entry and its responder are dropped with it: its callers hear of an unknown
            // outcome, as from any entry lost before it was answered.
            tracing::debug!(%fatal, "raft is stopped; an entry was not submitted");
        }
    }
}

/// A client write's result as the answer its callers get.
fn written_answer(written: ClientWriteResult<TypeConfig>) -> Result<Response, LockError> {
    match written {
        Ok(written) => Ok(written.data),
        // Refused before it was appended (this node is not the leader), or appended and then
        // dropped from this node's log by a new leader, which may still have it: either way
        // NotLeader, and the request id makes the caller's retry safe.
        Err(ClientWriteError::ForwardToLeader(f) | ClientWriteError::LogEntryDiscarded(f)) => {
            Err(not_leader(f))
        }
        // lockd attaches no preconditions to its writes.
        Err(ClientWriteError::PreconditionFailed(e)) => {
            Err(LockError::contention(format!("write refused: {e}")))
        }
        Err(ClientWriteError::ChangeMembershipError(e)) => Err(LockError::contention(format!(
            "membership change in progress: {e}"
        ))),
    }
}

struct Proposal {
    command: Command,
    reply: oneshot::Sender<Result<Response, LockError>>,
    /// Whether the entry carrying it may wait up to [`DEFERRAL_MAX`] for a prompt command.
    deferrable: bool,
}

/// The handle callers propose through. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Proposer {
    tx: mpsc::Sender<Proposal>,
    /// Lowest stamp the next entry may carry (see [`Proposer::raise_stamp_floor`]).
    stamp_floor_ms: Arc<AtomicU64>,
}

impl std::fmt::Debug for Proposal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proposal")
            .field("command", &self.command)
            .finish_non_exhaustive()
    }
}

impl Proposer {
    /// Starts the proposer task writing to `writer`, stamping with `clock`, with at most
    /// `in_flight_max` entries in flight and `batch_max` commands per entry.
    pub fn spawn<W: LogWriter>(
        writer: W,
        clock: Arc<dyn Clock>,
        in_flight_max: usize,
        batch_max: usize,
    ) -> Self {
        let (tx, rx) = mpsc::channel(PROPOSALS_QUEUED_MAX);
        let stamp_floor_ms = Arc::new(AtomicU64::new(0));
        tokio::spawn(run(
            writer,
            clock,
            rx,
            stamp_floor_ms.clone(),
            in_flight_max.max(1),
            batch_max.clamp(1, BATCH_COMMANDS_MAX),
        ));
        Self { tx, stamp_floor_ms }
    }

    /// Makes every later stamp at least `stamp_ms`. A new leader calls it with the latest stamp
    /// it finds in the replicated state, so its stamps never go below its predecessor's even if
    /// its wall clock is behind (D-time).
    pub fn raise_stamp_floor(&self, stamp_ms: u64) {
        self.stamp_floor_ms.fetch_max(stamp_ms, Ordering::Relaxed);
    }

    /// Proposes `command` and waits for its applied answer.
    ///
    /// Errors: `NotLeader` if this node is not (or stopped being) the leader, `Contention` if
    /// the outcome is unknown (the caller may retry with the same request id).
    pub async fn propose(&self, command: Command) -> Result<Response, LockError> {
        self.send(command, false).await
    }

    /// [`Proposer::propose`] for a command whose caller waits for something beyond its own
    /// answer anyway: an acquire that will queue behind another session's grant, whose caller
    /// is answered by the hand-off the holder's release brings.
    ///
    /// An entry of such commands only is not closed at once: it waits up to [`DEFERRAL_MAX`]
    /// for a prompt command (typically that release) and rides in the same entry, so a
    /// hand-off on a hot key costs one commit instead of two whose syncs queue behind each
    /// other. The log order is still the arrival order, so no answer changes; only the time
    /// the waiter's place is written does.
    pub async fn propose_deferrable(&self, command: Command) -> Result<Response, LockError> {
        self.send(command, true).await
    }

    async fn send(&self, command: Command, deferrable: bool) -> Result<Response, LockError> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(Proposal {
                command,
                reply,
                deferrable,
            })
            .await
            .map_err(|_| LockError::contention("the node is shutting down"))?;
        // The entry's answer was dropped unsent: the proposer or the Raft core stopped, or
        // the entry was lost with the leader. It may still commit under a later leader.
        answer.await.unwrap_or_else(|_| {
            Err(LockError::contention(
                "unknown outcome: the leader stopped before the entry was answered; retry with the same request id",
            ))
        })
    }
}

async fn run<W: LogWriter>(
    writer: W,
    clock: Arc<dyn Clock>,
    mut rx: mpsc::Receiver<Proposal>,
    stamp_floor_ms: Arc<AtomicU64>,
    in_flight_max: usize,
    batch_max: usize,
) {
    let in_flight = Arc::new(Semaphore::new(in_flight_max));
    let mut last_stamp_ms = 0u64;
    loop {
        // Take a slot first, then the commands: while every slot is busy, commands pile up in
        // the queue and the next entry gathers them all (group commit).
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            return;
        };
        let Some(first) = rx.recv().await else {
            return;
        };
        let mut proposals = vec![first];
        // Let the tasks that were woken together with the sender of `first` (requests that
        // arrived in the same poll of the network, typically the answers of one applied entry
        // turning around) queue theirs too: one pass of the scheduler, microseconds, so a lone
        // caller pays nothing noticeable. In W2 (one hot key) this puts the re-queued acquire
        // of the worker that released into the same entry as the next holder's release about
        // a third of the time: 2.0 -> 1.63 entries and +13% hand-offs/s. Two or three passes
        // gathered no more.
        gather_ready(&mut rx, &mut proposals, batch_max).await;
        // An entry of deferrable commands only waits for a prompt one to ride with it.
        if proposals.iter().all(|p| p.deferrable) {
            let until = tokio::time::Instant::now() + DEFERRAL_MAX;
            while proposals.len() < batch_max {
                match tokio::time::timeout_at(until, rx.recv()).await {
                    Ok(Some(p)) => {
                        let prompt = !p.deferrable;
                        proposals.push(p);
                        if prompt {
                            gather_ready(&mut rx, &mut proposals, batch_max).await;
                            break;
                        }
                    }
                    // The deferral is over, or every handle is gone: write what is here.
                    Ok(None) | Err(_) => break,
                }
            }
        }
        // D-time: never below the last stamp, whatever the wall clock did.
        last_stamp_ms = last_stamp_ms
            .max(stamp_floor_ms.load(Ordering::Relaxed))
            .max(clock.wall_ms());
        let (mut commands, replies): (Vec<Command>, Vec<_>) =
            proposals.into_iter().map(|p| (p.command, p.reply)).unzip();
        let command = if commands.len() == 1 {
            commands.pop().unwrap_or(Command::Batch(Vec::new()))
        } else {
            Command::Batch(commands)
        };
        let request = Request {
            stamp_ms: last_stamp_ms,
            command,
        };
        // Answered on the applying task; the slot frees once the callers have their answers
        // (or, if the entry is lost, once the answers are dropped).
        let on_applied: OnApplied = Box::new(move |answer| {
            dispatch(answer, replies);
            drop(permit);
        });
        writer.submit(request, on_applied).await;
    }
}

/// Adds to `proposals` the commands queued by the tasks woken together with the last one's
/// sender: one pass of the scheduler, then whatever the queue holds, up to `batch_max`.
async fn gather_ready(
    rx: &mut mpsc::Receiver<Proposal>,
    proposals: &mut Vec<Proposal>,
    batch_max: usize,
) {
    tokio::task::yield_now().await;
    while proposals.len() < batch_max {
        match rx.try_recv() {
            Ok(p) => proposals.push(p),
            Err(_) => break,
        }
    }
}

/// Sends each caller its own answer: a lone command gets the entry's answer, the commands of a
/// batch get the batch's answers in order.
fn dispatch(
    answer: Result<Response, LockError>,
    replies: Vec<oneshot::Sender<Result<Response, LockError>>>,
) {
    if replies.len() == 1 {
        if let Some(reply) = replies.into_iter().next() {
            let _ = reply.send(answer);
        }
        return;
    }
    match answer {
        Ok(Response::Batch(answers)) if answers.len() == replies.len() => {
            for (reply, answer) in replies.into_iter().zip(answers) {
                let _ = reply.send(Ok(answer));
            }
        }
        Ok(other) => {
            let err = LockError::contention(format!(
                "unknown outcome: a batch of {} commands was answered with {other:?}",
                replies.len()
            ));
            tracing::error!(%err, "batch answer does not match its commands");
            for reply in replies {
                let _ = reply.send(Err(err.clone()));
            }
        }
        Err(err) => {
            for reply in replies {
                let _ = reply.send(Err(err.clone()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use tokio::sync::Notify;

    use super::*;
    use crate::clock::ManualClock;

    /// A leader whose quorum lease lapsed answers a retry-safe `Contention`, not a `NotLeader`
    /// naming no one; a node that knows another leader names it.
    #[test]
    fn a_lapsed_leader_lease_is_contention_and_a_known_leader_is_named() {
        let lapsed =
            ForwardToLeader::<TypeConfig>::empty().with_reason(ForwardReason::LeaseExpired);
        assert!(matches!(not_leader(lapsed), LockError::Contention { .. }));
        let elsewhere =
            ForwardToLeader::<TypeConfig>::new(2, openraft::BasicNode::new("10.0.0.2:7000"));
        assert_eq!(
            not_leader(elsewhere),
            LockError::NotLeader {
                leader_id: Some(2),
                leader_addr: Some("10.0.0.2:7000".into()),
            }
        );
        assert_eq!(
            not_leader(ForwardToLeader::empty()),
            LockError::NotLeader {
                leader_id: None,
                leader_addr: None,
            }
        );
    }

    /// Answers `Release { request_id: n }` with `Queued { position: n }` so each caller can
    /// check it got its own answer; holds the first entry until `gate` is notified. While
    /// `lose` is set, an entry's answer is dropped unsent, as openraft drops the responder of
    /// an entry lost before it is answered.
    #[derive(Clone, Default)]
    struct FakeLog {
        requests: Arc<Mutex<Vec<Request>>>,
        gate: Arc<Notify>,
        lose: Arc<std::sync::atomic::AtomicBool>,
    }

    fn answer_of(command: &Command) -> Response {
        match command {
            Command::Release { request_id, .. } => Response::Queued {
                position: *request_id as u32,
            },
            Command::Batch(commands) => Response::Batch(commands.iter().map(answer_of).collect()),
            _ => Response::NoCommand,
        }
    }

    impl LogWriter for FakeLog {
        async fn submit(&self, request: Request, on_applied: OnApplied) {
            let first = {
                let mut requests = self.requests.lock().unwrap();
                requests.push(request.clone());
                requests.len() == 1
            };
            if self.lose.load(Ordering::SeqCst) {
                drop(on_applied);
                return;
            }
            let gate = self.gate.clone();
            tokio::spawn(async move {
                if first {
                    gate.notified().await;
                }
                on_applied(Ok(answer_of(&request.command)));
            });
        }
    }

    fn release(n: u64) -> Command {
        Command::Release {
            session_id: "s".into(),
            request_id: n,
            key: "k".into(),
            token: 1,
        }
    }

    async fn wait_for(cond: impl Fn() -> bool) {
        tokio::time::timeout(Duration::from_secs(5), async {
            while !cond() {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("condition not reached within 5 s");
    }

    #[tokio::test]
    async fn commands_queued_behind_an_entry_in_flight_form_one_batch_answered_in_order() {
        let log = FakeLog::default();
        let clock = Arc::new(ManualClock::new(1_000));
        let proposer = Proposer::spawn(log.clone(), clock, 1, BATCH_COMMANDS_MAX);

        let first = tokio::spawn({
            let p = proposer.clone();
            async move { p.propose(release(1)).await }
        });
        wait_for(|| log.requests.lock().unwrap().len() == 1).await;
        let later: Vec<_> = (2..=4)
            .map(|n| {
                let p = proposer.clone();
                tokio::spawn(async move { p.propose(release(n)).await })
            })
            .collect();
        // Let the three reach the queue while the first entry holds the only slot.
        wait_for(|| proposer.tx.capacity() == PROPOSALS_QUEUED_MAX - 3).await;
        log.gate.notify_one();

        assert_eq!(first.await.unwrap(), Ok(Response::Queued { position: 1 }));
        for (n, task) in (2..=4).zip(later) {
            assert_eq!(task.await.unwrap(), Ok(Response::Queued { position: n }));
        }
        let requests = log.requests.lock().unwrap().clone();
        assert_eq!(requests.len(), 2, "{requests:?}");
        assert_eq!(requests[0].command, release(1));
        assert_eq!(
            requests[1].command,
            Command::Batch(vec![release(2), release(3), release(4)])
        );
    }

    #[tokio::test]
    async fn stamps_never_go_backwards() {
        let log = FakeLog::default();
        log.gate.notify_one();
        let clock = Arc::new(ManualClock::new(5_000));
        let proposer = Proposer::spawn(log.clone(), clock.clone(), 1, BATCH_COMMANDS_MAX);
        proposer.propose(release(1)).await.unwrap();
        clock.set_wall_ms(4_000);
        proposer.propose(release(2)).await.unwrap();
        clock.set_wall_ms(6_000);
        proposer.propose(release(3)).await.unwrap();
        proposer.raise_stamp_floor(9_000);
        proposer.propose(release(4)).await.unwrap();
        let stamps: Vec<u64> = log
            .requests
            .lock()
            .unwrap()
            .iter()
            .map(|r| r.stamp_ms)
            .collect();
        assert_eq!(stamps, vec![5_000, 5_000, 6_000, 9_000]);
    }

    /// A proposer over an open (ungated) fake log, two entries in flight.
    fn open_proposer() -> (FakeLog, Proposer) {
        let log = FakeLog::default();
        log.gate.notify_one();
        let clock = Arc::new(ManualClock::new(1_000));
        let proposer = Proposer::spawn(log.clone(), clock, 2, BATCH_COMMANDS_MAX);
        (log, proposer)
    }

    /// An entry of deferrable commands only is written once the deferral is over when no
    /// prompt command comes; a prompt command alone is written at once. (Tokio's paused clock:
    /// the durations are the proposer's own timer, not the machine's speed.)
    #[tokio::test(start_paused = true)]
    async fn a_lone_deferrable_command_waits_out_the_deferral_and_a_prompt_one_does_not() {
        let (log, proposer) = open_proposer();

        let start = tokio::time::Instant::now();
        proposer.propose(release(1)).await.unwrap();
        assert_eq!(start.elapsed(), Duration::ZERO);

        let start = tokio::time::Instant::now();
        let answer = proposer.propose_deferrable(release(2)).await;
        assert_eq!(answer, Ok(Response::Queued { position: 2 }));
        assert!(start.elapsed() >= DEFERRAL_MAX, "{:?}", start.elapsed());
        let requests = log.requests.lock().unwrap().clone();
        let commands: Vec<_> = requests.into_iter().map(|r| r.command).collect();
        assert_eq!(commands, vec![release(1), release(2)]);
    }

    /// Deferrable commands ride in the entry of the first prompt command that arrives within
    /// the deferral, in arrival order, and each caller gets its own answer.
    #[tokio::test(start_paused = true)]
    async fn deferrable_commands_ride_with_the_next_prompt_one_in_arrival_order() {
        let (log, proposer) = open_proposer();

        let deferred: Vec<_> = (1..=2)
            .map(|n| {
                let p = proposer.clone();
                tokio::spawn(async move { p.propose_deferrable(release(n)).await })
            })
            .collect();
        wait_for(|| proposer.tx.capacity() == PROPOSALS_QUEUED_MAX).await;
        // Part of the deferral passes with nothing written.
        tokio::time::sleep(DEFERRAL_MAX / 2).await;
        assert!(log.requests.lock().unwrap().is_empty());

        let start = tokio::time::Instant::now();
        assert_eq!(
            proposer.propose(release(3)).await,
            Ok(Response::Queued { position: 3 })
        );
        assert_eq!(start.elapsed(), Duration::ZERO, "the prompt command waited");
        for (n, task) in (1..=2).zip(deferred) {
            assert_eq!(task.await.unwrap(), Ok(Response::Queued { position: n }));
        }
        let requests = log.requests.lock().unwrap().clone();
        assert_eq!(requests.len(), 1, "{requests:?}");
        assert_eq!(
            requests[0].command,
            Command::Batch(vec![release(1), release(2), release(3)])
        );
    }

    /// An entry whose answer is dropped unsent (the leader stopped, the entry was lost) gives
    /// its callers a retry-safe unknown outcome and frees its slot for the next entry.
    #[tokio::test]
    async fn a_lost_entry_is_an_unknown_outcome_and_frees_its_slot() {
        let log = FakeLog::default();
        log.gate.notify_one();
        log.lose.store(true, Ordering::SeqCst);
        let clock = Arc::new(ManualClock::new(1_000));
        let proposer = Proposer::spawn(log.clone(), clock, 1, BATCH_COMMANDS_MAX);
        let lost = tokio::time::timeout(Duration::from_secs(5), proposer.propose(release(1)));
        match lost.await.expect("the lost entry's callers were answered") {
            Err(LockError::Contention { message }) => {
                assert!(message.starts_with("unknown outcome"), "{message}");
                assert!(message.contains("same request id"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        log.lose.store(false, Ordering::SeqCst);
        let next = tokio::time::timeout(Duration::from_secs(5), proposer.propose(release(2)));
        assert_eq!(
            next.await.expect("the lost entry's slot was freed"),
            Ok(Response::Queued { position: 2 })
        );
    }

    /// A write refused or dropped by openraft is answered `NotLeader`, retry-safe with the
    /// same request id, naming the leader when this node knows it.
    #[test]
    fn a_write_openraft_forwards_or_discards_is_not_leader() {
        let leader = || ForwardToLeader::<TypeConfig>::new(2, openraft::BasicNode::new("b:7000"));
        let named = LockError::NotLeader {
            leader_id: Some(2),
            leader_addr: Some("b:7000".into()),
        };
        assert_eq!(
            written_answer(Err(ClientWriteError::ForwardToLeader(leader()))),
            Err(named.clone())
        );
        assert_eq!(
            written_answer(Err(ClientWriteError::LogEntryDiscarded(leader()))),
            Err(named)
        );
    }

    #[test]
    fn a_mismatched_batch_answer_is_an_unknown_outcome_for_everyone() {
        let (tx1, mut rx1) = oneshot::channel();
        let (tx2, mut rx2) = oneshot::channel();
        dispatch(
            Ok(Response::Batch(vec![Response::NoCommand])),
            vec![tx1, tx2],
        );
        for rx in [&mut rx1, &mut rx2] {
            assert!(matches!(
                rx.try_recv().unwrap(),
                Err(LockError::Contention { .. })
            ));
        }
    }
}
