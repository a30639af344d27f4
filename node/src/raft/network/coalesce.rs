//! Commit-only coalescing on an append stream. This is Raft protocol logic, the one place on
//! the client side of the transport that reads inside a Raft message, and it is kept here with
//! its rules stated and tested.
//!
//! openraft sends a **commit-only** append whenever the commit index moves while no new entry
//! is ready, only to tell the follower the new commit: it has no entries and repeats the
//! previous request's last log id as its `prev_log_id` ([`is_commit_only`]). Such a request is
//! held for up to [`COMMIT_ONLY_HOLD`] and, if openraft's next request would get the same
//! answer from the follower, not sent at all but *carried* by that next request
//! ([`carries`]): one follower message and answer fewer per commit when a client works alone
//! or a hot key changes hands. Its answer is then derived from the carrier's ([`Owed`]).
//!
//! The rules, each tested below:
//! - only a commit-only request is ever held; a request with entries, and the first request
//!   of a stream (nothing before it to repeat), leave as they come;
//! - a held request is carried only by a next request with the same vote, the same
//!   `prev_log_id` and a commit index at least as high; anything else goes after it;
//! - order is preserved: what leaves is openraft's requests in order, less the carried ones,
//!   and each carried request is answered, in order, before its carrier;
//! - what is held is one request and a count: a commit-only request that carries the held one
//!   replaces it (and its hold starts again), and a held request leaves on its own once
//!   nothing follows within [`COMMIT_ONLY_HOLD`] or openraft's input ends.
//!
//! Owns which requests leave, in what order, and what each sent one owes openraft. Must not
//! touch the wire: `append_stream` encodes what leaves and reads the follower's answers.

use std::time::Duration;

use futures::{Stream, StreamExt};
use lock_raft_store::{LogId, TypeConfig};
use openraft::raft::{AppendEntriesRequest, StreamAppendResult};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// How long a commit-only append may wait for the next append to carry it (see [`Outgoing`]).
///
/// Between two of a lone client's commands (W3) or two hand-offs of a hot key (W2) there is
/// about one client round trip, well under this; so such a request nearly always travels inside
/// the next append instead of costing its own message, follower wake-up and answer. When
/// nothing follows in time it leaves on its own: a follower learns a commit at most this much
/// later, which delays only its own apply (followers serve no reads), never a commit, an answer
/// to a client or a heartbeat.
pub(super) const COMMIT_ONLY_HOLD: Duration = Duration::from_millis(5);

type Request = AppendEntriesRequest<TypeConfig>;

/// The log id the follower matches once `rpc` succeeds: its last entry's, or, with no entries,
/// its `prev_log_id`.
fn matched_after(rpc: &Request) -> Option<LogId> {
    match rpc.entries.last() {
        Some(entry) => Some(entry.log_id),
        None => rpc.prev_log_id,
    }
}

/// Whether `rpc` only tells the follower a new commit index: it has no entries and its
/// `prev_log_id` is what the follower matches once the last sent request succeeds
/// (`last_sent`, `None` before any request was sent, so a stream's first request never is).
fn is_commit_only(last_sent: Option<Option<LogId>>, rpc: &Request) -> bool {
    rpc.entries.is_empty() && last_sent == Some(rpc.prev_log_id)
}

/// Whether `next` can carry the held commit-only request `held`: it has the same vote and
/// `prev_log_id`, so the follower checks exactly what it would have checked for `held`, and
/// a commit index at least as high, so the follower learns a commit at least as new.
fn carries(next: &Request, held: &Request) -> bool {
    next.vote == held.vote
        && next.prev_log_id == held.prev_log_id
        && next.leader_commit >= held.leader_commit
}

