//! The append stream: the appends of one openraft replication session (entries and
//! heartbeats, the hot path), **pipelined** on one `AppendStream` call.
//!
//! openraft hands over a stream of requests and reads a stream of results; each request leaves
//! as soon as openraft makes it (less the commit-only ones `coalesce` lets the next request
//! carry), without waiting for the answers to those before it. The follower answers in order,
//! so the n-th answer is the n-th sent request's. Every request must be answered within
//! openraft's RPC TTL, but at least [`APPEND_ANSWER_TIMEOUT_MIN`], from the moment it was
//! sent, or the stream fails with a timeout: a partitioned or paused follower is noticed even
//! though the stream itself never times out.
//!
//! Owns the gate before the stream opens, the encoding of what leaves, the deadline of each
//! answer and the pairing of answers with what `coalesce` says each sent request owes. It
//! reads nothing inside a Raft message but whether an answer is a match: openraft's stream
//! contract is that a conflict or a higher vote is the last answer.

use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use lock_proto::v1::RaftPayload;
use lock_raft_store::{NodeId, TypeConfig};
use openraft::OptionalSend;
use openraft::network::{RPCOption, RPCTypes};
use openraft::raft::{AppendEntriesRequest, StreamAppendResult};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::call_error::{CallError, classify, rpc_error};
use super::coalesce::{Outgoing, Owed, Sent};
use super::dial::observe;
use super::payload::{decode, encode};
use super::{PeerClient, Purpose, RpcError};
use crate::raft::StreamAnswer;
use crate::raft::peer_health::PeerHealth;

/// The least time an append on a stream has to be answered, counted from when it was sent.
///
/// openraft passes its heartbeat interval (50 ms by default) as the TTL of a replication stream.
/// A pipelined append can wait that long behind the follower's earlier appends and fsyncs on a
/// busy machine, and a stream that fails is restarted only after openraft's backoff: measured
/// in lock-bench, a 50 ms deadline made 1 in 20 commits stall for about 45 ms and halved W2.
/// A follower that is gone closes the connection at once; this bound is for one that is cut
/// off silently or paused (openraft's heartbeats, with their own deadline, are what depose a
/// leader that cannot reach its followers).
const APPEND_ANSWER_TIMEOUT_MIN: Duration = Duration::from_secs(2);

/// The results openraft reads from one append stream.
type Results = Result<StreamAppendResult<TypeConfig>, RpcError>;

impl PeerClient {
    /// `RaftNetworkV2::stream_append`: waits for the peer's turn unless this is the heartbeat
    /// client, then opens an `AppendStream` carrying `input`.
    pub(super) async fn append_stream<S>(
        &mut self,
        input: S,
        option: RPCOption,
    ) -> Result<impl Stream<Item = Results> + use<S>, RpcError>
    where
        S: Stream<Item = AppendEntriesRequest<TypeConfig>> + OptionalSend + Unpin + 'static,
    {
        // The backoff has to be here, before the dial, and not left to openraft (issue 17).
        // openraft's `ReplicationCore::run_stream_session` (openraft 0.10.0-alpha.37,
        // src/replication/mod.rs) treats an error from this call by counting it and
        // returning to its main loop, which asks RaftCore for the payload again and calls
        // this at once; openraft's backoff sleeps only inside the request stream
        // (`StreamState::next_request`, src/replication/stream_state.rs), which tonic polls
        // only once the connection is up. Against a refused connection that loop spun at a
        // core's worth of CPU and two WARN lines per turn. Waiting for the peer's turn here
        // paces it; a heartbeat that gets through ends the wait early.
        let wait = self.purpose != Purpose::Heartbeat;
        if let Err(err) = self.gate(wait).await {
            return Err(self.error(RPCTypes::AppendEntries, err));
        }
        let ttl = option.hard_ttl().max(APPEND_ANSWER_TIMEOUT_MIN);
        self.open_append_stream(input, ttl).await
    }

    /// Opens an `AppendStream` carrying `input`, and returns its answers, each bounded by `ttl`
    /// from the moment its request was sent.
    async fn open_append_stream<S>(
        &mut self,
        input: S,
        ttl: Duration,
    ) -> Result<impl Stream<Item = Results> + use<S>, RpcError>
    where
        S: Stream<Item = AppendEntriesRequest<TypeConfig>> + OptionalSend + Unpin + 'static,
    {
        let kind = RPCTypes::AppendEntries;
        let mut client = self.client().map_err(|e| self.error(kind, e))?;
        // What each sent request owes, in order; its answer is due `ttl` after it left.
        let (sent_tx, sent_rx) = mpsc::unbounded_channel::<Sent>();
        let requests = requests(Outgoing::new(input, sent_tx));
        let opened = match tokio::time::timeout(ttl, client.append_stream(requests)).await {
            Err(_) => Err(CallError::Timeout(ttl)),
            Ok(Err(status)) => Err(classify(status)),
            Ok(Ok(response)) => Ok(response.into_inner()),
        };
        // A stream's deadline is seconds: a timeout here is a peer cut off, not a busy one.
        self.observe(&opened, true);
        let answers = opened.map_err(|err| self.error(kind, err))?;
        Ok(Answers {
            answers,
            sent_rx,
            owed: None,
            ttl,
            self_id: self.self_id,
            target: self.target,
            health: self.health.clone(),
            addr: self.addr.clone(),
        }
        .into_stream())
    }
}

