//! `lockd dev`: a three-node cluster on 127.0.0.1 in the foreground, for trying lockd out.
//!
//! Owns starting three child `lockd run` processes of this same executable (node 1 with
//! `--bootstrap`), waiting for a leader, printing the endpoints, and stopping the children with
//! SIGTERM on Ctrl-C or SIGTERM. Data lives under `--dir` (one folder per node), so a second run
//! reuses it and never re-initialises. Children's logs go to `node{N}.log` in that folder.
//! Does not run any node logic in this process.
//!
//! The cluster runs with TLS like any other (docs/SECURITY.md §1): a throwaway CA and
//! certificates in `<dir>/tls/` (see `dev_tls`), client certificates required, and the role
//! map node-1..3=node, client=client, operator=operator, admin=admin. The readiness poll
//! speaks to the nodes as `admin`.

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use lock_proto::v1::StatusRequest;
use lock_proto::v1::admin_service_client::AdminServiceClient;
use tokio::process::{Child, Command};

/// Nodes in the dev cluster.
const NODES: u16 = 3;
/// How long the cluster may take to elect its first leader before `lockd dev` gives up.
const LEADER_WAIT: Duration = Duration::from_secs(30);
/// Pause between two readiness polls.
const POLL_INTERVAL: Duration = Duration::from_millis(100);
/// How long one readiness poll may take to connect (TCP and TLS handshake).
const POLL_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long each child may take to stop after SIGTERM before it is killed.
const STOP_WAIT: Duration = Duration::from_secs(10);

/// The `lockd dev` flags.
#[derive(Args, Clone, Debug)]
pub struct DevArgs {
    /// Folder for the three nodes' data and logs.
    #[arg(long, default_value = ".lockd-dev")]
    pub dir: PathBuf,
    /// Port of node 1; nodes 2 and 3 take the next two.
    #[arg(long, default_value_t = 7101)]
    pub base_port: u16,
}

struct DevNode {
    id: u16,
    addr: String,
    child: Option<Child>,
}

/// Runs the dev cluster until Ctrl-C or SIGTERM.
pub async fn run(args: DevArgs) -> anyhow::Result<()> {
    if args.base_port == 0 || args.base_port > u16::MAX - NODES {
        bail!(
            "--base-port {} leaves no room for {NODES} ports",
            args.base_port
        );
    }
    let exe = std::env::current_exe().context("cannot find the lockd executable")?;
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("cannot create {}", args.dir.display()))?;
    let dir = args
        .dir
        .canonicalize()
        .with_context(|| format!("cannot resolve {}", args.dir.display()))?;
    let addrs: Vec<String> = (0..NODES)
        .map(|i| format!("127.0.0.1:{}", args.base_port + i))
        .collect();
    let peers = addrs
        .iter()
        .enumerate()
        .map(|(i, a)| format!("{}={a}", i + 1))
        .collect::<Vec<_>>()
        .join(",");
    check_ports_file(&dir, args.base_port)?;
    // A port already taken (often: another `lockd dev`) would make a node exit while the
    // readiness poll talks to whatever holds the port; refuse up front instead.
    for addr in &addrs {
        if let Err(e) = std::net::TcpListener::bind(addr) {
            bail!(
                "cannot use {addr}: {e} (another lockd dev running? pick other ports with --base-port and --dir)"
            );
        }
    }
    let reused = dir
        .join("node1")
        .join(crate::process::identity::IDENTITY_FILE)
        .exists();
    let pki = super::dev_tls::DevPki::ensure(&dir.join(super::dev_tls::TLS_SUBDIR), NODES)?;
    let admin = pki.admin_tls()?;

    let mut nodes = Vec::new();
    for (i, addr) in addrs.iter().enumerate() {
        let id = i as u16 + 1;
        let child = spawn_node(&exe, &dir, &pki, id, addr, &peers)?;
        nodes.push(DevNode {
            id,
            addr: addr.clone(),
            child: Some(child),
        });
    }

    let mut signals = Signals::new()?;
    let leader = tokio::select! {
        leader = wait_for_leader(&mut nodes, &admin) => leader,
        _ = signals.recv() => {
            stop_all(&mut nodes).await;
            return Ok(());
        }
    };
    let leader = match leader {
        Ok(leader) => leader,
        Err(err) => {
            stop_all(&mut nodes).await;
            return Err(err.context(format!("see the logs in {}", dir.display())));
        }
    };

    println!(
        "lockd dev: {NODES} nodes up with TLS ({} data in {}; logs in {}/node{{1,2,3}}.log; certificates in {}{})",
        if reused { "reusing" } else { "fresh" },
        dir.display(),
        dir.display(),
        pki.dir.display(),
        if pki.minted { ", new" } else { ", reused" },
    );
    for node in &nodes {
        let role = if node.id as u64 == leader.0 {
            "  (leader)"
        } else {
            ""
        };
        println!("  node {}  https://{}{role}", node.id, node.addr);
    }
    println!("leader: node {} at {}", leader.0, leader.1);
    println!("To use it (lockctl and the SDK read these):");
    println!("  export LOCKD_ENDPOINTS={}", addrs.join(","));
    for line in pki.export_lines() {
        println!("  {line}");
    }
    println!("Ctrl-C stops all three; the next run reuses the data.");

    loop {
        tokio::select! {
            _ = signals.recv() => break,
            (id, status) = next_exit(&mut nodes) => {
                println!("node {id} exited ({status}); the others keep running");
            }
        }
    }
    stop_all(&mut nodes).await;
    println!("lockd dev: stopped");
    Ok(())
}