/// The request side of one append stream: openraft's requests in order, except that a
/// commit-only request is held for up to [`COMMIT_ONLY_HOLD`] and carried by the next request
/// when that one [`carries`] it (see the module docs).
///
/// Heartbeats come on streams of their own with one request each and are never held: the first
/// request of a stream has no previous one to repeat, and a request is never held past the end
/// of openraft's input.
pub(super) struct Outgoing<S> {
    input: S,
    /// openraft ended its input.
    ended: bool,
    /// A request read from openraft that did not carry the held one; it goes next.
    lookahead: Option<Request>,
    /// A commit-only request waiting to be carried, and how many earlier ones it carries.
    held: Option<(Request, usize)>,
    /// The log id the follower matches once the last sent request succeeds; `None` before any.
    last_sent: Option<Option<LogId>>,
    /// What each sent request owes, in order, for the answer side.
    sent_tx: mpsc::UnboundedSender<Sent>,
}

impl<S> Outgoing<S>
where
    S: Stream<Item = Request> + Unpin,
{
    /// The request side of a stream reading openraft's requests from `input` and telling the
    /// answer side through `sent_tx` what each sent request owes.
    pub(super) fn new(input: S, sent_tx: mpsc::UnboundedSender<Sent>) -> Self {
        Self {
            input,
            sent_tx,
            ended: false,
            lookahead: None,
            held: None,
            last_sent: None,
        }
    }

    async fn next_input(&mut self) -> Option<Request> {
        if self.ended {
            return None;
        }
        let next = self.input.next().await;
        self.ended = next.is_none();
        next
    }

    /// The next request to send and how many held commit-only requests it carries; `None` once
    /// openraft's input has ended and everything read was sent.
    ///
    /// Cancel-safe: a request read from openraft stays in `held` or `lookahead` across every
    /// await, so if the stream is dropped, [`Drop`] still reports it as owed.
    pub(super) async fn next_request(&mut self) -> Option<(Request, usize)> {
        let (rpc, carried) = loop {
            if self.held.is_none() {
                let rpc = match self.lookahead.take() {
                    Some(rpc) => rpc,
                    None => self.next_input().await?,
                };
                if is_commit_only(self.last_sent, &rpc) {
                    self.held = Some((rpc, 0));
                    continue;
                }
                break (rpc, 0);
            }
            let next = if self.ended {
                None
            } else {
                // Nothing following in time is the same as nothing following: the held request
                // goes on its own. `next()` is cancel-safe, so the timeout loses no request.
                tokio::time::timeout(COMMIT_ONLY_HOLD, self.next_input())
                    .await
                    .ok()
                    .flatten()
            };
            let Some((held, carried)) = self.held.take() else {
                continue;
            };
            match next {
                Some(rpc) if carries(&rpc, &held) => {
                    if rpc.entries.is_empty() {
                        // Another commit-only request: it carries the held ones in turn.
                        self.held = Some((rpc, carried + 1));
                        continue;
                    }
                    break (rpc, carried + 1);
                }
                // Not the same check, or nothing followed: the held request goes first.
                next => {
                    self.lookahead = next;
                    break (held, carried);
                }
            }
        };
        self.last_sent = Some(matched_after(&rpc));
        Some((rpc, carried))
    }

    /// Records that `rpc`, carrying `carried` held requests, is leaving now.
    pub(super) fn sent(&self, rpc: &Request, carried: usize) {
        // Nobody reads these once the answers are dropped; that is fine.
        let _ = self.sent_tx.send(Sent::Request {
            at: Instant::now(),
            carried,
            prev_log_id: rpc.prev_log_id,
        });
    }
}

impl<S> Drop for Outgoing<S> {
    /// A stream that closes (the peer ended it, or the connection broke) while requests wait
    /// here still owes openraft an answer for each: the answer side fails the first of them.
    fn drop(&mut self) {
        if self.held.is_some() || self.lookahead.is_some() {
            let _ = self.sent_tx.send(Sent::Lost);
        }
    }
}

