//! The conformance suite at the client face (issue 18): the same cases, through the gRPC API a
//! client calls — the Rust SDK where it can express the case, raw `lock_proto` stubs where the
//! case needs what the SDK hides (the same request id twice, a dropped RPC) — against every
//! backend: a one-node and a three-node Raft cluster (`t65_grpc_raft`) and two stateless nodes
//! on one PostgreSQL database (`t65_grpc_pg`) or one etcd cluster (`t65_grpc_etcd`).
//!
//! C2 requires the backends to be observably identical. The SPI suite (`t60_conformance_*`)
//! tests the `LockStore` traits, which no client calls; this one tests what a client sees.
//! Where a backend genuinely cannot match the Raft backend, the difference is declared once,
//! in [`Differences`], and the cases assert the declared behaviour instead — nowhere else may a
//! case relax for a backend.
//!
//! Owns the cases, the [`Target`] they run against (starting it, which node a call goes to,
//! what a transient fault is on it) and the [`Findings`] of one case. Each case uses keys and
//! owners unique to the run ([`Target::key`]), because the databases outlive runs. A case
//! checks every property it can even after one failed, and fails once at the end listing
//! them all, so one run tells which properties a backend lacks.
//!
//! # Layout
//!
//! - `queue`: FIFO hand-off, `waiter_count`, a dropped acquire (SDK future, raw RPC).
//! - `retry`: retried acquire, renew, release and force-revoke (same request id).
//! - `views`: what `Inspect`, `OpenSession`/`Heartbeat` and `ForceRevoke` answer.
//! - `failure`: session death and hand-off, transient faults that must not read as "lost".
//! - `principals`: a session refused to a principal other than the one that opened it.
//! - `audit`: the force-revoke audit log (`ListRevocations`): fields, order, filter, paging,
//!   and whom a revoke records over TLS.
//!
//! Shared by several test binaries with `mod conformance_grpc;`, each of which calls
//! [`cases!`] once; a binary does not use every helper, hence the `dead_code` allowance.
#![allow(dead_code)]

pub mod audit;
pub mod failure;
pub mod principals;
pub mod queue;
pub mod retry;
pub mod views;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lock_client::{ClientConfig, LockClient, TlsConfig};
use lock_tests::{Cluster, LockInfo, poll_until};
use lock_tests::{ClusterClient, NodeClient, StatelessBackend, StatelessNodes};

/// Lease of the sessions and grants that must outlive a case.
pub const LONG_TTL: Duration = Duration::from_secs(60);

/// How long a waiter waits server-side: far longer than any hand-off in these cases, so a
/// waiter that answers "not granted" shows a broken hand-off, not a slow machine.
pub const WAITER_MAX_WAIT: Duration = Duration::from_secs(40);

/// How long a case waits for a queued acquire to show in `Inspect`'s `waiter_count`, or for a
/// withdrawn one to leave it: a commit and scheduling on two loaded cores, with a wide margin.
pub const QUEUE_WAIT: Duration = Duration::from_secs(10);

/// How long a case waits for a waiter's answer after the key was handed to it.
pub const ANSWER_WAIT: Duration = Duration::from_secs(20);

/// What a backend does differently from the Raft backend because it cannot do otherwise,
/// declared once for the whole suite. Every case asserts the declared behaviour; a backend that
/// differs in anything not declared here fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Differences {
    /// Session TTLs are kept in whole multiples of this, rounded up: 1 ms on Raft and
    /// PostgreSQL (a TTL is kept as asked), 1 s on etcd, whose leases are whole seconds.
    /// `OpenSession` and `Heartbeat` must answer the TTL the backend really keeps.
    pub session_ttl_step: Duration,
    /// The shortest session TTL the backend keeps: `TTL_MIN` on Raft and PostgreSQL; on etcd
    /// its minimum lease TTL, 2 s at etcd's default settings (1.5 × its 1 s election timeout,
    /// rounded up to whole seconds).
    pub session_ttl_min: Duration,
}

impl Differences {
    /// The Raft backend: the reference.
    pub const RAFT: Self = Self {
        session_ttl_step: Duration::from_millis(1),
        session_ttl_min: lock_api::limits::TTL_MIN,
    };
    /// PostgreSQL: no declared difference.
    pub const PG: Self = Self::RAFT;
    /// etcd: sessions are etcd leases.
    pub const ETCD: Self = Self {
        session_ttl_step: Duration::from_secs(1),
        session_ttl_min: Duration::from_secs(2),
    };

