//! etcd under test: starts a three-member cluster of Debian's `etcd` (3.4) on free loopback
//! ports with data on disk, finds the leader, and drives it over etcd's own gRPC API: one
//! lease per worker, v3lock `Lock`/`Unlock`, token = the response header's revision. Owns
//! nothing of the workloads.
//!
//! The members serve TLS the way the lockd nodes do (`crate::pki`): client URLs and peer URLs
//! over TLS with certificates from a CA minted for the run, a client certificate required on
//! both, and every benchmark connection presenting the `client` certificate. `--insecure` runs
//! both systems plaintext.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, ClientTlsConfig};

use crate::lockd::channel_with;
use crate::pki::BenchPki;
use crate::procs::{NodeProcess, free_ports};
use crate::system::{
    Connections, KEEPER_TASKS, KeeperCounters, Keepers, LockSystem, LockWorker, keepalive_due,
};

/// The etcd stubs: the etcd API subset generated in `lock-proto` (`proto/proto/etcd/`, its
/// feature `etcd`).
pub use lock_proto::etcd as wire;

use wire::etcdserverpb::lease_client::LeaseClient;
use wire::etcdserverpb::maintenance_client::MaintenanceClient;
use wire::etcdserverpb::{
    LeaseGrantRequest, LeaseKeepAliveRequest, LeaseRevokeRequest, StatusRequest,
};
use wire::v3lockpb::lock_client::LockClient;
use wire::v3lockpb::{LockRequest, UnlockRequest};

/// Members in the cluster.
const MEMBERS: usize = 3;
/// How long the cluster gets to elect a leader that every member knows.
const LEADER_WAIT: Duration = Duration::from_secs(60);
/// Pause between two status polls while waiting for the leader.
const POLL_INTERVAL: Duration = Duration::from_millis(100);
/// TTL of a worker's lease, in seconds: longer than any run, so it needs no keep-alives.
const WORKER_LEASE_TTL_SECS: i64 = 600;
/// Room in a keep-alive stream's send queue.
const KEEPALIVE_QUEUE: usize = 1024;

/// A running three-member etcd cluster.
#[derive(Debug)]
pub struct EtcdCluster {
    members: Vec<NodeProcess>,
    leader_addr: String,
    maintenance: MaintenanceClient<Channel>,
    /// The one connection of every worker, with `Connections::Shared`.
    shared: Option<Channel>,
    /// Every connection's TLS config (`None`: the members serve plaintext).
    tls: Option<ClientTlsConfig>,
}

