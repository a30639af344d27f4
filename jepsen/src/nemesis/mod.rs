//! The nemeses: faults injected while the workload runs, each recorded when it starts and when
//! it heals, with outcome installed / skipped / indeterminate.
//!
//! Owns the schedule (which fault when, for how long, from the run's seed) and the shared
//! context. Each fault lives in its own module with a `start` and a `heal`. Node-level faults
//! (partition, kill, pause, membership, corrupt, power-cut, outage) run one at a time so that between
//! them a majority is up; the clock, client-pause, revoke and link (slow-net, flaky-net)
//! nemeses run alongside. Must not perform client operations other than force-revoke, and must
//! not judge the history.
//!
//! The members' list ([`Ctx::nodes`]) is what node faults pick their targets from; the
//! membership, corrupt and power-cut nemeses change it (a node added, removed, rebuilt under a new id)
//! and take new ids from the spare ids the cluster was prepared with.
//!
//! A step that fails in a way that leaves the cluster in an unknown state the harness cannot
//! repair (a firewall rule that cannot be removed) is a harness failure: the run aborts with
//! an error and no verdict.

pub mod client_pause;
pub mod clock;
pub mod corrupt;
pub mod kill;
pub mod link_faults;
pub mod membership;
pub mod outage;
pub mod partition;
pub mod pause;
pub mod power_cut;
pub mod revoke;

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use lock_client::LockClient;
use rand::Rng;
use rand::rngs::StdRng;
use serde_json::Value;
use tokio::sync::{Mutex, watch};

use crate::cluster::{Cluster, LIBFAKETIME_MISSING, StatusProbe};
use crate::history::{F, Op, Outcome, Phase, Recorder};
use crate::net::Firewall;
use crate::workload::Shared;

/// Shortest and longest quiet time between two faults of one nemesis.
pub const QUIET_MS: (u64, u64) = (1_500, 4_000);
/// Shortest and longest time a fault is held before it heals: long enough for elections and
/// lease expiries to happen inside it (leases are a few seconds).
pub const HOLD_MS: (u64, u64) = (3_000, 8_000);

/// The nemeses of a run when `--nemesis` is not given: the kinds [`Kind::in_default`] admits,
/// which come first in [`Kind::ALL`].
pub const DEFAULT_NEMESES: &[Kind] = Kind::ALL.split_at(DEFAULT_COUNT).0;

/// How many kinds, from the start of [`Kind::ALL`], are in [`DEFAULT_NEMESES`].
const DEFAULT_COUNT: usize = 8;

/// Exactly the first [`DEFAULT_COUNT`] kinds of [`Kind::ALL`] are in the default set.
const _: () = {
    let mut i = 0;
    while i < Kind::ALL.len() {
        assert!(Kind::ALL[i].in_default() == (i < DEFAULT_COUNT));
        i += 1;
    }
};

/// A kind of nemesis, as named on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// Network partitions between nodes.
    Partition,
    /// SIGKILL and restart of a node.
    Kill,
    /// SIGSTOP / SIGCONT of a node.
    Pause,
    /// A node's wall clock skewed or jumping.
    Clock,
    /// A client paused between its check and its write.
    ClientPause,
    /// Force-revokes of random keys.
    Revoke,
    /// Latency and jitter on links between nodes ([`link_faults`]).
    SlowNet,
    /// Loss, duplication, stalls and resets on links between nodes ([`link_faults`]).
    FlakyNet,
    /// A node added, a voter removed and added back ([`membership`]).
    Membership,
    /// A stopped node's WAL or snapshot damaged, then restarted or rebuilt ([`corrupt`]).
    Corrupt,
    /// A node killed with its unsynced writes lost on its lazyfs mount, then restarted or
    /// rebuilt ([`power_cut`]).
    PowerCut,
    /// A node killed or cut off for a long time ([`outage`]), for the cost of a fault.
    Outage,
}

impl Kind {
    /// Every kind, in the order the help text lists them; the default ones first (see
    /// [`DEFAULT_NEMESES`]).
    pub const ALL: [Kind; 12] = [
        Kind::Partition,
        Kind::Kill,
        Kind::Pause,
        Kind::Clock,
        Kind::ClientPause,
        Kind::Revoke,
        Kind::SlowNet,
        Kind::FlakyNet,
        Kind::Membership,
        Kind::Corrupt,
        Kind::PowerCut,
        Kind::Outage,
    ];

