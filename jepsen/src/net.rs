//! The test network: a private network namespace in which each node has its own loopback
//! address, and iptables rules inside it that cut node-to-node links.
//!
//! Owns the namespace's life (create, re-exec the harness inside it, delete it and whatever
//! still runs in it) and the `LOCKJEPSEN` iptables chain. Must not know about Raft, nodes'
//! roles or the history; [`crate::nemesis`] decides *which* links to cut.
//!
//! # Why a namespace, uids and iptables (and not a TCP proxy)
//!
//! Every packet of the test stays inside a namespace the harness made and deletes, so nothing
//! reaches the host's network and no host firewall rule is touched; deleting the namespace
//! removes every rule at once, even after a crash. The nodes run the real `lockd` binary with
//! its real transport: no proxy sits between them, so a cut is a kernel-level drop, and a
//! partition behaves like one (connections hang rather than being reset by a proxy).
//!
//! Loopback traffic is sourced from 127.0.0.1 whatever address a node listens on, so a rule
//! cannot tell senders apart by source address. Each node therefore runs as its own uid
//! ([`NODE_UID_BASE`] + node id) and a cut of link a–b is two `OUTPUT` rules: packets *owned by*
//! node a's uid to node b's address are dropped, and vice versa. Clients (the harness, uid 0)
//! are never cut. A proxy design (needed only without root) would depend on the node using its
//! own `--peers` addresses rather than the replicated membership's; it is not implemented, and
//! without root the partition nemesis is skipped (recorded as `skipped`).

use std::process::Stdio;

use anyhow::{Context, bail};
use tokio::process::Command;

/// Environment variable set on the harness re-executed inside the namespace, naming it.
pub const NETNS_ENV: &str = "LOCK_JEPSEN_NETNS";

/// Node `n` runs as uid `NODE_UID_BASE + n`, which the partition rules match on. Far above
/// any uid a distribution hands out, so no real user's traffic can match.
pub const NODE_UID_BASE: u32 = 61_000;

/// Node `n` listens on 127.0.0.(`NODE_ADDR_BASE` + n) inside the namespace.
pub const NODE_ADDR_BASE: u8 = 10;

/// The iptables chain holding every cut, jumped to from `OUTPUT`.
pub const CHAIN: &str = "LOCKJEPSEN";

/// Whether this process runs as root (read from /proc, no unsafe `geteuid`).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|euid| euid == "0"))
        })
        .unwrap_or(false)
}

/// The namespace this process was re-executed in, if any.
pub fn current_netns() -> Option<String> {
    std::env::var(NETNS_ENV).ok().filter(|n| !n.is_empty())
}

async fn run(program: &str, args: &[&str]) -> anyhow::Result<()> {
    let output = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .await
        .with_context(|| format!("running {program} {}", args.join(" ")))?;
    if !output.status.success() {
        bail!(
            "{program} {} failed ({}): {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}

/// Creates a fresh namespace named `name` with its loopback up.
pub async fn create_netns(name: &str) -> anyhow::Result<()> {
    run("ip", &["netns", "add", name]).await?;
    run(
        "ip",
        &["netns", "exec", name, "ip", "link", "set", "lo", "up"],
    )
    .await?;
    Ok(())
}

/// Kills every process still inside the namespace (processes this run started: the harness
/// and its nodes), then deletes the namespace and with it every rule.
pub async fn destroy_netns(name: &str) -> anyhow::Result<()> {
    let output = Command::new("ip")
        .args(["netns", "pids", name])
        .output()
        .await
        .context("listing the namespace's processes")?;
    for pid in String::from_utf8_lossy(&output.stdout).split_whitespace() {
        if pid.bytes().all(|b| b.is_ascii_digit()) {
            let _ = Command::new("kill").args(["-KILL", pid]).output().await;
        }
    }
    run("ip", &["netns", "del", name]).await
}

/// Runs this same command line inside namespace `name`, waits for it, and returns its exit
/// code. Ctrl-C (SIGINT) is passed on to the child, which stops its run and cleans up; the
/// namespace is destroyed whatever happens.
pub async fn reexec_in_netns(name: &str) -> anyhow::Result<i32> {
    let exe = std::env::current_exe().context("finding this executable")?;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut child = Command::new("ip")
        .args(["netns", "exec", name])
        .arg(&exe)
        .args(&args)
        .env(NETNS_ENV, name)
        .kill_on_drop(true)
        .spawn()
        .context("starting the harness inside the namespace")?;
    let status = loop {
        tokio::select! {
            status = child.wait() => break status.context("waiting for the harness")?,
            _ = tokio::signal::ctrl_c() => {
                // From a terminal the child got the signal too; from `kill` it did not. A
                // second SIGINT is harmless: the child handles the first and ignores the rest.
                if let Some(pid) = child
                    .id()
                    .and_then(|p| i32::try_from(p).ok())
                    .and_then(rustix::process::Pid::from_raw)
                {
                    let _ = rustix::process::kill_process(pid, rustix::process::Signal::INT);
                }
                eprintln!("lock-jepsen: interrupted; waiting for the run to clean up");
            }
        }
    };
    destroy_netns(name).await?;
    Ok(status.code().unwrap_or(2))
}

/// The iptables chain that holds the cuts between nodes, inside the current namespace.
#[derive(Debug)]
pub struct Firewall {
    enabled: bool,
}

impl Firewall {
    /// Sets up the chain (inside a namespace) or a disabled firewall (outside one: cuts are
    /// then refused, and the partition nemesis records them as skipped).
    pub async fn new(in_netns: bool) -> anyhow::Result<Self> {
        if in_netns {
            run("iptables", &["-w", "-N", CHAIN]).await?;
            run("iptables", &["-w", "-A", "OUTPUT", "-j", CHAIN]).await?;
        }
        Ok(Self { enabled: in_netns })
    }

    /// Whether links can be cut.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Cuts every link in `links` (pairs of node ids), both directions.
    pub async fn cut(&self, links: &[(u64, u64)]) -> anyhow::Result<()> {
        if !self.enabled {
            bail!("links cannot be cut outside a network namespace (run as root)");
        }
        for &(a, b) in links {
            for (from, to) in [(a, b), (b, a)] {
                let uid = node_uid(from).to_string();
                let dest = node_ip(to);
                run(
                    "iptables",
                    &[
                        "-w",
                        "-A",
                        CHAIN,
                        "-m",
                        "owner",
                        "--uid-owner",
                        &uid,
                        "-d",
                        &dest,
                        "-j",
                        "DROP",
                    ],
                )
                .await?;
            }
        }
        Ok(())
    }

    /// Removes every cut.
    pub async fn heal(&self) -> anyhow::Result<()> {
        if self.enabled {
            run("iptables", &["-w", "-F", CHAIN]).await?;
        }
        Ok(())
    }
}

/// The uid node `id` runs as inside the namespace.
pub fn node_uid(id: u64) -> u32 {
    NODE_UID_BASE + u32::try_from(id).unwrap_or(0)
}

/// The loopback address of node `id` inside the namespace.
pub fn node_ip(id: u64) -> String {
    format!(
        "127.0.0.{}",
        u64::from(NODE_ADDR_BASE) + id.min(u64::from(u8::MAX - NODE_ADDR_BASE))
    )
}