    /// The session TTL the backend keeps when `asked` is asked for.
    pub fn session_ttl_kept(&self, asked: Duration) -> Duration {
        let step = self.session_ttl_step.as_millis().max(1);
        let rounded = asked.as_millis().div_ceil(step) * step;
        Duration::from_millis(u64::try_from(rounded).unwrap_or(u64::MAX)).max(self.session_ttl_min)
    }
}

/// What serves the cases.
#[derive(Debug)]
enum Serving {
    /// Both boxed: a harness is a kilobyte or more, and the two differ by hundreds of bytes.
    Raft(Box<Cluster>),
    Stateless(Box<StatelessNodes>),
}

/// A running backend for one case, with the rules of where each call goes.
#[derive(Debug)]
pub struct Target {
    /// `raft-1`, `raft-3`, `pg` or `etcd`: names the target in failure messages.
    pub name: String,
    /// What this backend may do differently.
    pub differences: Differences,
    serving: Serving,
    nonce: String,
    /// The Raft node killed by [`Target::fault`], to start again in [`Target::heal`].
    killed: Option<u64>,
}

impl Target {
    /// A fresh Raft cluster of `nodes` voters with an agreed leader.
    pub async fn raft(nodes: usize) -> Self {
        Self {
            name: format!("raft-{nodes}"),
            differences: Differences::RAFT,
            serving: Serving::Raft(Box::new(Cluster::start(nodes).await)),
            nonce: run_nonce(),
            killed: None,
        }
    }

    /// Two stateless nodes on the PostgreSQL database of `LOCKD_TEST_PG_URL`.
    ///
    /// # Panics
    /// If the variable is unset (naming `scripts/test`) or a node does not start.
    pub async fn pg() -> Self {
        Self::stateless("pg", Differences::PG).await
    }

    /// Two stateless nodes on the etcd cluster of `LOCKD_TEST_ETCD_ENDPOINTS`.
    ///
    /// # Panics
    /// As [`Target::pg`].
    pub async fn etcd() -> Self {
        Self::stateless("etcd", Differences::ETCD).await
    }

    async fn stateless(backend: &str, differences: Differences) -> Self {
        let backend = StatelessBackend::from_env(backend);
        Self {
            name: backend.name().to_owned(),
            differences,
            serving: Serving::Stateless(Box::new(StatelessNodes::start(backend, 2).await)),
            nonce: run_nonce(),
            killed: None,
        }
    }

    /// A key unique to this run and case.
    pub fn key(&self, case: &str, n: usize) -> String {
        format!("grpc-conformance/{}/{case}/{n}", self.nonce)
    }

    /// An owner id unique to this run (the Inspect and grant checks compare it).
    pub fn owner(&self, what: &str) -> String {
        format!("{what}-{}", self.nonce)
    }

    /// How many nodes serve client calls: 1 on Raft (the leader), every node when stateless.
    pub fn serving_nodes(&self) -> usize {
        match &self.serving {
            Serving::Raft(_) => 1,
            Serving::Stateless(nodes) => nodes.len(),
        }
    }

    /// A client that follows the leader and retries transient errors, as a real client would.
    pub fn any(&self) -> ClusterClient {
        match &self.serving {
            Serving::Raft(cluster) => cluster.cluster_client(),
            Serving::Stateless(nodes) => nodes.cluster_client(),
        }
    }

    /// One node that answers client calls, raw (no retries): on Raft the leader, whatever `i`;
    /// stateless, node `i` modulo the node count, so consecutive calls of a case spread over
    /// the nodes and show that they serve one table.
    pub async fn node(&mut self, i: usize) -> NodeClient {
        match &mut self.serving {
            Serving::Raft(cluster) => cluster.leader_client().await,
            Serving::Stateless(nodes) => nodes.client(i % nodes.len()),
        }
    }

    /// [`Target::node`] `i`, presenting `name`'s certificate (`client`, `operator`, `admin`)
    /// instead of the harness's `admin`.
    pub async fn node_as(&mut self, i: usize, name: &str) -> NodeClient {
        match &mut self.serving {
            Serving::Raft(cluster) => {
                let leader = cluster.leader().await;
                cluster.client_as(leader, name)
            }
            Serving::Stateless(nodes) => nodes.client_as(i % nodes.len(), name),
        }
    }

