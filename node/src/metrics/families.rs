//! Every Prometheus family a node exports (issue 20), its name, labels, HELP text and buckets,
//! registered once at start so that each scrape lists every family's HELP and TYPE lines even
//! before its first sample.
//!
//! Owns the families only: who moves each one lives beside it (`apply` the applied-state
//! counters, `storage` the disk histograms, `raft` the Raft gauges, `grpc` the API families,
//! `process` the process gauges, `proposer` the batch histogram). Names follow Prometheus
//! conventions: base units, counters end in `_total` (the encoder appends it to the registered
//! name), durations in `_seconds`.

use std::borrow::Cow;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Metric, Registry};

/// `lockd_raft_peer_reachable` and `lockd_raft_replication_lag_entries`: the peer's node id.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PeerLabels {
    /// The peer's node id.
    pub peer: u64,
}

/// Which lease lapsed, for `lockd_lease_expirations_total`.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)] // The label values Prometheus shows, as the issue names them.
pub enum LeaseKind {
    /// A grant's lease lapsed (`ExpireLock` removed it).
    grant,
    /// A session's lease lapsed (`ExpireSession`); its grants are not also counted as `grant`.
    session,
}

/// `lockd_lease_expirations_total{kind}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LeaseLabels {
    /// Grant or session.
    pub kind: LeaseKind,
}

/// `lockd_grpc_requests_total{service,method,code}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// The full gRPC service name, `lockd.v1.LockService`.
    pub service: Cow<'static, str>,
    /// The RPC name, `Acquire`.
    pub method: Cow<'static, str>,
    /// The gRPC status code's name, `OK`, `INVALID_ARGUMENT`, …
    pub code: &'static str,
}

/// `lockd_grpc_request_duration_seconds{service,method}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MethodLabels {
    /// The full gRPC service name.
    pub service: Cow<'static, str>,
    /// The RPC name.
    pub method: Cow<'static, str>,
}

/// A gauge of whole numbers.
pub type IntGauge = Gauge<i64>;
/// A counter of whole events.
pub type IntCounter = Counter<u64>;
/// A counter of seconds.
pub type SecondsCounter = Counter<f64, AtomicU64>;
/// A family of histograms sharing one bucket layout.
pub type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// fsync latency: 50 µs to about 1.6 s, doubling. A healthy SSD syncs in well under a
/// millisecond; the example of a sick disk is 20 ms.
fn fsync_buckets() -> Histogram {
    Histogram::new(exponential_buckets(50e-6, 2.0, 16))
}

/// Snapshot builds: 1 ms to about 33 s, doubling (a table of a million grants builds in
/// seconds).
fn snapshot_buckets() -> Histogram {
    Histogram::new(exponential_buckets(1e-3, 2.0, 16))
}

/// Commands per entry: 1 to 512 (`limits::BATCH_MAX`), doubling.
fn batch_buckets() -> Histogram {
    Histogram::new(exponential_buckets(1.0, 2.0, 10))
}

/// A blocking acquire's wait: 1 ms to about 65 s, doubling; `max_wait_ms` is bounded by
/// `lock_api::limits::MAX_WAIT_MAX`.
fn acquire_wait_buckets() -> Histogram {
    Histogram::new(exponential_buckets(1e-3, 2.0, 17))
}

/// One RPC: 100 µs to about 13 s, doubling. A blocking acquire or a pipeline stream may last
/// longer; it counts in `+Inf`.
fn request_buckets() -> Histogram {
    Histogram::new(exponential_buckets(100e-6, 2.0, 18))
}

/// A family that is listed (HELP and TYPE) in every scrape. prometheus-client leaves out a
/// labelled family with no sample yet (`EncodeMetric::is_empty`); the issue wants every family
/// listed from the first scrape, e.g. `lockd_raft_peer_reachable` on a follower.
#[derive(Debug)]
struct AlwaysListed<M>(M);

impl<M: EncodeMetric> EncodeMetric for AlwaysListed<M> {
    fn encode(&self, encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        self.0.encode(encoder)
    }

    fn metric_type(&self) -> MetricType {
        self.0.metric_type()
    }
}

/// Registers `metric` as `name` with `help`, listed in every scrape.
fn listed(r: &mut Registry, name: &str, help: &str, metric: impl Metric) {
    r.register(name, help, AlwaysListed(metric));
}

