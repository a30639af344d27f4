//! The receiving side of the Raft transport: the `lockd.v1.RaftService` server, handing each
//! decoded openraft request to the local `Raft` and answering its postcard-encoded result.
//!
//! Owns decoding and encoding only. Bytes from the network are never trusted: a payload that
//! does not decode is answered `InvalidArgument`, never a panic. Raft's own errors travel back
//! inside the payload (`Result<Resp, RaftError>`), so the sender sees them as remote errors.
//!
//! `AppendStream` serves a leader's appends on one long-lived stream: each message is decoded,
//! handed to the local `Raft` and answered before the next is read, so answers come back in
//! request order. The work runs inside the stream that carries the answers (no task or channel
//! of its own), so one append costs the follower one wake-up for its DATA frame.

use std::future::Future;
use std::pin::Pin;

use futures::Stream;
use lock_proto::v1::RaftPayload;
use lock_proto::v1::raft_service_server::RaftService;
use lock_raft_store::{NodeId, TypeConfig};
use openraft::Raft;
use openraft::error::RaftError;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, VoteRequest,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tonic::{Request, Response, Status, Streaming};

/// The answers of one `AppendStream`, in request order.
pub type AppendAnswers = Pin<Box<dyn Stream<Item = Result<RaftPayload, Status>> + Send>>;

/// The Raft transport server of one node.
#[derive(Clone)]
pub struct RaftRpc {
    raft: Raft<TypeConfig>,
    /// Turns `true` when the node starts shutting down: append streams end.
    stop: watch::Receiver<bool>,
}

impl std::fmt::Debug for RaftRpc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RaftRpc").finish_non_exhaustive()
    }
}

impl RaftRpc {
    /// Serves `raft`'s transport until `stop` turns `true`: from then on an open append
    /// stream ends before its next message, so a stopping node stops acknowledging appends on
    /// it, as it stops accepting unary ones. (Without this an in-process node, whose runtime
    /// outlives its server, kept acknowledging on a leader's open stream after its stop:
    /// `t60_conformance_raft`'s cut.)
    pub fn new(raft: Raft<TypeConfig>, stop: watch::Receiver<bool>) -> Self {
        Self { raft, stop }
    }
}

fn decode<T: DeserializeOwned>(what: &str, payload: &RaftPayload) -> Result<T, Status> {
    postcard::from_bytes(&payload.data).map_err(|e| {
        Status::invalid_argument(format!(
            "{what}: payload of {} bytes does not decode: {e}",
            payload.data.len()
        ))
    })
}

fn encode<T: Serialize>(what: &str, answer: &T) -> Result<RaftPayload, Status> {
    postcard::to_stdvec(answer)
        .map(|data| RaftPayload { data })
        .map_err(|e| Status::internal(format!("{what}: answer does not encode: {e}")))
}

/// Answers the appends arriving on `incoming` one at a time, in order, through `append` (the
/// local `Raft` in production). Ends when the sender closes its side or the transport fails;
/// after a message that does not decode it answers that error and ends, since the sender's next
/// message could not be matched to an answer any more.
fn answer_appends<S, F, Fut>(append: F, incoming: S, stop: watch::Receiver<bool>) -> AppendAnswers
where
    S: Stream<Item = Result<RaftPayload, Status>> + Send + Unpin + 'static,
    F: FnMut(AppendEntriesRequest<TypeConfig>) -> Fut + Send + 'static,
    Fut: Future<Output = AppendResult> + Send,
{
    use futures::StreamExt;
    Box::pin(futures::stream::unfold(
        Some((append, incoming, stop)),
        |state| async move {
            let (mut append, mut incoming, mut stop) = state?;
            let next = tokio::select! {
                biased;
                _ = stop.wait_for(|stopping| *stopping) => {
                    tracing::debug!("shutting down: append stream ends");
                    return None;
                }
                next = incoming.next() => next,
            };
            let payload = match next? {
                Ok(payload) => payload,
                Err(status) => {
                    tracing::debug!(%status, "append stream ended by the transport");
                    return None;
                }
            };
            let answer = match decode::<AppendEntriesRequest<TypeConfig>>("append", &payload) {
                Ok(rpc) => encode("append", &append(rpc).await),
                Err(status) => Err(status),
            };
            let next = answer.is_ok().then_some((append, incoming, stop));
            Some((answer, next))
        },
    ))
}

/// What `Raft::append_entries` answers.
type AppendResult = Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>;

#[tonic::async_trait]
impl RaftService for RaftRpc {
    async fn append(&self, request: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let rpc: AppendEntriesRequest<TypeConfig> = decode("append", request.get_ref())?;
        let answer = self.raft.append_entries(rpc).await;
        encode("append", &answer).map(Response::new)
    }

