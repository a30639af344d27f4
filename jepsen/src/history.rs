//! The history: one JSON object per line, one line per operation event, the only thing the
//! checker reads.
//!
//! Owns the operation types, their serde form, the [`Recorder`] that stamps every event from one
//! monotonic clock, and the reader. Must not interpret a history (that is the checker's job) and
//! must not know how operations are performed (that is the workload's and the nemeses' job).
//!
//! # Format
//!
//! ```text
//! {"t_ns":1200,"process":3,"type":"invoke","f":"acquire","key":"k1","ttl_ms":2000,"max_wait_ms":3000}
//! {"t_ns":5400,"process":3,"type":"ok","f":"acquire","key":"k1","token":17,"deadline_ns":1700005400}
//! {"t_ns":9000,"process":"nemesis","type":"ok","f":"partition","phase":"start","outcome":"installed","value":{…}}
//! ```
//!
//! - `t_ns`: nanoseconds since the run started, from the harness's one monotonic clock; every
//!   `deadline_ns` is on the same clock.
//! - `process`: a client number, or `"nemesis"`.
//! - `type`: `invoke`, then exactly one of `ok` (it happened), `fail` (it certainly did not
//!   happen) or `info` (unknown: it may or may not have happened, now or later).
//! - `f`: `acquire` | `renew` | `release` | `write` | `revoke` for operations on a key, or a
//!   nemesis op (`partition`, `kill`, `pause`, `clock`, `pause-client`, `outage`, `slow-net`,
//!   `flaky-net`, `membership`, `corrupt`, `power-cut`; an outage's `value` names its `node` and `how`:
//!   `kill` or `isolate`; a `membership` heal's value lists the removed node's `leader_answers`,
//!   a `corrupt` or `power-cut` heal's value its `result`: `recovered` or `refused-rebuilt`; a
//!   `power-cut` start's value its cut's `pages_dropped`). A nemesis op is one line
//!   per `phase` (`start` or `heal`) whose `outcome` is `installed`, `skipped` or `indeterminate`
//!   (and whose `type` is `ok`, `fail` or `info` to match).
//! - Per `f`: an acquire `ok` carries `token` and `deadline_ns`; an acquire not granted within its
//!   wait is `fail` with `error: "contended"`. Renew, release and write invocations carry
//!   `token`; a renew `ok` carries the new `deadline_ns`, a renew that answers "lost" is `fail`
//!   with `error: "lost"`; a release `ok` carries `released`; a fenced write is `fail` with
//!   `error: "fenced"` and `stored`. A revoke `ok` carries `revoked`, `previous_token` and
//!   `previous_owner` (if a grant was displaced) and `new_token_floor`.

use std::fmt;
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::Path;
use std::sync::Mutex;
use std::time::Instant;

use anyhow::{Context, bail};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Longest line the reader accepts, in bytes. The longest legitimate line is a nemesis op with
/// a handful of node ids; a megabyte means the file is not a history.
pub const LINE_LEN_MAX: usize = 1 << 20;

/// Who performed an operation: a workload client, or the nemesis.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Process {
    /// Workload client number `n` (0-based). One client runs one operation at a time.
    Client(u32),
    /// The fault injector, including force-revokes.
    Nemesis,
}

impl fmt::Display for Process {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Client(n) => write!(f, "{n}"),
            Self::Nemesis => f.write_str("nemesis"),
        }
    }
}

impl Serialize for Process {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Client(n) => s.serialize_u32(*n),
            Self::Nemesis => s.serialize_str("nemesis"),
        }
    }
}

impl<'de> Deserialize<'de> for Process {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Number(u32),
            Name(String),
        }
        match Raw::deserialize(d)? {
            Raw::Number(n) => Ok(Self::Client(n)),
            Raw::Name(name) if name == "nemesis" => Ok(Self::Nemesis),
            Raw::Name(other) => Err(serde::de::Error::custom(format!(
                "process must be a client number or \"nemesis\", got {other:?}"
            ))),
        }
    }
}

/// The three-valued outcome of an operation, plus its invocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OpType {
    /// The operation was started.
    Invoke,
    /// The operation happened.
    Ok,
    /// The operation certainly did not happen.
    Fail,
    /// Unknown: the operation may have happened, or may still happen later.
    Info,
}