    /// Whether a run without `--nemesis` includes it. Every fault that leaves the cluster as
    /// it found it, within seconds, is in. Out, asked for by name: the outage (it holds a node
    /// out for a minute: a cost test for long runs), membership (after its first fault the
    /// cluster has a voter more for the rest of the run, which changes what every other fault
    /// means), corrupt (it destroys a node's data, and each refusal spends a node id on a
    /// rebuild) and power-cut (it puts every data dir on a FUSE mount, which not every machine
    /// allows, and a refusal spends a node id too).
    pub const fn in_default(self) -> bool {
        !matches!(
            self,
            Self::Membership | Self::Corrupt | Self::PowerCut | Self::Outage
        )
    }

    /// Whether it needs spare node ids (new members).
    pub fn needs_spares(self) -> bool {
        matches!(self, Self::Membership | Self::Corrupt | Self::PowerCut)
    }

    /// Whether it degrades links ([`link_faults`]).
    pub fn is_link_fault(self) -> bool {
        matches!(self, Self::SlowNet | Self::FlakyNet)
    }

    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Self::Partition => "partition",
            Self::Kill => "kill",
            Self::Pause => "pause",
            Self::Clock => "clock",
            Self::ClientPause => "client-pause",
            Self::Revoke => "revoke",
            Self::SlowNet => "slow-net",
            Self::FlakyNet => "flaky-net",
            Self::Membership => "membership",
            Self::Corrupt => "corrupt",
            Self::PowerCut => "power-cut",
            Self::Outage => "outage",
        }
    }

    /// Whether it is a node-level fault, run one at a time with the others of its kind.
    pub fn is_node_fault(self) -> bool {
        matches!(
            self,
            Self::Partition
                | Self::Kill
                | Self::Pause
                | Self::Membership
                | Self::Corrupt
                | Self::PowerCut
                | Self::Outage
        )
    }
}

impl FromStr for Kind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        Self::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| {
                let known: Vec<&str> = Self::ALL.iter().map(|k| k.name()).collect();
                format!("unknown nemesis {s:?}; known: {}", known.join(", "))
            })
    }
}

/// The nemeses of a run: `list` as given to `--nemesis` (`None`: [`DEFAULT_NEMESES`]; `none`:
/// no nemesis), and a note for the run's header if one was left out.
///
/// The clock nemesis needs libfaketime. Asked for by name without it, the run is a harness
/// failure naming the package (a run that silently skips a requested fault proves less than it
/// claims); among the defaults it is left out, and the note says so.
pub fn resolve(
    list: Option<&str>,
    have_libfaketime: bool,
) -> Result<(Vec<Kind>, Option<String>), String> {
    let Some(list) = list else {
        let mut kinds = DEFAULT_NEMESES.to_vec();
        if have_libfaketime {
            return Ok((kinds, None));
        }
        kinds.retain(|k| *k != Kind::Clock);
        return Ok((
            kinds,
            Some(format!(
                "the clock nemesis is left out: {LIBFAKETIME_MISSING}"
            )),
        ));
    };
    if list.trim() == "none" {
        return Ok((Vec::new(), None));
    }
    let kinds: Vec<Kind> = list.split(',').map(str::parse).collect::<Result<_, _>>()?;
    if kinds.contains(&Kind::Clock) && !have_libfaketime {
        return Err(format!(
            "--nemesis clock cannot install its faults: {LIBFAKETIME_MISSING}"
        ));
    }
    Ok((kinds, None))
}

