//! Counts over a history: operations by function and outcome, faults by kind and outcome.
//!
//! Owns the figures quoted in reports and issue notes ("operations, faults installed,
//! violations"). Must not judge anything: verdicts are the checker's.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::history::{ERROR_FENCED, F, Op, OpType, Outcome, Phase, Process};

/// Outcome counts of one kind of operation.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct OpCounts {
    /// Invocations.
    pub invoke: u64,
    /// Completed: happened.
    pub ok: u64,
    /// Completed: did not happen.
    pub fail: u64,
    /// Completed: unknown.
    pub info: u64,
}

/// Outcome counts of one kind of fault's start.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FaultCounts {
    /// Faults that took effect.
    pub installed: u64,
    /// Faults not attempted or certainly not in effect.
    pub skipped: u64,
    /// Faults that may or may not have taken effect.
    pub indeterminate: u64,
    /// Heals recorded.
    pub healed: u64,
}

/// The figures of one history.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Stats {
    /// History lines.
    pub lines: u64,
    /// Completed client operations (ok + fail + info).
    pub operations: u64,
    /// Per client operation: counts by outcome.
    pub ops: BTreeMap<&'static str, OpCounts>,
    /// Per fault kind: counts by start outcome.
    pub faults: BTreeMap<&'static str, FaultCounts>,
    /// Writes the register fenced out.
    pub writes_fenced: u64,
    /// Revokes that displaced a grant.
    pub revokes_displacing: u64,
    /// Time of the last line, in nanoseconds.
    pub duration_ns: u64,
}

impl Stats {
    /// Adds one line.
    pub fn add(&mut self, op: &Op) {
        self.lines += 1;
        self.duration_ns = self.duration_ns.max(op.t_ns);
        if op.f.is_fault() {
            let counts = self.faults.entry(op.f.name()).or_default();
            match (op.phase, op.outcome) {
                (Some(Phase::Start), Some(Outcome::Installed)) => counts.installed += 1,
                (Some(Phase::Start), Some(Outcome::Skipped)) => counts.skipped += 1,
                (Some(Phase::Start), Some(Outcome::Indeterminate)) => counts.indeterminate += 1,
                (Some(Phase::Heal), _) => counts.healed += 1,
                _ => {}
            }
            return;
        }
        let counts = self.ops.entry(op.f.name()).or_default();
        match op.kind {
            OpType::Invoke => counts.invoke += 1,
            OpType::Ok => counts.ok += 1,
            OpType::Fail => counts.fail += 1,
            OpType::Info => counts.info += 1,
        }
        if op.kind != OpType::Invoke && matches!(op.process, Process::Client(_)) {
            self.operations += 1;
        }
        if op.f == F::Write && op.kind == OpType::Fail && op.error.as_deref() == Some(ERROR_FENCED)
        {
            self.writes_fenced += 1;
        }
        if op.f == F::Revoke && op.kind == OpType::Ok && op.revoked == Some(true) {
            self.revokes_displacing += 1;
        }
    }

    /// Counts a whole history.
    pub fn of(ops: &[Op]) -> Self {
        let mut stats = Self::default();
        for op in ops {
            stats.add(op);
        }
        stats
    }

    /// Faults that took effect, over all kinds.
    pub fn faults_installed(&self) -> u64 {
        self.faults.values().map(|c| c.installed).sum()
    }
}