/// The messages of the request side: what `outgoing` lets leave, encoded, each recorded as
/// sent as it goes. An append that does not encode ends the stream (the answer side then
/// fails what it still owes).
fn requests<S>(outgoing: Outgoing<S>) -> impl Stream<Item = RaftPayload>
where
    S: Stream<Item = AppendEntriesRequest<TypeConfig>> + Unpin,
{
    futures::stream::unfold(outgoing, |mut outgoing| async move {
        let (rpc, carried) = outgoing.next_request().await?;
        match encode("append", &rpc) {
            Ok(payload) => {
                outgoing.sent(&rpc, carried);
                Some((payload, outgoing))
            }
            Err(err) => {
                tracing::error!(?err, "an append does not encode; ending the append stream");
                None
            }
        }
    })
}

/// The answer side of one append stream.
struct Answers {
    answers: tonic::Streaming<RaftPayload>,
    sent_rx: mpsc::UnboundedReceiver<Sent>,
    /// Answers known but not yet handed to openraft.
    owed: Option<Owed>,
    /// How long after it left each request's answer is due.
    ttl: Duration,
    /// This node and the peer, for openraft's errors.
    self_id: NodeId,
    target: NodeId,
    /// The peer's health and address, told when the stream fails.
    health: Arc<PeerHealth>,
    addr: String,
}

impl Answers {
    /// The results for openraft: one per request it made, in order, ending after the first
    /// failure or the first answer that is not a match.
    fn into_stream(self) -> impl Stream<Item = Results> {
        futures::stream::unfold(Some(self), |state| async move {
            let mut state = state?;
            let (result, more) = state.next_result().await?;
            Some((result, more.then_some(state)))
        })
    }

    /// The next result for openraft and whether any may follow it; `None` once openraft
    /// ended its input and every request was answered.
    async fn next_result(&mut self) -> Option<(Results, bool)> {
        let owed = match self.owed.take() {
            Some(owed) => owed,
            None => match self.sent_rx.recv().await? {
                Sent::Request {
                    at,
                    carried,
                    prev_log_id,
                } => match self.answer_to(at).await {
                    Ok(result) => Owed {
                        carried,
                        prev_log_id,
                        result,
                    },
                    // A failure is the first owed request's; the stream ends with it. The peer
                    // went away or is cut off: its next stream waits its turn.
                    Err(err) => {
                        observe(&self.health, &self.addr, Err(&err), true);
                        return Some((Err(self.error(err)), false));
                    }
                },
                Sent::Lost => {
                    let err = CallError::Unreachable(tonic::Status::unavailable(
                        "append stream closed before this append was sent",
                    ));
                    return Some((Err(self.error(err)), false));
                }
            },
        };
        let (result, rest) = owed.next();
        self.owed = rest;
        // After a conflict or a higher vote the peer answers nothing more.
        let more = result.is_ok();
        Some((Ok(result), more))
    }

    /// The follower's answer to the request that left at `at`, due `ttl` after.
    async fn answer_to(
        &mut self,
        at: Instant,
    ) -> Result<StreamAppendResult<TypeConfig>, CallError> {
        match tokio::time::timeout_at(at + self.ttl, self.answers.message()).await {
            Err(_) => Err(CallError::Timeout(self.ttl)),
            Ok(Err(status)) => Err(classify(status)),
            Ok(Ok(None)) => Err(CallError::Unreachable(tonic::Status::unavailable(
                "append stream ended by the peer",
            ))),
            Ok(Ok(Some(payload))) => decode::<StreamAnswer>("append answer", self.target, &payload)
                .and_then(|answer| answer.map_err(CallError::Remote)),
        }
    }

