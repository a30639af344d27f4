//! The receiving side of the Raft transport: the `lockd.v1.RaftService` server, handing each
//! decoded openraft request to the local `Raft` and answering its postcard-encoded result.
//!
//! Owns decoding and encoding only. Bytes from the network are never trusted: a payload that
//! does not decode is answered `InvalidArgument`, never a panic. Raft's own errors travel back
//! inside the payload (`Result<Resp, RaftError>`), so the sender sees them as remote errors.
//!
//! `AppendStream` serves a leader's pipelined appends on one long-lived stream: each message is
//! decoded and handed to openraft's `stream_append` as it arrives, without waiting for the
//! answers to those before it; openraft answers them in request order. A snapshot arrives as
//! one stream too (a header and its bytes), bounded by `SNAPSHOT_BYTES_MAX`.

use std::pin::Pin;
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use lock_proto::v1::RaftPayload;
use lock_proto::v1::raft_service_server::RaftService;
use lock_raft_store::storage::{SnapshotInbox, StorageError};
use lock_raft_store::{NodeId, Raft, Snapshot, SnapshotData, TypeConfig};
use openraft::raft::{AppendEntriesRequest, VoteRequest};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::{oneshot, watch};
use tonic::{Request, Response, Status, Streaming};

use super::network::PeerHints;
use super::{SnapshotHeader, StreamAnswer};

/// The answers of an `AppendStream`.
pub type AppendAnswers = Pin<Box<dyn Stream<Item = Result<RaftPayload, Status>> + Send>>;

/// The decoded appends of an `AppendStream`, as openraft's `stream_append` takes them.
type AppendRequests = Pin<Box<dyn Stream<Item = AppendEntriesRequest<TypeConfig>> + Send>>;

/// Serves `lockd.v1.RaftService` for the local Raft node.
#[derive(Clone)]
pub struct RaftRpc {
    raft: Raft,
    /// Where a snapshot a leader sends is written as it arrives.
    inbox: SnapshotInbox,
    /// Becomes true when the node stops: open append streams then take no new append.
    stop: watch::Receiver<bool>,
    /// Where a peer's `Hello` goes: this node's next attempt to it comes forward.
    hints: PeerHints,
}

impl std::fmt::Debug for RaftRpc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RaftRpc").finish_non_exhaustive()
    }
}