/// What the request side owes openraft, in order.
#[derive(Debug, PartialEq)]
pub(super) enum Sent {
    /// A sent append owes its own answer, after those of the commit-only requests it carries.
    Request {
        /// When it left; its answer is due the stream's TTL later.
        at: Instant,
        /// Held commit-only requests it carries (see [`Outgoing`]).
        carried: usize,
        /// The sent append's `prev_log_id`, which each request it carries had too.
        prev_log_id: Option<LogId>,
    },
    /// The stream closed with requests read from openraft but not sent.
    Lost,
}

/// A follower's answer to a sent append, still to be handed out for the requests it carried and
/// then for itself.
pub(super) struct Owed {
    /// Carried requests still to be answered before the sent one.
    pub(super) carried: usize,
    /// The sent append's `prev_log_id` (see [`Sent::Request`]).
    pub(super) prev_log_id: Option<LogId>,
    /// The follower's answer to the sent append.
    pub(super) result: StreamAppendResult<TypeConfig>,
}

impl Owed {
    /// The next answer for openraft, and what is still owed after it.
    ///
    /// A carried commit-only request had the sent request's vote and `prev_log_id`, so the
    /// follower would have answered it the same way: a conflict or a higher vote is its answer
    /// too, and a success matched at least its `prev_log_id` (never more is claimed for it than
    /// the follower confirmed).
    pub(super) fn next(self) -> (StreamAppendResult<TypeConfig>, Option<Owed>) {
        if self.carried == 0 {
            return (self.result, None);
        }
        let answer = match &self.result {
            Ok(matching) => Ok((*matching).min(self.prev_log_id)),
            Err(err) => Err(err.clone()),
        };
        let rest = Owed {
            carried: self.carried - 1,
            ..self
        };
        (answer, Some(rest))
    }
}

#[cfg(test)]
mod tests {
    use lock_raft_store::Vote;
    use openraft::raft::StreamAppendError;
    use tokio_stream::wrappers::UnboundedReceiverStream;

    use super::super::test_peer::{append_after, log_id};
    use super::*;

    type Input = UnboundedReceiverStream<Request>;

    /// An [`Outgoing`] over a channel the test feeds, and the channel of what it owes.
    fn outgoing() -> (
        mpsc::UnboundedSender<Request>,
        Outgoing<Input>,
        mpsc::UnboundedReceiver<Sent>,
    ) {
        let (requests, input) = mpsc::unbounded_channel();
        let (sent_tx, sent_rx) = mpsc::unbounded_channel();
        let outgoing = Outgoing::new(UnboundedReceiverStream::new(input), sent_tx);
        (requests, outgoing, sent_rx)
    }

    /// A request told apart in assertions by what it sends: its `prev_log_id`'s index, its
    /// entries' indexes and its commit index.
    type Shape = (Option<u64>, Vec<u64>, Option<u64>);

    fn shape(rpc: &Request) -> Shape {
        (
            rpc.prev_log_id.map(|id| id.index),
            rpc.entries.iter().map(|e| e.log_id.index).collect(),
            rpc.leader_commit.map(|id| id.index),
        )
    }

    /// Everything `outgoing` sends once its input has ended: each request's shape and how
    /// many it carries, recorded as sent as the transport does.
    async fn drain(outgoing: &mut Outgoing<Input>) -> Vec<(Shape, usize)> {
        let mut out = Vec::new();
        while let Some((rpc, carried)) = outgoing.next_request().await {
            outgoing.sent(&rpc, carried);
            out.push((shape(&rpc), carried));
        }
        out
    }

    /// The appends a leader in term 1 sends after entry 1: the first (entry 1) and, in
    /// `then`, what follows it.
    fn after_entry_one(then: &[Request]) -> Vec<Request> {
        let mut all = vec![append_after(None, &[1], None)];
        all.extend_from_slice(then);
        all
    }

    fn feed(requests: &mpsc::UnboundedSender<Request>, all: Vec<Request>) {
        for rpc in all {
            requests.send(rpc).unwrap();
        }
    }