    /// `Inspect` of `key` at [`Target::node`] `i`, leader-confirmed (on Raft). A retry-safe
    /// error (a node still reconnecting to its database after a fault, a leader just elected)
    /// is retried for up to [`QUEUE_WAIT`]: the cases check what Inspect answers, not whether
    /// the first attempt got through.
    ///
    /// # Panics
    /// If the node answers anything else, or only retry-safe errors until then.
    pub async fn inspect_at(&mut self, i: usize, key: &str) -> Option<LockInfo> {
        let node = self.node(i).await;
        let answer = poll_until(
            &format!("an answer to Inspect({key:?}) at {}", node.endpoint()),
            QUEUE_WAIT,
            || {
                let node = node.clone();
                let key = key.to_owned();
                async move {
                    match node.inspect(&key, true).await {
                        Ok(info) => Ok(Ok(info)),
                        Err(e) if e.is_retry_safe() => Err(e.to_string()),
                        Err(e) => Ok(Err(e)),
                    }
                }
            },
        )
        .await;
        match answer {
            Ok(Ok(info)) => info,
            Ok(Err(e)) => panic!(
                "{}: Inspect({key:?}) at {}: {e}",
                self.name,
                node.endpoint()
            ),
            Err(e) => panic!("{}: {e}", self.name),
        }
    }

    /// Every node's `host:port`, for the SDK.
    pub fn endpoints(&self) -> Vec<String> {
        match &self.serving {
            Serving::Raft(cluster) => cluster
                .ids()
                .into_iter()
                .map(|id| cluster.addr(id))
                .collect(),
            Serving::Stateless(nodes) => nodes.addrs(),
        }
    }

    /// An SDK client over every node, over TLS as `admin` (the harness's identity: some cases
    /// force-revoke), with `config`'s other settings.
    ///
    /// # Panics
    /// If it cannot connect.
    pub async fn sdk(&self, config: ClientConfig) -> LockClient {
        let (ca, cert, key) = match &self.serving {
            Serving::Raft(cluster) => cluster.sdk_tls("admin"),
            Serving::Stateless(nodes) => nodes.sdk_tls("admin"),
        };
        let config = ClientConfig {
            tls: Some(TlsConfig::new(ca).with_identity(cert, key)),
            ..config
        };
        LockClient::connect_with(&self.endpoints(), config)
            .await
            .unwrap_or_else(|e| panic!("{}: the SDK cannot connect: {e}", self.name))
    }

    /// Installs a transient fault that a client must ride out without ever hearing "lost":
    /// on a one-node cluster its node is SIGKILLed (a crash and, at [`Target::heal`], a restart
    /// on the same data); on a larger cluster the leader is SIGKILLed; stateless nodes lose
    /// their database connections. Returns what it did, for messages.
    pub async fn fault(&mut self) -> String {
        match &mut self.serving {
            Serving::Raft(cluster) => {
                let leader = cluster.leader().await;
                cluster.kill(leader);
                self.killed = Some(leader);
                format!("SIGKILL of node {leader}, the leader")
            }
            Serving::Stateless(nodes) => {
                nodes.cut_backend();
                format!("every node cut off {}", nodes.backend().name())
            }
        }
    }

    /// Ends the fault of [`Target::fault`]: the killed node runs again and a leader is agreed,
    /// or the database is reachable again.
    pub async fn heal(&mut self) {
        match &mut self.serving {
            Serving::Raft(cluster) => {
                if let Some(id) = self.killed.take() {
                    cluster.start_node(id).await;
                }
                cluster.leader().await;
            }
            Serving::Stateless(nodes) => nodes.heal_backend(),
        }
    }
}

/// A string unique to this run, so keys never collide with an earlier run's leftovers.
pub fn run_nonce() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{nanos:x}-{}", std::process::id())
}

/// The properties one case found broken. A case records each failed property and goes on
/// where it still can; [`Findings::finish`] fails the test listing them all.
#[derive(Debug)]
pub struct Findings {
    what: String,
    failures: Vec<String>,
}

impl Findings {
    /// The findings of `case` on `target`.
    pub fn new(target: &Target, case: &str) -> Self {
        Self {
            what: format!("{case} on {}", target.name),
            failures: Vec::new(),
        }
    }

