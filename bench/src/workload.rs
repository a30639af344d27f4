//! The workloads of issue 7 (W1 uncontended, W2 hot key, W3 one client, W4 sessions), written
//! once against [`LockSystem`] so lockd and etcd run exactly the same loop. Owns timing,
//! key choice and the fencing check; knows nothing of either system's protocol.

use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::stats::{Samples, Summary};
use crate::system::{KeeperReport, LockSystem, LockWorker};

/// W1's key space: random keys out of this many, so 32 workers almost never collide.
pub const W1_KEYS: u64 = 100_000;
/// W1's concurrency.
pub const W1_WORKERS: usize = 32;
/// W2's concurrency, all on one key.
pub const W2_WORKERS: usize = 16;
/// W4's background sessions (issue 7).
pub const W4_SESSIONS: usize = 10_000;
/// After this many failed operations a worker stops: the run is broken, not slow.
const ERRORS_PER_WORKER_MAX: u64 = 20;
/// Fixed seed: both systems see the same key sequence.
const SEED: u64 = 0x10c4_be4c;

/// Which keys a loop's workers use.
#[derive(Debug, Clone)]
pub enum Keys {
    /// A uniformly random key out of `count` per pair (W1).
    Random {
        /// Size of the key space.
        count: u64,
    },
    /// Every worker on the same key (W2).
    Hot,
    /// A new key per pair (W3).
    Fresh,
}

/// One run of an acquire → release loop.
#[derive(Debug, Clone)]
pub struct LoopSpec {
    /// Name for keys and messages, e.g. "w1".
    pub name: &'static str,
    /// Concurrent workers.
    pub workers: usize,
    /// Key choice.
    pub keys: Keys,
    /// Pairs before this are not measured.
    pub warmup: Duration,
    /// The measured window.
    pub measure: Duration,
}

/// What one loop measured.
#[derive(Debug, Clone, Serialize)]
pub struct LoopResult {
    /// Concurrent workers.
    pub workers: usize,
    /// The measured window, in seconds.
    pub seconds: f64,
    /// Acquire → release pairs completed in the window.
    pub pairs: u64,
    /// `pairs / seconds`: pairs/s for W1, hand-offs/s for W2.
    pub pairs_per_sec: f64,
    /// Acquire latency of pairs started in the window.
    pub acquire: Summary,
    /// Release latency of pairs started in the window.
    pub release: Summary,
    /// Grants whose token was not above every token granted before (fenced-resource check).
    pub token_order_violations: u64,
    /// Grants that arrived while another worker still held the key.
    pub overlaps: u64,
    /// Failed operations.
    pub errors: u64,
    /// The first failure, for the report.
    pub first_error: Option<String>,
    /// Replicated-log entries per pair (lockd: Raft entries; etcd: raft index), if measured.
    pub log_entries_per_pair: Option<f64>,
    /// CPU time of all three server processes per pair, in milliseconds (warm-up included in
    /// both the CPU time and the pairs). On a 2-core machine shared with the client, this bounds
    /// pairs/s at about 2000 / this figure.
    pub server_cpu_ms_per_pair: Option<f64>,
    /// CPU time of this benchmark process per pair, in milliseconds, counted like
    /// `server_cpu_ms_per_pair`: the client's share of the two cores (its workers, their
    /// connections, and in W4 the keep-alive tasks too).
    pub client_cpu_ms_per_pair: Option<f64>,
}

/// The benchmark's own fenced resource: the highest token seen and whether someone holds it.
#[derive(Debug, Default)]
struct Fence {
    state: Mutex<FenceState>,
}

#[derive(Debug, Default)]
struct FenceState {
    highest: u64,
    held: bool,
    violations: u64,
    overlaps: u64,
}

impl Fence {
    /// Called right after a grant, before the release is sent: a release is what lets the
    /// next grant happen, so no other grant can race this check.
    fn enter(&self, token: u64) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if token <= s.highest {
            s.violations += 1;
        }
        s.highest = s.highest.max(token);
        if s.held {
            s.overlaps += 1;
        }
        s.held = true;
    }

    /// Called right before the release is sent.
    fn leave(&self) {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).held = false;
    }
}

struct WorkerOutcome {
    acquire: Samples,
    release: Samples,
    pairs_in_window: u64,
    pairs_total: u64,
    errors: u64,
    first_error: Option<String>,
}

