//! `LockService.Pipeline` and the Raft `AppendStream` against real clusters: calls on one
//! stream run concurrently and get the answers their unary forms get (grants, idempotent
//! retries, errors as `ErrorDetail`s), a follower answers each call `NotLeader` and keeps the
//! stream, and nodes with both kinds of long-lived stream open still stop gracefully, at once,
//! ending the client's stream. (That a stopping node stops answering on an open stream is
//! tested where it is decided: the unit tests of `lockd::grpc::pipeline` and
//! `lockd::raft::service`, and the cut in `t60_conformance_raft`.)

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use lock_proto::error::lock_error_from_detail;
use lock_proto::v1::pipeline_request::Call;
use lock_proto::v1::pipeline_response::Answer;
use lock_proto::v1::{
    AcquireRequest, PipelineRequest, PipelineResponse, ReleaseRequest, TryAcquireRequest,
};
use lock_tests::{Cluster, LockError, NodeClient, next_request_id};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

/// Lease of the test sessions and grants.
const TTL: Duration = Duration::from_secs(60);

/// How long one answer may take on two loaded cores before the test gives up.
const ANSWER_WAIT: Duration = Duration::from_secs(20);

/// What lockd logs when a graceful stop had to cut calls still running (server.rs).
const DRAIN_CUT: &str = "calls still in flight after";

/// One open `Pipeline` stream.
struct Pipe {
    calls: mpsc::Sender<PipelineRequest>,
    answers: Streaming<PipelineResponse>,
}

impl Pipe {
    async fn open(node: &NodeClient) -> Self {
        let (calls, outgoing) = mpsc::channel(64);
        let answers = node
            .lock_service()
            .pipeline(ReceiverStream::new(outgoing))
            .await
            .expect("Pipeline opens")
            .into_inner();
        Self { calls, answers }
    }

    async fn send(&self, call_id: u64, call: Option<Call>) {
        self.calls
            .send(PipelineRequest {
                call_id,
                timeout_ms: 10_000,
                call,
            })
            .await
            .expect("stream open");
    }

    async fn next(&mut self) -> PipelineResponse {
        tokio::time::timeout(ANSWER_WAIT, self.answers.message())
            .await
            .expect("an answer in time")
            .expect("no transport error")
            .expect("the stream is still open")
    }

    /// The next `n` answers, by call id.
    async fn answers(&mut self, n: usize) -> BTreeMap<u64, Answer> {
        let mut by_id = BTreeMap::new();
        for _ in 0..n {
            let answer = self.next().await;
            let previous = by_id.insert(answer.call_id, answer.answer.expect("an answer"));
            assert!(previous.is_none(), "call {} answered twice", answer.call_id);
        }
        by_id
    }
}

fn acquire(session_id: &str, request_id: u64, key: &str) -> Call {
    Call::Acquire(AcquireRequest {
        session_id: session_id.to_owned(),
        request_id,
        key: key.to_owned(),
        ttl_ms: TTL.as_millis() as u64,
        max_wait_ms: 0,
    })
}

