//! CI's fault runs: one short, fixed-seed `lock-jepsen run` per nemesis against real `lockd`
//! processes. Each must end with exit code 0 (every property of docs/DESIGN.md §5 and D-cost
//! passes), and its nemesis must actually have installed at least one fault — a run whose
//! faults were all skipped proves nothing.
//!
//! Needs the `lockd` binary (`cargo build -p lockd`, same target dir, or `LOCKD_BIN`), and the
//! packages README's test command (`scripts/test`) installs: libfaketime for the clock
//! nemesis, and as root iproute2 and iptables. A missing one fails its test, naming them:
//! nothing passes untested. `--net auto` takes the namespace as root with iproute2 and iptables
//! installed and the proxy otherwise (the header says which and why); one partition run forces
//! `--net proxy`, so both ways of cutting links are exercised; t16 runs `--net netns` with a
//! lockd binary the node users cannot reach. t17 holds a node out for 20 s twice and judges
//! the survivors' cost. t18–t19 degrade links through the proxy's stream model (t18b asks the
//! namespace for netem, which a kernel without `sch_netem` cannot give: then the run must fail
//! naming it), t20 changes the membership under load, t21 damages a node's WAL or snapshot,
//! t22 cuts a node's power (its data dir on lock-lazyfs: FUSE must mount here, or the test
//! fails naming what is missing).
//! The runs are serialised within this binary; nextest's `cluster` group bounds them across
//! binaries.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;

use lock_jepsen::cluster::find_libfaketime;
use lock_jepsen::net::{self, Host};

/// Fault time of each run; a tail of [`TAIL`] follows for the recovery property.
const TIME: &str = "20s";
/// Fault-free tail after the last heal.
const TAIL: &str = "8s";
/// Every run uses this seed, so a failure replays with the same schedule of faults.
const SEED: &str = "20261130";
/// Fault time of the outage run: two outages of [`OUTAGE_HOLD`] and the quiet before each
/// (at most 4 s) fit in it.
const OUTAGE_TIME: &str = "50s";
/// How long each outage of the CI run holds its node out: long enough that a survivor's rate
/// is averaged over 15 s after the settling time, short enough for CI.
const OUTAGE_HOLD: &str = "20s";

/// One cluster at a time per test binary: two cores do not run more well.
static SERIAL: Mutex<()> = Mutex::new(());

/// The lockd binary the runs use.
fn lockd() -> PathBuf {
    if let Some(p) = std::env::var_os("LOCKD_BIN") {
        let p = PathBuf::from(p);
        assert!(p.is_file(), "LOCKD_BIN={} is not a file", p.display());
        return p;
    }
    let exe = Path::new(env!("CARGO_BIN_EXE_lock-jepsen"));
    let lockd = exe.with_file_name("lockd");
    assert!(
        lockd.is_file(),
        "{} not found: build it first with `cargo build -p lockd` (same profile and \
         CARGO_TARGET_DIR), or set LOCKD_BIN",
        lockd.display()
    );
    lockd
}

/// One finished `lock-jepsen run`.
struct Run {
    output: Output,
    stdout: String,
    stderr: String,
    results: Option<serde_json::Value>,
    out: tempfile::TempDir,
}

/// Runs `lock-jepsen run` on 3 nodes with `nemesis` and `extra` arguments for `time` of faults
/// (lockd as the harness finds it, unless `extra` has `--lockd`).
fn run(nemesis: &str, time: &str, extra: &[&str]) -> Run {
    // The harness finds lockd the same way; this only says what to build if it is missing.
    lockd();
    let out = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_lock-jepsen"))
        .args(["run", "--nodes", "3", "--clients", "8", "--keys", "4"])
        .args(["--time", time, "--tail", TAIL, "--seed", SEED])
        .args(["--nemesis", nemesis])
        .args(extra)
        .arg("--out")
        .arg(out.path())
        .output()
        .expect("lock-jepsen runs");
    let results = std::fs::read(out.path().join("results.json"))
        .ok()
        .and_then(|r| serde_json::from_slice::<serde_json::Value>(&r).ok());
    Run {
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        output,
        results,
        out,
    }
}

/// Runs `lock-jepsen run` with one nemesis and checks its verdict and that `fault` (the
/// stats key of the nemesis's faults, or `revoke` for revokes) was installed at least once.
fn short_run(nemesis: &str, fault: &str) -> serde_json::Value {
    short_run_with(nemesis, fault, TIME, &[])
}

