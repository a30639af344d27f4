//! A hand-check and measuring tool for a running cluster (e.g. `lockd dev`), over the raw gRPC
//! API. Not part of the server.
//!
//! ```text
//! cargo run -p lockd --example probe -- check   [ENDPOINTS]
//! cargo run -p lockd --example probe -- latency [ENDPOINTS] [PAIRS]
//! cargo run -p lockd --example probe -- throughput [ENDPOINTS] [CLIENTS] [SECONDS]
//! cargo run -p lockd --example probe -- heartbeats [ENDPOINTS] [CLIENTS] [SECONDS]
//! cargo run -p lockd --example probe -- failover [ENDPOINTS] LEADER_PID
//! ```
//!
//! `ENDPOINTS` defaults to `http://127.0.0.1:7101,http://127.0.0.1:7102,http://127.0.0.1:7103`.
//! `failover` SIGKILLs the process `LEADER_PID` (the current leader's `lockd run`) and measures
//! the time until a surviving node reports a new leader, and until that leader accepts a write.

use std::time::{Duration, Instant};

use lock_proto::lock_error_from_status;
use lock_proto::v1::admin_service_client::AdminServiceClient;
use lock_proto::v1::lock_service_client::LockServiceClient;
use lock_proto::v1::session_service_client::SessionServiceClient;
use lock_proto::v1::{
    AcquireRequest, HeartbeatRequest, InspectRequest, OpenSessionRequest, ReleaseRequest,
    StatusRequest, TryAcquireRequest,
};
use tonic::transport::Channel;

const DEFAULT_ENDPOINTS: &str = "http://127.0.0.1:7101,http://127.0.0.1:7102,http://127.0.0.1:7103";
/// Bound on every wait of this tool.
const WAIT_MAX: Duration = Duration::from_secs(30);

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

async fn channel(endpoint: &str) -> Result<Channel> {
    Ok(Channel::from_shared(endpoint.to_owned())?
        .connect_timeout(Duration::from_millis(300))
        .timeout(Duration::from_secs(5))
        .connect()
        .await?)
}

async fn leader_of(endpoint: &str) -> Option<(u64, String)> {
    let mut admin = AdminServiceClient::new(channel(endpoint).await.ok()?);
    let s = admin.status(StatusRequest {}).await.ok()?.into_inner();
    s.leader_id.map(|id| (id, s.leader_addr))
}

