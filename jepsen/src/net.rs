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
//! # The choice
//!
//! `--net auto` takes the namespace only when it can install its faults there: the harness
//! runs as root *and* `ip` (package iproute2) and `iptables` (package iptables) are installed
//! (looked up in `PATH`, then [`SBIN_DIRS`]). Otherwise it takes the proxy, and says why
//! ([`auto_mode`]). An explicit `--net netns` that cannot install its faults is a harness
//! failure naming the missing package, before any namespace or node exists.
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
use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::{Context, bail};
use tokio::process::Command;

use crate::proxy::{ProxyNet, Shape, ShapeCounts};

/// Environment variable set on the harness re-executed inside the namespace, naming it.
pub const NETNS_ENV: &str = "LOCK_JEPSEN_NETNS";

/// Node `n` runs as uid `NODE_UID_BASE + n`, which the partition rules match on. Far above
/// any uid a distribution hands out, so no real user's traffic can match.
pub const NODE_UID_BASE: u32 = 61_000;

/// Node `n` listens on 127.0.0.(`NODE_ADDR_BASE` + n) inside the namespace.
pub const NODE_ADDR_BASE: u8 = 10;

/// The iptables chain holding every cut, jumped to from `OUTPUT`.
pub const CHAIN: &str = "LOCKJEPSEN";

/// The `mangle` chain marking the packets of degraded links for `tc`, jumped to from `OUTPUT`.
pub const MARK_CHAIN: &str = "LOCKJEPSEN_MARK";

/// The firewall mark of a degraded link's packets, which the `tc` filter sends to netem.
pub const DEGRADED_MARK: &str = "0x1d";

/// Folders searched for a tool after `PATH`: `ip` and `iptables` live in sbin, which the `PATH`
/// of a non-login shell, a sudo session or a test runner often lacks.
pub const SBIN_DIRS: [&str; 2] = ["/usr/sbin", "/sbin"];

/// A program the namespace mode runs, and the Debian/Ubuntu package that provides it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tool {
    /// The program's name.
    pub name: &'static str,
    /// The package to install for it.
    pub package: &'static str,
}

/// `ip`: creates, enters and deletes the namespace.
pub const IP: Tool = Tool {
    name: "ip",
    package: "iproute2",
};

/// `iptables`: the cuts inside the namespace.
pub const IPTABLES: Tool = Tool {
    name: "iptables",
    package: "iptables",
};

/// `tc`: the netem qdisc of degraded links inside the namespace.
pub const TC: Tool = Tool {
    name: "tc",
    package: "iproute2",
};

impl Tool {
    /// The program's path: the first executable file named so in `PATH`, then in
    /// [`SBIN_DIRS`].
    pub fn find(self) -> Option<PathBuf> {
        self.find_in(&std::env::var_os("PATH").unwrap_or_default())
    }

    /// [`Tool::find`] with `path_var` as the value of `PATH`.
    pub fn find_in(self, path_var: &std::ffi::OsStr) -> Option<PathBuf> {
        std::env::split_paths(path_var)
            .chain(SBIN_DIRS.iter().map(PathBuf::from))
            .map(|dir| dir.join(self.name))
            .find(|candidate| is_executable_file(candidate))
    }

    /// The program's path, or an error naming the package that provides it.
    pub fn require(self) -> anyhow::Result<PathBuf> {
        self.find().with_context(|| {
            format!(
                "{} is not installed (looked in PATH and {}); install the {} package \
                 (apt-get install {}) or use --net proxy",
                self.name,
                SBIN_DIRS.join(", "),
                self.package,
                self.package
            )
        })
    }
}

fn is_executable_file(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// What the harness found on this machine that decides the network mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Host {
    /// Runs as root (euid 0).
    pub root: bool,
    /// `ip` is installed.
    pub have_ip: bool,
    /// `iptables` is installed.
    pub have_iptables: bool,
}