/// Everything a nemesis can touch.
#[derive(Debug)]
pub struct Ctx {
    /// The history.
    pub recorder: Arc<Recorder>,
    /// The cluster's processes.
    pub cluster: Arc<Mutex<Cluster>>,
    /// Who leads, without the cluster's lock.
    pub probe: StatusProbe,
    /// Link cuts.
    pub firewall: Arc<Firewall>,
    /// The workload's shared state (client pauses).
    pub shared: Arc<Shared>,
    /// A client for force-revokes.
    pub lock_client: LockClient,
    /// Flips to `true` when faults must stop (each nemesis heals what it holds, then exits).
    pub stop: watch::Receiver<bool>,
    /// The voters now, as the harness believes (see [`Ctx::nodes`]).
    pub members: std::sync::Mutex<Vec<u64>>,
    /// Node ids prepared but never started, for new members (lowest first).
    pub spares: std::sync::Mutex<Vec<u64>>,
    /// Whether the membership nemesis has added its node yet.
    pub grown: std::sync::atomic::AtomicBool,
    /// Number of workload clients.
    pub clients: u32,
    /// Number of keys.
    pub keys: u32,
    /// The grants' TTL.
    pub ttl: Duration,
    /// How long an outage keeps its node out.
    pub outage_hold: Duration,
    /// Faults in force now (started, not yet healed), for the progress line.
    pub active: std::sync::Mutex<Vec<&'static str>>,
    /// The nodes' lazyfs mounts, in a run with the power-cut nemesis.
    pub lazyfs: Option<Arc<crate::lazyfs::mounts::Mounts>>,
}

