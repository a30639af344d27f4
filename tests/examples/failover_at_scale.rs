//! Failover at scale (issue 23, W5's failover row), measured from outside: a three-node cluster
//! is filled with `sessions × locks` held locks through one `Pipeline` stream, the leader is
//! SIGKILLed, and each kind of call is sent to the survivors every few milliseconds until it is
//! served. Prints, from the kill, when the first grant, heartbeat, renewal and confirmed inspect
//! were served and how many `Contention` answers came before each; then checks that sampled
//! keys kept their holder and token.
//!
//! ```text
//! cargo build --release -p lockd
//! LOCKD_BIN=target/release/lockd cargo run --release -p lock-tests --example failover_at_scale -- 200 1000
//! ```
//!
//! A measurement, not a test: it asserts only that the sampled locks survived.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use lock_proto::v1::pipeline_request::Call;
use lock_proto::v1::pipeline_response::Answer;
use lock_proto::v1::{PipelineRequest, TryAcquireRequest};
use lock_tests::{Cluster, LockError, NodeClient, ProcStats, next_request_id};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

/// Every session and lock outlives the run.
const TTL: Duration = lock_api::limits::TTL_MAX;

/// Calls in flight on the fill stream.
const WINDOW: usize = 512;

/// How often a probe retries a call that was not served.
const PROBE_EVERY: Duration = Duration::from_millis(5);

/// Held locks checked after the failover.
const SAMPLES: usize = 1_000;

/// How long the idle leader's CPU is sampled.
const IDLE: Duration = Duration::from_secs(10);

/// Prints node `id`'s CPU share over [`IDLE`] with no traffic, and its resident memory.
async fn idle_cpu(cluster: &Cluster, id: u64, what: &str) {
    let Some(pid) = cluster.pid(id) else {
        return;
    };
    let (Ok(before), started) = (ProcStats::sample(pid), Instant::now()) else {
        return;
    };
    tokio::time::sleep(IDLE).await;
    if let Ok(after) = ProcStats::sample(pid) {
        let cpu = after.growth_since(&before).cpu.as_secs_f64() / started.elapsed().as_secs_f64();
        println!(
            "{what} (node {id}) idle: {:.2} % of a core over {IDLE:?}, resident {:.0} MiB",
            cpu * 100.0,
            after.rss_bytes as f64 / (1024.0 * 1024.0)
        );
    }
}

/// The first time one kind of call was served, from the kill, and the refusals before it.
#[derive(Debug, Default)]
struct Served {
    after: Option<Duration>,
    contention: u64,
    not_leader: u64,
    other: u64,
}