/// The file in the dev folder recording the base port its cluster was created with.
const PORTS_FILE: &str = "base-port";

/// The nodes' addresses are part of the replicated membership, so a folder created with one
/// base port cannot be reused with another: the nodes would listen where no peer looks for
/// them. Records the port on first use and refuses a different one later.
fn check_ports_file(dir: &Path, base_port: u16) -> anyhow::Result<()> {
    let path = dir.join(PORTS_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let recorded: u16 = text
                .trim()
                .parse()
                .with_context(|| format!("{} does not hold a port number", path.display()))?;
            if recorded != base_port {
                bail!(
                    "{} holds a cluster created with --base-port {recorded}; use that port, or another --dir",
                    dir.display()
                );
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::write(&path, format!("{base_port}\n"))
                .with_context(|| format!("cannot write {}", path.display()))
        }
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

fn spawn_node(
    exe: &Path,
    dir: &Path,
    pki: &super::dev_tls::DevPki,
    id: u16,
    addr: &str,
    peers: &str,
) -> anyhow::Result<Child> {
    let log_path = dir.join(format!("node{id}.log"));
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .with_context(|| format!("cannot open {}", log_path.display()))?;
    let err_log = log
        .try_clone()
        .with_context(|| format!("cannot reuse {}", log_path.display()))?;
    let mut command = Command::new(exe);
    command
        .arg("run")
        .args(["--node-id", &id.to_string()])
        .args(["--listen", addr])
        .arg("--data-dir")
        .arg(dir.join(format!("node{id}")))
        .args(["--peers", peers])
        .args(pki.node_args(id))
        // Three nodes share this machine's cores.
        .args([
            "--worker-threads",
            &crate::process::config::colocated_worker_threads(usize::from(NODES)).to_string(),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::from(log))
        .stderr(Stdio::from(err_log))
        // Own process group: a terminal's Ctrl-C reaches `lockd dev` only, which then stops the
        // nodes itself, in order, and reports each stop.
        .process_group(0)
        .kill_on_drop(true);
    if id == 1 {
        command.arg("--bootstrap");
    }
    command
        .spawn()
        .with_context(|| format!("cannot start node {id} ({})", exe.display()))
}

/// Polls every node's status until all three name the same leader; returns its id and address.
async fn wait_for_leader(
    nodes: &mut [DevNode],
    admin: &std::sync::Arc<lock_tls::client::ClientTls>,
) -> anyhow::Result<(u64, String)> {
    let deadline = tokio::time::Instant::now() + LEADER_WAIT;
    loop {
        for node in nodes.iter_mut() {
            if let Some(child) = node.child.as_mut()
                && let Some(status) = child.try_wait().context("cannot poll a node")?
            {
                bail!(
                    "node {} exited before the cluster was up ({status})",
                    node.id
                );
            }
        }
        let mut leaders = Vec::new();
        for node in nodes.iter() {
            leaders.push(leader_of(&node.addr, node.id, admin).await);
        }
        if let Some(Some(first)) = leaders.first()
            && leaders.iter().all(|l| l.as_ref() == Some(first))
        {
            return Ok(first.clone());
        }
        if tokio::time::Instant::now() >= deadline {
            bail!("no leader elected within {LEADER_WAIT:?}");
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// The leader `addr` reports (asked over TLS as `admin`), if it answers as node `id` and knows
/// one.
async fn leader_of(
    addr: &str,
    id: u16,
    admin: &std::sync::Arc<lock_tls::client::ClientTls>,
) -> Option<(u64, String)> {
    // `http`: the connector does the TLS (see lock_tls::client).
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .ok()?
        .connect_timeout(POLL_CONNECT_TIMEOUT)
        .connect_with_connector(lock_tls::client::TlsConnector::new(admin.clone()))
        .await
        .ok()?;
    let mut client = AdminServiceClient::new(channel);
    let status = client.status(StatusRequest {}).await.ok()?.into_inner();
    if status.node_id != u64::from(id) {
        return None;
    }
    status.leader_id.map(|id| (id, status.leader_addr))
}

/// Waits for the next child to exit; pending forever if none is running.
async fn next_exit(nodes: &mut [DevNode]) -> (u16, ExitStatus) {
    let waits = nodes.iter_mut().filter_map(|node| {
        let id = node.id;
        let child = node.child.as_mut()?;
        Some(Box::pin(async move { (id, child.wait().await) }))
    });
    let waits: Vec<_> = waits.collect();
    if waits.is_empty() {
        return std::future::pending().await;
    }
    let ((id, status), _, _) = futures::future::select_all(waits).await;
    for node in nodes.iter_mut() {
        if node.id == id {
            node.child = None;
        }
    }
    match status {
        Ok(status) => (id, status),
        Err(e) => {
            tracing::warn!(node = id, error = %e, "cannot wait for node");
            (id, ExitStatus::default())
        }
    }
}

/// SIGTERM to every running child, then wait; a child still running after [`STOP_WAIT`] is
/// killed.
async fn stop_all(nodes: &mut [DevNode]) {
    for node in nodes.iter() {
        if let Some(pid) = node.child.as_ref().and_then(Child::id) {
            // rustix's safe wrapper: the workspace forbids unsafe code, and tokio's Child only
            // offers SIGKILL, which would skip the node's graceful shutdown.
            if let Some(pid) = rustix::process::Pid::from_raw(pid as i32) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
            }
        }
    }
    for node in nodes.iter_mut() {
        let Some(mut child) = node.child.take() else {
            continue;
        };
        match tokio::time::timeout(STOP_WAIT, child.wait()).await {
            Ok(Ok(status)) => println!("node {} stopped ({status})", node.id),
            Ok(Err(e)) => println!("node {}: cannot wait for it: {e}", node.id),
            Err(_) => {
                println!(
                    "node {} did not stop within {STOP_WAIT:?}; killing it",
                    node.id
                );
                let _ = child.kill().await;
            }
        }
    }
}

/// SIGINT (Ctrl-C), SIGTERM and SIGHUP (the terminal went away).
pub struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
    hangup: tokio::signal::unix::Signal,
}

impl std::fmt::Debug for Signals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signals").finish_non_exhaustive()
    }
}

impl Signals {
    /// Starts listening for SIGINT, SIGTERM and SIGHUP.
    pub fn new() -> anyhow::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Self {
            interrupt: signal(SignalKind::interrupt()).context("cannot listen for SIGINT")?,
            terminate: signal(SignalKind::terminate()).context("cannot listen for SIGTERM")?,
            hangup: signal(SignalKind::hangup()).context("cannot listen for SIGHUP")?,
        })
    }

    /// Resolves at the next SIGINT, SIGTERM or SIGHUP.
    pub async fn recv(&mut self) {
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
            _ = self.hangup.recv() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dev_folder_keeps_its_base_port() {
        let dir = tempfile::tempdir().unwrap();
        check_ports_file(dir.path(), 7101).unwrap();
        check_ports_file(dir.path(), 7101).unwrap();
        let err = check_ports_file(dir.path(), 7201).unwrap_err().to_string();
        assert!(err.contains("7101"), "{err}");
    }
}
