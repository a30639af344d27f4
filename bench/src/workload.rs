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

use crate::stats::{Histogram, Samples, Summary};
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
    /// Acquire latency of the same pairs in 1 % buckets, for the latency CDF plot; kept only
    /// where asked for ([`LoopResult::with_acquire_histogram`]: W3).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub acquire_histogram: Option<Histogram>,
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
    /// What the figures above were computed from, so that slices of one workload can be
    /// combined exactly ([`LoopResult::combine`]).
    #[serde(skip)]
    raw: RawLoop,
}

/// The counts behind a [`LoopResult`].
#[derive(Debug, Clone, Default)]
struct RawLoop {
    acquire: Samples,
    release: Samples,
    /// Pairs completed in the measured window.
    pairs: u64,
    /// Pairs completed including the warm-up (the divisor of the per-pair figures).
    pairs_total: u64,
    token_order_violations: u64,
    overlaps: u64,
    errors: u64,
    first_error: Option<String>,
    /// Replicated-log growth over the run, if measured.
    log_entries: Option<u64>,
    /// Server CPU seconds over the run.
    server_cpu_s: f64,
    /// This process's CPU seconds over the run, if measured.
    client_cpu_s: Option<f64>,
}

impl RawLoop {
    /// Adds the counts of `later`, a run after this one: samples and counts add up, the
    /// first error stays, a figure one of them lacks is lacking.
    fn add(&mut self, later: RawLoop) {
        self.acquire.merge(later.acquire);
        self.release.merge(later.release);
        self.pairs += later.pairs;
        self.pairs_total += later.pairs_total;
        self.token_order_violations += later.token_order_violations;
        self.overlaps += later.overlaps;
        self.errors += later.errors;
        if self.first_error.is_none() {
            self.first_error = later.first_error;
        }
        self.log_entries = self.log_entries.zip(later.log_entries).map(|(a, b)| a + b);
        self.server_cpu_s += later.server_cpu_s;
        self.client_cpu_s = self
            .client_cpu_s
            .zip(later.client_cpu_s)
            .map(|(a, b)| a + b);
    }
}

impl LoopResult {
    /// Builds the figures from the counts of a run of `workers` workers measured over
    /// `seconds`.
    fn from_raw(workers: usize, seconds: f64, raw: RawLoop) -> Self {
        let per_pair = |total: f64| {
            (raw.pairs_total > 0 && total > 0.0).then(|| total * 1000.0 / raw.pairs_total as f64)
        };
        LoopResult {
            workers,
            seconds,
            pairs: raw.pairs,
            pairs_per_sec: if seconds > 0.0 {
                raw.pairs as f64 / seconds
            } else {
                0.0
            },
            acquire: raw.acquire.clone().summary(),
            release: raw.release.clone().summary(),
            acquire_histogram: None,
            token_order_violations: raw.token_order_violations,
            overlaps: raw.overlaps,
            errors: raw.errors,
            first_error: raw.first_error.clone(),
            // The log also holds the warm-up's pairs, so divide by every pair completed.
            log_entries_per_pair: raw
                .log_entries
                .filter(|_| raw.pairs_total > 0)
                .map(|entries| entries as f64 / raw.pairs_total as f64),
            server_cpu_ms_per_pair: per_pair(raw.server_cpu_s),
            client_cpu_ms_per_pair: raw.client_cpu_s.and_then(per_pair),
            raw,
        }
    }

    /// The same result with its acquire latencies kept as a histogram in the report.
    pub fn with_acquire_histogram(mut self) -> Self {
        self.acquire_histogram = Some(self.raw.acquire.histogram());
        self
    }

