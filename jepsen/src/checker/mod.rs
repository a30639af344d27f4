//! The checker: reads a history and decides, per promise of docs/DESIGN.md §5 (and D-cost),
//! pass / fail / unknown.
//!
//! Owns the pairing of invocations with their completions ([`Analysis`]), the validity window
//! of a grant ([`Analysis::window`]), the verdict types, and [`check`], which runs one module per
//! property. It reads nothing but the history and the nodes' resource samples recorded beside
//! it ([`Analysis::with_resources`]): no clock, no cluster, no harness state. A history
//! that does not pair up (a completion with no invocation, two invocations in flight on one
//! client) is a harness failure and comes back as an error, never as a verdict.
//!
//! # Layout
//!
//! - [`unique_tokens`] — §5.1: no fencing token issued twice.
//! - [`token_order`] — §5.1: per key, tokens increase in real-time grant order.
//! - [`no_overlap`] — §5.2/§5.4: validity windows of one key's grants never overlap.
//! - [`fenced_writes`] — §5.1/§5.4: accepted writes' tokens strictly increase and were granted.
//! - [`no_lost_grants`] — §5.3: an acknowledged grant is not lost while it is valid.
//! - [`linearizable`] — §5.1–§5.3 as one model: per key, the acquires, renewals, releases and
//!   revokes linearize against a mutex with leases and increasing tokens (a bounded search).
//! - [`removed_not_leader`] — §5.2: a voter removed by the membership nemesis never answers
//!   as leader once its removal took effect.
//! - [`damage_detected`] — §3.2/§5.3: a node whose WAL or snapshot was damaged either starts
//!   or refuses naming the file.
//! - [`recovery`] — §5.5: after the last fault heals, acquires succeed within a bound.
//! - [`outage_cost`] — D-cost: while a node is out, the survivors' CPU and log rates stay
//!   bounded.

pub mod damage_detected;
pub mod fenced_writes;
pub mod linearizable;
pub mod no_lost_grants;
pub mod no_overlap;
pub mod outage_cost;
pub mod recovery;
pub mod removed_not_leader;
pub mod token_order;
pub mod unique_tokens;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Duration;

use anyhow::{Context, bail};
use serde::Serialize;

use crate::history::{ERROR_FENCED, ERROR_LOST, F, Op, OpType, Outcome, Phase, Process};
use crate::resources::Sample;

/// How long after the last fault heals every key must see a granted acquire (docs/DESIGN.md §5.5:
/// "a new leader is in place within a few election timeouts"). 20 s covers an election (well
/// under 2 s with lockd's defaults), a restarted node catching up, and the lease of a grant
/// orphaned by an indeterminate acquire running out (the workload's TTLs are a few seconds).
pub const RECOVERY_BOUND_DEFAULT: Duration = Duration::from_secs(20);

/// How long after its invocation a force-revoke whose answer was lost (`info`) may still take
/// effect, as far as the checker assumes. A revoke is one Raft entry: if it reached a leader, it
/// is committed or discarded within a few election timeouts of that leader reaching (or losing)
/// a majority, and the nemeses never hold a fault longer than a few seconds. Grants whose
/// validity window meets this span are cut at the revoke's invocation (counted as excused).
pub const REVOKE_INFO_HORIZON: Duration = Duration::from_secs(60);

/// Violations listed per property in the results; the total is always counted.
pub const VIOLATIONS_LISTED_MAX: usize = 50;

/// Checker parameters that are not in the history.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct CheckConfig {
    /// See [`RECOVERY_BOUND_DEFAULT`].
    pub recovery_bound_ns: u64,
}

impl Default for CheckConfig {
    fn default() -> Self {
        Self {
            recovery_bound_ns: duration_ns(RECOVERY_BOUND_DEFAULT),
        }
    }
}

/// A duration in nanoseconds, saturating.
pub fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A property's verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Checked and held.
    Pass,
    /// At least one violation.
    Fail,
    /// The history cannot decide (e.g. it ended too soon after the last heal).
    Unknown,
}

/// One violation, with enough context to find it in the history.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Violation {
    /// When it became visible, on the history's clock.
    pub t_ns: u64,
    /// The key involved, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// What happened, naming processes, tokens and times.
    pub message: String,
}