impl Ctx {
    /// The voters now: node faults pick their targets among them.
    pub fn nodes(&self) -> Vec<u64> {
        self.members
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Replaces the members' list (sorted).
    pub fn set_members(&self, mut voters: Vec<u64>) {
        voters.sort_unstable();
        voters.dedup();
        *self.members.lock().unwrap_or_else(|p| p.into_inner()) = voters;
    }

    /// Takes the lowest spare node id, if any is left.
    pub fn take_spare(&self) -> Option<u64> {
        let mut spares = self.spares.lock().unwrap_or_else(|p| p.into_inner());
        (!spares.is_empty()).then(|| spares.remove(0))
    }

    /// Whether a spare node id is left.
    pub fn has_spare(&self) -> bool {
        !self
            .spares
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
    }

    /// Whether the membership nemesis has grown the cluster.
    pub fn grown(&self) -> bool {
        self.grown.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Notes that the membership nemesis grew the cluster.
    pub fn set_grown(&self) {
        self.grown.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Sleeps `d`, or less if the run is stopping; `false` if it is.
    pub async fn sleep(&self, d: Duration) -> bool {
        let mut stop = self.stop.clone();
        if *stop.borrow() {
            return false;
        }
        tokio::select! {
            () = tokio::time::sleep(d) => !*stop.borrow(),
            _ = stop.changed() => false,
        }
    }

    /// Records one phase of fault `f`.
    pub fn record(&self, f: F, phase: Phase, outcome: Outcome, value: Value) {
        self.recorder.record(Op::nemesis(f, phase, outcome, value));
        let mut active = self.active.lock().unwrap_or_else(|p| p.into_inner());
        match phase {
            Phase::Start if outcome != Outcome::Skipped => active.push(f.name()),
            Phase::Heal => {
                if let Some(i) = active.iter().position(|a| *a == f.name()) {
                    active.remove(i);
                }
            }
            Phase::Start => {}
        }
    }

    /// The faults in force now, e.g. `partition+clock`, or `-`.
    pub fn active(&self) -> String {
        let active = self.active.lock().unwrap_or_else(|p| p.into_inner());
        if active.is_empty() {
            "-".to_owned()
        } else {
            active.join("+")
        }
    }

    /// The target of a node fault: the leader half of the time (if one is known), else a
    /// random node. Returns the node and whether it was the leader.
    pub async fn pick_node(&self, rng: &mut StdRng) -> (u64, bool) {
        if rng.gen_bool(0.5)
            && let Some(leader) = self.probe.leader().await
            && self.nodes().contains(&leader)
        {
            return (leader, true);
        }
        let nodes = self.nodes();
        // The members' list is never empty (a change that would empty it fails at the leader);
        // node 1 stands in should it ever be.
        let node = nodes
            .get(rng.gen_range(0..nodes.len().max(1)))
            .copied()
            .unwrap_or(1);
        let leader = self.probe.leader().await == Some(node);
        (node, leader)
    }
}

/// A random duration in `[lo, hi]` milliseconds.
pub fn between(rng: &mut StdRng, (lo, hi): (u64, u64)) -> Duration {
    Duration::from_millis(rng.gen_range(lo..=hi))
}

/// Runs the node-level faults in `kinds` one at a time until stopped, healing the last.
pub async fn run_node_faults(
    ctx: Arc<Ctx>,
    kinds: Vec<Kind>,
    mut rng: StdRng,
) -> anyhow::Result<()> {
    if kinds.is_empty() {
        return Ok(());
    }
    let mut outages = 0;
    loop {
        if !ctx.sleep(between(&mut rng, QUIET_MS)).await {
            return Ok(());
        }
        let kind = kinds[rng.gen_range(0..kinds.len())];
        let hold = between(&mut rng, HOLD_MS);
        match kind {
            Kind::Partition => {
                let cut = partition::start(&ctx, &mut rng).await;
                ctx.sleep(hold).await;
                partition::heal(&ctx, cut).await?;
            }
            Kind::Kill => {
                let killed = kill::start(&ctx, &mut rng).await;
                ctx.sleep(hold).await;
                kill::heal(&ctx, killed).await?;
            }
            Kind::Pause => {
                let paused = pause::start(&ctx, &mut rng).await;
                ctx.sleep(hold).await;
                pause::heal(&ctx, paused).await?;
            }
            Kind::Membership => {
                let mut removed = membership::start(&ctx, &mut rng).await;
                membership::watch(&ctx, &mut removed, hold).await;
                membership::heal(&ctx, removed).await?;
            }
            Kind::Corrupt => {
                let damaged = corrupt::start(&ctx, &mut rng).await;
                ctx.sleep(hold).await;
                corrupt::heal(&ctx, damaged).await?;
            }
            Kind::PowerCut => {
                let cut = power_cut::start(&ctx, &mut rng).await;
                ctx.sleep(hold).await;
                power_cut::heal(&ctx, cut).await?;
            }
            Kind::Outage => {
                let how = outage::How::nth(outages);
                outages += 1;
                let out = outage::start(&ctx, &mut rng, how).await;
                ctx.sleep(ctx.outage_hold).await;
                outage::heal(&ctx, out).await?;
            }
            other => anyhow::bail!("{other:?} is not a node-level fault"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_nemesis_name_parses_and_unknown_ones_do_not() {
        for (name, kind) in [
            ("partition", Kind::Partition),
            ("kill", Kind::Kill),
            ("pause", Kind::Pause),
            ("clock", Kind::Clock),
            ("client-pause", Kind::ClientPause),
            ("revoke", Kind::Revoke),
            ("slow-net", Kind::SlowNet),
            ("flaky-net", Kind::FlakyNet),
            ("membership", Kind::Membership),
            ("corrupt", Kind::Corrupt),
            ("power-cut", Kind::PowerCut),
            ("outage", Kind::Outage),
        ] {
            assert_eq!(name.parse::<Kind>(), Ok(kind));
        }
        assert!("partitions".parse::<Kind>().is_err());
    }

    #[test]
    fn the_default_set_leaves_out_the_outage_membership_corrupt_and_power_cut() {
        for kind in Kind::ALL {
            assert_eq!(
                DEFAULT_NEMESES.contains(&kind),
                !matches!(
                    kind,
                    Kind::Outage | Kind::Membership | Kind::Corrupt | Kind::PowerCut
                ),
                "{kind:?}"
            );
        }
        assert!(DEFAULT_NEMESES.contains(&Kind::SlowNet));
        assert!(DEFAULT_NEMESES.contains(&Kind::FlakyNet));
    }

    #[test]
    fn the_clock_nemesis_needs_libfaketime_when_asked_for_and_is_dropped_by_default() {
        let (all, note) = resolve(None, true).unwrap();
        assert_eq!(all, DEFAULT_NEMESES.to_vec());
        assert_eq!(note, None);
        let (without, note) = resolve(None, false).unwrap();
        assert!(!without.contains(&Kind::Clock));
        assert_eq!(without.len(), DEFAULT_NEMESES.len() - 1);
        let note = note.expect("the header says the clock nemesis is left out");
        assert!(note.contains("libfaketime package"), "{note}");
        let err = resolve(Some("partition,clock"), false).unwrap_err();
        assert!(err.contains("install the libfaketime package"), "{err}");
        assert_eq!(
            resolve(Some("partition,clock"), true).unwrap().0,
            vec![Kind::Partition, Kind::Clock]
        );
        assert_eq!(
            resolve(Some("kill"), false).unwrap(),
            (vec![Kind::Kill], None)
        );
        assert_eq!(resolve(Some("none"), false).unwrap(), (Vec::new(), None));
        assert!(resolve(Some("kill,bogus"), true).is_err());
    }
}