    /// Records `message` as a broken property.
    pub fn fail(&mut self, message: impl Into<String>) {
        let message = message.into();
        eprintln!("{}: FAILED: {message}", self.what);
        self.failures.push(message);
    }

    /// Records `message()` unless `ok`. Returns `ok`.
    pub fn check(&mut self, ok: bool, message: impl FnOnce() -> String) -> bool {
        if !ok {
            self.fail(message());
        }
        ok
    }

    /// Passes if nothing was recorded; otherwise panics listing every failure (while the
    /// target still runs, so its logs are printed).
    pub fn finish(self) {
        if !self.failures.is_empty() {
            panic!(
                "{}: {} propert{} broken:\n  - {}",
                self.what,
                self.failures.len(),
                if self.failures.len() == 1 { "y" } else { "ies" },
                self.failures.join("\n  - ")
            );
        }
    }
}

/// Waits until `Inspect` of `key` reports `count` waiters; records a failure (with the last
/// answer) if it does not within [`QUEUE_WAIT`]. Returns whether it did.
pub async fn expect_waiters(
    target: &mut Target,
    findings: &mut Findings,
    key: &str,
    count: u32,
    why: &str,
) -> bool {
    let node = target.node(0).await;
    let seen = poll_until(
        &format!("waiter_count of {key:?} to be {count} ({why})"),
        QUEUE_WAIT,
        || {
            let node = node.clone();
            let key = key.to_owned();
            async move {
                match node.inspect(&key, true).await {
                    Ok(Some(info)) if info.waiter_count == count => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            }
        },
    )
    .await;
    match seen {
        Ok(()) => true,
        Err(e) => {
            findings.fail(format!("Inspect's waiter_count: {e}"));
            false
        }
    }
}

/// One `#[tokio::test]` per case against the target `$start` (an expression of type
/// `Target`, awaited in each test), in a module named `$name`: `cases!(raft_3, Target::raft(3))`
/// gives tests `raft_3::fifo_hand_off_in_arrival_order` etc.
#[macro_export]
macro_rules! cases {
    ($name:ident, $start:expr) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            use $crate::conformance_grpc::{Target, audit, failure, principals, queue, retry, views};

            $crate::cases!(@case $start, waiters_are_granted_in_arrival_order, queue::fifo);
            $crate::cases!(@case $start, inspect_counts_the_queued_acquires, queue::waiter_count);
            $crate::cases!(@case $start, a_dropped_sdk_acquire_leaves_no_waiter_and_no_grant, queue::cancel_sdk_drop);
            $crate::cases!(@case $start, a_cancelled_acquire_rpc_leaves_no_waiter_and_no_grant, queue::cancel_rpc_drop);
            $crate::cases!(@case $start, a_retried_acquire_answers_the_same_grant, retry::acquire);
            $crate::cases!(@case $start, a_retried_renew_answers_the_same_grant, retry::renew);
            $crate::cases!(@case $start, a_retried_release_answers_true_and_spares_a_later_grant, retry::release);
            $crate::cases!(@case $start, a_retried_force_revoke_revokes_once, retry::force_revoke);
            $crate::cases!(@case $start, force_revoke_advances_the_token_floor, views::revoke_floor);
            $crate::cases!(@case $start, inspect_shows_the_holders_owner_and_session, views::inspect_holder);
            $crate::cases!(@case $start, heartbeat_answers_the_session_ttl, views::heartbeat_ttl);
            $crate::cases!(@case $start, a_dead_session_loses_its_grant_to_the_next_waiter, failure::session_death);
            $crate::cases!(@case $start, a_transient_fault_is_never_reported_as_lost, failure::transient_fault);
            $crate::cases!(@case $start, a_session_is_refused_to_another_principal, principals::session_hijack);
            $crate::cases!(@case $start, the_audit_log_lists_revokes_newest_first_with_every_field, audit::newest_first);
            $crate::cases!(@case $start, the_audit_log_pages_stably_and_refuses_a_bad_token, audit::paging);
            $crate::cases!(@case $start, a_revoke_records_the_callers_principal_and_refuses_anothers_name, audit::principal);
        }
    };
    (@case $start:expr, $test:ident, $case:path) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $test() {
            let mut target: Target = $start.await;
            $case(&mut target).await;
        }
    };
}