/// The verdict on one property.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PropertyResult {
    /// Short name (the module name).
    pub name: &'static str,
    /// Where the promise is written down.
    pub design_ref: &'static str,
    /// The promise, in one sentence.
    pub promise: &'static str,
    /// pass / fail / unknown.
    pub status: Status,
    /// How many things were checked (grants, windows, writes, keys).
    pub checked: u64,
    /// How many were left out because the history cannot decide them (a possible revoke, a
    /// paused client).
    pub excused: u64,
    /// Total violations found.
    pub violation_count: u64,
    /// The first [`VIOLATIONS_LISTED_MAX`] violations.
    pub violations: Vec<Violation>,
    /// A figure or explanation worth showing (e.g. the measured recovery time).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl PropertyResult {
    /// An empty passing result, to be filled in by a property module.
    pub fn new(name: &'static str, design_ref: &'static str, promise: &'static str) -> Self {
        Self {
            name,
            design_ref,
            promise,
            status: Status::Pass,
            checked: 0,
            excused: 0,
            violation_count: 0,
            violations: Vec::new(),
            note: None,
        }
    }

    /// Records a violation (listing only the first few) and marks the property failed.
    pub fn violate(&mut self, t_ns: u64, key: Option<&str>, message: String) {
        self.status = Status::Fail;
        self.violation_count += 1;
        if self.violations.len() < VIOLATIONS_LISTED_MAX {
            self.violations.push(Violation {
                t_ns,
                key: key.map(str::to_owned),
                message,
            });
        }
    }
}

/// The verdict on a whole history.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Verdict {
    /// fail if any property failed, else unknown if any is unknown, else pass.
    pub status: Status,
    /// One result per property, in the order of docs/DESIGN.md §5, then D-cost.
    pub properties: Vec<PropertyResult>,
}

impl Verdict {
    /// The result of the property called `name`.
    pub fn property(&self, name: &str) -> Option<&PropertyResult> {
        self.properties.iter().find(|p| p.name == name)
    }
}

/// Checks every property on `ops`. Errors only if the history is malformed.
pub fn check(ops: &[Op], config: &CheckConfig) -> anyhow::Result<Verdict> {
    let analysis = Analysis::new(ops)?;
    Ok(check_analysis(&analysis, config))
}

/// Checks every property on an already-paired history.
pub fn check_analysis(analysis: &Analysis, config: &CheckConfig) -> Verdict {
    let properties = vec![
        unique_tokens::check(analysis),
        token_order::check(analysis),
        no_overlap::check(analysis),
        fenced_writes::check(analysis),
        no_lost_grants::check(analysis),
        linearizable::check(analysis),
        removed_not_leader::check(analysis),
        damage_detected::check(analysis),
        recovery::check(analysis, config),
        outage_cost::check(analysis),
    ];
    let status = if properties.iter().any(|p| p.status == Status::Fail) {
        Status::Fail
    } else if properties.iter().any(|p| p.status == Status::Unknown) {
        Status::Unknown
    } else {
        Status::Pass
    };
    Verdict { status, properties }
}

/// A client operation: its invocation paired with its completion.
#[derive(Clone, Debug, PartialEq)]
pub struct ClientOp {
    /// The client number.
    pub process: u32,
    /// acquire / renew / release / write.
    pub f: F,
    /// The key.
    pub key: String,
    /// The token presented (renew, release, write) or granted (acquire ok).
    pub token: Option<u64>,
    /// When it was invoked.
    pub invoke_t: u64,
    /// When it completed; the end of the history for an operation still in flight.
    pub complete_t: u64,
    /// ok / fail / info; an operation still in flight at the end is `Info`.
    pub outcome: OpType,
    /// The completion line (absent for an operation still in flight).
    pub completion: Option<Op>,
    /// Position of the completion line in the history (`usize::MAX` if none).
    pub complete_index: usize,
    /// The lease asked for, from an acquire's invocation (`None` on other operations).
    pub ttl_ms: Option<u64>,
}

impl ClientOp {
    /// The `error` of the completion, if any.
    pub fn error(&self) -> Option<&str> {
        self.completion.as_ref().and_then(|c| c.error.as_deref())
    }
}