async fn find_leader(endpoints: &[String]) -> Result<(u64, String)> {
    let deadline = Instant::now() + WAIT_MAX;
    loop {
        for e in endpoints {
            if let Some(l) = leader_of(e).await {
                return Ok(l);
            }
        }
        if Instant::now() > deadline {
            return Err("no leader".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn check(endpoints: &[String]) -> Result<()> {
    let (leader_id, leader_addr) = find_leader(endpoints).await?;
    println!("leader: node {leader_id} at {leader_addr}");
    let leader_ep = format!("http://{leader_addr}");
    for e in endpoints.iter().filter(|e| **e != leader_ep) {
        let mut sessions = SessionServiceClient::new(channel(e).await?);
        let err = sessions
            .open_session(OpenSessionRequest {
                owner_id: "probe".into(),
                ttl_ms: 5_000,
            })
            .await
            .expect_err("a follower must refuse");
        println!("follower {e}: {:?}", lock_error_from_status(&err));
    }
    let ch = channel(&leader_ep).await?;
    let mut sessions = SessionServiceClient::new(ch.clone());
    let mut locks = LockServiceClient::new(ch);
    let session = sessions
        .open_session(OpenSessionRequest {
            owner_id: "probe".into(),
            ttl_ms: 5_000,
        })
        .await?
        .into_inner();
    println!("session: {}", session.session_id);
    let grant = locks
        .try_acquire(TryAcquireRequest {
            session_id: session.session_id.clone(),
            request_id: 1,
            key: "probe/key".into(),
            ttl_ms: 5_000,
        })
        .await?
        .into_inner()
        .grant
        .ok_or("not granted")?;
    println!(
        "granted: token {} expiry {}",
        grant.fencing_token, grant.server_expiry_unix_ms
    );
    let info = locks
        .inspect(InspectRequest {
            key: "probe/key".into(),
            leader_confirmed: true,
        })
        .await?
        .into_inner();
    println!("inspect: {:?}", info.info);
    // A waiting acquire whose client goes away is cancelled: its waiter leaves the queue.
    let other = sessions
        .open_session(OpenSessionRequest {
            owner_id: "probe-waiter".into(),
            ttl_ms: 5_000,
        })
        .await?
        .into_inner()
        .session_id;
    let mut waiting_client = locks.clone();
    let waiting = tokio::spawn(async move {
        waiting_client
            .acquire(AcquireRequest {
                session_id: other,
                request_id: 1,
                key: "probe/key".into(),
                ttl_ms: 5_000,
                max_wait_ms: 20_000,
            })
            .await
    });
    let waiters = |info: Option<lock_proto::v1::LockInfo>| info.map_or(0, |i| i.waiter_count);
    let deadline = Instant::now() + WAIT_MAX;
    while waiters(
        locks
            .inspect(InspectRequest {
                key: "probe/key".into(),
                leader_confirmed: false,
            })
            .await?
            .into_inner()
            .info,
    ) != 1
    {
        if Instant::now() > deadline {
            return Err("the waiter never queued".into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    println!("waiter queued; dropping its call");
    waiting.abort();
    let dropped_at = Instant::now();
    while waiters(
        locks
            .inspect(InspectRequest {
                key: "probe/key".into(),
                leader_confirmed: false,
            })
            .await?
            .into_inner()
            .info,
    ) != 0
    {
        if Instant::now() > deadline {
            return Err("the abandoned waiter was never cancelled".into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    println!(
        "abandoned waiter cancelled after {:?}",
        dropped_at.elapsed()
    );
    let released = locks
        .release(ReleaseRequest {
            session_id: session.session_id,
            request_id: 2,
            key: "probe/key".into(),
            fencing_token: grant.fencing_token,
        })
        .await?
        .into_inner()
        .released;
    println!("released: {released}");
    Ok(())
}

async fn latency(endpoints: &[String], pairs: usize) -> Result<()> {
    let (_, leader_addr) = find_leader(endpoints).await?;
    let ch = channel(&format!("http://{leader_addr}")).await?;
    let mut sessions = SessionServiceClient::new(ch.clone());
    let mut locks = LockServiceClient::new(ch);
    let session = sessions
        .open_session(OpenSessionRequest {
            owner_id: "probe".into(),
            ttl_ms: 30_000,
        })
        .await?
        .into_inner()
        .session_id;
    let mut samples = Vec::with_capacity(pairs);
    let mut request_id = 0;
    for i in 0..pairs {
        if i % 50 == 0 {
            // Keep the session alive (outside the timed pair).
            let alive = sessions
                .heartbeat(HeartbeatRequest {
                    session_id: session.clone(),
                })
                .await?
                .into_inner()
                .alive;
            if !alive {
                return Err("session lost".into());
            }
        }
        let start = Instant::now();
        request_id += 1;
        let grant = locks
            .try_acquire(TryAcquireRequest {
                session_id: session.clone(),
                request_id,
                key: format!("latency/{}", i % 16),
                ttl_ms: 5_000,
            })
            .await?
            .into_inner()
            .grant
            .ok_or("not granted")?;
        request_id += 1;
        locks
            .release(ReleaseRequest {
                session_id: session.clone(),
                request_id,
                key: grant.key,
                fencing_token: grant.fencing_token,
            })
            .await?;
        samples.push(start.elapsed());
    }
    samples.sort();
    let pct = |p: f64| samples[((samples.len() as f64 - 1.0) * p) as usize];
    println!(
        "acquire+release pairs: {pairs}; p50 {:?}, p90 {:?}, p99 {:?}, max {:?}",
        pct(0.5),
        pct(0.9),
        pct(0.99),
        samples[samples.len() - 1]
    );
    Ok(())
}

/// `clients` concurrent sessions, each doing acquire+release pairs on its own key (or a
/// heartbeat, with `heartbeats`) for `seconds`; prints operations per second.
async fn throughput(
    endpoints: &[String],
    clients: usize,
    seconds: u64,
    heartbeats: bool,
) -> Result<()> {
    let (_, leader_addr) = find_leader(endpoints).await?;
    let ch = channel(&format!("http://{leader_addr}")).await?;
    let until = Instant::now() + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for c in 0..clients {
        let ch = ch.clone();
        tasks.push(tokio::spawn(async move {
            let mut sessions = SessionServiceClient::new(ch.clone());
            let mut locks = LockServiceClient::new(ch);
            let session = sessions
                .open_session(OpenSessionRequest {
                    owner_id: format!("probe-{c}"),
                    ttl_ms: 30_000,
                })
                .await?
                .into_inner()
                .session_id;
            let mut ops = 0u64;
            let mut request_id = 0;
            while Instant::now() < until {
                if heartbeats {
                    sessions
                        .heartbeat(HeartbeatRequest {
                            session_id: session.clone(),
                        })
                        .await?;
                } else {
                    request_id += 1;
                    let grant = locks
                        .try_acquire(TryAcquireRequest {
                            session_id: session.clone(),
                            request_id,
                            key: format!("tp/{c}"),
                            ttl_ms: 5_000,
                        })
                        .await?
                        .into_inner()
                        .grant
                        .ok_or("not granted")?;
                    request_id += 1;
                    locks
                        .release(ReleaseRequest {
                            session_id: session.clone(),
                            request_id,
                            key: grant.key,
                            fencing_token: grant.fencing_token,
                        })
                        .await?;
                }
                ops += 1;
            }
            Ok::<u64, Box<dyn std::error::Error + Send + Sync>>(ops)
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await?.map_err(|e| e.to_string())?;
    }
    println!(
        "{clients} clients, {seconds} s: {total} {} ({:.0}/s)",
        if heartbeats {
            "heartbeats"
        } else {
            "acquire+release pairs"
        },
        total as f64 / seconds as f64
    );
    Ok(())
}

async fn failover(endpoints: &[String], pid: i32) -> Result<()> {
    let (old_id, old_addr) = find_leader(endpoints).await?;
    let survivors: Vec<String> = endpoints
        .iter()
        .filter(|e| **e != format!("http://{old_addr}"))
        .cloned()
        .collect();
    let killed_at = Instant::now();
    let pid = rustix::process::Pid::from_raw(pid).ok_or("bad pid")?;
    rustix::process::kill_process(pid, rustix::process::Signal::KILL)?;
    println!("killed node {old_id} (pid {pid:?})");
    let deadline = killed_at + WAIT_MAX;
    let new_leader = loop {
        let mut found = None;
        for e in &survivors {
            if let Some((id, addr)) = leader_of(e).await
                && id != old_id
            {
                found = Some((id, addr));
            }
        }
        if let Some(l) = found {
            break l;
        }
        if Instant::now() > deadline {
            return Err("no new leader".into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let elected = killed_at.elapsed();
    let mut sessions =
        SessionServiceClient::new(channel(&format!("http://{}", new_leader.1)).await?);
    let writable = loop {
        let r = sessions
            .open_session(OpenSessionRequest {
                owner_id: "probe".into(),
                ttl_ms: 5_000,
            })
            .await;
        if r.is_ok() {
            break killed_at.elapsed();
        }
        if Instant::now() > deadline {
            return Err("new leader never accepted a write".into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    println!(
        "new leader node {} reported after {elected:?}; first write accepted after {writable:?}",
        new_leader.0
    );
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mode = args.first().map(String::as_str).unwrap_or("check");
    let endpoints: Vec<String> = args
        .get(1)
        .map(String::as_str)
        .unwrap_or(DEFAULT_ENDPOINTS)
        .split(',')
        .map(str::to_owned)
        .collect();
    match mode {
        "check" => check(&endpoints).await,
        "latency" => {
            let pairs = args.get(2).map(|s| s.parse()).transpose()?.unwrap_or(1000);
            latency(&endpoints, pairs).await
        }
        "throughput" | "heartbeats" => {
            let clients = args.get(2).map(|s| s.parse()).transpose()?.unwrap_or(32);
            let seconds = args.get(3).map(|s| s.parse()).transpose()?.unwrap_or(10);
            throughput(&endpoints, clients, seconds, mode == "heartbeats").await
        }
        "failover" => {
            let pid: i32 = args
                .get(2)
                .ok_or("failover needs the leader's pid")?
                .parse()?;
            failover(&endpoints, pid).await
        }
        other => Err(format!(
            "unknown mode {other:?}: check | latency | throughput | heartbeats | failover"
        )
        .into()),
    }
}