impl RaftRpc {
    /// Serves `raft`, whose state machine takes snapshots in through `inbox`; `stop` turning
    /// true ends every open append stream before its next message, so that a stopping node
    /// acknowledges no further append. A peer's `Hello` goes to `hints`, the hints of the
    /// network this node's Raft calls its peers through.
    pub fn new(
        raft: Raft,
        inbox: SnapshotInbox,
        stop: watch::Receiver<bool>,
        hints: PeerHints,
    ) -> Self {
        Self {
            raft,
            inbox,
            stop,
            hints,
        }
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

/// Turns an `AppendStream`'s messages into appends for `pipeline` (openraft's `stream_append`,
/// which answers them in order) and its answers into messages. The appends end at the
/// transport's end or error, when the node stops, or at the first message that does not decode;
/// that one is answered `InvalidArgument` after the answers to the appends before it.
fn answer_appends<S, F, R>(pipeline: F, incoming: S, stop: watch::Receiver<bool>) -> AppendAnswers
where
    S: Stream<Item = Result<RaftPayload, Status>> + Send + Unpin + 'static,
    F: FnOnce(AppendRequests) -> R,
    R: Stream<Item = StreamAnswer> + Send + 'static,
{
    let (garbage_tx, garbage_rx) = oneshot::channel::<Status>();
    let requests = futures::stream::unfold(
        (incoming, stop, Some(garbage_tx)),
        |(mut incoming, mut stop, mut garbage_tx)| async move {
            let next = tokio::select! {
                biased;
                _ = stop.wait_for(|stopping| *stopping) => {
                    tracing::debug!("shutting down: append stream takes no more appends");
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
            match decode::<AppendEntriesRequest<TypeConfig>>("append", &payload) {
                Ok(rpc) => Some((rpc, (incoming, stop, garbage_tx))),
                Err(status) => {
                    tracing::warn!(%status, "undecodable append; ending the append stream");
                    if let Some(tx) = garbage_tx.take() {
                        let _ = tx.send(status);
                    }
                    None
                }
            }
        },
    );
    let answers = pipeline(Box::pin(requests)).map(|answer| encode("append", &answer));
    let garbage = futures::stream::once(garbage_rx)
        .filter_map(|garbage| std::future::ready(garbage.ok().map(Err)));
    Box::pin(answers.chain(garbage))
}

/// Most answers openraft's pipeline may have ready before the stream carrying them takes them
/// (openraft's own pipeline buffer is as deep).
const PIPELINE_ANSWERS_BUFFERED: usize = 64;

/// openraft's `stream_append` for `requests`, as a stream that owns what it needs. openraft's
/// stream borrows the `Raft` handle it came from (an artifact of its return type), so a task
/// that owns the handle drives it and forwards the answers; the task ends with the appends, or
/// as soon as nobody reads the answers.
fn openraft_pipeline(
    raft: Raft,
    requests: AppendRequests,
) -> impl Stream<Item = StreamAnswer> + Send + 'static {
    let (tx, rx) = tokio::sync::mpsc::channel(PIPELINE_ANSWERS_BUFFERED);
    tokio::spawn(async move {
        let answers = raft.stream_append(requests);
        futures::pin_mut!(answers);
        loop {
            let answer = tokio::select! {
                _ = tx.closed() => break,
                answer = answers.next() => answer,
            };
            let Some(answer) = answer else { break };
            if tx
                .send(answer.map_err(|fatal| fatal.to_string()))
                .await
                .is_err()
            {
                break;
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// A failure to take a snapshot in: the sender's (too long, too short, damaged:
/// `InvalidArgument`) or this node's disk (`Internal`).
fn refused(err: StorageError) -> Status {
    match err {
        StorageError::Io { .. } => Status::internal(format!("snapshot: {err}")),
        _ => Status::invalid_argument(format!("snapshot: {err}")),
    }
}

/// Runs `f` on a blocking thread (snapshot files are written with blocking calls).
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StorageError> + Send + 'static,
) -> Result<T, Status> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|join| Status::internal(format!("snapshot: the writing task failed: {join}")))?
        .map_err(refused)
}

/// Reads a `Snapshot` stream: the header, then exactly `header.len` bytes of data, at most
/// [`SNAPSHOT_BYTES_MAX`](lock_raft_store::storage::SNAPSHOT_BYTES_MAX), written into a file
/// of `inbox` as they arrive (never whole in memory) and checked (the data record's version
/// and checksum) once all arrived.
async fn receive_snapshot<S>(
    inbox: &SnapshotInbox,
    mut incoming: S,
) -> Result<(SnapshotHeader, SnapshotData), Status>
where
    S: Stream<Item = Result<RaftPayload, Status>> + Unpin,
{
    let first = incoming
        .next()
        .await
        .transpose()?
        .ok_or_else(|| Status::invalid_argument("snapshot: the stream has no header"))?;
    let header: SnapshotHeader = decode("snapshot header", &first)?;
    // `receive` refuses a length above the limit before it creates any file.
    let started = Instant::now();
    let mut file = {
        let (inbox, meta, len) = (inbox.clone(), header.meta.clone(), header.len);
        blocking(move || inbox.receive(&meta, len)).await?
    };
    let mut writing = Duration::ZERO;
    while let Some(chunk) = incoming.next().await.transpose()? {
        let write = Instant::now();
        file = blocking(move || file.write(&chunk.data).map(|()| file)).await?;
        writing += write.elapsed();
    }
    let arrived = started.elapsed();
    // The checks of the whole and the file's head (the install syncs the file as it decodes).
    let data = blocking(move || file.finish()).await?;
    let took = started.elapsed();
    tracing::info!(
        index = header.meta.last_log_id.map(|id| id.index),
        bytes = header.len,
        took_ms = took.as_millis() as u64,
        writing_ms = writing.as_millis() as u64,
        finishing_ms = (took - arrived).as_millis() as u64,
        "snapshot received from the leader"
    );
    Ok((header, data))
}

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
            move |requests| openraft_pipeline(raft, requests),
            request.into_inner(),
            self.stop.clone(),
        )))
    }

