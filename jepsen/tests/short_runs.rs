//! CI's fault runs: one short, fixed-seed `lock-jepsen run` per nemesis against real `lockd`
//! processes. Each must end with exit code 0 (every property of docs/DESIGN.md §5 passes), and its
//! nemesis must actually have installed at least one fault — a run whose faults were all
//! skipped proves nothing.
//!
//! Needs the `lockd` binary (`cargo build -p lockd`, same target dir, or `LOCKD_BIN`), and
//! libfaketime for the clock nemesis. As root (CI) the runs use a network namespace and
//! iptables for partitions; one partition run forces `--net proxy`, the mode a non-root user
//! gets, so both ways of cutting links are exercised.
//! The runs are serialised within this binary; nextest's `cluster` group bounds them across
//! binaries.

use std::path::Path;
use std::process::Command;
use std::sync::Mutex;

/// Fault time of each run; a tail of [`TAIL`] follows for the recovery property.
const TIME: &str = "20s";
/// Fault-free tail after the last heal.
const TAIL: &str = "8s";
/// Every run uses this seed, so a failure replays with the same schedule of faults.
const SEED: &str = "20261130";

/// One cluster at a time per test binary: two cores do not run more well.
static SERIAL: Mutex<()> = Mutex::new(());

fn lockd_exists() -> Result<(), String> {
    if let Some(p) = std::env::var_os("LOCKD_BIN") {
        return if Path::new(&p).is_file() {
            Ok(())
        } else {
            Err(format!("LOCKD_BIN={p:?} is not a file"))
        };
    }
    let exe = Path::new(env!("CARGO_BIN_EXE_lock-jepsen"));
    let lockd = exe.with_file_name("lockd");
    if lockd.is_file() {
        Ok(())
    } else {
        Err(format!(
            "{} not found: build it first with `cargo build -p lockd` (same profile and \
             CARGO_TARGET_DIR), or set LOCKD_BIN",
            lockd.display()
        ))
    }
}

/// Runs `lock-jepsen run` with one nemesis and checks its verdict and that `fault` (the
/// stats key of the nemesis's faults, or `revoke` for revokes) was installed at least once.
fn short_run(nemesis: &str, fault: &str) -> serde_json::Value {
    short_run_with(nemesis, fault, &[])
}

/// [`short_run`] with `extra` arguments; returns `results.json`.
fn short_run_with(nemesis: &str, fault: &str, extra: &[&str]) -> serde_json::Value {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    lockd_exists().unwrap();
    let out = tempfile::tempdir().unwrap();
    let status = Command::new(env!("CARGO_BIN_EXE_lock-jepsen"))
        .args(["run", "--nodes", "3", "--clients", "8", "--keys", "4"])
        .args(["--time", TIME, "--tail", TAIL, "--seed", SEED])
        .args(["--nemesis", nemesis])
        .args(extra)
        .arg("--out")
        .arg(out.path())
        .status()
        .expect("lock-jepsen runs");
    let results = std::fs::read(out.path().join("results.json"));
    let summary = results
        .as_ref()
        .ok()
        .and_then(|r| serde_json::from_slice::<serde_json::Value>(r).ok());
    if !status.success() {
        // Keep the evidence: history, results, report and node logs.
        let kept = out.keep();
        panic!(
            "lock-jepsen run --nemesis {nemesis} exited with {status}; report kept in {}; results: {}",
            kept.display(),
            summary.map(|s| s.to_string()).unwrap_or_default()
        );
    }
    let summary = summary.expect("results.json is written");
    assert_eq!(summary["status"], "pass", "{summary}");
    assert_eq!(summary["violations"], 0, "{summary}");
    let installed = if fault == "revoke" {
        summary["stats"]["ops"]["revoke"]["ok"].as_u64()
    } else {
        summary["stats"]["faults"][fault]["installed"].as_u64()
    };
    assert!(
        installed.unwrap_or(0) >= 1,
        "the {nemesis} nemesis installed no fault, so the run proves nothing: {}",
        summary["stats"]
    );
    let operations = summary["stats"]["operations"].as_u64().unwrap_or(0);
    assert!(
        operations > 50,
        "only {operations} operations: {}",
        summary["stats"]
    );
    summary
}

#[test]
fn t10_partition() {
    short_run("partition", "partition");
}

/// The partition nemesis through the harness's TCP proxies instead of iptables (what a
/// non-root user gets): partitions must be installed and every property must still pass.
#[test]
fn t10_partition_proxy() {
    let summary = short_run_with("partition", "partition", &["--net", "proxy"]);
    assert_eq!(summary["run"]["net"], "proxy", "{}", summary["run"]);
}

#[test]
fn t11_kill() {
    short_run("kill", "kill");
}

#[test]
fn t12_pause() {
    short_run("pause", "pause");
}

#[test]
fn t13_clock() {
    short_run("clock", "clock");
}

#[test]
fn t14_client_pause() {
    short_run("client-pause", "pause-client");
}

#[test]
fn t15_revoke() {
    short_run("revoke", "revoke");
}
