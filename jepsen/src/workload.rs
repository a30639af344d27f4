//! The workload: clients that loop acquire → (renew) → `check_still_held` → write to a fenced
//! register → release, recording every step in the history; and the fenced register itself.
//!
//! Owns the clients' behaviour and the register's rule. Must not inject faults (the nemeses
//! do, including the client pause, which only *arms* [`ClientPauses`]) and must not judge the
//! history.
//!
//! # Deadlines
//!
//! The history's `deadline_ns` is the handle's `client_deadline` on the run clock. The SDK
//! also caps a grant by its session's deadline; sessions here live [`SESSION_TTL`] while
//! grants live a few seconds and are renewed together with the session's heartbeats by the
//! same leader, so the handle's deadline is the binding one.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lock_api::{Fence, LockError, LockHandle};
use lock_client::{ClientConfig, LockClient, LockClientSession};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

use crate::history::{ERROR_CONTENDED, ERROR_FENCED, ERROR_LOST, F, Op, OpType, Process, Recorder};

/// Session TTL of the workload's clients: long next to the grants' TTL (see the module doc),
/// well within the server's limits.
pub const SESSION_TTL: Duration = Duration::from_secs(30);

/// The owner id client `process` opens its sessions as.
pub fn owner_of(process: u32) -> String {
    format!("{OWNER_PREFIX}{process}")
}

/// The client whose owner id `owner` is ([`owner_of`]'s inverse); `None` for any other name.
pub fn process_of(owner: &str) -> Option<u32> {
    owner.strip_prefix(OWNER_PREFIX)?.parse().ok()
}

/// How every workload owner id begins.
const OWNER_PREFIX: &str = "jepsen-client-";

/// Pause between two attempts to open a session while the cluster is unavailable.
const SESSION_RETRY_PAUSE: Duration = Duration::from_millis(250);

/// Pause after an acquire with an unknown outcome, so a client does not spin against a
/// cluster without a leader.
const INFO_BACKOFF: Duration = Duration::from_millis(100);

/// Longest wait for closing a session at the end of the run (or a dead one): one call budget
/// of the SDK is plenty on a healed cluster, and a close that does not arrive only means the
/// session ends with its TTL.
const SESSION_CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// Longest "short" hold, in ms: a brief critical section before the write, so that other
/// clients' acquires queue behind it (a hand-off) rather than always finding the key free.
const SHORT_HOLD_MS_MAX: u64 = 30;

/// What a client does.
#[derive(Clone, Debug, serde::Serialize)]
pub struct WorkloadConfig {
    /// Number of clients.
    pub clients: u32,
    /// Keys `k0 .. k{keys-1}`.
    pub keys: u32,
    /// Lease of each grant.
    pub ttl: Duration,
    /// Longest wait of one acquire.
    pub max_wait: Duration,
    /// Fraction of holds that last several TTLs and need renewals.
    pub long_hold_fraction: f64,
    /// Seed; client `n` uses `seed + n`.
    pub seed: u64,
    /// TLS to the nodes, as the `client` principal (`None`: the nodes run `--insecure`).
    #[serde(skip)]
    pub tls: Option<lock_client::TlsConfig>,
}

/// The protected resource: one fence per key, C2's rule (`lock_api::Fence`).
///
/// Each verdict is recorded while the register's lock is held, so the order of write
/// completions in the history is the order the register applied them.
#[derive(Debug, Default)]
pub struct FencedRegister {
    fences: Mutex<HashMap<String, (Fence, Option<String>)>>,
}

impl FencedRegister {
    /// Presents `token` for a write of `value` to `key`, recording the outcome as `process`.
    /// Returns whether the write was accepted.
    pub fn write(
        &self,
        recorder: &Recorder,
        process: u32,
        key: &str,
        token: u64,
        value: &str,
    ) -> bool {
        let mut fences = self.fences.lock().unwrap_or_else(|p| p.into_inner());
        let (fence, stored_value) = fences
            .entry(key.to_owned())
            .or_insert_with(|| (Fence::new(key), None));
        let op = match fence.admit(token) {
            Ok(()) => {
                *stored_value = Some(value.to_owned());
                Op::new(Process::Client(process), OpType::Ok, F::Write)
                    .key(key)
                    .token(token)
                    .value(json!(value))
            }
            Err(LockError::FencedOut { stored, .. }) => {
                let mut op = Op::new(Process::Client(process), OpType::Fail, F::Write)
                    .key(key)
                    .token(token)
                    .error(ERROR_FENCED)
                    .value(json!(value));
                op.stored = Some(stored);
                op
            }
            Err(other) => Op::new(Process::Client(process), OpType::Fail, F::Write)
                .key(key)
                .token(token)
                .error(other.to_string()),
        };
        let accepted = op.kind == OpType::Ok;
        recorder.record(op);
        accepted
    }
}

