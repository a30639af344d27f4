//! The test network, in one of two modes ([`NetMode`]), behind one [`Firewall`] that cuts and
//! heals node-to-node links whichever mode is active.
//!
//! - `netns` (root): a private network namespace in which each node has its own loopback
//!   address, and iptables rules inside it that cut links.
//! - `proxy` (no root needed): every node on 127.0.0.1 with its own port; node i reaches node
//!   j's Raft service only through an in-harness TCP proxy for link i→j ([`crate::proxy`]),
//!   which cuts by holding bytes.
//!
//! Owns the namespace's life (create, re-exec the harness inside it, delete it and whatever
//! still runs in it), the `LOCKJEPSEN` iptables chain and the choice between the modes. Must
//! not know about Raft, nodes' roles or the history; [`crate::nemesis`] decides *which* links
//! to cut.
//!
//! # Why a namespace, uids and iptables
//!
//! Every packet of the test stays inside a namespace the harness made and deletes, so nothing
//! reaches the host's network and no host firewall rule is touched; deleting the namespace
//! removes every rule at once, even after a crash. The nodes run the real `lockd` binary with
//! its real transport: no proxy sits between them, so a cut is a kernel-level drop, and a
//! partition behaves like one (connections hang rather than being reset).
//!
//! Loopback traffic is sourced from 127.0.0.1 whatever address a node listens on, so a rule
//! cannot tell senders apart by source address. Each node therefore runs as its own uid
//! ([`NODE_UID_BASE`] + node id) and a cut of link a–b is two `OUTPUT` rules: packets *owned by*
//! node a's uid to node b's address are dropped, and vice versa. Clients (the harness, uid 0)
//! are never cut.
//!
//! # The proxy mode
//!
//! Without root there is no namespace and no iptables. Node i is started with `--raft-dial
//! j=<proxy i→j>` for every other node j, so its Raft RPCs go through the harness while the
//! replicated membership (and the leader address clients are sent to) keeps the nodes' real
//! addresses; clients talk to the nodes directly and are never cut. A cut holds bytes in both
//! directions and blackholes new connections, as a DROP rule would (see [`crate::proxy`]).

use std::collections::BTreeMap;
use std::process::Stdio;

use anyhow::{Context, bail};
use tokio::process::Command;

use crate::proxy::ProxyNet;

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

/// How node-to-node links are cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NetMode {
    /// A network namespace, own loopback addresses and uids, iptables DROP rules (root).
    Netns,
    /// Nodes on 127.0.0.1, Raft traffic through the harness's per-link TCP proxies.
    Proxy,
}

impl NetMode {
    /// The name used on the command line and in `results.json`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Netns => "netns",
            Self::Proxy => "proxy",
        }
    }

    /// How the report describes the network.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Netns => "network namespace, cuts by iptables DROP rules",
            Self::Proxy => {
                "127.0.0.1, Raft links through the harness's TCP proxies (cuts hold bytes)"
            }
        }
    }
}

/// The `--net` choice before it is resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum NetArg {
    /// `netns` as root, `proxy` otherwise.
    Auto,
    /// Network namespace and iptables (needs root).
    Netns,
    /// In-harness TCP proxies (any user).
    Proxy,
}

/// What the harness should do with `--net`, given whether it runs as root and whether it
/// already runs inside its namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NetPlan {
    /// Create a namespace and re-execute inside it.
    EnterNetns,
    /// Run here in this mode.
    Run(NetMode),
}

/// Resolves `--net`: inside the harness's namespace the mode is `netns`; `auto` picks `netns`
/// for root and `proxy` otherwise; `netns` without root is an error naming the way out.
pub fn plan(arg: NetArg, root: bool, in_netns: bool) -> anyhow::Result<NetPlan> {
    Ok(match (arg, in_netns) {
        (_, true) => NetPlan::Run(NetMode::Netns),
        (NetArg::Proxy, false) => NetPlan::Run(NetMode::Proxy),
        (NetArg::Auto, false) if !root => NetPlan::Run(NetMode::Proxy),
        (NetArg::Auto | NetArg::Netns, false) => {
            if !root {
                bail!("--net netns needs root (a network namespace and iptables); use --net proxy");
            }
            NetPlan::EnterNetns
        }
    })
}

/// Cuts and heals links between nodes, by iptables rules or by proxies; the nemeses use only
/// this and never learn which.
#[derive(Debug)]
pub struct Firewall {
    backend: Backend,
}

#[derive(Debug)]
enum Backend {
    /// The `LOCKJEPSEN` chain inside the current namespace.
    Iptables,
    /// One proxy per ordered node pair.
    Proxy(ProxyNet),
}

impl Firewall {
    /// Sets up the iptables chain; only inside the harness's namespace.
    pub async fn iptables() -> anyhow::Result<Self> {
        if current_netns().is_none() {
            bail!("iptables cuts only run inside the harness's network namespace");
        }
        run("iptables", &["-w", "-N", CHAIN]).await?;
        run("iptables", &["-w", "-A", "OUTPUT", "-j", CHAIN]).await?;
        Ok(Self {
            backend: Backend::Iptables,
        })
    }

    /// Starts a proxy for every ordered pair of `nodes` (id → real `host:port`).
    pub async fn proxy(nodes: &BTreeMap<u64, String>) -> anyhow::Result<Self> {
        Ok(Self {
            backend: Backend::Proxy(ProxyNet::start(nodes).await?),
        })
    }

    /// Which mode cuts the links.
    pub fn mode(&self) -> NetMode {
        match self.backend {
            Backend::Iptables => NetMode::Netns,
            Backend::Proxy(_) => NetMode::Proxy,
        }
    }

    /// Node `id`'s `--raft-dial` value, if its Raft traffic must go through the proxies.
    pub fn raft_dial(&self, id: u64) -> Option<String> {
        match &self.backend {
            Backend::Iptables => None,
            Backend::Proxy(net) => Some(net.raft_dial(id)),
        }
    }

    /// Cuts every link in `links` (pairs of node ids), both directions.
    pub async fn cut(&self, links: &[(u64, u64)]) -> anyhow::Result<()> {
        match &self.backend {
            Backend::Proxy(net) => net.cut(links),
            Backend::Iptables => {
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
        }
    }

    /// Removes every cut.
    pub async fn heal(&self) -> anyhow::Result<()> {
        match &self.backend {
            Backend::Proxy(net) => {
                net.heal();
                Ok(())
            }
            Backend::Iptables => run("iptables", &["-w", "-F", CHAIN]).await,
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn net_auto_is_netns_for_root_and_proxy_otherwise() {
        assert_eq!(
            plan(NetArg::Auto, true, false).unwrap(),
            NetPlan::EnterNetns
        );
        assert_eq!(
            plan(NetArg::Auto, false, false).unwrap(),
            NetPlan::Run(NetMode::Proxy)
        );
        assert_eq!(
            plan(NetArg::Proxy, true, false).unwrap(),
            NetPlan::Run(NetMode::Proxy)
        );
        assert_eq!(
            plan(NetArg::Netns, true, false).unwrap(),
            NetPlan::EnterNetns
        );
        let err = plan(NetArg::Netns, false, false).unwrap_err();
        assert!(err.to_string().contains("--net proxy"), "{err}");
        for arg in [NetArg::Auto, NetArg::Netns, NetArg::Proxy] {
            assert_eq!(
                plan(arg, true, true).unwrap(),
                NetPlan::Run(NetMode::Netns),
                "inside the namespace"
            );
        }
    }
}
