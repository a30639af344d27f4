//! [`RaftBackend`]: the [`Backend`](crate::backend::Backend) over this node's Raft cluster.
//!
//! Owns the node-side orchestration of every client request, split by what each part owns:
//! - `requests`: the rules of each operation (validation, then the leader check, then a
//!   proposal or a leader-local lease change) — the `Backend` implementation;
//! - `leadership`: the leader check, lease readiness after promote, the coalesced
//!   confirmation round, `NotLeader` with the leader's address, and the serving watch;
//! - `rejection`: the state machine's `Rejection` as a `LockError`, in one place;
//! - `cancel`: withdrawing a waiting acquire whose caller went away;
//! - `admin`: status, initialisation and membership, straight from and to openraft;
//! - `spi`: C2's `LockStore` + `SessionRegistry` over the same requests (the conformance
//!   suite drives it).
//!
//! Does not speak gRPC (see `grpc/`) and does not decide lock outcomes (the state machine
//! does).

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use lock_api::LockError;
use lock_raft_store::storage::StateReader;
use lock_raft_store::{Command, Raft, Response};

use crate::backend::Grant;
use crate::clock::Clock;
use crate::leader::confirm::Confirmer;
use crate::leader::leases::LeaseKeeper;
use crate::leader::proposer::Proposer;
use crate::leader::waiters::WaiterRegistry;
use crate::log_limit::LogLimit;

mod admin;
mod cancel;
mod leadership;
mod rejection;
mod requests;
mod spi;

pub use leadership::CONFIRM_TIMEOUT;

/// What the backend is built from (see `server`).
#[derive(Clone)]
pub struct RaftBackendParts {
    /// This node's id.
    pub node_id: u64,
    /// The Raft node.
    pub raft: Raft,
    /// The proposer writing to `raft`.
    pub proposer: Proposer,
    /// Lease deadlines.
    pub keeper: Arc<LeaseKeeper>,
    /// Waiting acquires.
    pub waiters: Arc<WaiterRegistry>,
    /// Read view of the applied state.
    pub reader: StateReader,
    /// The node's clocks.
    pub clock: Arc<dyn Clock>,
    /// Turns `true` when the node starts shutting down: waiting acquires stop waiting.
    pub stop: tokio::sync::watch::Receiver<bool>,
}

impl std::fmt::Debug for RaftBackendParts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RaftBackendParts")
            .field("node_id", &self.node_id)
            .finish_non_exhaustive()
    }
}

struct Inner {
    node_id: u64,
    raft: Raft,
    proposer: Proposer,
    keeper: Arc<LeaseKeeper>,
    waiters: Arc<WaiterRegistry>,
    reader: StateReader,
    clock: Arc<dyn Clock>,
    stop: tokio::sync::watch::Receiver<bool>,
    confirmer: Confirmer,
    /// `true` while a leader is known (see `leadership::report_serving`).
    serving: tokio::sync::watch::Receiver<bool>,
    /// Abandoned acquires whose cancel failed: one per client that walks away while the
    /// cluster cannot commit, so logged as a change of state with a summary a minute.
    cancel_failures: std::sync::Mutex<LogLimit>,
    /// Request ids for the SPI methods, which carry none: a per-process counter seeded from
    /// the clock in microseconds, so ids keep growing across restarts of this process too.
    next_request_id: AtomicU64,
}

/// The backend over the Raft cluster. Cheap to clone; every clone is the same backend.
#[derive(Clone)]
pub struct RaftBackend {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for RaftBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RaftBackend")
            .field("node_id", &self.inner.node_id)
            .finish_non_exhaustive()
    }
}

/// Longest a proposal may take to commit and apply before the call answers "unknown outcome".
///
/// A leader cut off from its majority keeps its role until it hears of a newer term, and its
/// proposals wait forever; a client call must not (C2: every method but `acquire` is one round
/// trip). Five seconds is several election timeouts: a healthy cluster commits in milliseconds,
/// and a failover completes well within it.
pub const PROPOSAL_TIMEOUT: Duration = Duration::from_secs(5);

impl RaftBackend {
    /// Builds the backend from its parts. Spawns the task that keeps the serving watch, so it
    /// must be called on a runtime.
    pub fn new(parts: RaftBackendParts) -> Self {
        let seed = parts.clock.wall_ms().saturating_mul(1_000);
        let confirmer = leadership::confirmer(parts.raft.clone(), parts.clock.clone());
        let serving = leadership::spawn_serving_watch(parts.raft.clone());
        Self {
            inner: Arc::new(Inner {
                node_id: parts.node_id,
                raft: parts.raft,
                proposer: parts.proposer,
                keeper: parts.keeper,
                waiters: parts.waiters,
                reader: parts.reader,
                clock: parts.clock,
                stop: parts.stop,
                confirmer,
                serving,
                cancel_failures: std::sync::Mutex::new(LogLimit::default()),
                next_request_id: AtomicU64::new(seed.max(1)),
            }),
        }
    }