/// Pauses armed by the client-pause nemesis: client `n` sleeps `pause` between its next
/// `check_still_held` and its write, then reports that it did.
#[derive(Debug, Default)]
pub struct ClientPauses {
    armed: Mutex<HashMap<u32, (Duration, tokio::sync::oneshot::Sender<u64>)>>,
}

impl ClientPauses {
    /// Arms a pause for `process`; the receiver gets the run time (ns) at which the pause
    /// began.
    pub fn arm(&self, process: u32, pause: Duration) -> tokio::sync::oneshot::Receiver<u64> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.armed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(process, (pause, tx));
        rx
    }

    /// Disarms `process` (a pause that never happened).
    pub fn disarm(&self, process: u32) {
        self.armed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&process);
    }

    fn take(&self, process: u32) -> Option<(Duration, tokio::sync::oneshot::Sender<u64>)> {
        self.armed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&process)
    }
}

/// State shared by the clients and the harness.
#[derive(Debug)]
pub struct Shared {
    /// The history.
    pub recorder: Arc<Recorder>,
    /// The fenced register.
    pub register: FencedRegister,
    /// Armed client pauses.
    pub pauses: ClientPauses,
    /// Set to stop the clients after their current cycle.
    pub stop: AtomicBool,
    /// Completed acquires, for the progress line.
    pub granted: AtomicU64,
}