    type AppendStreamStream = AppendAnswers;

    async fn append_stream(
        &self,
        request: Request<Streaming<RaftPayload>>,
    ) -> Result<Response<AppendAnswers>, Status> {
        let raft = self.raft.clone();
        Ok(Response::new(answer_appends(
            move |rpc| {
                let raft = raft.clone();
                async move { raft.append_entries(rpc).await }
            },
            request.into_inner(),
            self.stop.clone(),
        )))
    }

    async fn vote(&self, request: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let rpc: VoteRequest<u64> = decode("vote", request.get_ref())?;
        let answer = self.raft.vote(rpc).await;
        encode("vote", &answer).map(Response::new)
    }

    async fn snapshot(
        &self,
        request: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        let rpc: InstallSnapshotRequest<TypeConfig> = decode("snapshot", request.get_ref())?;
        let answer = self.raft.install_snapshot(rpc).await;
        encode("snapshot", &answer).map(Response::new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_is_invalid_argument_not_a_panic() {
        let payload = RaftPayload {
            data: vec![0xff; 7],
        };
        let err = decode::<AppendEntriesRequest<TypeConfig>>("append", &payload).unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(err.message().contains("append"), "{}", err.message());
    }

    fn append_request(term: u64) -> RaftPayload {
        let rpc = AppendEntriesRequest::<TypeConfig> {
            vote: openraft::Vote::new_committed(term, 1),
            prev_log_id: None,
            entries: Vec::new(),
            leader_commit: None,
        };
        RaftPayload {
            data: postcard::to_stdvec(&rpc).unwrap(),
        }
    }

    #[tokio::test]
    async fn a_stream_answers_each_append_in_order_and_ends_after_garbage() {
        use futures::StreamExt;
        use std::sync::{Arc, Mutex};
        let seen = Arc::new(Mutex::new(Vec::new()));
        let incoming = futures::stream::iter(vec![
            Ok(append_request(4)),
            Ok(append_request(5)),
            Ok(RaftPayload {
                data: vec![0xff; 3],
            }),
            Ok(append_request(6)),
        ]);
        let append = {
            let seen = seen.clone();
            move |rpc: AppendEntriesRequest<TypeConfig>| {
                let term = rpc.vote.leader_id().term;
                seen.lock().unwrap().push(term);
                async move {
                    // Answer with a term-dependent value so order is visible.
                    Ok(AppendEntriesResponse::HigherVote(openraft::Vote::new(
                        term, 9,
                    )))
                }
            }
        };
        let (_stop_tx, stop) = watch::channel(false);
        let answers: Vec<_> = answer_appends(append, incoming, stop).collect().await;
        assert_eq!(answers.len(), 3, "{answers:?}");
        for (answer, term) in answers.iter().take(2).zip([4, 5]) {
            let payload = answer.as_ref().expect("an answer, not an error");
            let decoded: AppendResult = postcard::from_bytes(&payload.data).unwrap();
            assert_eq!(
                decoded,
                Ok(AppendEntriesResponse::HigherVote(openraft::Vote::new(
                    term, 9
                )))
            );
        }
        let err = answers[2].as_ref().unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert_eq!(
            *seen.lock().unwrap(),
            vec![4, 5],
            "nothing after the garbage"
        );
    }

    #[tokio::test]
    async fn a_stream_ends_before_its_next_message_once_the_node_stops() {
        use futures::StreamExt;
        let (requests, incoming) = tokio::sync::mpsc::channel(4);
        let (stop_tx, stop) = watch::channel(false);
        let append = |rpc: AppendEntriesRequest<TypeConfig>| async move {
            Ok(AppendEntriesResponse::HigherVote(rpc.vote))
        };
        let mut answers = answer_appends(
            append,
            tokio_stream::wrappers::ReceiverStream::new(incoming).map(Ok),
            stop,
        );
        requests.send(append_request(1)).await.unwrap();
        assert!(
            answers.next().await.unwrap().is_ok(),
            "answered while running"
        );
        stop_tx.send(true).unwrap();
        // The leader's next append is never answered (and so never acknowledged): the stream
        // ends, though the leader has not closed its side.
        requests.send(append_request(2)).await.unwrap();
        assert!(answers.next().await.is_none());
    }

    #[test]
    fn vote_round_trips_through_postcard() {
        let vote = VoteRequest::<u64>::new(openraft::Vote::new(3, 2), None);
        let bytes = postcard::to_stdvec(&vote).unwrap();
        let back: VoteRequest<u64> = decode("vote", &RaftPayload { data: bytes }).unwrap();
        assert_eq!(back, vote);
    }
}