impl Host {
    /// Looks at this process and this machine.
    pub fn probe() -> Self {
        Self {
            root: is_root(),
            have_ip: IP.find().is_some(),
            have_iptables: IPTABLES.find().is_some(),
        }
    }
}

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

async fn run(tool: Tool, args: &[&str]) -> anyhow::Result<()> {
    let program = tool.require()?;
    let name = tool.name;
    let output = Command::new(&program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .await
        .with_context(|| format!("running {name} {}", args.join(" ")))?;
    if !output.status.success() {
        bail!(
            "{name} {} failed ({}): {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}

/// Whether `tc netem` works here (inside the harness's namespace): `Err` says why not. A
/// kernel without the netem qdisc (module `sch_netem`) answers "Specified qdisc kind is
/// unknown".
pub async fn netem_available() -> Result<(), String> {
    let probe = run(
        TC,
        &[
            "qdisc", "add", "dev", "lo", "root", "handle", "1:", "netem", "delay", "1ms",
        ],
    )
    .await;
    match probe {
        Ok(()) => {
            let _ = run(TC, &["qdisc", "del", "dev", "lo", "root"]).await;
            Ok(())
        }
        Err(e) => Err(format!(
            "tc netem is not available ({e:#}); it needs tc (package iproute2) and the kernel's \
             netem qdisc (module sch_netem); use --net proxy for the proxy's stream model"
        )),
    }
}

/// Creates a fresh namespace named `name` with its loopback up.
pub async fn create_netns(name: &str) -> anyhow::Result<()> {
    run(IP, &["netns", "add", name]).await?;
    run(IP, &["-n", name, "link", "set", "lo", "up"]).await?;
    Ok(())
}

/// Kills every process still inside the namespace (processes this run started: the harness
/// and its nodes), then deletes the namespace and with it every rule.
pub async fn destroy_netns(name: &str) -> anyhow::Result<()> {
    let output = Command::new(IP.require()?)
        .args(["netns", "pids", name])
        .output()
        .await
        .context("listing the namespace's processes")?;
    for pid in String::from_utf8_lossy(&output.stdout).split_whitespace() {
        if pid.bytes().all(|b| b.is_ascii_digit()) {
            let _ = Command::new("kill").args(["-KILL", pid]).output().await;
        }
    }
    run(IP, &["netns", "del", name]).await
}

/// Runs this same command line inside namespace `name`, waits for it, and returns its exit
/// code. Ctrl-C (SIGINT) is passed on to the child, which stops its run and cleans up; the
/// namespace is destroyed whatever happens.
pub async fn reexec_in_netns(name: &str) -> anyhow::Result<i32> {
    let exe = std::env::current_exe().context("finding this executable")?;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut child = Command::new(IP.require()?)
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
    /// `netns` as root with `ip` and `iptables` installed, `proxy` otherwise.
    Auto,
    /// Network namespace and iptables (needs root, iproute2 and iptables).
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

/// A resolved `--net`: what to do, and why, in words for the run's header and report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetChoice {
    /// What to do.
    pub plan: NetPlan,
    /// Why this mode, e.g. `--net auto: root, but iptables is not installed (package iptables)`.
    pub why: String,
}

/// The mode `--net auto` picks on a host, and why: the namespace only when it can install its
/// faults there (root, `ip` and `iptables`), else the proxy, which needs none of them.
pub fn auto_mode(root: bool, have_ip: bool, have_iptables: bool) -> (NetMode, String) {
    if !root {
        return (
            NetMode::Proxy,
            "--net auto: not root, and a network namespace needs root".to_owned(),
        );
    }
    let missing: Vec<Tool> = [(IP, have_ip), (IPTABLES, have_iptables)]
        .into_iter()
        .filter(|(_, have)| !have)
        .map(|(tool, _)| tool)
        .collect();
    if missing.is_empty() {
        return (
            NetMode::Netns,
            "--net auto: root, and ip and iptables are installed".to_owned(),
        );
    }
    let names: Vec<&str> = missing.iter().map(|t| t.name).collect();
    let packages: Vec<&str> = missing.iter().map(|t| t.package).collect();
    let verb = if missing.len() == 1 { "is" } else { "are" };
    (
        NetMode::Proxy,
        format!(
            "--net auto: root, but {} {verb} not installed (looked in PATH and {}; package {}); \
             the namespace mode needs them",
            names.join(" and "),
            SBIN_DIRS.join(", "),
            packages.join(", "),
        ),
    )
}

/// Resolves `--net` on `host`: inside the harness's namespace the mode is `netns`; `auto` is
/// [`auto_mode`]; an explicit `netns` without root or without `ip` / `iptables` is an error
/// naming what to install (or `--net proxy`), so it fails before any namespace or node exists.
pub fn plan(arg: NetArg, host: Host, in_netns: bool) -> anyhow::Result<NetChoice> {
    let (mode, why) = match arg {
        NetArg::Proxy => (NetMode::Proxy, "--net proxy (asked for)".to_owned()),
        NetArg::Auto => auto_mode(host.root, host.have_ip, host.have_iptables),
        NetArg::Netns => {
            if !host.root {
                bail!("--net netns needs root (a network namespace and iptables); use --net proxy");
            }
            for (tool, have) in [(IP, host.have_ip), (IPTABLES, host.have_iptables)] {
                if !have {
                    bail!(
                        "--net netns cannot install its faults: {} is not installed (looked \
                         in PATH and {}); install the {} package (apt-get install {}) or use \
                         --net proxy",
                        tool.name,
                        SBIN_DIRS.join(", "),
                        tool.package,
                        tool.package
                    );
                }
            }
            (NetMode::Netns, "--net netns (asked for)".to_owned())
        }
    };
    let plan = match (mode, in_netns) {
        (_, true) => NetPlan::Run(NetMode::Netns),
        (NetMode::Netns, false) => NetPlan::EnterNetns,
        (NetMode::Proxy, false) => NetPlan::Run(NetMode::Proxy),
    };
    Ok(NetChoice { plan, why })
}

/// Cuts and heals links between nodes, by iptables rules or by proxies; the nemeses use only
/// this and never learn which.
#[derive(Debug)]
pub struct Firewall {
    backend: Backend,
}

#[derive(Debug)]
enum Backend {
    /// The `LOCKJEPSEN` chain inside the current namespace; `netem` says whether this kernel
    /// has the netem qdisc (else a degraded link only loses and duplicates packets, by
    /// iptables' own random match: [`PACKET_LOSS`], [`PACKET_DUPLICATION`]).
    Iptables { netem: bool },
    /// One proxy per ordered node pair.
    Proxy(ProxyNet),
}

impl Firewall {
    /// Sets up the iptables chain; only inside the harness's namespace.
    pub async fn iptables() -> anyhow::Result<Self> {
        if current_netns().is_none() {
            bail!("iptables cuts only run inside the harness's network namespace");
        }
        run(IPTABLES, &["-w", "-N", CHAIN]).await?;
        run(IPTABLES, &["-w", "-A", "OUTPUT", "-j", CHAIN]).await?;
        Ok(Self {
            backend: Backend::Iptables {
                netem: netem_available().await.is_ok(),
            },
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
            Backend::Iptables { .. } => NetMode::Netns,
            Backend::Proxy(_) => NetMode::Proxy,
        }
    }

    /// Node `id`'s `--raft-dial` value, if its Raft traffic must go through the proxies.
    pub fn raft_dial(&self, id: u64) -> Option<String> {
        match &self.backend {
            Backend::Iptables { .. } => None,
            Backend::Proxy(net) => Some(net.raft_dial(id)),
        }
    }

    /// Cuts every link in `links` (pairs of node ids), both directions.
    pub async fn cut(&self, links: &[(u64, u64)]) -> anyhow::Result<()> {
        match &self.backend {
            Backend::Proxy(net) => net.cut(links),
            Backend::Iptables { .. } => {
                for &(a, b) in links {
                    for (from, to) in [(a, b), (b, a)] {
                        let uid = node_uid(from).to_string();
                        let dest = node_ip(to);
                        run(
                            IPTABLES,
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

    /// How this network degrades a link, for the header and the history.
    pub fn degrade_model(&self) -> &'static str {
        match self.backend {
            Backend::Iptables { netem: true } => {
                "netem: tc netem on the packets each node sends to a degraded peer's address \
                 (delay, jitter, loss, duplication at the IP level)"
            }
            Backend::Iptables { netem: false } => {
                "iptables packet model: the packets each node sends to a degraded peer's \
                 address dropped (5 %) and duplicated by TEE (1 %) at random in the kernel, \
                 which TCP repairs; no added latency (this kernel has no netem qdisc)"
            }
            Backend::Proxy(_) => {
                "proxy stream model: chunks held for latency + jitter in order, random stalls \
                 (a retransmission's delay), random connection resets (no bytes dropped)"
            }
        }
    }

    /// Degrades every link in `links` (pairs of node ids), both directions: in proxy mode with
    /// `shape`; in the namespace with netem `netem` (e.g. `delay 20ms 10ms loss 5%`), or, on a
    /// kernel without netem, by iptables' random drop and duplication when the fault
    /// `loses_packets` (flaky-net). A latency-only fault (slow-net) without netem is an error:
    /// the caller must not ask for one (see [`Firewall::degrades_latency`]).
    pub async fn degrade(
        &self,
        links: &[(u64, u64)],
        shape: Shape,
        netem: &[&str],
        loses_packets: bool,
    ) -> anyhow::Result<()> {
        match &self.backend {
            Backend::Proxy(net) => net.shape(links, shape),
            Backend::Iptables { netem: true } => degrade_with_netem(links, netem).await,
            Backend::Iptables { netem: false } if loses_packets => {
                degrade_with_iptables(links).await
            }
            Backend::Iptables { netem: false } => {
                bail!("latency on a link in the namespace needs tc netem, which this kernel lacks")
            }
        }
    }

    /// Whether this network can add latency to a link (slow-net): the proxies always can, the
    /// namespace only with netem.
    pub fn degrades_latency(&self) -> bool {
        !matches!(self.backend, Backend::Iptables { netem: false })
    }

    /// What the iptables packet model did so far: packets dropped and duplicated by the
    /// degraded links' rules now installed (`None` unless this is the namespace without netem,
    /// or the counters cannot be read).
    pub async fn packet_counts(&self) -> Option<PacketCounts> {
        if !matches!(self.backend, Backend::Iptables { netem: false }) {
            return None;
        }
        let listed = Command::new(IPTABLES.require().ok()?)
            .args(["-w", "-t", "mangle", "-L", MARK_CHAIN, "-v", "-n", "-x"])
            .output()
            .await
            .ok()?;
        Some(PacketCounts::parse(&String::from_utf8_lossy(
            &listed.stdout,
        )))
    }

    /// What the proxies' shapes did so far (`None` in the namespace: netem keeps no count the
    /// harness reads).
    pub fn shape_counts(&self) -> Option<ShapeCounts> {
        match &self.backend {
            Backend::Proxy(net) => Some(net.shape_counts()),
            Backend::Iptables { .. } => None,
        }
    }

    /// Removes every degradation.
    pub async fn restore(&self) -> anyhow::Result<()> {
        match &self.backend {
            Backend::Proxy(net) => {
                net.unshape();
                Ok(())
            }
            Backend::Iptables { netem: false } => {
                // The packet model lives in the chain alone.
                run(IPTABLES, &["-w", "-t", "mangle", "-F", MARK_CHAIN]).await
            }
            Backend::Iptables { netem: true } => {
                let _ = run(IPTABLES, &["-w", "-t", "mangle", "-F", MARK_CHAIN]).await;
                // Deleting fails when nothing is installed; what matters is that no netem is.
                let _ = run(TC, &["qdisc", "del", "dev", "lo", "root"]).await;
                let shown = Command::new(TC.require()?)
                    .args(["qdisc", "show", "dev", "lo"])
                    .output()
                    .await
                    .context("running tc qdisc show dev lo")?;
                let shown = String::from_utf8_lossy(&shown.stdout);
                if shown.contains("netem") {
                    bail!("a netem qdisc is still on lo after removing it: {shown}");
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
            Backend::Iptables { .. } => run(IPTABLES, &["-w", "-F", CHAIN]).await,
        }
    }
}

/// Packet loss of a flaky link in the namespace without netem: iptables' `statistic` match,
/// per packet a node sends to the degraded peer.
pub const PACKET_LOSS: &str = "0.05";

/// Packet duplication of a flaky link in the namespace without netem: the `TEE` target sends a
/// copy of the packet to the same peer, which TCP must discard.
pub const PACKET_DUPLICATION: &str = "0.01";

/// Packets the iptables packet model dropped and duplicated, read from its rules' counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct PacketCounts {
    /// Packets dropped.
    pub dropped: u64,
    /// Packets duplicated.
    pub duplicated: u64,
}

impl PacketCounts {
    /// Sums the packet counters of `iptables -L -v -n -x` output by target (`DROP`, `TEE`).
    pub fn parse(listing: &str) -> Self {
        let mut counts = Self::default();
        for line in listing.lines() {
            let mut words = line.split_whitespace();
            let (Some(packets), Some(_bytes), Some(target)) =
                (words.next(), words.next(), words.next())
            else {
                continue;
            };
            let Ok(packets) = packets.parse::<u64>() else {
                continue;
            };
            match target {
                "DROP" => counts.dropped += packets,
                "TEE" => counts.duplicated += packets,
                _ => {}
            }
        }
        counts
    }
}

/// Creates [`MARK_CHAIN`] and the jump to it from `OUTPUT`, unless they exist.
async fn ensure_mark_chain() -> anyhow::Result<()> {
    let _ = run(IPTABLES, &["-w", "-t", "mangle", "-N", MARK_CHAIN]).await;
    let jump = ["-w", "-t", "mangle", "-C", "OUTPUT", "-j", MARK_CHAIN];
    if run(IPTABLES, &jump).await.is_err() {
        run(
            IPTABLES,
            &["-w", "-t", "mangle", "-A", "OUTPUT", "-j", MARK_CHAIN],
        )
        .await?;
    }
    Ok(())
}

/// Appends to [`MARK_CHAIN`] a rule matching the packets node `from` sends to node `to`'s
/// address (by the sender's uid, as the cuts match them), followed by `then` (further matches
/// and the target).
async fn append_link_rule(from: u64, to: u64, then: &[&str]) -> anyhow::Result<()> {
    let uid = node_uid(from).to_string();
    let dest = node_ip(to);
    let mut rule = vec![
        "-w",
        "-t",
        "mangle",
        "-A",
        MARK_CHAIN,
        "-m",
        "owner",
        "--uid-owner",
        &uid,
        "-d",
        &dest,
    ];
    rule.extend_from_slice(then);
    run(IPTABLES, &rule).await
}

/// netem on the degraded links: their packets are marked in [`MARK_CHAIN`] and a `tc` filter
/// sends the marked ones to a netem class.
async fn degrade_with_netem(links: &[(u64, u64)], netem: &[&str]) -> anyhow::Result<()> {
    // Marked packets go to a netem class; the rest to a plain one. htb, not prio:
    // it is the classful qdisc every kernel with netem also has.
    let _ = run(TC, &["qdisc", "del", "dev", "lo", "root"]).await;
    run(
        TC,
        &[
            "qdisc", "add", "dev", "lo", "root", "handle", "1:", "htb", "default", "1",
        ],
    )
    .await?;
    for class in ["1:1", "1:2"] {
        run(
            TC,
            &[
                "class", "add", "dev", "lo", "parent", "1:", "classid", class, "htb", "rate",
                "10gbit",
            ],
        )
        .await?;
    }
    let mut qdisc = vec![
        "qdisc", "add", "dev", "lo", "parent", "1:2", "handle", "20:", "netem",
    ];
    qdisc.extend_from_slice(netem);
    run(TC, &qdisc).await?;
    run(
        TC,
        &[
            "filter",
            "add",
            "dev",
            "lo",
            "parent",
            "1:",
            "protocol",
            "ip",
            "prio",
            "1",
            "handle",
            DEGRADED_MARK,
            "fw",
            "flowid",
            "1:2",
        ],
    )
    .await?;
    ensure_mark_chain().await?;
    for &(a, b) in links {
        for (from, to) in [(a, b), (b, a)] {
            append_link_rule(from, to, &["-j", "MARK", "--set-mark", DEGRADED_MARK]).await?;
        }
    }
    Ok(())
}

/// The iptables packet model on the degraded links: per direction, a rule in [`MARK_CHAIN`]
/// dropping [`PACKET_LOSS`] of the packets and one sending a copy of [`PACKET_DUPLICATION`]
/// of them again (`TEE` to the same address). Real loss and duplication, repaired by the
/// kernel's TCP, as netem's would be; only latency is missing.
async fn degrade_with_iptables(links: &[(u64, u64)]) -> anyhow::Result<()> {
    ensure_mark_chain().await?;
    for &(a, b) in links {
        for (from, to) in [(a, b), (b, a)] {
            let random = ["-m", "statistic", "--mode", "random", "--probability"];
            let mut drop = random.to_vec();
            drop.extend([PACKET_LOSS, "-j", "DROP"]);
            append_link_rule(from, to, &drop).await?;
            let dest = node_ip(to);
            let mut duplicate = random.to_vec();
            duplicate.extend([PACKET_DUPLICATION, "-j", "TEE", "--gateway", &dest]);
            append_link_rule(from, to, &duplicate).await?;
        }
    }
    Ok(())
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
    fn packet_counts_sum_the_drop_and_tee_rules() {
        let listing = "Chain LOCKJEPSEN_MARK (1 references)
    pkts      bytes target     prot opt in     out     source               destination
      15   146000 DROP       0    --  *      *       0.0.0.0/0            127.0.0.12           owner UID match 20001 statistic mode random probability 0.05000000000
      10   206000 TEE        0    --  *      *       0.0.0.0/0            127.0.0.12           owner UID match 20001 statistic mode random probability 0.01000000000 TEE gw:127.0.0.12
       4     4000 DROP       0    --  *      *       0.0.0.0/0            127.0.0.11           owner UID match 20002 statistic mode random probability 0.05000000000
";
        assert_eq!(
            PacketCounts::parse(listing),
            PacketCounts {
                dropped: 19,
                duplicated: 10
            }
        );
        assert_eq!(PacketCounts::parse(""), PacketCounts::default());
    }

    fn host(root: bool, have_ip: bool, have_iptables: bool) -> Host {
        Host {
            root,
            have_ip,
            have_iptables,
        }
    }

    #[test]
    fn net_auto_takes_the_namespace_only_for_root_with_ip_and_iptables() {
        for root in [false, true] {
            for have_ip in [false, true] {
                for have_iptables in [false, true] {
                    let (mode, why) = auto_mode(root, have_ip, have_iptables);
                    let expected = if root && have_ip && have_iptables {
                        NetMode::Netns
                    } else {
                        NetMode::Proxy
                    };
                    assert_eq!(
                        mode, expected,
                        "root={root} ip={have_ip} iptables={have_iptables}"
                    );
                    assert!(why.starts_with("--net auto: "), "{why}");
                    if root && !have_iptables {
                        assert!(why.contains("package") && why.contains("iptables"), "{why}");
                    }
                    if root && !have_ip {
                        assert!(why.contains("iproute2"), "{why}");
                    }
                    if !root {
                        assert!(why.contains("not root"), "{why}");
                    }
                }
            }
        }
        assert_eq!(
            auto_mode(true, true, false).1,
            "--net auto: root, but iptables is not installed (looked in PATH and /usr/sbin, \
             /sbin; package iptables); the namespace mode needs them"
        );
        assert!(
            auto_mode(true, false, false)
                .1
                .contains("ip and iptables are not installed"),
            "{}",
            auto_mode(true, false, false).1
        );
        assert!(
            auto_mode(true, false, false)
                .1
                .contains("package iproute2, iptables"),
            "{}",
            auto_mode(true, false, false).1
        );
    }

    #[test]
    fn net_plan_enters_the_namespace_or_names_what_is_missing() {
        let all = host(true, true, true);
        assert_eq!(
            plan(NetArg::Auto, all, false).unwrap().plan,
            NetPlan::EnterNetns
        );
        assert_eq!(
            plan(NetArg::Auto, host(true, true, false), false)
                .unwrap()
                .plan,
            NetPlan::Run(NetMode::Proxy)
        );
        assert_eq!(
            plan(NetArg::Auto, host(false, true, true), false)
                .unwrap()
                .plan,
            NetPlan::Run(NetMode::Proxy)
        );
        assert_eq!(
            plan(NetArg::Proxy, all, false).unwrap().plan,
            NetPlan::Run(NetMode::Proxy)
        );
        assert_eq!(
            plan(NetArg::Netns, all, false).unwrap().plan,
            NetPlan::EnterNetns
        );
        let err = plan(NetArg::Netns, host(false, true, true), false).unwrap_err();
        assert!(err.to_string().contains("--net proxy"), "{err}");
        let err = plan(NetArg::Netns, host(true, true, false), false).unwrap_err();
        assert!(
            err.to_string().contains("install the iptables package"),
            "{err}"
        );
        let err = plan(NetArg::Netns, host(true, false, true), false).unwrap_err();
        assert!(
            err.to_string().contains("install the iproute2 package"),
            "{err}"
        );
        for arg in [NetArg::Auto, NetArg::Netns] {
            let inside = plan(arg, all, true).unwrap();
            assert_eq!(
                inside.plan,
                NetPlan::Run(NetMode::Netns),
                "inside the namespace"
            );
            // The re-executed harness states the same reason the outer one chose by.
            assert_eq!(inside.why, plan(arg, all, false).unwrap().why);
        }
    }

    #[test]
    fn tools_are_found_in_path_and_in_sbin() {
        let dir = tempfile::tempdir().unwrap();
        let tool = Tool {
            name: "lock-jepsen-test-tool",
            package: "lock-jepsen-test-package",
        };
        assert!(tool.find_in(dir.path().as_os_str()).is_none());
        let err = tool.require().unwrap_err().to_string();
        assert!(
            err.contains("install the lock-jepsen-test-package package"),
            "{err}"
        );
        let program = dir.path().join(tool.name);
        std::fs::write(&program, "#!/bin/sh\n").unwrap();
        // Not executable: not a tool.
        assert!(tool.find_in(dir.path().as_os_str()).is_none());
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(tool.find_in(dir.path().as_os_str()), Some(program));
        // With an empty PATH, sbin is still searched: `ip` is found wherever iproute2 put it.
        let ip_in_sbin = SBIN_DIRS
            .iter()
            .map(|d| Path::new(d).join("ip"))
            .find(|p| is_executable_file(p));
        assert_eq!(IP.find_in(std::ffi::OsStr::new("")), ip_in_sbin);
    }
}