/// Runs client `process` until [`Shared::stop`] is set.
pub async fn client(
    process: u32,
    endpoints: Vec<String>,
    config: WorkloadConfig,
    shared: Arc<Shared>,
) {
    let mut rng = StdRng::seed_from_u64(config.seed.wrapping_add(u64::from(process)));
    let owner = owner_of(process);
    let client_config = ClientConfig {
        session_ttl: SESSION_TTL,
        jitter_seed: Some(config.seed ^ (u64::from(process) << 32)),
        tls: config.tls.clone(),
        ..ClientConfig::default()
    };
    let mut lock_client: Option<LockClient> = None;
    let mut session: Option<LockClientSession> = None;
    while !shared.stop.load(Ordering::SeqCst) {
        if lock_client.is_none() {
            match LockClient::connect_with(&endpoints, client_config.clone()).await {
                Ok(c) => lock_client = Some(c),
                Err(_) => {
                    tokio::time::sleep(SESSION_RETRY_PAUSE).await;
                    continue;
                }
            }
        }
        if session.as_ref().is_none_or(|s| !s.is_alive()) {
            if let Some(dead) = session.take() {
                let _ = tokio::time::timeout(SESSION_CLOSE_TIMEOUT, dead.close()).await;
            }
            let Some(c) = lock_client.as_ref() else {
                continue;
            };
            match c.open_session(&owner).await {
                Ok(s) => session = Some(s),
                Err(_) => {
                    tokio::time::sleep(SESSION_RETRY_PAUSE).await;
                    continue;
                }
            }
        }
        let Some(s) = session.as_ref() else { continue };
        cycle(process, s, &config, &shared, &mut rng).await;
    }
    if let Some(s) = session.take() {
        let _ = tokio::time::timeout(SESSION_CLOSE_TIMEOUT, s.close()).await;
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// One acquire → hold → check → write → release cycle.
async fn cycle(
    process: u32,
    session: &LockClientSession,
    config: &WorkloadConfig,
    shared: &Shared,
    rng: &mut StdRng,
) {
    let recorder = &shared.recorder;
    let key = format!("k{}", rng.gen_range(0..config.keys.max(1)));
    let me = Process::Client(process);
    let mut invoke = Op::new(me, OpType::Invoke, F::Acquire).key(&key);
    invoke.ttl_ms = Some(ms(config.ttl));
    invoke.max_wait_ms = Some(ms(config.max_wait));
    recorder.record(invoke);
    let mut handle = match session.acquire(&key, config.ttl, config.max_wait).await {
        Ok(Some(h)) => {
            recorder.record(
                Op::new(me, OpType::Ok, F::Acquire)
                    .key(&key)
                    .token(h.fencing_token)
                    .deadline(recorder.ns_at(h.client_deadline)),
            );
            shared.granted.fetch_add(1, Ordering::Relaxed);
            h
        }
        Ok(None) => {
            recorder.record(
                Op::new(me, OpType::Fail, F::Acquire)
                    .key(&key)
                    .error(ERROR_CONTENDED),
            );
            return;
        }
        Err(e) => {
            recorder.record(
                Op::new(me, OpType::Info, F::Acquire)
                    .key(&key)
                    .error(e.to_string()),
            );
            tokio::time::sleep(INFO_BACKOFF).await;
            return;
        }
    };

    // Hold: usually briefly; sometimes for several TTLs, renewing every third of the TTL.
    if rng.gen_bool(config.long_hold_fraction) {
        let hold_until = Instant::now() + config.ttl * 3 / 2;
        while Instant::now() < hold_until {
            tokio::time::sleep(config.ttl / 3).await;
            if session.check_still_held(&handle).is_err() {
                return;
            }
            let token = handle.fencing_token;
            recorder.record(Op::new(me, OpType::Invoke, F::Renew).key(&key).token(token));
            match session.renew(&handle).await {
                Ok(Some(renewed)) => {
                    recorder.record(
                        Op::new(me, OpType::Ok, F::Renew)
                            .key(&key)
                            .token(token)
                            .deadline(recorder.ns_at(renewed.client_deadline)),
                    );
                    handle = renewed;
                }
                Ok(None) => {
                    recorder.record(
                        Op::new(me, OpType::Fail, F::Renew)
                            .key(&key)
                            .token(token)
                            .error(ERROR_LOST),
                    );
                    return;
                }
                Err(e) => {
                    // Transient, or "lost" decided locally (deadline passed): neither is the
                    // server's verdict, so the outcome is unknown.
                    let lost_locally = matches!(e, LockError::LockLost { .. });
                    recorder.record(
                        Op::new(me, OpType::Info, F::Renew)
                            .key(&key)
                            .token(token)
                            .error(e.to_string()),
                    );
                    if lost_locally {
                        return;
                    }
                }
            }
        }
    } else {
        tokio::time::sleep(Duration::from_millis(rng.gen_range(0..SHORT_HOLD_MS_MAX))).await;
    }

    // The critical section: check, (maybe be paused like a GC pause would), write.
    if session.check_still_held(&handle).is_err() {
        return;
    }
    if let Some((pause, began)) = shared.pauses.take(process) {
        let _ = began.send(recorder.now_ns());
        tokio::time::sleep(pause).await;
    }
    write_and_release(process, session, &handle, shared).await;
}

async fn write_and_release(
    process: u32,
    session: &LockClientSession,
    handle: &LockHandle,
    shared: &Shared,
) {
    let recorder = &shared.recorder;
    let me = Process::Client(process);
    let key = handle.key.as_str();
    let token = handle.fencing_token;
    let value = format!("c{process}-t{token}");
    recorder.record(
        Op::new(me, OpType::Invoke, F::Write)
            .key(key)
            .token(token)
            .value(json!(value)),
    );
    shared.register.write(recorder, process, key, token, &value);

    recorder.record(
        Op::new(me, OpType::Invoke, F::Release)
            .key(key)
            .token(token),
    );
    match session.release(handle).await {
        Ok(released) => {
            let mut op = Op::new(me, OpType::Ok, F::Release).key(key).token(token);
            op.released = Some(released);
            recorder.record(op);
        }
        Err(e) => {
            recorder.record(
                Op::new(me, OpType::Info, F::Release)
                    .key(key)
                    .token(token)
                    .error(e.to_string()),
            );
        }
    }
}