/// Every family of a node. Cheap to share: each metric is an `Arc` inside.
#[derive(Debug)]
pub struct Families {
    // Raft, from openraft's metrics (`raft`).
    /// `lockd_raft_term`.
    pub raft_term: IntGauge,
    /// `lockd_raft_is_leader`.
    pub raft_is_leader: IntGauge,
    /// `lockd_raft_leader_changes_total`.
    pub raft_leader_changes: IntCounter,
    /// `lockd_raft_commit_index`.
    pub raft_commit_index: IntGauge,
    /// `lockd_raft_applied_index`.
    pub raft_applied_index: IntGauge,
    /// `lockd_raft_purged_index`.
    pub raft_purged_index: IntGauge,
    /// `lockd_raft_peer_reachable{peer}`.
    pub raft_peer_reachable: Family<PeerLabels, IntGauge>,
    /// `lockd_raft_replication_lag_entries{peer}`.
    pub raft_replication_lag: Family<PeerLabels, IntGauge>,
    // Storage (`storage`).
    /// `lockd_wal_fsync_duration_seconds`.
    pub wal_fsync_duration: Histogram,
    /// `lockd_wal_bytes`.
    pub wal_bytes: IntGauge,
    /// `lockd_snapshot_build_duration_seconds`.
    pub snapshot_build_duration: Histogram,
    /// `lockd_snapshot_bytes`.
    pub snapshot_bytes: IntGauge,
    // Proposer (`proposer`).
    /// `lockd_proposer_batch_commands`.
    pub proposer_batch_commands: Histogram,
    // Locks (`apply`, and the gauges read from the applied state).
    /// `lockd_sessions`.
    pub sessions: IntGauge,
    /// `lockd_locks_held`.
    pub locks_held: IntGauge,
    /// `lockd_waiters`.
    pub waiters: IntGauge,
    /// `lockd_grants_total`.
    pub grants: IntCounter,
    /// `lockd_handoffs_total`.
    pub handoffs: IntCounter,
    /// `lockd_releases_total`.
    pub releases: IntCounter,
    /// `lockd_lease_expirations_total{kind}`.
    pub lease_expirations: Family<LeaseLabels, IntCounter>,
    /// `lockd_revocations_total`.
    pub revocations: IntCounter,
    /// `lockd_acquire_wait_duration_seconds`.
    pub acquire_wait_duration: Histogram,
    // API (`grpc`).
    /// `lockd_grpc_requests_total{service,method,code}`.
    pub grpc_requests: Family<RequestLabels, IntCounter>,
    /// `lockd_grpc_request_duration_seconds{service,method}`.
    pub grpc_request_duration: HistogramFamily<MethodLabels>,
    // Process (`process`).
    /// `process_cpu_seconds_total`.
    pub process_cpu_seconds: SecondsCounter,
    /// `process_resident_memory_bytes`.
    pub process_resident_memory_bytes: IntGauge,
    /// `process_open_fds`.
    pub process_open_fds: IntGauge,
}

impl Families {
    /// Every family, unregistered.
    fn new() -> Self {
        let lease_expirations = Family::<LeaseLabels, IntCounter>::default();
        // Both kinds sampled from the start, so a rate over them never starts from "absent".
        for kind in [LeaseKind::grant, LeaseKind::session] {
            drop(lease_expirations.get_or_create(&LeaseLabels { kind }));
        }
        Self {
            raft_term: IntGauge::default(),
            raft_is_leader: IntGauge::default(),
            raft_leader_changes: IntCounter::default(),
            raft_commit_index: IntGauge::default(),
            raft_applied_index: IntGauge::default(),
            raft_purged_index: IntGauge::default(),
            raft_peer_reachable: Family::default(),
            raft_replication_lag: Family::default(),
            wal_fsync_duration: fsync_buckets(),
            wal_bytes: IntGauge::default(),
            snapshot_build_duration: snapshot_buckets(),
            snapshot_bytes: IntGauge::default(),
            proposer_batch_commands: batch_buckets(),
            sessions: IntGauge::default(),
            locks_held: IntGauge::default(),
            waiters: IntGauge::default(),
            grants: IntCounter::default(),
            handoffs: IntCounter::default(),
            releases: IntCounter::default(),
            lease_expirations,
            revocations: IntCounter::default(),
            acquire_wait_duration: acquire_wait_buckets(),
            grpc_requests: Family::default(),
            grpc_request_duration: Family::new_with_constructor(request_buckets),
            process_cpu_seconds: SecondsCounter::default(),
            process_resident_memory_bytes: IntGauge::default(),
            process_open_fds: IntGauge::default(),
        }
    }

    /// Every family, registered in a fresh registry with its HELP text. `raft` is false for a
    /// stateless node (`--backend pg|etcd`): it has no Raft log, WAL, snapshots or proposer,
    /// so those families are left out rather than exported as zeros that would read as "a
    /// node with an empty log". Its applied-state counters and gauges are left out too: the
    /// lock table is applied by the database, not by the node, so the node never sees a grant
    /// applied. The API, acquire-wait and process families apply to both.
    pub fn registered(raft: bool) -> (Self, Registry) {
        let f = Self::new();
        let mut r = Registry::default();
        if raft {
            f.register_raft(&mut r);
        }
        f.register_api(&mut r);
        f.register_process(&mut r);
        (f, r)
    }