    async fn vote(&self, request: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let rpc: VoteRequest<TypeConfig> = decode("vote", request.get_ref())?;
        let answer = self.raft.vote(rpc).await;
        encode("vote", &answer).map(Response::new)
    }

    async fn pre_vote(
        &self,
        request: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        let rpc: VoteRequest<TypeConfig> = decode("pre-vote", request.get_ref())?;
        let answer = self.raft.pre_vote(rpc).await;
        encode("pre-vote", &answer).map(Response::new)
    }

    async fn snapshot(
        &self,
        request: Request<Streaming<RaftPayload>>,
    ) -> Result<Response<RaftPayload>, Status> {
        let (header, data) = receive_snapshot(&self.inbox, request.into_inner()).await?;
        let snapshot = Snapshot {
            meta: header.meta,
            snapshot: data,
        };
        let answer = self
            .raft
            .install_full_snapshot(header.vote, snapshot)
            .await
            .map_err(|fatal| fatal.to_string());
        encode("snapshot", &answer).map(Response::new)
    }

    /// A peer that has just started says it is listening: a retry of it that waits for its
    /// backoff goes now (`raft::network::hello`). Answers `()`.
    async fn hello(&self, request: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let peer: NodeId = decode("hello", request.get_ref())?;
        self.hints.heard_from(peer);
        encode("hello", &()).map(Response::new)
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;
    use lock_raft_store::storage::SNAPSHOT_BYTES_MAX;
    use lock_raft_store::{LeaderId, LogId, SnapshotMeta};

    use super::*;

    #[test]
    fn a_hello_that_is_not_a_node_id_is_invalid_argument_with_its_length() {
        let payload = RaftPayload { data: vec![0x80] };
        let err = decode::<NodeId>("hello", &payload).unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(err.message().contains("1 bytes"), "{}", err.message());
        let good = RaftPayload {
            data: postcard::to_stdvec(&7u64).unwrap(),
        };
        assert_eq!(decode::<NodeId>("hello", &good).unwrap(), 7);
    }

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
            vote: lock_raft_store::Vote::new_committed(term, 1),
            prev_log_id: None,
            entries: Vec::new(),
            leader_commit: None,
        };
        RaftPayload {
            data: postcard::to_stdvec(&rpc).unwrap(),
        }
    }

    /// A pipeline that answers each append with a log id whose index is the append's term, so
    /// that order is visible, and records the terms it saw.
    fn echo_terms(
        seen: std::sync::Arc<std::sync::Mutex<Vec<u64>>>,
    ) -> impl FnOnce(AppendRequests) -> futures::stream::BoxStream<'static, StreamAnswer> {
        move |requests| {
            requests
                .map(move |rpc| {
                    let term = rpc.vote.leader_id().term;
                    seen.lock().unwrap().push(term);
                    Ok(Ok(Some(LogId::new(LeaderId { term, node_id: 1 }, term))))
                })
                .boxed()
        }
    }

    fn answered_index(answer: &Result<RaftPayload, Status>) -> u64 {
        let payload = answer.as_ref().expect("an answer, not an error");
        let decoded: StreamAnswer = postcard::from_bytes(&payload.data).unwrap();
        decoded.unwrap().unwrap().unwrap().index
    }

    #[tokio::test]
    async fn a_stream_answers_each_append_in_order_and_ends_after_garbage() {
        let seen = std::sync::Arc::default();
        let incoming = futures::stream::iter(vec![
            Ok(append_request(4)),
            Ok(append_request(5)),
            Ok(RaftPayload {
                data: vec![0xff; 3],
            }),
            Ok(append_request(6)),
        ]);
        let (_stop_tx, stop) = watch::channel(false);
        let answers: Vec<_> =
            answer_appends(echo_terms(std::sync::Arc::clone(&seen)), incoming, stop)
                .collect()
                .await;
        assert_eq!(answers.len(), 3, "{answers:?}");
        assert_eq!(answered_index(&answers[0]), 4);
        assert_eq!(answered_index(&answers[1]), 5);
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
        let (requests, incoming) = tokio::sync::mpsc::channel(4);
        let (stop_tx, stop) = watch::channel(false);
        let mut answers = answer_appends(
            echo_terms(std::sync::Arc::default()),
            tokio_stream::wrappers::ReceiverStream::new(incoming).map(Ok),
            stop,
        );
        requests.send(append_request(1)).await.unwrap();
        assert_eq!(answered_index(&answers.next().await.unwrap()), 1);
        stop_tx.send(true).unwrap();
        // The leader's next append is never answered (and so never acknowledged): the stream
        // ends, though the leader has not closed its side.
        requests.send(append_request(2)).await.unwrap();
        assert!(answers.next().await.is_none());
    }

    fn header(len: u64) -> Result<RaftPayload, Status> {
        let header = SnapshotHeader {
            vote: lock_raft_store::Vote::new_committed(3, 1),
            meta: SnapshotMeta {
                last_log_id: Some(LogId::new(
                    LeaderId {
                        term: 3,
                        node_id: 1,
                    },
                    9,
                )),
                last_membership: Default::default(),
            },
            len,
        };
        Ok(RaftPayload {
            data: postcard::to_stdvec(&header).unwrap(),
        })
    }

    fn chunk(bytes: &[u8]) -> Result<RaftPayload, Status> {
        Ok(RaftPayload {
            data: bytes.to_vec(),
        })
    }

    /// A snapshot is its header and exactly the bytes announced, a sound data record, written
    /// into a file of the inbox; anything else is refused and leaves no file behind.
    #[tokio::test]
    async fn a_snapshot_is_its_header_and_exactly_the_bytes_announced() {
        let dir = tempfile::tempdir().unwrap();
        let inbox = lock_raft_store::StateMachineStore::open(dir.path(), None)
            .unwrap()
            .inbox();
        // A data record: format version 1, the payload's CRC, the payload.
        let mut record = vec![1u8];
        record.extend_from_slice(&crc32fast::hash(b"abc").to_le_bytes());
        record.extend_from_slice(b"abc");
        let stream =
            futures::stream::iter(vec![header(8), chunk(&record[..2]), chunk(&record[2..])]);
        let (received, data) = receive_snapshot(&inbox, stream)
            .await
            .expect("a whole snapshot");
        assert_eq!(received.len, 8);
        assert_eq!(received.meta.last_log_id.map(|id| id.index), Some(9));
        assert_eq!(data.to_vec().unwrap(), record);
        assert!(format!("{data:?}").contains(".tmp"), "{data:?}");
        drop(data);

        let mut damaged = record.clone();
        damaged[6] ^= 1;
        for (name, messages) in [
            ("short", vec![header(8), chunk(&record[..5])]),
            ("long", vec![header(2), chunk(b"abc")]),
            (
                "over the limit",
                vec![header(SNAPSHOT_BYTES_MAX as u64 + 1)],
            ),
            ("no header", vec![]),
            ("garbage header", vec![chunk(&[0xff; 4])]),
            ("damaged", vec![header(8), chunk(&damaged)]),
        ] {
            let err = receive_snapshot(&inbox, futures::stream::iter(messages))
                .await
                .expect_err(name);
            assert_eq!(err.code(), tonic::Code::InvalidArgument, "{name}: {err}");
        }
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(left.is_empty(), "files left behind: {left:?}");
    }

    #[test]
    fn vote_round_trips_through_postcard() {
        let vote = VoteRequest::<TypeConfig>::new(lock_raft_store::Vote::new(3, 2), None);
        let bytes = postcard::to_stdvec(&vote).unwrap();
        let back: VoteRequest<TypeConfig> = decode("vote", &RaftPayload { data: bytes }).unwrap();
        assert_eq!(back, vote);
    }
}
