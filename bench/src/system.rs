//! The seam between the workloads and a lock system under test: what a workload needs from
//! lockd or etcd, and nothing else. Implemented in `lockd.rs` and `etcd.rs`.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Result;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// How a system's benchmark workers reach its leader.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Connections {
    /// One HTTP/2 connection per worker, as if each worker were its own process.
    PerWorker,
    /// One HTTP/2 connection for all workers, as one process with one client (the SDK's and
    /// etcd clientv3's default): calls made together can leave in one write.
    Shared,
}

/// A running lock cluster the workloads drive.
pub trait LockSystem: Send + Sync + 'static {
    /// One worker's connection and identity (a lockd session, an etcd lease).
    type Worker: LockWorker;

    /// Creates worker `index`: its connection to the leader (its own, or the one all share:
    /// [`Connections`]) and its own owner identity.
    fn worker(&self, index: usize) -> impl Future<Output = Result<Self::Worker>> + Send;

    /// Opens `count` sessions (lockd) or leases (etcd) of `ttl` and keeps each alive every
    /// `ttl / 3` until stopped. Answers once every one is open and beating.
    fn start_keepers(
        &self,
        count: usize,
        ttl: Duration,
    ) -> impl Future<Output = Result<Keepers>> + Send;

    /// The leader's replicated-log position (lockd: Raft commit index; etcd: raft index), to
    /// count log entries per hand-off.
    fn log_position(&self) -> impl Future<Output = Result<u64>> + Send;

    /// CPU time all nodes of the cluster have used so far, in seconds.
    fn cpu_seconds(&self) -> f64;
}

/// One benchmark worker: holds at most one grant at a time.
pub trait LockWorker: Send + 'static {
    /// Blocking acquire of `key`; answers the grant's fencing token.
    fn acquire(&mut self, key: &str) -> impl Future<Output = Result<u64>> + Send;

    /// Releases the grant the last `acquire` answered.
    fn release(&mut self) -> impl Future<Output = Result<()>> + Send;
}

/// Counters shared by the keep-alive tasks of a [`Keepers`] load.
#[derive(Debug, Default)]
pub struct KeeperCounters {
    /// Keep-alives answered "alive".
    pub ok: AtomicU64,
    /// Keep-alives that failed or answered "gone".
    pub errors: AtomicU64,
    /// The first failure, for the report.
    pub first_error: std::sync::Mutex<Option<String>>,
    /// Sessions or leases that could not be closed when the load stopped.
    pub close_errors: AtomicU64,
    /// Leases found already expired when the load stopped and went to close them. Not a
    /// failure: on a busy machine the keep-alives stop before the last closes are sent, and a
    /// short lease may lapse in between. (A lockd session that lapsed closes as "0 locks
    /// released", so only etcd counts here.)
    pub expired_before_close: AtomicU64,
}

impl KeeperCounters {
    /// Counts a failed keep-alive and remembers the first failure.
    pub fn fail(&self, what: String) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        self.remember(what);
    }

    /// Counts a session or lease that could not be closed and remembers the first failure.
    pub fn close_failed(&self, what: String) {
        self.close_errors.fetch_add(1, Ordering::Relaxed);
        self.remember(what);
    }

    /// Counts a lease that had already expired when its close was sent.
    pub fn expired_before_close(&self) {
        self.expired_before_close.fetch_add(1, Ordering::Relaxed);
    }

    fn remember(&self, what: String) {
        let mut first = self.first_error.lock().unwrap_or_else(|p| p.into_inner());
        first.get_or_insert(what);
    }
}

/// A running background keep-alive load (W4): tasks that keep sessions or leases alive until
/// [`Keepers::stop`], then close them.
#[derive(Debug)]
pub struct Keepers {
    counters: Arc<KeeperCounters>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    sessions: usize,
    open_secs: f64,
    /// When the keep-alives began, for their rate (see [`Keepers::new`]).
    beats_from: Instant,
    period: Duration,
}

impl Keepers {
    /// Wraps tasks that watch `stop` and count into `counters`. `beats_from` is when the
    /// load's keep-alives began, the rate's start: for keep-alives spread over one period that
    /// starts together for every session (etcd: one period after every lease was granted),
    /// that start; for sessions each beaten from its own open (lockd), the mean of the opens,
    /// so that the rate is the keep-alives over the sessions' mean time beating.
    pub fn new(
        counters: Arc<KeeperCounters>,
        stop: watch::Sender<bool>,
        tasks: Vec<JoinHandle<()>>,
        sessions: usize,
        open_secs: f64,
        period: Duration,
        beats_from: Instant,
    ) -> Self {
        Self {
            counters,
            stop,
            tasks,
            sessions,
            open_secs,
            beats_from,
            period,
        }
    }

    /// Stops every task, waits until each has closed its sessions or leases, and reports
    /// what the load did.
    pub async fn stop(self) -> KeeperReport {
        let stopped = Instant::now();
        let _ = self.stop.send(true);
        for task in self.tasks {
            // A task that panicked has already stopped counting; its counts stay valid.
            let _ = task.await;
        }
        let close_secs = stopped.elapsed().as_secs_f64();
        let ok = self.counters.ok.load(Ordering::Relaxed);
        KeeperReport {
            sessions: self.sessions,
            open_secs: self.open_secs,
            keepalives_ok: ok,
            keepalive_errors: self.counters.errors.load(Ordering::Relaxed),
            first_error: self
                .counters
                .first_error
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
            keepalives_per_sec: ok as f64
                / stopped
                    .saturating_duration_since(self.beats_from)
                    .as_secs_f64()
                    .max(f64::EPSILON),
            keepalives_offered_per_sec: self.sessions as f64 / self.period.as_secs_f64(),
            close_secs,
            close_errors: self.counters.close_errors.load(Ordering::Relaxed),
            expired_before_close: self.counters.expired_before_close.load(Ordering::Relaxed),
        }
    }
}