    fn register_raft(&self, r: &mut Registry) {
        listed(
            r,
            "lockd_raft_term",
            "The Raft term this node is in",
            self.raft_term.clone(),
        );
        listed(
            r,
            "lockd_raft_is_leader",
            "1 while this node is the Raft leader, else 0",
            self.raft_is_leader.clone(),
        );
        listed(
            r,
            "lockd_raft_leader_changes",
            "Leaders this node has learned of: each time it knows a leader for a new term \
             (counted by every node)",
            self.raft_leader_changes.clone(),
        );
        listed(
            r,
            "lockd_raft_commit_index",
            "The highest log index this node knows to be committed",
            self.raft_commit_index.clone(),
        );
        listed(
            r,
            "lockd_raft_applied_index",
            "The highest log index this node has applied to its lock table",
            self.raft_applied_index.clone(),
        );
        listed(
            r,
            "lockd_raft_purged_index",
            "The highest log index this node has removed from its log, as covered by its \
             snapshot (0 before the first purge): a peer whose matched index is below the \
             leader's can only catch up from a snapshot",
            self.raft_purged_index.clone(),
        );
        listed(
            r,
            "lockd_raft_peer_reachable",
            "On the leader: 1 if the peer acknowledged a heartbeat or append within the \
             election timeout, else 0",
            self.raft_peer_reachable.clone(),
        );
        listed(
            r,
            "lockd_raft_replication_lag_entries",
            "On the leader: log entries the peer has not yet acknowledged (the leader's last \
             log index minus the peer's matched index)",
            self.raft_replication_lag.clone(),
        );
        listed(
            r,
            "lockd_wal_fsync_duration_seconds",
            "Duration of one flush of the Raft log (one fdatasync group; for the sled engine \
             its flush and fdatasync)",
            self.wal_fsync_duration.clone(),
        );
        listed(
            r,
            "lockd_wal_bytes",
            "Bytes of the Raft log on disk (WAL segments, or the sled database)",
            self.wal_bytes.clone(),
        );
        listed(
            r,
            "lockd_snapshot_build_duration_seconds",
            "Duration of building a snapshot of the lock table and writing it durably",
            self.snapshot_build_duration.clone(),
        );
        listed(
            r,
            "lockd_snapshot_bytes",
            "Size in bytes of the newest snapshot file (0 before the first)",
            self.snapshot_bytes.clone(),
        );
        listed(
            r,
            "lockd_proposer_batch_commands",
            "Commands in each log entry this node proposed as leader (group commit, D-batch)",
            self.proposer_batch_commands.clone(),
        );
        listed(
            r,
            "lockd_sessions",
            "Live sessions in the applied lock table (the same on every node once applied)",
            self.sessions.clone(),
        );
        listed(
            r,
            "lockd_locks_held",
            "Keys held by a grant in the applied lock table",
            self.locks_held.clone(),
        );
        listed(
            r,
            "lockd_waiters",
            "Waiting acquires queued in the applied lock table, all keys together",
            self.waiters.clone(),
        );
        listed(
            r,
            "lockd_grants",
            "Grants applied: direct grants and hand-offs to a waiter alike",
            self.grants.clone(),
        );
        listed(
            r,
            "lockd_handoffs",
            "Grants applied by handing a freed key to its next waiter (also in grants_total)",
            self.handoffs.clone(),
        );
        listed(
            r,
            "lockd_releases",
            "Grants given up by their holder: Release, a cancelled acquire that released its \
             grant, and each grant of a session its client closed (a revoke is not a release)",
            self.releases.clone(),
        );
        listed(
            r,
            "lockd_lease_expirations",
            "Leases that lapsed and were applied as expired: kind=grant a grant's lease, \
             kind=session a session's (its grants are not also counted as kind=grant)",
            self.lease_expirations.clone(),
        );
        listed(
            r,
            "lockd_revocations",
            "Force-revokes that deleted a grant (a revoke of a free key is not counted)",
            self.revocations.clone(),
        );
    }

    fn register_api(&self, r: &mut Registry) {
        listed(
            r,
            "lockd_acquire_wait_duration_seconds",
            "Server-side time of each blocking Acquire from arrival to answer, granted or not \
             (TryAcquire is not observed)",
            self.acquire_wait_duration.clone(),
        );
        listed(
            r,
            "lockd_grpc_requests",
            "gRPC calls answered, by service, method and status code; a call on a Pipeline \
             stream counts under its unary method, the stream once as method=Pipeline",
            self.grpc_requests.clone(),
        );
        listed(
            r,
            "lockd_grpc_request_duration_seconds",
            "Duration of gRPC calls from arrival to the end of the answer, by service and \
             method",
            self.grpc_request_duration.clone(),
        );
    }

    fn register_process(&self, r: &mut Registry) {
        listed(
            r,
            "process_cpu_seconds",
            "User and system CPU time this process has used, in seconds",
            self.process_cpu_seconds.clone(),
        );
        listed(
            r,
            "process_resident_memory_bytes",
            "Resident memory of this process in bytes",
            self.process_resident_memory_bytes.clone(),
        );
        listed(
            r,
            "process_open_fds",
            "File descriptors this process has open",
            self.process_open_fds.clone(),
        );
    }
}