    fn error(&self, err: CallError) -> RpcError {
        rpc_error(self.self_id, self.target, RPCTypes::AppendEntries, err)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use futures::StreamExt;
    use openraft::error::RPCError;

    use super::super::test_peer::{
        FakePeer, TTL, append_after, append_request, client_of, log_id, matched, open_stream,
        reaches,
    };
    use super::*;

    #[tokio::test]
    async fn appends_leave_before_earlier_ones_are_answered_and_answers_come_in_order() {
        let peer = FakePeer::default();
        let mut client = client_of(peer.clone()).await;
        let (requests, mut answers) = open_stream(&mut client, TTL).await;
        for term in 1..=20 {
            requests.send(append_request(term)).unwrap();
        }
        // All twenty reach the peer while no answer has been read: they are pipelined.
        assert!(reaches(&peer.appends_received, 20).await);
        let terms: Vec<_> = (1..=20).map(Some).collect();
        assert_eq!(matched(&mut answers, 20).await, terms);
        drop(requests);
        assert!(answers.next().await.is_none(), "input ended, all answered");
        assert_eq!(peer.streams_opened.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn an_unanswered_append_times_out_and_ends_the_stream() {
        let peer = FakePeer {
            silent: true,
            ..FakePeer::default()
        };
        let mut client = client_of(peer.clone()).await;
        // openraft's TTL is short; the answer is still given the floor.
        let ttl = APPEND_ANSWER_TIMEOUT_MIN;
        let (requests, mut answers) = open_stream(&mut client, Duration::from_millis(50)).await;
        // Idle time before a request is not counted against it.
        tokio::time::sleep(ttl + Duration::from_millis(200)).await;
        let sent = Instant::now();
        requests.send(append_request(1)).unwrap();
        let answer = answers.next().await.expect("an item");
        assert!(matches!(answer, Err(RPCError::Timeout(_))), "{answer:?}");
        assert!(
            sent.elapsed() >= ttl,
            "timed out early: {:?}",
            sent.elapsed()
        );
        assert!(answers.next().await.is_none(), "a failed stream ends");
    }

    #[tokio::test]
    async fn a_stream_the_peer_ends_fails_the_append_it_owed() {
        let peer = FakePeer {
            end_after: Some(1),
            ..FakePeer::default()
        };
        let mut client = client_of(peer.clone()).await;
        let (requests, mut answers) = open_stream(&mut client, TTL).await;
        requests.send(append_request(1)).unwrap();
        requests.send(append_request(2)).unwrap();
        assert_eq!(matched(&mut answers, 1).await, [Some(1)]);
        let second = answers.next().await.expect("an item");
        assert!(
            matches!(second, Err(RPCError::Unreachable(_))),
            "{second:?}"
        );
        assert!(answers.next().await.is_none());
    }

    #[tokio::test]
    async fn a_commit_only_append_rides_in_the_next_append_and_both_are_answered_in_order() {
        let peer = FakePeer::default();
        let mut client = client_of(peer.clone()).await;
        let (requests, mut answers) = open_stream(&mut client, TTL).await;
        requests.send(append_after(None, &[1], None)).unwrap();
        // The commit moved and nothing new was written: openraft's commit-only request...
        requests.send(append_after(Some(1), &[], Some(1))).unwrap();
        // ...and the next entries, with the same check and a commit at least as new.
        requests.send(append_after(Some(1), &[2], Some(1))).unwrap();
        assert_eq!(matched(&mut answers, 3).await, [Some(1), Some(1), Some(2)]);
        assert_eq!(
            peer.appends_received.load(Ordering::SeqCst),
            2,
            "the commit-only request travelled inside the next append"
        );
    }

    #[tokio::test]
    async fn a_commit_only_append_with_nothing_after_it_leaves_on_its_own() {
        let peer = FakePeer::default();
        let mut client = client_of(peer.clone()).await;
        let (requests, mut answers) = open_stream(&mut client, TTL).await;
        requests.send(append_after(None, &[1], None)).unwrap();
        requests.send(append_after(Some(1), &[], Some(1))).unwrap();
        // The input stays open and idle: the hold runs out and the request is sent.
        assert_eq!(matched(&mut answers, 2).await, [Some(1), Some(1)]);
        assert!(reaches(&peer.appends_received, 2).await);
    }

    #[tokio::test]
    async fn a_commit_only_append_goes_first_when_the_next_append_checks_something_else() {
        let peer = FakePeer::default();
        let mut client = client_of(peer.clone()).await;
        let (requests, mut answers) = open_stream(&mut client, TTL).await;
        requests.send(append_after(None, &[1], None)).unwrap();
        requests.send(append_after(Some(1), &[], Some(1))).unwrap();
        // A lower commit index than the held request's: it cannot carry it.
        requests.send(append_after(Some(1), &[2], None)).unwrap();
        assert_eq!(matched(&mut answers, 3).await, [Some(1), Some(1), Some(2)]);
        assert_eq!(peer.appends_received.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_conflict_on_the_carrying_append_is_the_carried_requests_answer_and_ends_the_stream()
    {
        let peer = FakePeer {
            conflict_from: Some(1),
            ..FakePeer::default()
        };
        let mut client = client_of(peer.clone()).await;
        let (requests, mut answers) = open_stream(&mut client, TTL).await;
        requests.send(append_after(None, &[1], None)).unwrap();
        requests.send(append_after(Some(1), &[], Some(1))).unwrap();
        requests
            .send(append_after(Some(1), &[2, 3], Some(1)))
            .unwrap();
        assert_eq!(matched(&mut answers, 1).await, [Some(1)]);
        let carried = answers.next().await.expect("an answer").expect("no error");
        assert_eq!(
            carried,
            Err(openraft::raft::StreamAppendError::Conflict(log_id(1)))
        );
        assert!(answers.next().await.is_none(), "nothing after a conflict");
        assert_eq!(peer.appends_received.load(Ordering::SeqCst), 2);
    }
}