/// What a keep-alive load did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct KeeperReport {
    /// Sessions or leases kept alive.
    pub sessions: usize,
    /// Time to open all of them, in seconds.
    pub open_secs: f64,
    /// Keep-alives sent and answered "alive".
    pub keepalives_ok: u64,
    /// Keep-alives that failed or answered "gone".
    pub keepalive_errors: u64,
    /// Keep-alives answered per second, from when they began (one period after every lease
    /// was granted for etcd; the sessions' mean open for lockd, whose sessions beat from their
    /// own open) until the load stopped.
    pub keepalives_per_sec: f64,
    /// Keep-alives due per second: sessions / (TTL / 3).
    pub keepalives_offered_per_sec: f64,
    /// The first failed keep-alive or close.
    pub first_error: Option<String>,
    /// Time to close every session or lease once the load stopped, in seconds.
    pub close_secs: f64,
    /// Sessions or leases that could not be closed.
    pub close_errors: u64,
    /// Leases that had already expired when their close was sent (not failures).
    pub expired_before_close: u64,
}

impl KeeperReport {
    /// One report for loads of the same size run one after another: counts add up, rates and
    /// times are the mean of the loads'. `None` for no loads.
    pub fn combine(loads: &[KeeperReport]) -> Option<KeeperReport> {
        let first = loads.first()?;
        let n = loads.len() as f64;
        let mean = |f: fn(&KeeperReport) -> f64| loads.iter().map(f).sum::<f64>() / n;
        Some(KeeperReport {
            sessions: first.sessions,
            open_secs: mean(|l| l.open_secs),
            keepalives_ok: loads.iter().map(|l| l.keepalives_ok).sum(),
            keepalive_errors: loads.iter().map(|l| l.keepalive_errors).sum(),
            keepalives_per_sec: mean(|l| l.keepalives_per_sec),
            keepalives_offered_per_sec: first.keepalives_offered_per_sec,
            first_error: loads.iter().find_map(|l| l.first_error.clone()),
            close_secs: mean(|l| l.close_secs),
            close_errors: loads.iter().map(|l| l.close_errors).sum(),
            expired_before_close: loads.iter().map(|l| l.expired_before_close).sum(),
        })
    }
}

/// How many tasks share a keep-alive load; each owns one connection and a slice of the
/// sessions, as a client library multiplexes many sessions over few connections.
pub const KEEPER_TASKS: usize = 32;

/// Paces one keep-alive task: `count` items spread evenly over `period`, the first due one
/// period after `start`; answers the instant item `n` (counting across periods) is due.
pub fn keepalive_due(start: Instant, period: Duration, count: usize, n: u64) -> Instant {
    let per_item = period.as_nanos() as u64 / count.max(1) as u64;
    start + period + Duration::from_nanos(per_item.saturating_mul(n))
}

/// When the first keep-alive of the `n`th of `count` sessions, opened at `opened`, is due:
/// `(n + 1) / count` of a period after its open, so a share opened all at once spreads its
/// first keep-alives evenly over the period after (as each session's own timer would), and
/// no session, however late in its share it opened, is first due more than one period after
/// its own open (`n` past the share counts as its last). A session beaten from its own open
/// cannot lapse while the rest of its share is still opening.
pub fn first_keepalive_due(opened: Instant, period: Duration, count: usize, n: usize) -> Instant {
    let count = count.max(1) as u128;
    let n = (n as u128).min(count - 1);
    opened + Duration::from_nanos((period.as_nanos() * (n + 1) / count) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keepalives_start_one_period_after_the_start_and_spread_over_each_period() {
        let (start, period) = (Instant::now(), Duration::from_secs(5));
        assert_eq!(keepalive_due(start, period, 4, 0), start + period);
        assert_eq!(
            keepalive_due(start, period, 4, 1),
            start + period + period / 4
        );
        // Item 4 of 4 is item 0's second keep-alive, one period after its first.
        assert_eq!(keepalive_due(start, period, 4, 4), start + 2 * period);
    }

    #[test]
    fn a_first_keepalive_is_due_within_one_period_of_its_own_open() {
        let (opened, period) = (Instant::now(), Duration::from_secs(5));
        let count = 3_094;
        let mut last = opened;
        for n in 0..count {
            let due = first_keepalive_due(opened, period, count, n);
            assert!(due > opened, "session {n} is due at its open");
            assert!(due <= opened + period, "session {n} is due past one period");
            assert!(
                due >= last,
                "session {n} is due before session {}",
                n.max(1) - 1
            );
            last = due;
        }
        assert_eq!(last, opened + period, "the last is due one period after");
        assert_eq!(
            first_keepalive_due(opened, period, count, 0),
            opened + period / count as u32
        );
        // Past the share, or with no share, still within one period.
        assert_eq!(first_keepalive_due(opened, period, 4, 10), opened + period);
        assert_eq!(first_keepalive_due(opened, period, 0, 0), opened + period);
    }
}