fn error_of(answer: &Answer) -> LockError {
    match answer {
        Answer::Error(detail) => lock_error_from_detail(detail.clone()),
        other => panic!("expected an error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_on_one_stream_get_their_unary_answers() {
    let mut cluster = Cluster::start(3).await;
    let leader = cluster.leader_client().await;
    let session = leader.open_session("piped", TTL).await.expect("session");
    let mut pipe = Pipe::open(&leader).await;

    let keys: Vec<String> = (0..20).map(|i| format!("piped-{i}")).collect();
    let request_ids: Vec<u64> = keys.iter().map(|_| next_request_id()).collect();
    for (i, key) in keys.iter().enumerate() {
        pipe.send(
            100 + i as u64,
            Some(acquire(&session.id, request_ids[i], key)),
        )
        .await;
    }
    pipe.send(1, None).await;
    pipe.send(2, Some(acquire(&session.id, next_request_id(), "")))
        .await;
    let answers = pipe.answers(keys.len() + 2).await;

    let mut tokens = BTreeMap::new();
    for (i, key) in keys.iter().enumerate() {
        match &answers[&(100 + i as u64)] {
            Answer::Acquire(a) => {
                let grant = a.grant.as_ref().expect("a free key is granted");
                assert_eq!(&grant.key, key);
                assert_eq!(grant.session_id, session.id);
                tokens.insert(key.clone(), grant.fencing_token);
            }
            other => panic!("acquire of {key}: {other:?}"),
        }
    }
    let distinct: BTreeSet<u64> = tokens.values().copied().collect();
    assert_eq!(
        distinct.len(),
        keys.len(),
        "one token per grant: {tokens:?}"
    );
    assert!(
        matches!(error_of(&answers[&1]), LockError::InvalidArgument { .. }),
        "a call without a call: {:?}",
        answers[&1]
    );
    assert!(
        matches!(error_of(&answers[&2]), LockError::InvalidArgument { .. }),
        "a blank key: {:?}",
        answers[&2]
    );

    // A retried request id is answered from memory, as a unary retry would be.
    pipe.send(200, Some(acquire(&session.id, request_ids[0], &keys[0])))
        .await;
    match pipe.answers(1).await.remove(&200) {
        Some(Answer::Acquire(a)) => assert_eq!(
            a.grant.map(|g| g.fencing_token),
            Some(tokens[&keys[0]]),
            "the retry gets the first answer"
        ),
        other => panic!("retried acquire: {other:?}"),
    }
    // A held key is refused to another session, on the pipeline as in a unary call.
    let other = leader.open_session("other", TTL).await.expect("session");
    pipe.send(
        300,
        Some(Call::TryAcquire(TryAcquireRequest {
            session_id: other.id.clone(),
            request_id: next_request_id(),
            key: keys[1].clone(),
            ttl_ms: TTL.as_millis() as u64,
        })),
    )
    .await;
    match pipe.answers(1).await.remove(&300) {
        Some(Answer::Acquire(a)) => assert!(a.grant.is_none(), "held by the first session"),
        other => panic!("try_acquire of a held key: {other:?}"),
    }

    for (i, key) in keys.iter().enumerate() {
        let release = Call::Release(ReleaseRequest {
            session_id: session.id.clone(),
            request_id: next_request_id(),
            key: key.clone(),
            fencing_token: tokens[key],
        });
        pipe.send(400 + i as u64, Some(release)).await;
    }
    let released = pipe.answers(keys.len()).await;
    for (id, answer) in &released {
        assert!(
            matches!(answer, Answer::Release(r) if r.released),
            "release call {id}: {answer:?}"
        );
    }
    for key in &keys {
        assert_eq!(
            leader.inspect(key, true).await.expect("inspect"),
            None,
            "{key} is free after its piped release"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_answers_each_call_not_leader_and_keeps_the_stream() {
    let mut cluster = Cluster::start(3).await;
    let leader_id = cluster.leader().await;
    let follower = cluster.followers().await[0];
    let session = cluster
        .client(leader_id)
        .open_session("piped", TTL)
        .await
        .expect("session");
    let mut pipe = Pipe::open(&cluster.client(follower)).await;
    for call_id in [7, 8] {
        pipe.send(
            call_id,
            Some(acquire(&session.id, next_request_id(), "at-a-follower")),
        )
        .await;
        let answer = pipe.next().await;
        assert_eq!(answer.call_id, call_id);
        match error_of(&answer.answer.expect("an answer")) {
            LockError::NotLeader {
                leader_id: Some(id),
                leader_addr: Some(addr),
            } => {
                assert_eq!(id, leader_id);
                assert_eq!(addr, cluster.addr(leader_id));
            }
            other => panic!("a follower must answer NotLeader with the leader, got {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_ends_open_streams_instead_of_waiting_for_them() {
    let mut cluster = Cluster::start(3).await;
    let leader_id = cluster.leader().await;
    let leader = cluster.client(leader_id);
    let session = leader.open_session("piped", TTL).await.expect("session");
    // The leader's append streams to both followers are open once anything commits.
    let mut pipe = Pipe::open(&leader).await;
    pipe.send(1, Some(acquire(&session.id, next_request_id(), "k")))
        .await;
    assert!(matches!(pipe.next().await.answer, Some(Answer::Acquire(_))));

    // A follower with the leader's append stream open stops at once...
    let follower = cluster.followers().await[0];
    let status = cluster.stop(follower).await;
    assert!(status.success(), "follower exit: {status:?}");
    // ...and so does the leader with a client's idle pipeline open; the pipeline ends.
    let status = cluster.stop(leader_id).await;
    assert!(status.success(), "leader exit: {status:?}");
    let end = tokio::time::timeout(ANSWER_WAIT, pipe.answers.message())
        .await
        .expect("the stream ends with the node");
    assert!(
        !matches!(end, Ok(Some(_))),
        "no answer was owed, yet: {end:?}"
    );
    for id in [follower, leader_id] {
        let log = std::fs::read_to_string(cluster.log_path(id)).expect("node log");
        assert!(
            !log.contains(DRAIN_CUT),
            "node {id}'s stop had to cut calls still in flight:\n{}",
            cluster.log_tails()
        );
    }
}