/// What an operation does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum F {
    /// Blocking acquire of a key.
    Acquire,
    /// Lease renewal of a held grant.
    Renew,
    /// Release of a held grant.
    Release,
    /// A write to the harness's fenced register under a grant's token.
    Write,
    /// A force-revoke of a key (issued by the nemesis).
    Revoke,
    /// Network partition between nodes.
    Partition,
    /// SIGKILL of a node, healed by restarting it.
    Kill,
    /// SIGSTOP of a node, healed by SIGCONT.
    Pause,
    /// A node's wall clock skewed or jumping.
    Clock,
    /// Workload clients sleeping between `check_still_held` and their write.
    PauseClient,
    /// One node killed or cut off from its peers for a long time, then brought back.
    Outage,
    /// Links between nodes given latency and jitter.
    SlowNet,
    /// Links between nodes that lose, stall, duplicate or reset.
    FlakyNet,
    /// A membership change: a node added, a voter removed and added back.
    Membership,
    /// A stopped node's newest WAL segment or snapshot damaged, then the node restarted.
    Corrupt,
    /// A node killed and its unsynced writes lost (lazyfs `cut`), then the node restarted.
    PowerCut,
}

impl F {
    /// Whether this is a fault with a start and a heal (as opposed to an operation on a key).
    pub fn is_fault(self) -> bool {
        matches!(
            self,
            Self::Partition
                | Self::Kill
                | Self::Pause
                | Self::Clock
                | Self::PauseClient
                | Self::Outage
                | Self::SlowNet
                | Self::FlakyNet
                | Self::Membership
                | Self::Corrupt
                | Self::PowerCut
        )
    }

    /// The name used in the history and the report.
    pub fn name(self) -> &'static str {
        match self {
            Self::Acquire => "acquire",
            Self::Renew => "renew",
            Self::Release => "release",
            Self::Write => "write",
            Self::Revoke => "revoke",
            Self::Partition => "partition",
            Self::Kill => "kill",
            Self::Pause => "pause",
            Self::Clock => "clock",
            Self::PauseClient => "pause-client",
            Self::Outage => "outage",
            Self::SlowNet => "slow-net",
            Self::FlakyNet => "flaky-net",
            Self::Membership => "membership",
            Self::Corrupt => "corrupt",
            Self::PowerCut => "power-cut",
        }
    }
}

/// Which end of a fault a nemesis line records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// The fault was installed (or attempted).
    Start,
    /// The fault was removed (or the removal attempted).
    Heal,
}

/// Whether a nemesis step took effect (STYLE.md: a nemesis installed its fault, skipped it, or
/// is indeterminate).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// The step took effect.
    Installed,
    /// The step was not attempted, or certainly did not take effect.
    Skipped,
    /// The step may or may not have taken effect.
    Indeterminate,
}

impl Outcome {
    /// The operation type that goes with this outcome in the history.
    pub fn op_type(self) -> OpType {
        match self {
            Self::Installed => OpType::Ok,
            Self::Skipped => OpType::Fail,
            Self::Indeterminate => OpType::Info,
        }
    }
}

/// `error` value of an acquire that was not granted within its `max_wait`.
pub const ERROR_CONTENDED: &str = "contended";
/// `error` value of a renew answered "the grant is lost".
pub const ERROR_LOST: &str = "lost";
/// `error` value of a write the register's fence rejected.
pub const ERROR_FENCED: &str = "fenced";

/// One line of the history. Fields a line does not use are absent, never `null`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Op {
    /// Nanoseconds since the run started, on the harness's one monotonic clock.
    pub t_ns: u64,
    /// Who performed the operation.
    pub process: Process,
    /// invoke / ok / fail / info.
    #[serde(rename = "type")]
    pub kind: OpType,
    /// What the operation does.
    pub f: F,
    /// The lock key (key operations only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// A fencing token: the grant's on acquire `ok`, the presented one on renew, release and
    /// write.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<u64>,
    /// The client's deadline for the grant, on the `t_ns` clock (acquire and renew `ok`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_ns: Option<u64>,
    /// Why a `fail` or `info` happened: `contended`, `lost`, `fenced`, or a message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The register's stored token that fenced a write out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stored: Option<u64>,
    /// Whether a release removed this grant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub released: Option<bool>,
    /// The requested lease, on an acquire invocation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
    /// The requested wait, on an acquire invocation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_wait_ms: Option<u64>,
    /// Whether a revoke displaced a grant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked: Option<bool>,
    /// The token of the grant a revoke displaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_token: Option<u64>,
    /// The owner id of the grant a revoke displaced (the workload's `jepsen-client-N`), so
    /// the checker knows whose acquire it was even when that acquire's outcome is unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_owner: Option<String>,
    /// The token floor after a revoke: every later grant's token is above it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_token_floor: Option<u64>,
    /// Start or heal, on a nemesis op.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    /// installed / skipped / indeterminate, on a nemesis op.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<Outcome>,
    /// Free-form details: the value written, or a nemesis op's targets
    /// (`pause-client` carries `{"processes": [...]}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<serde_json::Value>,
}