    #[test]
    fn commit_only_means_no_entries_and_the_last_sent_match_repeated() {
        let commit_only = append_after(Some(1), &[], Some(1));
        assert!(is_commit_only(Some(Some(log_id(1))), &commit_only));
        // The first request of a stream: nothing was sent, so nothing is repeated.
        assert!(!is_commit_only(None, &commit_only));
        assert!(!is_commit_only(None, &append_after(None, &[], None)));
        // Entry-less but after another match: a probe of an earlier point, not commit-only.
        assert!(!is_commit_only(Some(Some(log_id(2))), &commit_only));
        // Entries are never commit-only.
        assert!(!is_commit_only(
            Some(Some(log_id(1))),
            &append_after(Some(1), &[2], Some(1))
        ));
    }

    #[test]
    fn a_request_carries_a_held_one_only_with_the_same_check_and_no_older_commit() {
        let held = append_after(Some(1), &[], Some(1));
        assert!(carries(&append_after(Some(1), &[2], Some(1)), &held));
        assert!(carries(&append_after(Some(1), &[2], Some(2)), &held));
        assert!(carries(&append_after(Some(1), &[], Some(2)), &held));
        // An older commit index would tell the follower less than the held request did.
        assert!(!carries(&append_after(Some(1), &[2], None), &held));
        // Another `prev_log_id` is another check on the follower.
        assert!(!carries(&append_after(Some(2), &[3], Some(1)), &held));
        assert!(!carries(&append_after(None, &[1], Some(1)), &held));
        // Another vote: the follower might answer it otherwise.
        let mut other_vote = append_after(Some(1), &[2], Some(1));
        other_vote.vote = Vote::new_committed(2, 1);
        assert!(!carries(&other_vote, &held));
    }