/// Runs `spec` against `system`: creates the workers, runs them together for warm-up plus the
/// measured window, and checks every grant against a shared fence (tokens increase in grant
/// order, no two holders of a key at once). The fence only bites for a shared key (W2); for
/// W1/W3 keys it is skipped.
pub async fn run_loop<S: LockSystem>(system: &S, spec: &LoopSpec) -> Result<LoopResult> {
    let mut workers = Vec::with_capacity(spec.workers);
    for index in 0..spec.workers {
        workers.push(
            system
                .worker(index)
                .await
                .with_context(|| format!("{}: creating worker {index}", spec.name))?,
        );
    }
    let fence = matches!(spec.keys, Keys::Hot).then(|| Arc::new(Fence::default()));
    let log_before = system.log_position().await.ok();
    let cpu_before = system.cpu_seconds();
    let client_cpu_before = own_cpu_seconds();
    let start = Instant::now();
    let measure_start = start + spec.warmup;
    let end = measure_start + spec.measure;
    let mut tasks = Vec::with_capacity(spec.workers);
    for (index, worker) in workers.into_iter().enumerate() {
        let spec = spec.clone();
        let fence = fence.clone();
        tasks.push(tokio::spawn(async move {
            drive(worker, index, &spec, fence.as_deref(), measure_start, end).await
        }));
    }
    let mut acquire = Samples::default();
    let mut release = Samples::default();
    let (mut pairs, mut pairs_total, mut errors, mut first_error) = (0, 0, 0, None);
    for task in tasks {
        let outcome = task.await.context("a worker task panicked")?;
        acquire.merge(outcome.acquire);
        release.merge(outcome.release);
        pairs += outcome.pairs_in_window;
        pairs_total += outcome.pairs_total;
        errors += outcome.errors;
        if first_error.is_none() {
            first_error = outcome.first_error;
        }
    }
    let log_after = system.log_position().await.ok();
    let cpu_used = system.cpu_seconds() - cpu_before;
    let client_cpu_used = own_cpu_seconds().zip(client_cpu_before).map(|(a, b)| a - b);
    let seconds = spec.measure.as_secs_f64();
    // The log also holds the warm-up's pairs, so divide by every pair completed.
    let log_entries_per_pair = match (log_before, log_after) {
        (Some(b), Some(a)) if pairs_total > 0 && a >= b => {
            Some((a - b) as f64 / pairs_total as f64)
        }
        _ => None,
    };
    let (violations, overlaps) = fence.map_or((0, 0), |f| {
        let s = f.state.lock().unwrap_or_else(|p| p.into_inner());
        (s.violations, s.overlaps)
    });
    Ok(LoopResult {
        workers: spec.workers,
        seconds,
        pairs,
        pairs_per_sec: pairs as f64 / seconds,
        acquire: acquire.summary(),
        release: release.summary(),
        token_order_violations: violations,
        overlaps,
        errors,
        first_error,
        log_entries_per_pair,
        server_cpu_ms_per_pair: (pairs_total > 0 && cpu_used > 0.0)
            .then(|| cpu_used * 1000.0 / pairs_total as f64),
        client_cpu_ms_per_pair: client_cpu_used
            .filter(|&used| pairs_total > 0 && used > 0.0)
            .map(|used| used * 1000.0 / pairs_total as f64),
    })
}

/// CPU time this benchmark process has used so far, in seconds.
fn own_cpu_seconds() -> Option<f64> {
    crate::procs::process_cpu_seconds(std::process::id())
}

async fn drive<W: LockWorker>(
    mut worker: W,
    index: usize,
    spec: &LoopSpec,
    fence: Option<&Fence>,
    measure_start: Instant,
    end: Instant,
) -> WorkerOutcome {
    let mut rng = StdRng::seed_from_u64(SEED ^ index as u64);
    let mut out = WorkerOutcome {
        acquire: Samples::with_capacity(64 * 1024),
        release: Samples::with_capacity(64 * 1024),
        pairs_in_window: 0,
        pairs_total: 0,
        errors: 0,
        first_error: None,
    };
    let fail = |out: &mut WorkerOutcome, what: &str, e: anyhow::Error| {
        out.errors += 1;
        if out.first_error.is_none() {
            out.first_error = Some(format!("worker {index} {what}: {e:#}"));
        }
    };
    let mut sequence = 0u64;
    let mut key = String::with_capacity(32);
    while Instant::now() < end && out.errors < ERRORS_PER_WORKER_MAX {
        key.clear();
        match spec.keys {
            Keys::Random { count } => key.push_str(&format!(
                "bench/{}/{:06}",
                spec.name,
                rng.gen_range(0..count)
            )),
            Keys::Hot => key.push_str(&format!("bench/{}/hot", spec.name)),
            Keys::Fresh => key.push_str(&format!("bench/{}/{index}-{sequence}", spec.name)),
        }
        sequence += 1;
        let t0 = Instant::now();
        let token = match worker.acquire(&key).await {
            Ok(token) => token,
            Err(e) => {
                fail(&mut out, "acquire", e);
                continue;
            }
        };
        let t1 = Instant::now();
        if let Some(fence) = fence {
            fence.enter(token);
            fence.leave();
        }
        if let Err(e) = worker.release().await {
            fail(&mut out, "release", e);
            continue;
        }
        let t2 = Instant::now();
        out.pairs_total += 1;
        if t0 >= measure_start && t0 < end {
            out.acquire.push(t1 - t0);
            out.release.push(t2 - t1);
        }
        if t2 >= measure_start && t2 <= end {
            out.pairs_in_window += 1;
        }
    }
    out
}

/// W4: W1 while `sessions` other sessions keep alive at a third of `ttl`.
#[derive(Debug, Clone, Serialize)]
pub struct SessionsResult {
    /// The keep-alive load.
    pub keepers: KeeperReport,
    /// Session TTL, in milliseconds.
    pub session_ttl_ms: u64,
    /// W1 measured while the sessions were kept alive.
    pub w1: LoopResult,
}

/// Runs W4: starts the keep-alive load, runs `w1` under it, stops the load.
pub async fn run_sessions<S: LockSystem>(
    system: &S,
    sessions: usize,
    ttl: Duration,
    w1: &LoopSpec,
) -> Result<SessionsResult> {
    let keepers = system
        .start_keepers(sessions, ttl)
        .await
        .context("w4: starting the background sessions")?;
    let loaded = run_loop(system, w1).await;
    let report = keepers.stop().await;
    Ok(SessionsResult {
        keepers: report,
        session_ttl_ms: ttl.as_millis() as u64,
        w1: loaded?,
    })
}