    /// The Raft node.
    pub fn raft(&self) -> &Raft {
        &self.inner.raft
    }

    /// This node's id.
    pub fn node_id(&self) -> u64 {
        self.inner.node_id
    }

    async fn propose(&self, command: Command) -> Result<Response, LockError> {
        within_proposal_timeout(self.inner.proposer.propose(command)).await
    }

    /// [`RaftBackend::propose`] through [`Proposer::propose_deferrable`]: for an acquire that
    /// will queue behind another session's grant.
    ///
    /// [`Proposer::propose_deferrable`]: crate::leader::proposer::Proposer::propose_deferrable
    async fn propose_deferrable(&self, command: Command) -> Result<Response, LockError> {
        within_proposal_timeout(self.inner.proposer.propose_deferrable(command)).await
    }

    /// Resolves once the node starts shutting down.
    async fn stopping(&self) {
        let mut stop = self.inner.stop.clone();
        // A dropped sender means the node is gone: treat it as stopping too.
        let _ = stop.wait_for(|stopping| *stopping).await;
    }
}

/// A proposal's applied answer, or `Contention` (unknown outcome, retry-safe) once
/// `PROPOSAL_TIMEOUT` has passed without one.
async fn within_proposal_timeout(
    answer: impl std::future::Future<Output = Result<Response, LockError>>,
) -> Result<Response, LockError> {
    match tokio::time::timeout(PROPOSAL_TIMEOUT, answer).await {
        Ok(answer) => answer,
        Err(_) => Err(LockError::contention(format!(
            "unknown outcome: not committed within {PROPOSAL_TIMEOUT:?} (no majority reachable?); retry with the same request id"
        ))),
    }
}

/// `command` as `caller` made it: wrapped in `Command::AsCaller` when there is a caller, so
/// the state machine binds a new session to it or refuses it another principal's session at
/// apply (docs/DESIGN.md D-session-principal); unchanged on an `--insecure` node.
fn as_caller(caller: Option<&str>, command: Command) -> Command {
    match caller {
        Some(principal) => Command::AsCaller {
            principal: principal.to_owned(),
            command: Box::new(command),
        },
        None => command,
    }
}

impl RaftBackend {
    /// Refuses `caller` on `session_id` if the applied state binds that session to another
    /// principal. For the calls served leader-locally (renewals, `LocksOf`; a heartbeat is
    /// checked by the lease keeper, whose record of the session carries its principal), which
    /// never reach the state machine's own check: a session's principal is written by the
    /// entry that opens it and never changes, so any applied state that holds the session
    /// holds its principal; one that does not yet hold it knows no lease of it either, and the
    /// call finds nothing to act on.
    fn check_session_owner(&self, caller: Option<&str>, session_id: &str) -> Result<(), LockError> {
        if caller.is_none() {
            return Ok(());
        }
        let opened_by = self.inner.reader.read(|table| {
            table
                .session(session_id)
                .and_then(|s| s.principal().map(str::to_owned))
        });
        lock_api::validate::session_principal(caller, opened_by.as_deref())
    }

    /// [`RaftBackend::check_session_owner`] for the session holding grant `(key, token)`, if
    /// that is still the grant: a renewal names its grant by `(key, token)`, whichever session
    /// presents it.
    fn check_grant_owner(
        &self,
        caller: Option<&str>,
        key: &str,
        token: u64,
    ) -> Result<(), LockError> {
        if caller.is_none() {
            return Ok(());
        }
        let holder = self.inner.reader.read(|table| {
            table
                .grant(key)
                .filter(|g| g.token == token)
                .map(|g| g.session_id().to_owned())
        });
        match holder {
            Some(session_id) => self.check_session_owner(caller, &session_id),
            None => Ok(()),
        }
    }
}

/// A replicated grant as the seam's record.
fn grant(g: lock_raft_store::Grant) -> Grant {
    Grant {
        key: g.key,
        owner_id: g.owner_id,
        session_id: g.session_id,
        token: g.token,
        ttl_ms: g.ttl_ms,
        expires_at_ms: g.expires_at_ms,
    }
}