/// A granted acquire and the operations its holder made under it.
#[derive(Clone, Debug, PartialEq)]
pub struct Grant {
    /// The holder's client number.
    pub process: u32,
    /// The key.
    pub key: String,
    /// The fencing token.
    pub token: u64,
    /// When the acquire was invoked.
    pub invoke_t: u64,
    /// When the grant was acknowledged to the client.
    pub ok_t: u64,
    /// The client deadline of the acquire.
    pub deadline_ns: u64,
    /// Indices into [`Analysis::client_ops`] of operations presenting this grant's token, in
    /// invocation order.
    pub ops: Vec<usize>,
}

/// A force-revoke by the nemesis.
#[derive(Clone, Debug, PartialEq)]
pub struct Revoke {
    /// The key.
    pub key: String,
    /// When it was invoked.
    pub invoke_t: u64,
    /// When it completed (the history's end if it never did).
    pub complete_t: u64,
    /// ok / fail / info.
    pub outcome: OpType,
    /// Whether a grant was displaced (ok only).
    pub revoked: bool,
    /// The displaced grant's token (ok only).
    pub previous_token: Option<u64>,
    /// The displaced grant's owner id (ok only; absent in histories recorded before it was).
    pub previous_owner: Option<String>,
    /// The token floor after the revoke (ok only).
    pub new_token_floor: Option<u64>,
}

/// A fault from its start line to its heal line.
#[derive(Clone, Debug, PartialEq)]
pub struct FaultSpan {
    /// partition / kill / pause / clock / pause-client.
    pub f: F,
    /// When it started.
    pub start_t: u64,
    /// How the start went.
    pub start_outcome: Outcome,
    /// When it healed; `None` if the history has no heal for it.
    pub heal_t: Option<u64>,
    /// How the heal went.
    pub heal_outcome: Option<Outcome>,
    /// The start line's value (targets, mode).
    pub value: serde_json::Value,
    /// The heal line's value (what the heal found, e.g. a membership fault's leader answers),
    /// `Null` without a heal.
    pub heal_value: serde_json::Value,
}

impl FaultSpan {
    /// Whether the fault may have taken effect (installed or indeterminate).
    pub fn took_effect(&self) -> bool {
        self.start_outcome != Outcome::Skipped
    }

    /// The client numbers of a `pause-client` fault.
    pub fn paused_processes(&self) -> Vec<u32> {
        self.value
            .get("processes")
            .and_then(|p| p.as_array())
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_u64())
                    .filter_map(|v| u32::try_from(v).ok())
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// Why a validity window ends where it does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum WindowEnd {
    /// The client deadline (after renewals) passed.
    Deadline,
    /// The holder invoked release.
    Release,
    /// The holder learned the grant was lost (renew lost, fenced write).
    Lost,
    /// An acknowledged revoke displaced the grant.
    Revoked,
    /// A revoke whose outcome is unknown may have displaced the grant.
    PossiblyRevoked,
    /// The holder was paused by the client-pause nemesis: its later view is not trusted.
    Paused,
}

/// The interval in which a grant's holder may act as the holder: from the acknowledgement to
/// the earliest of its (renewed) deadline, its release, its learning of a loss, a revoke, or a
/// client pause.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// Index into [`Analysis::grants`].
    pub grant: usize,
    /// Acknowledgement time.
    pub start: u64,
    /// End time (may equal `start`: an empty window).
    pub end: u64,
    /// Why it ends there.
    pub end_reason: WindowEnd,
}

/// A paired history.
#[derive(Clone, Debug, PartialEq)]
pub struct Analysis {
    /// Every client operation, in invocation order.
    pub client_ops: Vec<ClientOp>,
    /// Every granted acquire, in acknowledgement order.
    pub grants: Vec<Grant>,
    /// Every force-revoke, in invocation order.
    pub revokes: Vec<Revoke>,
    /// Every fault, in start order.
    pub faults: Vec<FaultSpan>,
    /// The time of the last line.
    pub end_t: u64,
    /// How many lines the history has.
    pub line_count: usize,
    /// The nodes' resource samples, on the history's clock (empty unless added by
    /// [`Analysis::with_resources`]).
    pub resources: Vec<Sample>,
}