/// [`short_run`] with `time` of faults and `extra` arguments; returns `results.json`.
fn short_run_with(nemesis: &str, fault: &str, time: &str, extra: &[&str]) -> serde_json::Value {
    short_run_kept(nemesis, fault, time, extra).0
}

/// [`short_run_with`], also returning the report folder (history, node logs).
fn short_run_kept(
    nemesis: &str,
    fault: &str,
    time: &str,
    extra: &[&str],
) -> (serde_json::Value, tempfile::TempDir) {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let run = run(nemesis, time, extra);
    if !run.output.status.success() {
        // Keep the evidence: history, results, report and node logs.
        let failing: Vec<String> = run
            .results
            .as_ref()
            .and_then(|r| r["properties"].as_array().cloned())
            .unwrap_or_default()
            .iter()
            .filter(|p| p["status"] != "pass")
            .map(|p| {
                format!(
                    "{} {}: {} {}",
                    p["name"], p["status"], p["note"], p["violations"]
                )
            })
            .collect();
        let kept = run.out.keep();
        panic!(
            "lock-jepsen run --nemesis {nemesis} exited with {}; report kept in {}\n\
             failing properties:\n{}\nstdout:\n{}\nstderr (end):\n{}",
            run.output.status,
            kept.display(),
            failing.join("\n"),
            run.stdout,
            tail(&run.stderr, 20)
        );
    }
    let summary = run.results.expect("results.json is written");
    assert_header(&run.stdout, &summary);
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
    (summary, run.out)
}

/// The last `n` lines of `text`.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The stdout header names the network mode and why, as `results.json` does.
fn assert_header(stdout: &str, summary: &serde_json::Value) {
    let run = &summary["run"];
    let net = run["net"].as_str().expect("run.net");
    let why = run["net_why"].as_str().expect("run.net_why");
    let line = stdout
        .lines()
        .find(|l| l.starts_with("network: "))
        .unwrap_or_else(|| panic!("no network line in the header:\n{stdout}"));
    assert!(line.starts_with(&format!("network: {net} ")), "{line}");
    assert!(line.ends_with(why), "{line} / {why}");
}

/// What `--net auto` must pick here, and why.
fn expected_auto() -> (&'static str, String) {
    let host = Host::probe();
    let (mode, why) = net::auto_mode(host.root, host.have_ip, host.have_iptables);
    (mode.name(), why)
}

#[test]
fn t10_partition() {
    let summary = short_run("partition", "partition");
    // `--net auto`: the namespace only where it can install its cuts, else the proxy.
    let (mode, why) = expected_auto();
    assert_eq!(summary["run"]["net"], mode, "{}", summary["run"]);
    assert_eq!(
        summary["run"]["net_why"],
        why.as_str(),
        "{}",
        summary["run"]
    );
}