impl Op {
    /// A line with only the mandatory fields set; `t_ns` is filled in by the [`Recorder`].
    pub fn new(process: Process, kind: OpType, f: F) -> Self {
        Self {
            t_ns: 0,
            process,
            kind,
            f,
            key: None,
            token: None,
            deadline_ns: None,
            error: None,
            stored: None,
            released: None,
            ttl_ms: None,
            max_wait_ms: None,
            revoked: None,
            previous_token: None,
            previous_owner: None,
            new_token_floor: None,
            phase: None,
            outcome: None,
            value: None,
        }
    }

    /// A nemesis line for one phase of a fault.
    pub fn nemesis(f: F, phase: Phase, outcome: Outcome, value: serde_json::Value) -> Self {
        let mut op = Self::new(Process::Nemesis, outcome.op_type(), f);
        op.phase = Some(phase);
        op.outcome = Some(outcome);
        op.value = Some(value);
        op
    }

    /// Sets the time (builder style, for hand-made histories).
    pub fn at(mut self, t_ns: u64) -> Self {
        self.t_ns = t_ns;
        self
    }

    /// Sets the key.
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Sets the token.
    pub fn token(mut self, token: u64) -> Self {
        self.token = Some(token);
        self
    }

    /// Sets the client deadline.
    pub fn deadline(mut self, deadline_ns: u64) -> Self {
        self.deadline_ns = Some(deadline_ns);
        self
    }

    /// Sets the error.
    pub fn error(mut self, error: impl Into<String>) -> Self {
        self.error = Some(error.into());
        self
    }

    /// Sets the value.
    pub fn value(mut self, value: serde_json::Value) -> Self {
        self.value = Some(value);
        self
    }

    /// Whether this line completes an operation (ok, fail or info).
    pub fn is_completion(&self) -> bool {
        self.kind != OpType::Invoke
    }
}

/// Appends operations to the history file, stamping each with the one run clock.
///
/// The clock is read under the same lock as the append, so `t_ns` never decreases down the
/// file: file order is time order, which the checker relies on (the fenced register appends its
/// verdict while holding its own lock, so file order is also the register's apply order).
#[derive(Debug)]
pub struct Recorder {
    start: Instant,
    inner: Mutex<RecorderInner>,
}

#[derive(Debug)]
struct RecorderInner {
    out: BufWriter<File>,
    count: u64,
    last_t_ns: u64,
    /// The first write error; once set, the run is a harness failure.
    failed: Option<String>,
}

impl Recorder {
    /// Creates (truncates) the history file at `path`; `t_ns` counts from `start`.
    pub fn create(path: &Path, start: Instant) -> anyhow::Result<Self> {
        let file = File::create(path)
            .with_context(|| format!("creating history file {}", path.display()))?;
        Ok(Self {
            start,
            inner: Mutex::new(RecorderInner {
                out: BufWriter::new(file),
                count: 0,
                last_t_ns: 0,
                failed: None,
            }),
        })
    }

    /// The run's start instant: `t_ns` and `deadline_ns` are nanoseconds after it.
    pub fn start(&self) -> Instant {
        self.start
    }

    /// Nanoseconds since the start at `at` (0 for an instant before the start).
    pub fn ns_at(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.start).as_nanos()).unwrap_or(u64::MAX)
    }

    /// Nanoseconds since the start, now.
    pub fn now_ns(&self) -> u64 {
        self.ns_at(Instant::now())
    }

    /// Stamps `op` with the current time and appends it. Returns the stamp.
    ///
    /// A failed write is remembered and reported by [`Recorder::finish`]: the run is then a
    /// harness failure, never a verdict.
    pub fn record(&self, mut op: Op) -> u64 {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let t_ns = self.now_ns().max(inner.last_t_ns);
        op.t_ns = t_ns;
        inner.last_t_ns = t_ns;
        inner.count += 1;
        if inner.failed.is_none() {
            let result = serde_json::to_writer(&mut inner.out, &op)
                .map_err(std::io::Error::from)
                .and_then(|()| inner.out.write_all(b"\n"));
            if let Err(e) = result {
                inner.failed = Some(format!("writing history line {}: {e}", inner.count));
            }
        }
        t_ns
    }

    /// Lines recorded so far.
    pub fn count(&self) -> u64 {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).count
    }

    /// Flushes buffered lines to the file.
    pub fn flush(&self) -> anyhow::Result<()> {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = &inner.failed {
            bail!("history is incomplete: {e}");
        }
        inner.out.flush().context("flushing the history file")
    }

    /// Flushes and syncs the file; fails if any line could not be written.
    pub fn finish(&self) -> anyhow::Result<()> {
        self.flush()?;
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner
            .out
            .get_ref()
            .sync_all()
            .context("syncing the history file")
    }
}