    /// One result for slices of the same workload run one after another: pairs, time, CPU
    /// and log growth add up, latencies are the percentiles of every slice's samples together.
    /// `None` for no slices.
    pub fn combine(slices: Vec<LoopResult>) -> Option<LoopResult> {
        let mut slices = slices.into_iter();
        let first = slices.next()?;
        let (workers, mut seconds, mut raw) = (first.workers, first.seconds, first.raw);
        for slice in slices {
            seconds += slice.seconds;
            raw.add(slice.raw);
        }
        Some(LoopResult::from_raw(workers, seconds, raw))
    }
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
    let server_cpu_s = system.cpu_seconds() - cpu_before;
    let client_cpu_s = own_cpu_seconds().zip(client_cpu_before).map(|(a, b)| a - b);
    let (violations, overlaps) = fence.map_or((0, 0), |f| {
        let s = f.state.lock().unwrap_or_else(|p| p.into_inner());
        (s.violations, s.overlaps)
    });
    Ok(LoopResult::from_raw(
        spec.workers,
        spec.measure.as_secs_f64(),
        RawLoop {
            acquire,
            release,
            pairs,
            pairs_total,
            token_order_violations: violations,
            overlaps,
            errors,
            first_error,
            log_entries: match (log_before, log_after) {
                (Some(b), Some(a)) if a >= b => Some(a - b),
                _ => None,
            },
            server_cpu_s,
            client_cpu_s,
        },
    ))
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

/// W4: W1 with and without `sessions` other sessions kept alive at a third of their TTL, in
/// alternating slices.
#[derive(Debug, Clone, Serialize)]
pub struct SessionsResult {
    /// The keep-alive load, all rounds together.
    pub keepers: KeeperReport,
    /// Session TTL, in milliseconds.
    pub session_ttl_ms: u64,
    /// Rounds of one slice without and one with the sessions.
    pub rounds: usize,
    /// W1 while the sessions were kept alive: every round's slice together.
    pub w1: LoopResult,
    /// W1 without them, in the slices between: every round's slice together.
    pub baseline: LoopResult,
}

impl SessionsResult {
    /// How much W1's pairs/s drop with the sessions, in percent of the W1 slices without them.
    pub fn cost_pct(&self) -> f64 {
        (1.0 - self.w1.pairs_per_sec / self.baseline.pairs_per_sec) * 100.0
    }
}

/// Runs W4: `rounds` rounds of two W1 slices of `w1.measure / rounds` each, one without the
/// sessions and one with `sessions` of them kept alive, opened just before it and closed just
/// after. The order alternates (without, with; with, without; ...), so a host that slows down
/// or speeds up during the run weighs on both halves alike, and each slice is compared with
/// its neighbours minutes rather than a whole run apart.
pub async fn run_sessions<S: LockSystem>(
    system: &S,
    sessions: usize,
    ttl: Duration,
    w1: &LoopSpec,
    rounds: usize,
) -> Result<SessionsResult> {
    let rounds = rounds.max(1);
    let slice = LoopSpec {
        measure: w1.measure / rounds as u32,
        ..w1.clone()
    };
    let (mut with, mut without, mut loads) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        for loaded in [round % 2 == 1, round % 2 == 0] {
            if !loaded {
                let result = run_loop(system, &slice).await;
                without.push(result.with_context(|| format!("w4 round {round}: W1 alone"))?);
                continue;
            }
            let keepers = system
                .start_keepers(sessions, ttl)
                .await
                .with_context(|| format!("w4 round {round}: opening the sessions"))?;
            let result = run_loop(system, &slice).await;
            loads.push(keepers.stop().await);
            with.push(result.with_context(|| format!("w4 round {round}: W1 with the sessions"))?);
        }
    }
    let missing = || anyhow::anyhow!("w4 ran no slice");
    Ok(SessionsResult {
        keepers: KeeperReport::combine(&loads).ok_or_else(missing)?,
        session_ttl_ms: ttl.as_millis() as u64,
        rounds,
        w1: LoopResult::combine(with).ok_or_else(missing)?,
        baseline: LoopResult::combine(without).ok_or_else(missing)?,
    })
}