impl Analysis {
    /// Adds the nodes' resource samples, which the D-cost property and the cost charts read.
    pub fn with_resources(mut self, mut samples: Vec<Sample>) -> Self {
        samples.sort_by_key(|s| (s.t_ns, s.node));
        self.resources = samples;
        self
    }

    /// Pairs invocations with completions. Errors name the offending line.
    pub fn new(ops: &[Op]) -> anyhow::Result<Self> {
        let mut client_ops: Vec<ClientOp> = Vec::new();
        let mut pending_client: HashMap<u32, usize> = HashMap::new();
        let mut revokes: Vec<Revoke> = Vec::new();
        let mut pending_revoke: Option<usize> = None;
        let mut faults: Vec<FaultSpan> = Vec::new();
        let mut pending_faults: HashMap<F, VecDeque<usize>> = HashMap::new();
        let mut last_t = 0;
        let end_t = ops.iter().map(|o| o.t_ns).max().unwrap_or(0);

        for (index, op) in ops.iter().enumerate() {
            let line = index + 1;
            if op.t_ns < last_t {
                bail!(
                    "line {line}: t_ns {} goes back from {last_t}: the history must be in time order",
                    op.t_ns
                );
            }
            last_t = op.t_ns;
            match (op.process, op.f) {
                (Process::Client(p), F::Acquire | F::Renew | F::Release | F::Write) => {
                    let key = op
                        .key
                        .clone()
                        .with_context(|| format!("line {line}: a client op has no key"))?;
                    if op.kind == OpType::Invoke {
                        if let Some(&open) = pending_client.get(&p) {
                            bail!(
                                "line {line}: client {p} invokes {} while its {} is still in flight",
                                op.f.name(),
                                client_ops[open].f.name()
                            );
                        }
                        if op.f != F::Acquire && op.token.is_none() {
                            bail!("line {line}: a {} invocation has no token", op.f.name());
                        }
                        pending_client.insert(p, client_ops.len());
                        client_ops.push(ClientOp {
                            process: p,
                            f: op.f,
                            key,
                            token: op.token,
                            invoke_t: op.t_ns,
                            complete_t: end_t,
                            outcome: OpType::Info,
                            completion: None,
                            complete_index: usize::MAX,
                            ttl_ms: op.ttl_ms,
                        });
                    } else {
                        let open = pending_client.remove(&p).with_context(|| {
                            format!("line {line}: client {p} completes an op it never invoked")
                        })?;
                        let cop = &mut client_ops[open];
                        if cop.f != op.f || cop.key != key {
                            bail!(
                                "line {line}: client {p} completes {} {key:?} but invoked {} {:?}",
                                op.f.name(),
                                cop.f.name(),
                                cop.key
                            );
                        }
                        if op.f == F::Acquire && op.kind == OpType::Ok {
                            let token = op.token.with_context(|| {
                                format!("line {line}: an acquire ok has no token")
                            })?;
                            if op.deadline_ns.is_none() {
                                bail!("line {line}: an acquire ok has no deadline_ns");
                            }
                            cop.token = Some(token);
                        }
                        if op.f == F::Renew && op.kind == OpType::Ok && op.deadline_ns.is_none() {
                            bail!("line {line}: a renew ok has no deadline_ns");
                        }
                        if op.f == F::Release && op.kind == OpType::Ok && op.released.is_none() {
                            bail!("line {line}: a release ok has no released flag");
                        }
                        if op.f == F::Write
                            && op.kind == OpType::Fail
                            && op.error.as_deref() == Some(ERROR_FENCED)
                            && op.stored.is_none()
                        {
                            bail!("line {line}: a fenced write has no stored token");
                        }
                        cop.complete_t = op.t_ns;
                        cop.outcome = op.kind;
                        cop.completion = Some(op.clone());
                        cop.complete_index = index;
                    }
                }
                (Process::Nemesis, F::Revoke) => {
                    let key = op
                        .key
                        .clone()
                        .with_context(|| format!("line {line}: a revoke has no key"))?;
                    if op.kind == OpType::Invoke {
                        if pending_revoke.is_some() {
                            bail!("line {line}: a revoke is invoked while another is in flight");
                        }
                        pending_revoke = Some(revokes.len());
                        revokes.push(Revoke {
                            key,
                            invoke_t: op.t_ns,
                            complete_t: end_t,
                            outcome: OpType::Info,
                            revoked: false,
                            previous_token: None,
                            previous_owner: None,
                            new_token_floor: None,
                        });
                    } else {
                        let open = pending_revoke.take().with_context(|| {
                            format!("line {line}: a revoke completes that was never invoked")
                        })?;
                        let r = &mut revokes[open];
                        if r.key != key {
                            bail!(
                                "line {line}: revoke completes {key:?} but invoked {:?}",
                                r.key
                            );
                        }
                        r.complete_t = op.t_ns;
                        r.outcome = op.kind;
                        if op.kind == OpType::Ok {
                            r.revoked = op.revoked.with_context(|| {
                                format!("line {line}: a revoke ok has no revoked flag")
                            })?;
                            r.previous_token = op.previous_token;
                            r.previous_owner = op.previous_owner.clone();
                            r.new_token_floor = op.new_token_floor;
                        }
                    }
                }
                (Process::Nemesis, f) if f.is_fault() => {
                    let phase = op
                        .phase
                        .with_context(|| format!("line {line}: a nemesis op has no phase"))?;
                    let outcome = op
                        .outcome
                        .with_context(|| format!("line {line}: a nemesis op has no outcome"))?;
                    match phase {
                        Phase::Start => {
                            pending_faults.entry(f).or_default().push_back(faults.len());
                            faults.push(FaultSpan {
                                f,
                                start_t: op.t_ns,
                                start_outcome: outcome,
                                heal_t: None,
                                heal_outcome: None,
                                value: op.value.clone().unwrap_or(serde_json::Value::Null),
                                heal_value: serde_json::Value::Null,
                            });
                        }
                        Phase::Heal => {
                            let open = pending_faults
                                .get_mut(&f)
                                .and_then(VecDeque::pop_front)
                                .with_context(|| {
                                    format!("line {line}: {} heals but never started", f.name())
                                })?;
                            faults[open].heal_t = Some(op.t_ns);
                            faults[open].heal_outcome = Some(outcome);
                            faults[open].heal_value =
                                op.value.clone().unwrap_or(serde_json::Value::Null);
                        }
                    }
                }
                (process, f) => bail!("line {line}: process {process} cannot perform {}", f.name()),
            }
        }

        // Grants, and the operations presenting each grant's token.
        let mut grants: Vec<Grant> = Vec::new();
        let mut by_token: HashMap<(u32, &str, u64), usize> = HashMap::new();
        let mut order: Vec<usize> = (0..client_ops.len()).collect();
        order.sort_by_key(|&i| (client_ops[i].complete_t, client_ops[i].complete_index));
        for &i in &order {
            let cop = &client_ops[i];
            if cop.f == F::Acquire && cop.outcome == OpType::Ok {
                let completion = cop.completion.as_ref();
                grants.push(Grant {
                    process: cop.process,
                    key: cop.key.clone(),
                    token: cop.token.unwrap_or(0),
                    invoke_t: cop.invoke_t,
                    ok_t: cop.complete_t,
                    deadline_ns: completion.and_then(|c| c.deadline_ns).unwrap_or(0),
                    ops: Vec::new(),
                });
            }
        }
        for (g, grant) in grants.iter().enumerate() {
            // A duplicate token on one client and key is unique_tokens' business; the ops
            // attach to the first such grant.
            by_token
                .entry((grant.process, grant.key.as_str(), grant.token))
                .or_insert(g);
        }
        let mut attach: Vec<(usize, usize)> = Vec::new();
        for (i, cop) in client_ops.iter().enumerate() {
            if cop.f == F::Acquire {
                continue;
            }
            if let Some(token) = cop.token
                && let Some(&g) = by_token.get(&(cop.process, cop.key.as_str(), token))
            {
                attach.push((g, i));
            }
        }
        for (g, i) in attach {
            grants[g].ops.push(i);
        }

        Ok(Self {
            client_ops,
            grants,
            revokes,
            faults,
            end_t,
            line_count: ops.len(),
            resources: Vec::new(),
        })
    }