    #[tokio::test(start_paused = true)]
    async fn a_commit_only_request_is_carried_by_the_next_append_and_owed_before_it() {
        let (requests, mut outgoing, mut sent) = outgoing();
        feed(
            &requests,
            after_entry_one(&[
                append_after(Some(1), &[], Some(1)),
                append_after(Some(1), &[2], Some(1)),
            ]),
        );
        drop(requests);
        let start = Instant::now();
        assert_eq!(
            drain(&mut outgoing).await,
            [((None, vec![1], None), 0), ((Some(1), vec![2], Some(1)), 1)]
        );
        assert_eq!(
            start.elapsed(),
            Duration::ZERO,
            "nothing waited for the hold"
        );
        let owed: Vec<_> = std::iter::from_fn(|| sent.try_recv().ok()).collect();
        assert_eq!(
            owed,
            [
                Sent::Request {
                    at: start,
                    carried: 0,
                    prev_log_id: None
                },
                Sent::Request {
                    at: start,
                    carried: 1,
                    prev_log_id: Some(log_id(1))
                },
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn successive_commit_only_requests_are_held_as_one_and_carried_by_the_next_append() {
        let (requests, mut outgoing, _sent) = outgoing();
        feed(
            &requests,
            after_entry_one(&[
                append_after(Some(1), &[], Some(1)),
                append_after(Some(1), &[], Some(1)),
                append_after(Some(1), &[], Some(1)),
                append_after(Some(1), &[2, 3], Some(1)),
            ]),
        );
        drop(requests);
        assert_eq!(
            drain(&mut outgoing).await,
            [
                ((None, vec![1], None), 0),
                ((Some(1), vec![2, 3], Some(1)), 3)
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_held_request_goes_before_a_next_one_that_cannot_carry_it() {
        let mut newer_vote = append_after(Some(1), &[2], Some(1));
        newer_vote.vote = Vote::new_committed(2, 1);
        let cannot_carry = [
            ("an older commit", append_after(Some(1), &[2], None)),
            ("another prev_log_id", append_after(Some(0), &[1], Some(1))),
            ("another vote", newer_vote),
        ];
        for (why, next) in cannot_carry {
            let (requests, mut outgoing, _sent) = outgoing();
            let next_shape = shape(&next);
            feed(
                &requests,
                after_entry_one(&[append_after(Some(1), &[], Some(1)), next]),
            );
            drop(requests);
            assert_eq!(
                drain(&mut outgoing).await,
                [
                    ((None, vec![1], None), 0),
                    ((Some(1), vec![], Some(1)), 0),
                    (next_shape, 0),
                ],
                "{why}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn requests_with_entries_and_a_streams_first_request_are_never_held() {
        let (requests, mut outgoing, _sent) = outgoing();
        // A heartbeat stream: one entry-less request with nothing before it.
        requests.send(append_after(None, &[], Some(1))).unwrap();
        let start = Instant::now();
        let (first, carried) = outgoing.next_request().await.expect("a request");
        assert_eq!((shape(&first), carried), ((None, vec![], Some(1)), 0));
        // An append with entries leaves as it comes, though the input stays open.
        requests.send(append_after(None, &[1], Some(1))).unwrap();
        let (second, carried) = outgoing.next_request().await.expect("a request");
        assert_eq!((shape(&second), carried), ((None, vec![1], Some(1)), 0));
        assert_eq!(start.elapsed(), Duration::ZERO, "nothing was held");
    }

    #[tokio::test(start_paused = true)]
    async fn a_held_request_with_nothing_after_it_leaves_alone_when_the_hold_runs_out() {
        let (requests, mut outgoing, _sent) = outgoing();
        feed(
            &requests,
            after_entry_one(&[append_after(Some(1), &[], Some(1))]),
        );
        outgoing.next_request().await.expect("the first append");
        // The input stays open and idle.
        let start = Instant::now();
        let (held, carried) = outgoing.next_request().await.expect("the held request");
        assert_eq!((shape(&held), carried), ((Some(1), vec![], Some(1)), 0));
        assert_eq!(start.elapsed(), COMMIT_ONLY_HOLD);
        // A later append after it is no longer a candidate: the held request already left.
        requests.send(append_after(Some(1), &[2], Some(1))).unwrap();
        let (next, carried) = outgoing.next_request().await.expect("the next append");
        assert_eq!((shape(&next), carried), ((Some(1), vec![2], Some(1)), 0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_held_request_leaves_at_once_when_the_input_ends() {
        let (requests, mut outgoing, _sent) = outgoing();
        feed(
            &requests,
            after_entry_one(&[append_after(Some(1), &[], Some(1))]),
        );
        drop(requests);
        let start = Instant::now();
        assert_eq!(
            drain(&mut outgoing).await,
            [((None, vec![1], None), 0), ((Some(1), vec![], Some(1)), 0)]
        );
        assert_eq!(start.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn each_commit_only_request_that_carries_the_held_one_starts_its_hold_again() {
        let (requests, mut outgoing, _sent) = outgoing();
        requests.send(append_after(None, &[1], None)).unwrap();
        outgoing.next_request().await.expect("the first append");
        // Three commit-only requests, each within the hold of the one before.
        let gap = COMMIT_ONLY_HOLD - Duration::from_millis(1);
        let feeder = requests.clone();
        tokio::spawn(async move {
            for _ in 0..3 {
                feeder.send(append_after(Some(1), &[], Some(1))).unwrap();
                tokio::time::sleep(gap).await;
            }
        });
        let start = Instant::now();
        let (last, carried) = outgoing.next_request().await.expect("the held request");
        assert_eq!((shape(&last), carried), ((Some(1), vec![], Some(1)), 2));
        // Held from the third request's arrival (after two gaps) for one hold.
        assert_eq!(start.elapsed(), 2 * gap + COMMIT_ONLY_HOLD);
        drop(requests);
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_being_held_survives_a_cancelled_call_and_goes_in_order() {
        let (requests, mut outgoing, _sent) = outgoing();
        feed(
            &requests,
            after_entry_one(&[append_after(Some(1), &[], Some(1))]),
        );
        outgoing.next_request().await.expect("the first append");
        // The transport stops polling half-way through the hold.
        let cut_short = tokio::time::timeout(COMMIT_ONLY_HOLD / 2, outgoing.next_request()).await;
        assert!(cut_short.is_err(), "nothing leaves before the hold ends");
        requests.send(append_after(Some(1), &[2], Some(1))).unwrap();
        drop(requests);
        assert_eq!(
            drain(&mut outgoing).await,
            [((Some(1), vec![2], Some(1)), 1)]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_dropped_with_a_request_held_owes_a_lost_answer() {
        let (requests, mut outgoing, mut sent) = outgoing();
        feed(
            &requests,
            after_entry_one(&[append_after(Some(1), &[], Some(1))]),
        );
        let (rpc, carried) = outgoing.next_request().await.expect("the first append");
        outgoing.sent(&rpc, carried);
        let _ = tokio::time::timeout(COMMIT_ONLY_HOLD / 2, outgoing.next_request()).await;
        drop(outgoing);
        assert!(matches!(
            sent.try_recv(),
            Ok(Sent::Request { carried: 0, .. })
        ));
        assert_eq!(sent.try_recv(), Ok(Sent::Lost));
        assert!(sent.try_recv().is_err(), "one loss, reported once");
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_dropped_with_nothing_waiting_owes_nothing_more() {
        let (requests, mut outgoing, mut sent) = outgoing();
        requests.send(append_after(None, &[1], None)).unwrap();
        let (rpc, carried) = outgoing.next_request().await.expect("the first append");
        outgoing.sent(&rpc, carried);
        drop(outgoing);
        assert!(matches!(
            sent.try_recv(),
            Ok(Sent::Request { carried: 0, .. })
        ));
        assert!(sent.try_recv().is_err());
    }

    /// Every answer `owed` hands out, in order.
    fn answers(owed: Owed) -> Vec<StreamAppendResult<TypeConfig>> {
        let mut out = Vec::new();
        let mut owed = Some(owed);
        while let Some(next) = owed {
            let (answer, rest) = next.next();
            out.push(answer);
            owed = rest;
        }
        out
    }

    #[test]
    fn carried_requests_are_answered_first_and_claim_no_more_than_their_own_prev_log_id() {
        let owed = Owed {
            carried: 2,
            prev_log_id: Some(log_id(1)),
            result: Ok(Some(log_id(3))),
        };
        assert_eq!(
            answers(owed),
            [
                Ok(Some(log_id(1))),
                Ok(Some(log_id(1))),
                Ok(Some(log_id(3)))
            ]
        );
    }

    #[test]
    fn a_conflict_or_a_higher_vote_is_every_carried_requests_answer_too() {
        let conflict = Owed {
            carried: 1,
            prev_log_id: Some(log_id(1)),
            result: Err(StreamAppendError::Conflict(log_id(1))),
        };
        assert_eq!(
            answers(conflict),
            [
                Err(StreamAppendError::Conflict(log_id(1))),
                Err(StreamAppendError::Conflict(log_id(1)))
            ]
        );
        let higher = Vote::new_committed(2, 2);
        let deposed = Owed {
            carried: 1,
            prev_log_id: Some(log_id(1)),
            result: Err(StreamAppendError::HigherVote(higher)),
        };
        assert_eq!(
            answers(deposed),
            [
                Err(StreamAppendError::HigherVote(higher)),
                Err(StreamAppendError::HigherVote(higher))
            ]
        );
    }

    #[test]
    fn an_answer_that_carries_nothing_is_handed_out_once() {
        let owed = Owed {
            carried: 0,
            prev_log_id: None,
            result: Ok(Some(log_id(1))),
        };
        assert_eq!(answers(owed), [Ok(Some(log_id(1)))]);
    }
}