#[cfg(test)]
impl LoopResult {
    /// For other modules' tests: `pairs` pairs in one second, each acquire and release taking
    /// `latency_ms`.
    pub(crate) fn for_test(pairs: u64, latency_ms: u64) -> Self {
        let mut raw = RawLoop {
            pairs,
            pairs_total: pairs,
            ..RawLoop::default()
        };
        for _ in 0..pairs {
            raw.acquire.push(Duration::from_millis(latency_ms));
            raw.release.push(Duration::from_millis(latency_ms));
        }
        LoopResult::from_raw(1, 1.0, raw)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slice(
        seconds: f64,
        pairs: u64,
        pairs_total: u64,
        cpu_s: f64,
        latency_ms: u64,
    ) -> LoopResult {
        let mut acquire = Samples::default();
        let mut release = Samples::default();
        for _ in 0..pairs {
            acquire.push(Duration::from_millis(latency_ms));
            release.push(Duration::from_millis(latency_ms));
        }
        LoopResult::from_raw(
            32,
            seconds,
            RawLoop {
                acquire,
                release,
                pairs,
                pairs_total,
                errors: 1,
                first_error: Some(format!("slice of {latency_ms} ms")),
                log_entries: Some(pairs_total / 5),
                server_cpu_s: cpu_s,
                client_cpu_s: Some(cpu_s / 4.0),
                ..RawLoop::default()
            },
        )
    }

    fn close(got: Option<f64>, want: f64) -> bool {
        got.is_some_and(|got| (got - want).abs() < 1e-9)
    }

    #[test]
    fn combined_slices_add_up_and_weigh_per_pair_figures_by_pairs() {
        // 5 ms and 12.5 ms of server CPU per pair (warm-up pairs included).
        let a = slice(10.0, 100, 120, 0.6, 2);
        let b = slice(10.0, 300, 280, 3.5, 8);
        assert!(close(a.server_cpu_ms_per_pair, 5.0));
        assert!(close(b.server_cpu_ms_per_pair, 12.5));
        let all = LoopResult::combine(vec![a, b]).expect("two slices");
        assert_eq!(all.seconds, 20.0);
        assert_eq!(all.pairs, 400);
        assert_eq!(all.pairs_per_sec, 20.0);
        assert_eq!(all.errors, 2);
        assert_eq!(all.first_error.as_deref(), Some("slice of 2 ms"));
        // 4.1 s over 400 pairs, not the mean of the two slices' figures (8.75).
        assert!(close(all.server_cpu_ms_per_pair, 10.25));
        assert!(close(all.client_cpu_ms_per_pair, 10.25 / 4.0));
        assert!(close(all.log_entries_per_pair, (24 + 56) as f64 / 400.0));
        // Percentiles over both slices' samples: 100 at 2 ms, 300 at 8 ms.
        assert_eq!(all.acquire.count, 400);
        assert_eq!(all.acquire.p50_ms, Some(8.0));
        assert!(LoopResult::combine(Vec::new()).is_none());
    }

    #[test]
    fn the_acquire_histogram_is_kept_only_when_asked_for_and_holds_every_sample() {
        let plain = slice(10.0, 50, 50, 0.1, 3);
        assert!(plain.acquire_histogram.is_none());
        let kept = plain.with_acquire_histogram();
        let histogram = kept.acquire_histogram.as_ref().expect("kept");
        assert_eq!(histogram.count(), 50);
        assert_eq!(histogram.buckets.len(), 1, "50 samples of 3 ms");
    }

    #[test]
    fn a_slice_without_a_log_position_leaves_the_combined_one_unknown() {
        let mut b = slice(10.0, 10, 10, 0.1, 1);
        b.raw.log_entries = None;
        let all = LoopResult::combine(vec![slice(10.0, 10, 10, 0.1, 1), b]).expect("two slices");
        assert_eq!(all.log_entries_per_pair, None);
        assert_eq!(all.pairs, 20);
    }
}
