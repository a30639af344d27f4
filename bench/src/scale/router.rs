//! W5's clients to the cluster: one connection to each node, the calls W5 makes (pipelined
//! lock calls, heartbeat batches, sessions, confirmed reads), each sent to the node believed to
//! lead and retried while the answer is retry-safe — following a `NotLeader` hint, moving to
//! another node when the connection fails, after the SDK's jittered exponential backoff
//! (`lock_client::backoff`, its default 25 ms doubling to 1 s), as an SDK client would, so a
//! refusing leader is not answered with a retry storm — and every refusal counted by kind. The count of
//! refusals a healthy leader gives (`NotLeader` with no election) is one of W5's figures.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow};
use lock_client::backoff::Backoff;
use lock_client::pipeline::Pipeline;
use lock_client::{BackoffConfig, LockError};
use lock_proto::v1::lock_service_client::LockServiceClient;
use lock_proto::v1::session_service_client::SessionServiceClient;
use serde::Serialize;
use tonic::Status;
use tonic::transport::Channel;

use super::cluster::{Cluster, LeaderCell};

/// How long a call is retried before it fails.
pub const RETRY_FOR: Duration = Duration::from_secs(60);
/// The server-side bound every pipelined call carries.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// How a failed call was refused: the lockd error kind, or `transport:<code>` when the
/// answer carried no lockd detail (the connection failed, the node is down).
pub fn kind_of(status: &Status) -> (String, LockError) {
    let error = lock_proto::lock_error_from_status(status);
    let kind = if status.details().is_empty() {
        format!("transport:{:?}", status.code())
    } else {
        match &error {
            LockError::NotLeader { .. } => "not_leader",
            LockError::Contention { .. } => "contention",
            LockError::LockLost { .. } => "lock_lost",
            LockError::FencedOut { .. } => "fenced_out",
            LockError::InvalidArgument { .. } => "invalid_argument",
            LockError::Unauthenticated { .. } => "unauthenticated",
            LockError::PermissionDenied { .. } => "permission_denied",
            _ => "other",
        }
        .to_owned()
    };
    (kind, error)
}

/// Refusals counted by kind, with the first message of each kind.
#[derive(Debug, Default)]
pub struct Refusals(Mutex<BTreeMap<String, RefusalCount>>);

/// How often one kind of refusal was answered.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct RefusalCount {
    /// Answers of this kind.
    pub count: u64,
    /// The first one, as the error printed.
    pub first: String,
}

impl Refusals {
    /// Counts one refusal of `kind`.
    pub fn note(&self, kind: &str, error: &LockError) {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let entry = map.entry(kind.to_owned()).or_default();
        if entry.count == 0 {
            entry.first = error.to_string();
        }
        entry.count += 1;
    }

    /// The counts so far.
    pub fn counts(&self) -> BTreeMap<String, RefusalCount> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The counts answered since `before` (an earlier [`Refusals::counts`]).
    pub fn since(&self, before: &BTreeMap<String, RefusalCount>) -> BTreeMap<String, RefusalCount> {
        self.counts()
            .into_iter()
            .filter_map(|(kind, now)| {
                let was = before.get(&kind).map_or(0, |c| c.count);
                (now.count > was).then(|| {
                    (
                        kind,
                        RefusalCount {
                            count: now.count - was,
                            first: now.first,
                        },
                    )
                })
            })
            .collect()
    }
}

/// Every refusal's total in `counts`.
pub fn total(counts: &BTreeMap<String, RefusalCount>) -> u64 {
    counts.values().map(|c| c.count).sum()
}

/// Clients to every node of the cluster, on one connection per node.
#[derive(Debug)]
pub struct Router {
    pipelines: Vec<Arc<Pipeline>>,
    locks: Vec<LockServiceClient<Channel>>,
    sessions: Vec<SessionServiceClient<Channel>>,
    ids: Vec<u64>,
    leader: Arc<LeaderCell>,
    /// Where every refusal this router sees is counted.
    pub refusals: Arc<Refusals>,
}

impl Router {
    /// New connections to every node of `cluster` (made on first use), counting refusals
    /// into `refusals`.
    pub fn new(cluster: &Cluster, refusals: Arc<Refusals>) -> Result<Self> {
        let channels = cluster.channels()?;
        Ok(Self {
            pipelines: channels
                .iter()
                .map(|c| Arc::new(Pipeline::new(c.clone())))
                .collect(),
            locks: channels
                .iter()
                .map(|c| LockServiceClient::new(c.clone()))
                .collect(),
            sessions: channels
                .iter()
                .map(|c| SessionServiceClient::new(c.clone()))
                .collect(),
            ids: cluster.nodes.iter().map(|n| n.id).collect(),
            leader: cluster.leader.clone(),
            refusals,
        })
    }

    /// Node `index`'s pipeline.
    pub fn pipeline(&self, index: usize) -> Arc<Pipeline> {
        self.pipelines[index].clone()
    }

    /// Node `index`'s lock service (unary: `Inspect`).
    pub fn lock(&self, index: usize) -> LockServiceClient<Channel> {
        self.locks[index].clone()
    }

    /// Node `index`'s session service.
    pub fn session(&self, index: usize) -> SessionServiceClient<Channel> {
        self.sessions[index].clone()
    }

    /// Nodes the router knows.
    pub fn node_count(&self) -> usize {
        self.ids.len()
    }

    /// Makes `call` at the node believed to lead, retrying retry-safe refusals for up to
    /// [`RETRY_FOR`]: a `NotLeader` with a hint at the hinted node at once, one without after
    /// the backoff's next delay, a failed connection at the next node after it. `what` names
    /// the call in errors.
    pub async fn call<T, F, Fut>(&self, what: &str, call: F) -> Result<T>
    where
        F: Fn(usize) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let deadline = Instant::now() + RETRY_FOR;
        let mut backoff = Backoff::new(BackoffConfig::default(), None);
        let mut node = self.leader.get();
        loop {
            let status = match call(node).await {
                Ok(answer) => return Ok(answer.into_inner()),
                Err(status) => status,
            };
            let (kind, error) = kind_of(&status);
            self.refusals.note(&kind, &error);
            if !error.is_retry_safe() {
                return Err(anyhow!("{what}: {error}"));
            }
            if Instant::now() > deadline {
                return Err(anyhow!(
                    "{what}: still refused after {RETRY_FOR:?}: {error}"
                ));
            }
            let hinted = match &error {
                LockError::NotLeader {
                    leader_id: Some(id),
                    ..
                } => self.ids.iter().position(|i| i == id),
                _ => None,
            };
            match hinted {
                Some(hinted) if hinted != node => {
                    self.leader.set(hinted);
                    node = hinted;
                    continue;
                }
                _ => {}
            }
            if kind.starts_with("transport:") {
                // That node is unreachable: ask the next one (it answers with a hint).
                node = (node + 1) % self.ids.len();
            } else {
                node = self.leader.get();
            }
            tokio::time::sleep(backoff.next_delay()).await;
        }
    }
}