/// Reads a history file. A line that does not parse is an error naming the line: a malformed
/// history is a harness failure, never a verdict.
pub fn read(path: &Path) -> anyhow::Result<Vec<Op>> {
    let file =
        File::open(path).with_context(|| format!("opening history file {}", path.display()))?;
    parse(BufReader::new(file)).with_context(|| format!("reading history {}", path.display()))
}

/// Parses history lines from `reader` (blank lines are skipped).
pub fn parse(reader: impl BufRead) -> anyhow::Result<Vec<Op>> {
    let mut ops = Vec::new();
    for (index, line) in reader.lines().enumerate() {
        let line = line.with_context(|| format!("line {}", index + 1))?;
        if line.trim().is_empty() {
            continue;
        }
        if line.len() > LINE_LEN_MAX {
            bail!(
                "line {} is {} bytes, over LINE_LEN_MAX {LINE_LEN_MAX}",
                index + 1,
                line.len()
            );
        }
        let op: Op = serde_json::from_str(&line)
            .with_context(|| format!("line {} is not a history operation", index + 1))?;
        ops.push(op);
    }
    Ok(ops)
}

/// Writes `ops` as history lines (for hand-made histories and re-written reports).
pub fn write(path: &Path, ops: &[Op]) -> anyhow::Result<()> {
    let file = File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut out = BufWriter::new(file);
    for op in ops {
        serde_json::to_writer(&mut out, op).context("encoding a history line")?;
        out.write_all(b"\n")?;
    }
    out.flush()
        .with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_use_the_documented_field_names() {
        let op = Op::new(Process::Client(3), OpType::Ok, F::Acquire)
            .at(5400)
            .key("k1")
            .token(17)
            .deadline(1_700_005_400);
        let line = serde_json::to_string(&op).unwrap();
        assert_eq!(
            line,
            r#"{"t_ns":5400,"process":3,"type":"ok","f":"acquire","key":"k1","token":17,"deadline_ns":1700005400}"#
        );
        let nemesis = Op::nemesis(
            F::PauseClient,
            Phase::Start,
            Outcome::Installed,
            serde_json::json!({"processes": [1, 2]}),
        )
        .at(9);
        let line = serde_json::to_string(&nemesis).unwrap();
        assert_eq!(
            line,
            r#"{"t_ns":9,"process":"nemesis","type":"ok","f":"pause-client","phase":"start","outcome":"installed","value":{"processes":[1,2]}}"#
        );
        assert_eq!(serde_json::from_str::<Op>(&line).unwrap(), nemesis);
    }

    #[test]
    fn malformed_lines_are_errors_naming_the_line() {
        let text = "{\"t_ns\":1,\"process\":0,\"type\":\"invoke\",\"f\":\"acquire\"}\n\n{\"t_ns\":2,\"process\":\"x\",\"type\":\"ok\",\"f\":\"acquire\"}\n";
        let err = parse(text.as_bytes()).unwrap_err();
        assert!(format!("{err:#}").contains("line 3"), "{err:#}");
        let unknown = "{\"t_ns\":1,\"process\":0,\"type\":\"invoke\",\"f\":\"acquire\",\"tokn\":1}";
        assert!(parse(unknown.as_bytes()).is_err());
    }

    #[test]
    fn recorder_stamps_never_decrease_and_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("history.jsonl");
        let recorder = Recorder::create(&path, Instant::now()).unwrap();
        for n in 0..50 {
            recorder.record(Op::new(Process::Client(n % 3), OpType::Invoke, F::Acquire).key("k"));
        }
        recorder.finish().unwrap();
        let ops = read(&path).unwrap();
        assert_eq!(ops.len(), 50);
        assert!(ops.windows(2).all(|w| w[0].t_ns <= w[1].t_ns));
    }
}