    /// The grant's deadline after every renewal that completed before the deadline it
    /// extends. A renewal acknowledged after the current deadline passed does not revive the
    /// window: the holder had to assume the grant lost at that deadline (FR-11).
    pub fn effective_deadline(&self, grant: &Grant) -> u64 {
        let mut renewals: Vec<&ClientOp> = grant
            .ops
            .iter()
            .map(|&i| &self.client_ops[i])
            .filter(|c| c.f == F::Renew && c.outcome == OpType::Ok)
            .collect();
        renewals.sort_by_key(|c| c.complete_t);
        let mut deadline = grant.deadline_ns;
        for renewal in renewals {
            if renewal.complete_t > deadline {
                break;
            }
            let renewed = renewal
                .completion
                .as_ref()
                .and_then(|c| c.deadline_ns)
                .unwrap_or(0);
            deadline = deadline.max(renewed);
        }
        deadline
    }

    /// Whether a revoke of `key` may have displaced the grant with `token` before `t`:
    /// an acknowledged revoke that names it, or an indeterminate revoke of the key invoked
    /// before `t` and within [`REVOKE_INFO_HORIZON`] of it.
    pub fn possibly_revoked_before(&self, key: &str, token: u64, t: u64) -> Option<&Revoke> {
        let horizon = duration_ns(REVOKE_INFO_HORIZON);
        self.revokes.iter().find(|r| {
            r.key == key
                && r.invoke_t < t
                && match r.outcome {
                    OpType::Ok => r.previous_token == Some(token),
                    OpType::Info | OpType::Invoke => t <= r.invoke_t.saturating_add(horizon),
                    OpType::Fail => false,
                }
        })
    }