/// Sends `op` round the survivors until it succeeds or `give_up` passes.
async fn probe<F, Fut>(
    survivors: Vec<NodeClient>,
    killed: Instant,
    give_up: Duration,
    op: F,
) -> Served
where
    F: Fn(NodeClient) -> Fut,
    Fut: std::future::Future<Output = Result<bool, LockError>>,
{
    let mut served = Served::default();
    let mut i = 0;
    while killed.elapsed() < give_up {
        let node = survivors[i % survivors.len()].clone();
        i += 1;
        match op(node).await {
            Ok(true) => {
                served.after = Some(killed.elapsed());
                return served;
            }
            Ok(false) => served.other += 1,
            Err(LockError::Contention { .. }) => served.contention += 1,
            Err(LockError::NotLeader { .. }) => served.not_leader += 1,
            Err(_) => served.other += 1,
        }
        tokio::time::sleep(PROBE_EVERY).await;
    }
    served
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut args = std::env::args().skip(1);
    let sessions: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(100);
    let per_session: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1_000);
    let mut cluster = Cluster::start(3).await;
    let leader = cluster.leader_client().await;

    let mut opened = Vec::with_capacity(sessions);
    for s in 0..sessions {
        opened.push(
            leader
                .open_session(&format!("w5-{s}"), TTL)
                .await
                .expect("open session"),
        );
    }
    let (calls, outgoing) = mpsc::channel(WINDOW * 2);
    let mut answers = leader
        .lock_service()
        .pipeline(ReceiverStream::new(outgoing))
        .await
        .expect("Pipeline opens")
        .into_inner();
    let total = sessions * per_session;
    let key_of = |n: usize| format!("w5/{:04}/{:07}", n % sessions, n);
    let started = Instant::now();
    let mut sent = 0;
    let mut granted: BTreeMap<usize, u64> = BTreeMap::new();
    let mut in_flight = 0;
    // Refused fill calls (a leader that answers NotLeader or Contention for a while), resent
    // with their request id.
    let mut refused: Vec<usize> = Vec::new();
    let mut refusals = 0u64;
    let mut request_ids: BTreeMap<usize, u64> = BTreeMap::new();
    while granted.len() < total {
        while in_flight < WINDOW && (sent < total || !refused.is_empty()) {
            let n = refused.pop().unwrap_or_else(|| {
                sent += 1;
                sent - 1
            });
            let request_id = *request_ids.entry(n).or_insert_with(next_request_id);
            let call = Call::TryAcquire(TryAcquireRequest {
                session_id: opened[n % sessions].id.clone(),
                request_id,
                key: key_of(n),
                ttl_ms: TTL.as_millis() as u64,
            });
            calls
                .send(PipelineRequest {
                    call_id: n as u64,
                    timeout_ms: 30_000,
                    call: Some(call),
                })
                .await
                .expect("stream open");
            in_flight += 1;
        }
        let answer = answers
            .message()
            .await
            .expect("no transport error")
            .expect("stream open");
        in_flight -= 1;
        match answer.answer {
            Some(Answer::Acquire(a)) => {
                let grant = a.grant.expect("a free key is granted");
                granted.insert(answer.call_id as usize, grant.fencing_token);
            }
            Some(Answer::Error(detail)) if refusals < 1_000_000 => {
                if refusals.is_power_of_two() || refusals == 0 {
                    println!(
                        "fill refusal {refusals} at {:?}: {detail:?}",
                        started.elapsed()
                    );
                }
                refusals += 1;
                refused.push(answer.call_id as usize);
                if refused.len() >= WINDOW / 2 {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            other => panic!("fill call {}: {other:?}", answer.call_id),
        }
    }
    println!("fill: {refusals} calls refused (NotLeader/Contention) and resent");
    drop(calls);
    let fill = started.elapsed();
    println!(
        "filled {total} locks in {fill:?} ({:.0} locks/s)",
        total as f64 / fill.as_secs_f64()
    );
    let probe_session = leader.open_session("probe", TTL).await.expect("open probe");

    let old = cluster.leader().await;
    idle_cpu(&cluster, old, "leader").await;
    let survivors: Vec<NodeClient> = cluster
        .ids()
        .into_iter()
        .filter(|id| *id != old)
        .map(|id| cluster.client(id))
        .collect();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let killed = Instant::now();
    cluster.kill(old);
    let give_up = Duration::from_secs(60);
    let held_session = opened[0].id.clone();
    let (held_key, held_token) = (key_of(0), granted[&0]);
    let probe_id = probe_session.id.clone();
    let grant = probe(survivors.clone(), killed, give_up, move |node| {
        let id = probe_id.clone();
        async move {
            let key = format!("after-{}", next_request_id());
            node.try_acquire(&id, &key, TTL).await.map(|g| g.is_some())
        }
    });
    let session = held_session.clone();
    let heartbeat = probe(survivors.clone(), killed, give_up, move |node| {
        let id = session.clone();
        async move { node.heartbeat(&id).await }
    });
    let (session, key) = (held_session.clone(), held_key.clone());
    let renew = probe(survivors.clone(), killed, give_up, move |node| {
        let (id, key) = (session.clone(), key.clone());
        async move {
            node.renew(&id, &key, held_token, TTL)
                .await
                .map(|g| g.is_some())
        }
    });
    let key = held_key.clone();
    let inspect = probe(survivors.clone(), killed, give_up, move |node| {
        let key = key.clone();
        async move { node.inspect(&key, true).await.map(|i| i.is_some()) }
    });
    let (grant, heartbeat, renew, inspect) = tokio::join!(
        tokio::spawn(grant),
        tokio::spawn(heartbeat),
        tokio::spawn(renew),
        tokio::spawn(inspect)
    );
    println!("load average at the kill: {}", load.trim());
    for (what, served) in [
        ("first grant", grant),
        ("first heartbeat", heartbeat),
        ("first renewal", renew),
        ("first confirmed inspect", inspect),
    ] {
        let served = served.expect("probe task");
        println!(
            "{what:>24}: {:?} after the kill ({} Contention, {} NotLeader, {} other before it)",
            served.after, served.contention, served.not_leader, served.other
        );
    }

    let any = cluster
        .cluster_client()
        .with_retry_for(Duration::from_secs(30));
    let step = (total / SAMPLES).max(1);
    let mut kept = 0;
    for n in (0..total).step_by(step).take(SAMPLES) {
        let info = any
            .inspect_confirmed(&key_of(n))
            .await
            .expect("inspect")
            .unwrap_or_else(|| panic!("{} lost in the failover", key_of(n)));
        assert_eq!(info.fencing_token, granted[&n], "{}", key_of(n));
        assert_eq!(info.session_id, opened[n % sessions].id, "{}", key_of(n));
        kept += 1;
    }
    println!("{kept} of {kept} sampled keys kept their holder and token");
    let new = cluster.leader().await;
    idle_cpu(&cluster, new, "new leader").await;
}