impl EtcdCluster {
    /// Starts three etcd members with data under `data_dir` and waits until every member
    /// knows the same leader. With `tls` they serve clients and each other TLS with a PKI
    /// minted under `data_dir`, else plaintext.
    pub async fn start(
        bin: &Path,
        data_dir: &Path,
        connections: Connections,
        tls: bool,
    ) -> Result<Self> {
        let pki = if tls {
            Some(BenchPki::mint(&data_dir.join("pki"), "lock-bench etcd CA")?)
        } else {
            None
        };
        let scheme = if pki.is_some() { "https" } else { "http" };
        let ports = free_ports(2 * MEMBERS)?;
        let client_addrs: Vec<String> = ports[..MEMBERS]
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        let peer_urls: Vec<String> = ports[MEMBERS..]
            .iter()
            .map(|p| format!("{scheme}://127.0.0.1:{p}"))
            .collect();
        let initial_cluster = peer_urls
            .iter()
            .enumerate()
            .map(|(i, url)| format!("e{}={url}", i + 1))
            .collect::<Vec<_>>()
            .join(",");
        let token = format!("lock-bench-{}", std::process::id());
        let mut members = Vec::with_capacity(MEMBERS);
        for i in 0..MEMBERS {
            let name = format!("e{}", i + 1);
            let dir = data_dir.join(format!("etcd-{}", i + 1));
            let client_url = format!("{scheme}://{}", client_addrs[i]);
            let mut args = vec![
                format!("--name={name}"),
                format!("--data-dir={}", dir.display()),
                format!("--listen-client-urls={client_url}"),
                format!("--advertise-client-urls={client_url}"),
                format!("--listen-peer-urls={}", peer_urls[i]),
                format!("--initial-advertise-peer-urls={}", peer_urls[i]),
                format!("--initial-cluster={initial_cluster}"),
                "--initial-cluster-state=new".to_owned(),
                format!("--initial-cluster-token={token}"),
                "--logger=zap".to_owned(),
                "--log-outputs=stderr".to_owned(),
            ];
            if let Some(pki) = &pki {
                args.extend(member_tls_args(pki, &name)?);
            }
            members.push(NodeProcess::spawn(
                &format!("etcd-{}", i + 1),
                bin,
                &args,
                data_dir,
            )?);
        }
        let tls = pki.as_ref().map(BenchPki::client);
        let deadline = Instant::now() + LEADER_WAIT;
        let leader_addr = loop {
            for member in &mut members {
                member.check_running()?;
            }
            if let Some(leader) = agreed_leader(&client_addrs, tls.as_ref()).await {
                break leader;
            }
            if Instant::now() > deadline {
                bail!(
                    "etcd: no leader known to all {MEMBERS} members within {LEADER_WAIT:?}; see \
                     the member logs in {}",
                    data_dir.display()
                );
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        };
        let maintenance = MaintenanceClient::new(channel_with(&leader_addr, tls.as_ref()).await?);
        let shared = match connections {
            Connections::Shared => Some(channel_with(&leader_addr, tls.as_ref()).await?),
            Connections::PerWorker => None,
        };
        Ok(Self {
            members,
            leader_addr,
            maintenance,
            shared,
            tls,
        })
    }

    /// The leader's client address.
    pub fn leader_addr(&self) -> &str {
        &self.leader_addr
    }

    /// Stops every member (SIGTERM).
    pub async fn stop(self) -> Result<()> {
        let mut first_error = None;
        for member in self.members {
            if let Err(e) = member.stop().await {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// Member `name`'s TLS flags: its certificate for clients and peers alike, the CA, and a client
/// certificate required on both.
fn member_tls_args(pki: &BenchPki, name: &str) -> Result<Vec<String>> {
    let files = pki.issue(name)?;
    let (cert, key, ca) = (
        files.cert.display().to_string(),
        files.key.display().to_string(),
        pki.ca_file().display().to_string(),
    );
    Ok(vec![
        format!("--cert-file={cert}"),
        format!("--key-file={key}"),
        format!("--trusted-ca-file={ca}"),
        "--client-cert-auth".to_owned(),
        format!("--peer-cert-file={cert}"),
        format!("--peer-key-file={key}"),
        format!("--peer-trusted-ca-file={ca}"),
        "--peer-client-cert-auth".to_owned(),
    ])
}

/// The leader's client address if every member reports the same leader, else `None`.
async fn agreed_leader(addrs: &[String], tls: Option<&ClientTlsConfig>) -> Option<String> {
    let mut leader = None;
    let mut leader_addr = None;
    for addr in addrs {
        let mut client = MaintenanceClient::new(channel_with(addr, tls).await.ok()?);
        let status = client.status(StatusRequest {}).await.ok()?.into_inner();
        if status.leader == 0 || leader.is_some_and(|l| l != status.leader) {
            return None;
        }
        leader = Some(status.leader);
        if status.header.is_some_and(|h| h.member_id == status.leader) {
            leader_addr = Some(addr.clone());
        }
    }
    leader_addr
}

/// Grants a lease of `ttl_secs` and answers its id.
async fn grant_lease(leases: &mut LeaseClient<Channel>, ttl_secs: i64) -> Result<i64> {
    let answer = leases
        .lease_grant(LeaseGrantRequest {
            ttl: ttl_secs,
            id: 0,
        })
        .await
        .context("etcd LeaseGrant")?
        .into_inner();
    if !answer.error.is_empty() {
        bail!("etcd LeaseGrant: {}", answer.error);
    }
    Ok(answer.id)
}

impl LockSystem for EtcdCluster {
    type Worker = EtcdWorker;

    async fn worker(&self, _index: usize) -> Result<EtcdWorker> {
        let channel = match &self.shared {
            Some(shared) => shared.clone(),
            None => channel_with(&self.leader_addr, self.tls.as_ref()).await?,
        };
        let lease = grant_lease(
            &mut LeaseClient::new(channel.clone()),
            WORKER_LEASE_TTL_SECS,
        )
        .await?;
        Ok(EtcdWorker {
            lock: LockClient::new(channel),
            lease,
            held: None,
        })
    }

    async fn start_keepers(&self, count: usize, ttl: Duration) -> Result<Keepers> {
        let started = Instant::now();
        let counters = Arc::new(KeeperCounters::default());
        let (stop_tx, stop_rx) = watch::channel(false);
        let (opened_tx, mut opened_rx) = mpsc::channel::<Result<()>>(KEEPER_TASKS);
        let ttl_secs = ttl.as_secs().max(1) as i64;
        let mut tasks = Vec::with_capacity(KEEPER_TASKS);
        for task in 0..KEEPER_TASKS {
            let share = count / KEEPER_TASKS + usize::from(task < count % KEEPER_TASKS);
            let addr = self.leader_addr.clone();
            let tls = self.tls.clone();
            let counters = counters.clone();
            let opened_tx = opened_tx.clone();
            let mut stop = stop_rx.clone();
            tasks.push(tokio::spawn(async move {
                let opened = async {
                    let channel = channel_with(&addr, tls.as_ref()).await?;
                    let mut leases = LeaseClient::new(channel);
                    let mut ids = Vec::with_capacity(share);
                    for _ in 0..share {
                        ids.push(grant_lease(&mut leases, ttl_secs).await?);
                    }
                    anyhow::Ok((leases, ids))
                }
                .await;
                let (mut leases, ids) = match opened {
                    Ok(v) => {
                        let _ = opened_tx.send(Ok(())).await;
                        v
                    }
                    Err(e) => {
                        let _ = opened_tx.send(Err(e)).await;
                        return;
                    }
                };
                if ids.is_empty() {
                    return;
                }
                // The writer paces the keep-alives into the stream; it runs on its own task
                // because the call answers only once the server has sent its headers.
                let (tx, rx) = mpsc::channel(KEEPALIVE_QUEUE);
                let period = ttl / 3;
                let mut writer_stop = stop.clone();
                let to_revoke = ids.clone();
                let writer = tokio::spawn(async move {
                    let start = Instant::now();
                    for n in 0u64.. {
                        let due = keepalive_due(start, period, ids.len(), n);
                        tokio::select! {
                            _ = tokio::time::sleep_until(due.into()) => {}
                            _ = writer_stop.changed() => return,
                        }
                        let id = ids[(n % ids.len() as u64) as usize];
                        if tx.send(LeaseKeepAliveRequest { id }).await.is_err() {
                            return;
                        }
                    }
                });
                // Stopping ends the writer, which ends the stream: not a keep-alive failure.
                let failed = |stop: &watch::Receiver<bool>, what: String| {
                    if !*stop.borrow() {
                        counters.fail(what);
                    }
                };
                let mut responses = match leases.lease_keep_alive(ReceiverStream::new(rx)).await {
                    Ok(r) => Some(r.into_inner()),
                    Err(status) => {
                        failed(&stop, format!("LeaseKeepAlive: {status}"));
                        None
                    }
                };
                while let Some(stream) = responses.as_mut() {
                    tokio::select! {
                        message = stream.message() => match message {
                            Ok(Some(answer)) if answer.ttl > 0 => {
                                counters.ok.fetch_add(1, Ordering::Relaxed);
                            }
                            Ok(Some(answer)) => {
                                counters.fail(format!("lease {:x} is gone (TTL {})", answer.id, answer.ttl));
                            }
                            Ok(None) => {
                                failed(&stop, "LeaseKeepAlive stream ended".to_owned());
                                break;
                            }
                            Err(status) => {
                                failed(&stop, format!("LeaseKeepAlive: {status}"));
                                break;
                            }
                        },
                        _ = stop.changed() => break,
                    }
                }
                writer.abort();
                // Stopped (or the stream failed): wait for the stop, then revoke the leases,
                // so that the next W1 slice runs without them.
                while !*stop.borrow_and_update() {
                    if stop.changed().await.is_err() {
                        break;
                    }
                }
                for id in to_revoke {
                    match leases.lease_revoke(LeaseRevokeRequest { id }).await {
                        Ok(_) => {}
                        // etcd answers NOT_FOUND ("requested lease not found") for a lease
                        // that expired before its revoke arrived: it is gone, as wanted.
                        Err(status) if status.code() == tonic::Code::NotFound => {
                            counters.expired_before_close();
                        }
                        Err(status) => counters.close_failed(format!("LeaseRevoke: {status}")),
                    }
                }
            }));
        }
        // Each task reports once, after opening its share (the tasks keep their senders).
        drop(opened_tx);
        for _ in 0..KEEPER_TASKS {
            let opened = opened_rx
                .recv()
                .await
                .unwrap_or_else(|| Err(anyhow::anyhow!("a keep-alive task ended early")));
            if let Err(e) = opened {
                let _ = stop_tx.send(true);
                return Err(e.context("etcd: granting the W4 leases"));
            }
        }
        Ok(Keepers::new(
            counters,
            stop_tx,
            tasks,
            count,
            started.elapsed().as_secs_f64(),
            ttl / 3,
            // Each writer's first keep-alive is due one period after its share was granted.
            Instant::now() + ttl / 3,
        ))
    }

    fn cpu_seconds(&self) -> f64 {
        self.members
            .iter()
            .filter_map(NodeProcess::cpu_seconds)
            .sum()
    }

    async fn log_position(&self) -> Result<u64> {
        let status = self
            .maintenance
            .clone()
            .status(StatusRequest {})
            .await
            .context("etcd Maintenance.Status")?;
        Ok(status.into_inner().raft_index)
    }
}

/// An etcd benchmark worker: one connection and one lease.
#[derive(Debug)]
pub struct EtcdWorker {
    lock: LockClient<Channel>,
    lease: i64,
    held: Option<Vec<u8>>,
}

impl LockWorker for EtcdWorker {
    async fn acquire(&mut self, key: &str) -> Result<u64> {
        let answer = self
            .lock
            .lock(LockRequest {
                name: key.as_bytes().to_vec(),
                lease: self.lease,
            })
            .await
            .with_context(|| format!("etcd Lock {key}"))?
            .into_inner();
        let revision = answer
            .header
            .map(|h| h.revision)
            .with_context(|| format!("etcd Lock {key}: answer without a header"))?;
        self.held = Some(answer.key);
        u64::try_from(revision).with_context(|| format!("etcd Lock {key}: revision {revision}"))
    }

    async fn release(&mut self) -> Result<()> {
        let Some(key) = self.held.take() else {
            bail!("release without a held lock");
        };
        self.lock
            .unlock(UnlockRequest { key })
            .await
            .context("etcd Unlock")?;
        Ok(())
    }
}