    /// The validity window of grant `g` (see [`Window`]).
    pub fn window(&self, g: usize) -> Window {
        let grant = &self.grants[g];
        let start = grant.ok_t;
        let mut end = self.effective_deadline(grant).max(start);
        let mut reason = WindowEnd::Deadline;
        let mut cut = |t: u64, why: WindowEnd, end: &mut u64| {
            let t = t.max(start);
            if t < *end {
                *end = t;
                reason = why;
            }
        };
        for &i in &grant.ops {
            let cop = &self.client_ops[i];
            match cop.f {
                F::Release => cut(cop.invoke_t, WindowEnd::Release, &mut end),
                F::Renew if cop.outcome == OpType::Fail && cop.error() == Some(ERROR_LOST) => {
                    cut(cop.complete_t, WindowEnd::Lost, &mut end)
                }
                F::Write if cop.outcome == OpType::Fail && cop.error() == Some(ERROR_FENCED) => {
                    cut(cop.complete_t, WindowEnd::Lost, &mut end)
                }
                _ => {}
            }
        }
        let horizon = duration_ns(REVOKE_INFO_HORIZON);
        for r in self.revokes.iter().filter(|r| r.key == grant.key) {
            let displaces = match r.outcome {
                OpType::Ok if r.previous_token == Some(grant.token) => Some(WindowEnd::Revoked),
                OpType::Info | OpType::Invoke
                    if r.invoke_t < end && start <= r.invoke_t.saturating_add(horizon) =>
                {
                    Some(WindowEnd::PossiblyRevoked)
                }
                _ => None,
            };
            if let Some(why) = displaces {
                cut(r.invoke_t, why, &mut end);
            }
        }
        for fault in self.faults.iter().filter(|f| f.f == F::PauseClient) {
            if fault.took_effect() && fault.paused_processes().contains(&grant.process) {
                let paused_until = fault.heal_t.unwrap_or(self.end_t);
                if fault.start_t < end && paused_until >= start {
                    cut(fault.start_t, WindowEnd::Paused, &mut end);
                }
            }
        }
        Window {
            grant: g,
            start,
            end,
            end_reason: reason,
        }
    }

    /// Every grant's window, grouped by key (keys in order).
    pub fn windows_by_key(&self) -> BTreeMap<&str, Vec<Window>> {
        let mut by_key: BTreeMap<&str, Vec<Window>> = BTreeMap::new();
        for g in 0..self.grants.len() {
            by_key
                .entry(self.grants[g].key.as_str())
                .or_default()
                .push(self.window(g));
        }
        by_key
    }
}

/// Seconds with millisecond precision, for messages.
pub fn secs(t_ns: u64) -> String {
    format!("{:.3}s", t_ns as f64 / 1e9)
}