/// The partition nemesis through the harness's TCP proxies instead of iptables (what a
/// non-root user gets): partitions must be installed and every property must still pass.
#[test]
fn t10_partition_proxy() {
    let summary = short_run_with("partition", "partition", TIME, &["--net", "proxy"]);
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

/// With libfaketime, the clock nemesis runs and must pass; without it, asking for it by name
/// is a harness failure (exit 2, no verdict) naming the package to install.
#[test]
fn t13_clock() {
    // Without libfaketime the clock nemesis cannot run, and a pass would test nothing:
    // README's test command installs it (the harness's own refusal, naming the package, is what
    // a user without it sees).
    assert!(
        find_libfaketime().is_some(),
        "libfaketime is not installed, so the clock nemesis cannot run: use `scripts/test` \
         (it installs the faketime and libfaketime packages) or `apt-get install libfaketime`"
    );
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

/// An explicit `--net netns`, with the lockd binary in a folder only root may enter (like a
/// clone under /root): where the namespace is possible the nodes (other uids) must still run
/// it — the harness copies it — and every property must pass; without root the run is a harness
/// failure that says to use `--net proxy`.
#[test]
fn t16_net_netns_runs_a_private_binary_or_names_the_missing_package() {
    let private = tempfile::tempdir().unwrap();
    std::fs::set_permissions(private.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let copy = private.path().join("lockd");
    std::fs::copy(lockd(), &copy).unwrap();
    let copy = copy.to_str().expect("a UTF-8 temp path").to_owned();
    let host = Host::probe();
    // As root the namespace must be possible: README's test command installs iproute2 and
    // iptables, and a pass that only saw the refusal would not have run the nodes at all.
    assert!(
        !host.root || (host.have_ip && host.have_iptables),
        "running as root without ip or iptables: use `scripts/test` (it installs iproute2 and \
         iptables) or `apt-get install iproute2 iptables`"
    );
    if host.root {
        let summary = short_run_with(
            "partition",
            "partition",
            TIME,
            &["--net", "netns", "--lockd", &copy],
        );
        assert_eq!(summary["run"]["net"], "netns", "{}", summary["run"]);
        let note = summary["run"]["lockd_note"].as_str().unwrap_or_default();
        assert!(
            note.contains("copied from") && note.contains("mode 700"),
            "{note}"
        );
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let run = run("partition", TIME, &["--net", "netns", "--lockd", &copy]);
    assert_eq!(run.output.status.code(), Some(2), "{}", run.stderr);
    // Not root: the namespace is never possible, and the refusal must say to use the proxy.
    assert!(
        run.stderr.contains("harness failure") && run.stderr.contains("--net proxy"),
        "{}",
        run.stderr
    );
}

/// Two outages of 20 s (a kill, then an isolation): while a node is out, every survivor's CPU
/// and log rate must stay under the D-cost bounds, and both outages must have been judged.
#[test]
fn t17_outage() {
    let summary = short_run_with(
        "outage",
        "outage",
        OUTAGE_TIME,
        &["--outage-hold", OUTAGE_HOLD],
    );
    let cost = summary["properties"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == "outage_cost"))
        .expect("the outage_cost property is reported")
        .clone();
    assert!(
        cost["checked"].as_u64().unwrap_or(0) >= 4,
        "two outages with two survivors each must be judged: {cost}"
    );
    let outages = summary["resources"]["outages"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let ways: Vec<&str> = outages.iter().filter_map(|o| o["how"].as_str()).collect();
    assert!(ways.starts_with(&["kill", "isolate"]), "{ways:?}");
    let minutes = summary["resources"]["per_minute"]
        .as_array()
        .map_or(0, Vec::len);
    assert!(
        minutes >= 3,
        "per node, per minute figures: {}",
        summary["resources"]
    );
}

/// The property called `name` in `results.json`.
fn property(summary: &serde_json::Value, name: &str) -> serde_json::Value {
    summary["properties"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == name))
        .unwrap_or_else(|| panic!("no property {name} in {summary}"))
        .clone()
}

/// Latency and jitter through the proxies (the stream model; the header says so).
#[test]
fn t18_slow_net() {
    let summary = short_run_with("slow-net", "slow-net", TIME, &["--net", "proxy"]);
    let model = summary["run"]["net_faults"].as_str().unwrap_or_default();
    assert!(
        model.starts_with("proxy stream model"),
        "{}",
        summary["run"]
    );
    assert_eq!(property(&summary, "linearizable")["status"], "pass");
}

/// Stalls and resets through the proxies.
#[test]
fn t19_flaky_net() {
    let summary = short_run_with("flaky-net", "flaky-net", TIME, &["--net", "proxy"]);
    let model = summary["run"]["net_faults"].as_str().unwrap_or_default();
    assert!(
        model.starts_with("proxy stream model"),
        "{}",
        summary["run"]
    );
}

/// Latency in the namespace is netem's alone: with it the run must pass; a kernel without the
/// netem qdisc must make the run a harness failure naming it, not a run without the fault.
#[test]
fn t18b_slow_net_in_the_namespace_or_a_failure_naming_netem() {
    let host = Host::probe();
    if !host.root {
        // No namespace without root; t16 checks that refusal.
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let run = run("slow-net", TIME, &["--net", "netns"]);
    match run.output.status.code() {
        Some(0) => {
            let summary = run.results.expect("results.json is written");
            let model = summary["run"]["net_faults"].as_str().unwrap_or_default();
            assert!(model.starts_with("netem"), "{}", summary["run"]);
            assert!(
                summary["stats"]["faults"]["slow-net"]["installed"]
                    .as_u64()
                    .unwrap_or(0)
                    >= 1,
                "{}",
                summary["stats"]
            );
        }
        code => {
            assert_eq!(code, Some(2), "{}\n{}", run.stdout, run.stderr);
            assert!(
                run.stderr.contains("netem") && run.stderr.contains("sch_netem"),
                "{}",
                run.stderr
            );
        }
    }
}

/// Packet loss and duplication in the namespace, with netem or, on a kernel without it, with
/// iptables' packet model: the run must pass, and the kernel must really have dropped and
/// duplicated packets of the degraded links (the heal lines' counters).
#[test]
fn t19b_flaky_net_in_the_namespace_loses_and_duplicates_packets() {
    let host = Host::probe();
    if !host.root {
        return;
    }
    let (summary, out) = short_run_kept("flaky-net", "flaky-net", TIME, &["--net", "netns"]);
    assert_eq!(summary["run"]["net"], "netns", "{}", summary["run"]);
    let model = summary["run"]["net_faults"].as_str().unwrap_or_default();
    if model.starts_with("netem") {
        // netem keeps no counter the harness reads; its installation is what t18b checks.
        return;
    }
    assert!(model.starts_with("iptables"), "{}", summary["run"]);
    let history = std::fs::read_to_string(out.path().join("history.jsonl")).unwrap();
    let (mut dropped, mut duplicated) = (0, 0);
    for line in history.lines() {
        let op: serde_json::Value = serde_json::from_str(line).unwrap();
        if op["f"] == "flaky-net" && op["value"]["did"].is_object() {
            dropped += op["value"]["did"]["dropped"].as_u64().unwrap_or(0);
            duplicated += op["value"]["did"]["duplicated"].as_u64().unwrap_or(0);
        }
    }
    assert!(
        dropped > 0 && duplicated > 0,
        "the flaky links dropped {dropped} and duplicated {duplicated} packets"
    );
}

/// A fourth node added and promoted, voters removed and added back while the clients run: every
/// property holds, and a removed node never answers as leader.
#[test]
fn t20_membership() {
    let summary = short_run("membership", "membership");
    let removed = property(&summary, "removed_not_leader");
    assert_eq!(removed["status"], "pass", "{removed}");
    assert!(
        removed["checked"].as_u64().unwrap_or(0) >= 1,
        "no removal was watched: {removed}"
    );
    assert_eq!(summary["run"]["spare_ids"][0], 4, "{}", summary["run"]);
}

/// A node's newest WAL segment or snapshot damaged while it is down: it recovers, or refuses
/// naming the file and is rebuilt under a new id; every property holds.
#[test]
fn t21_corrupt() {
    let summary = short_run("corrupt", "corrupt");
    let damage = property(&summary, "damage_detected");
    assert_eq!(damage["status"], "pass", "{damage}");
    assert!(
        damage["checked"].as_u64().unwrap_or(0) >= 1,
        "no damaged node was restarted: {damage}"
    );
}

/// Fault time of the power-cut run: each fault holds a node down for 3–8 s, so 30 s gives a
/// few cuts.
const POWER_CUT_TIME: &str = "30s";

/// Every node's data dir on lock-lazyfs; a node killed with a sync in flight loses a seeded
/// part of its unsynced pages, then restarts: it recovers (the WAL cuts the torn tail) or
/// refuses naming the file and is rebuilt; every property holds. At least one cut must have
/// discarded pages, or the run tested nothing a SIGKILL does not.
#[test]
fn t22_power_cut() {
    assert!(
        Path::new(lock_jepsen::lazyfs::daemon::FUSE_DEVICE).exists(),
        "{} is missing, so the power-cut nemesis cannot mount its file system: {}",
        lock_jepsen::lazyfs::daemon::FUSE_DEVICE,
        lock_jepsen::lazyfs::daemon::FUSE_MISSING
    );
    let (summary, out) = short_run_kept("power-cut", "power-cut", POWER_CUT_TIME, &[]);
    assert_eq!(summary["run"]["data_dirs"], "lazyfs", "{}", summary["run"]);
    let history = std::fs::read_to_string(out.path().join("history.jsonl")).unwrap();
    let (mut cuts, mut dropped, mut heals) = (0, 0, Vec::new());
    for line in history.lines() {
        let op: serde_json::Value = serde_json::from_str(line).unwrap();
        if op["f"] != "power-cut" || op["outcome"] != "installed" {
            continue;
        }
        if op["phase"] == "start" {
            cuts += 1;
            dropped += op["value"]["pages_dropped"].as_u64().unwrap_or(0);
        } else {
            heals.push(op["value"]["result"].as_str().unwrap_or("?").to_owned());
        }
    }
    eprintln!("t22: {cuts} cuts, {dropped} unsynced pages dropped, restarts: {heals:?}");
    assert!(
        dropped > 0,
        "no cut discarded an unsynced page in {cuts} cuts, so the run tested nothing a SIGKILL \
         does not"
    );
    assert!(
        heals
            .iter()
            .all(|h| h == "recovered" || h == "refused-rebuilt"),
        "{heals:?}"
    );
    let damage = property(&summary, "damage_detected");
    assert_eq!(damage["status"], "pass", "{damage}");
    assert!(
        damage["checked"].as_u64().unwrap_or(0) >= 1,
        "no cut node was restarted: {damage}"
    );
}
