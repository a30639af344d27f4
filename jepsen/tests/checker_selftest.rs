//! The checker's self-test: a good hand-made history passes every property, and for each
//! property a bad history (the good one with one thing changed) fails that property and only
//! that one. Shows the checker can fail — a checker that always passes proves nothing.
//!
//! The D-cost property reads resource samples as well: an outage with a spinning survivor (or
//! one that floods its log) fails it, quiet survivors pass it (t26–t29).

use lock_jepsen::checker::outage_cost::{SURVIVOR_CPU_CORES_MAX, SURVIVOR_LOG_BYTES_PER_S_MAX};
use lock_jepsen::checker::{self, Analysis, CheckConfig, Status, Verdict};
use lock_jepsen::history::{
    ERROR_CONTENDED, ERROR_FENCED, ERROR_LOST, F, Op, OpType, Outcome, Phase, Process,
};
use lock_jepsen::resources::Sample;
use serde_json::json;

const MS: u64 = 1_000_000;
const PROPERTIES: [&str; 7] = [
    "unique_tokens",
    "token_order",
    "no_overlap",
    "fenced_writes",
    "no_lost_grants",
    "recovery",
    "outage_cost",
];

/// The pieces of the good history that the bad ones change.
#[derive(Clone)]
struct Knobs {
    /// Token of client 1's late grant on k2 (good: 7).
    late_k2_token: u64,
    /// Token of client 0's late grant on k1 (good: 6, above the revoke floor 5).
    late_k1_token: u64,
    /// When client 0 invokes its first release (good: 700 ms, before client 1's grant).
    first_release_ms: u64,
    /// Whether client 2's write after its pause is accepted (good: fenced).
    paused_write_accepted: bool,
    /// Whether client 0's renewal answers "lost" (good: renewed).
    renew_lost: bool,
    /// Whether client 1's late acquire of k2 is granted (good) or waits out to 25 s.
    late_k2_granted: bool,
    /// Time of the last line, in ms.
    end_ms: u64,
}

impl Default for Knobs {
    fn default() -> Self {
        Self {
            late_k2_token: 7,
            late_k1_token: 6,
            first_release_ms: 700,
            paused_write_accepted: false,
            renew_lost: false,
            late_k2_granted: true,
            end_ms: 6_000,
        }
    }
}

fn client(p: u32, kind: OpType, f: F, key: &str) -> Op {
    Op::new(Process::Client(p), kind, f).key(key)
}

fn history(k: &Knobs) -> Vec<Op> {
    let mut ops: Vec<(u64, Op)> = Vec::new();
    let mut at = |ms: u64, op: Op| ops.push((ms, op));

    // A partition from 1 s to 3 s.
    at(
        1_000,
        Op::nemesis(
            F::Partition,
            Phase::Start,
            Outcome::Installed,
            json!({"mode": "halves", "cut": [[1, 2]]}),
        ),
    );
    at(
        3_000,
        Op::nemesis(F::Partition, Phase::Heal, Outcome::Installed, json!({})),
    );

    // Client 0: acquire k1 (token 1), write, renew, release.
    at(100, client(0, OpType::Invoke, F::Acquire, "k1"));
    at(
        200,
        client(0, OpType::Ok, F::Acquire, "k1")
            .token(1)
            .deadline(2_200 * MS),
    );
    at(300, client(0, OpType::Invoke, F::Write, "k1").token(1));
    at(310, client(0, OpType::Ok, F::Write, "k1").token(1));
    at(500, client(0, OpType::Invoke, F::Renew, "k1").token(1));
    if k.renew_lost {
        at(
            600,
            client(0, OpType::Fail, F::Renew, "k1")
                .token(1)
                .error(ERROR_LOST),
        );
    } else {
        at(
            600,
            client(0, OpType::Ok, F::Renew, "k1")
                .token(1)
                .deadline(2_600 * MS),
        );
    }
    let release_ms = k.first_release_ms;
    at(
        release_ms,
        client(0, OpType::Invoke, F::Release, "k1").token(1),
    );
    let mut released = client(0, OpType::Ok, F::Release, "k1").token(1);
    released.released = Some(!k.renew_lost);
    at(release_ms + 50, released);

    // Client 1 waits for k1 and gets it once client 0 released it (token 2).
    at(400, client(1, OpType::Invoke, F::Acquire, "k1"));
    at(
        800,
        client(1, OpType::Ok, F::Acquire, "k1")
            .token(2)
            .deadline(2_800 * MS),
    );
    at(900, client(1, OpType::Invoke, F::Write, "k1").token(2));
    at(910, client(1, OpType::Ok, F::Write, "k1").token(2));
    at(1_000, client(1, OpType::Invoke, F::Release, "k1").token(2));
    let mut released = client(1, OpType::Ok, F::Release, "k1").token(2);
    released.released = Some(true);
    at(1_050, released);

    // Client 2 holds k2 (token 3) and is paused between check_still_held and its write; its
    // lease runs out, client 3 gets k2 (token 4) and writes; client 2's late write is fenced.
    at(100, client(2, OpType::Invoke, F::Acquire, "k2"));
    at(
        150,
        client(2, OpType::Ok, F::Acquire, "k2")
            .token(3)
            .deadline(2_150 * MS),
    );
    at(
        200,
        Op::nemesis(
            F::PauseClient,
            Phase::Start,
            Outcome::Installed,
            json!({"processes": [2], "pause_ms": 2300}),
        ),
    );
    at(2_500, client(2, OpType::Invoke, F::Write, "k2").token(3));
    if k.paused_write_accepted {
        at(2_510, client(2, OpType::Ok, F::Write, "k2").token(3));
    } else {
        let mut fenced = client(2, OpType::Fail, F::Write, "k2")
            .token(3)
            .error(ERROR_FENCED);
        fenced.stored = Some(4);
        at(2_510, fenced);
    }
    at(
        2_600,
        Op::nemesis(
            F::PauseClient,
            Phase::Heal,
            Outcome::Installed,
            json!({"processes": [2]}),
        ),
    );
    at(2_700, client(2, OpType::Invoke, F::Release, "k2").token(3));
    let mut released = client(2, OpType::Ok, F::Release, "k2").token(3);
    released.released = Some(false);
    at(2_750, released);

    at(300, client(3, OpType::Invoke, F::Acquire, "k2"));
    at(
        2_200,
        client(3, OpType::Ok, F::Acquire, "k2")
            .token(4)
            .deadline(4_200 * MS),
    );
    at(2_300, client(3, OpType::Invoke, F::Write, "k2").token(4));
    at(2_310, client(3, OpType::Ok, F::Write, "k2").token(4));
    at(2_400, client(3, OpType::Invoke, F::Release, "k2").token(4));
    let mut released = client(3, OpType::Ok, F::Release, "k2").token(4);
    released.released = Some(true);
    at(2_450, released);

    // Client 4: one acquire not granted, one with an unknown outcome.
    at(100, client(4, OpType::Invoke, F::Acquire, "k1"));
    at(
        1_100,
        client(4, OpType::Fail, F::Acquire, "k1").error(ERROR_CONTENDED),
    );
    at(1_200, client(4, OpType::Invoke, F::Acquire, "k2"));
    at(
        2_000,
        client(4, OpType::Info, F::Acquire, "k2").error("deadline exceeded"),
    );

    // A revoke of the free key k1 raises its token floor to 5.
    at(
        1_500,
        Op::new(Process::Nemesis, OpType::Invoke, F::Revoke).key("k1"),
    );
    let mut revoke = Op::new(Process::Nemesis, OpType::Ok, F::Revoke).key("k1");
    revoke.revoked = Some(false);
    revoke.new_token_floor = Some(5);
    at(1_600, revoke);

    // After the heal: both keys are granted again.
    at(3_500, client(0, OpType::Invoke, F::Acquire, "k1"));
    at(
        3_600,
        client(0, OpType::Ok, F::Acquire, "k1")
            .token(k.late_k1_token)
            .deadline(5_600 * MS),
    );
    at(
        3_700,
        client(0, OpType::Invoke, F::Write, "k1").token(k.late_k1_token),
    );
    at(
        3_710,
        client(0, OpType::Ok, F::Write, "k1").token(k.late_k1_token),
    );
    at(
        3_800,
        client(0, OpType::Invoke, F::Release, "k1").token(k.late_k1_token),
    );
    let mut released = client(0, OpType::Ok, F::Release, "k1").token(k.late_k1_token);
    released.released = Some(true);
    at(3_850, released);

    at(3_500, client(1, OpType::Invoke, F::Acquire, "k2"));
    if k.late_k2_granted {
        at(
            3_700,
            client(1, OpType::Ok, F::Acquire, "k2")
                .token(k.late_k2_token)
                .deadline(5_700 * MS),
        );
    } else {
        at(
            25_000,
            client(1, OpType::Fail, F::Acquire, "k2").error(ERROR_CONTENDED),
        );
    }
    at(k.end_ms, client(5, OpType::Invoke, F::Acquire, "k1"));

    ops.sort_by_key(|(ms, _)| *ms);
    ops.into_iter().map(|(ms, op)| op.at(ms * MS)).collect()
}

fn verdict(k: &Knobs) -> Verdict {
    checker::check(&history(k), &CheckConfig::default()).expect("the hand-made history pairs up")
}

/// Asserts `failing` fails (or is `failing_status`) and every other property passes.
fn assert_only(verdict: &Verdict, failing: &str, failing_status: Status) {
    for name in PROPERTIES {
        let p = verdict.property(name).expect("every property is reported");
        let expected = if name == failing {
            failing_status
        } else {
            Status::Pass
        };
        assert_eq!(
            p.status, expected,
            "{name}: expected {expected:?}, got {:?}: {:#?}",
            p.status, p.violations
        );
        if name == failing && failing_status == Status::Fail {
            assert!(p.violation_count > 0 && !p.violations.is_empty());
        }
    }
    assert_eq!(verdict.status, failing_status);
}

#[test]
fn t10_good_history_passes_every_property() {
    let v = verdict(&Knobs::default());
    for p in &v.properties {
        assert_eq!(p.status, Status::Pass, "{}: {:#?}", p.name, p.violations);
        assert!(
            p.design_ref.starts_with("DESIGN.md §5.") || p.design_ref == "DESIGN.md D-cost",
            "{}",
            p.design_ref
        );
        if p.name == "outage_cost" {
            // This history has no outage: nothing to check, and the note says so.
            assert_eq!(p.checked, 0);
            assert_eq!(p.note.as_deref(), Some("no outage in this run"));
        } else {
            assert!(p.checked > 0, "{} checked nothing", p.name);
        }
    }
    assert_eq!(v.status, Status::Pass);
    // The paused client's window is cut at its pause, and that is visible as an excuse.
    assert!(v.property("no_overlap").unwrap().excused >= 1);
}

#[test]
fn t20_duplicate_token_fails_unique_tokens() {
    let v = verdict(&Knobs {
        late_k2_token: 6,
        ..Knobs::default()
    });
    assert_only(&v, "unique_tokens", Status::Fail);
}

#[test]
fn t21_token_below_the_floor_fails_token_order() {
    // Token 5 is unique and above every earlier k1 token, but not above the revoke's floor 5.
    let v = verdict(&Knobs {
        late_k1_token: 5,
        ..Knobs::default()
    });
    assert_only(&v, "token_order", Status::Fail);
}

#[test]
fn t22_two_holders_at_once_fail_no_overlap() {
    // Client 0 still holds k1 (releases at 900 ms) when client 1 is granted it at 800 ms.
    let v = verdict(&Knobs {
        first_release_ms: 900,
        ..Knobs::default()
    });
    assert_only(&v, "no_overlap", Status::Fail);
    let overlap = &v.property("no_overlap").unwrap().violations[0];
    assert_eq!(overlap.key.as_deref(), Some("k1"));
}

#[test]
fn t23_stale_write_accepted_fails_fenced_writes() {
    let v = verdict(&Knobs {
        paused_write_accepted: true,
        ..Knobs::default()
    });
    assert_only(&v, "fenced_writes", Status::Fail);
}

#[test]
fn t24_grant_lost_before_its_deadline_fails_no_lost_grants() {
    let v = verdict(&Knobs {
        renew_lost: true,
        ..Knobs::default()
    });
    assert_only(&v, "no_lost_grants", Status::Fail);
}

#[test]
fn t25_no_grant_after_the_heal_fails_recovery() {
    let v = verdict(&Knobs {
        late_k2_granted: false,
        end_ms: 25_000,
        ..Knobs::default()
    });
    assert_only(&v, "recovery", Status::Fail);
    // The same history cut off before the bound ran out cannot decide: unknown, not pass.
    let mut ops = history(&Knobs {
        late_k2_granted: false,
        end_ms: 10_000,
        ..Knobs::default()
    });
    ops.retain(|op| op.t_ns <= 10_000 * MS);
    let cut = checker::check(&ops, &CheckConfig::default()).unwrap();
    assert_eq!(cut.property("recovery").unwrap().status, Status::Unknown);
    assert_eq!(cut.status, Status::Unknown);
}

/// How the survivors behave in the outage history.
#[derive(Clone, Copy)]
struct Survivors {
    /// CPU seconds n1 uses per second while n2 is out.
    n1_cpu_per_s: f64,
    /// Log bytes n3 writes per second while n2 is out.
    n3_log_per_s: u64,
    /// CPU seconds the node that is out uses per second (it runs only when isolated).
    out_cpu_per_s: f64,
}

const QUIET: Survivors = Survivors {
    n1_cpu_per_s: 0.05,
    n3_log_per_s: 300,
    out_cpu_per_s: 0.05,
};

/// A 30 s outage of n2 (1 s → 31 s, `how` = kill or isolate), a grant before and after it, and
/// a resource sample of each node every second.
fn outage_run(how: &str, survivors: Survivors) -> (Vec<Op>, Vec<Sample>) {
    let mut ops: Vec<(u64, Op)> = vec![
        (100, client(0, OpType::Invoke, F::Acquire, "k1")),
        (
            200,
            client(0, OpType::Ok, F::Acquire, "k1")
                .token(1)
                .deadline(2_200 * MS),
        ),
        (300, client(0, OpType::Invoke, F::Release, "k1").token(1)),
        (400, {
            let mut op = client(0, OpType::Ok, F::Release, "k1");
            op.released = Some(true);
            op
        }),
        (
            1_000,
            Op::nemesis(
                F::Outage,
                Phase::Start,
                Outcome::Installed,
                json!({"node": 2, "how": how, "leader": false, "hold_s": 30.0}),
            ),
        ),
        (
            31_000,
            Op::nemesis(
                F::Outage,
                Phase::Heal,
                Outcome::Installed,
                json!({"node": 2, "how": how}),
            ),
        ),
        (32_000, client(0, OpType::Invoke, F::Acquire, "k1")),
        (
            32_100,
            client(0, OpType::Ok, F::Acquire, "k1")
                .token(2)
                .deadline(34_100 * MS),
        ),
        (32_200, client(0, OpType::Invoke, F::Release, "k1").token(2)),
        (32_300, {
            let mut op = client(0, OpType::Ok, F::Release, "k1");
            op.released = Some(true);
            op
        }),
        (33_000, client(1, OpType::Invoke, F::Acquire, "k1")),
    ];
    ops.sort_by_key(|(ms, _)| *ms);
    let ops = ops.into_iter().map(|(ms, op)| op.at(ms * MS)).collect();

    let mut samples = Vec::new();
    let mut cpu = [0.0f64; 4];
    let mut log = [0u64; 4];
    for t in 0..=33u64 {
        let during = (2..=31).contains(&t);
        for node in 1..=3u64 {
            let i = node as usize;
            let killed = node == 2 && how == "kill" && (2..=31).contains(&t);
            let restarted = node == 2 && how == "kill" && t > 31;
            let (cpu_per_s, log_per_s) = match (node, during) {
                (1, true) => (survivors.n1_cpu_per_s, 300),
                (3, true) => (0.05, survivors.n3_log_per_s),
                (2, true) => (survivors.out_cpu_per_s, 300),
                _ => (0.05, 300),
            };
            if t > 0 {
                cpu[i] += cpu_per_s;
                log[i] += log_per_s;
            }
            samples.push(Sample {
                t_ns: t * 1_000 * MS,
                node,
                pid: (!killed).then_some(100 + node as i32 + if restarted { 10 } else { 0 }),
                cpu_s: (!killed).then_some(cpu[i]),
                rss_bytes: (!killed).then_some(50 << 20),
                log_bytes: log[i],
            });
        }
    }
    (ops, samples)
}

fn outage_verdict(how: &str, survivors: Survivors, with_samples: bool) -> Verdict {
    let (ops, samples) = outage_run(how, survivors);
    let analysis = Analysis::new(&ops)
        .expect("the outage history pairs up")
        .with_resources(if with_samples { samples } else { Vec::new() });
    checker::check_analysis(&analysis, &CheckConfig::default())
}

#[test]
fn t26_quiet_survivors_pass_outage_cost() {
    for how in ["kill", "isolate"] {
        let v = outage_verdict(how, QUIET, true);
        assert_only(&v, "", Status::Pass);
        let p = v.property("outage_cost").unwrap();
        assert_eq!(p.checked, 2, "n1 and n3 over one window: {p:?}");
        assert!(
            p.note.as_deref().unwrap().contains("5 % of a core"),
            "{p:?}"
        );
    }
}

#[test]
fn t27_spinning_survivor_fails_outage_cost() {
    let spinning = Survivors {
        n1_cpu_per_s: 0.97,
        ..QUIET
    };
    assert!(spinning.n1_cpu_per_s > SURVIVOR_CPU_CORES_MAX);
    let v = outage_verdict("kill", spinning, true);
    assert_only(&v, "outage_cost", Status::Fail);
    let p = v.property("outage_cost").unwrap();
    assert_eq!(p.violation_count, 1, "{:#?}", p.violations);
    let message = &p.violations[0].message;
    assert!(
        message.contains("survivor n1") && message.contains("97 % of a core"),
        "{message}"
    );
}

#[test]
fn t28_survivor_flooding_its_log_fails_outage_cost() {
    let flooding = Survivors {
        n3_log_per_s: 40 * 1024,
        ..QUIET
    };
    assert!(flooding.n3_log_per_s as f64 > SURVIVOR_LOG_BYTES_PER_S_MAX);
    let v = outage_verdict("isolate", flooding, true);
    assert_only(&v, "outage_cost", Status::Fail);
    let message = &v.property("outage_cost").unwrap().violations[0].message;
    assert!(
        message.contains("survivor n3") && message.contains("40.0 KiB/s"),
        "{message}"
    );
}

#[test]
fn t29_outage_cost_judges_only_survivors_and_needs_samples() {
    // The isolated node itself may spin electing itself: it is not a survivor.
    let out_spins = Survivors {
        out_cpu_per_s: 1.0,
        ..QUIET
    };
    assert_only(
        &outage_verdict("isolate", out_spins, true),
        "",
        Status::Pass,
    );
    // An outage with no samples to judge it by is undecided, not passed.
    let v = outage_verdict("kill", QUIET, false);
    assert_only(&v, "outage_cost", Status::Unknown);
}

#[test]
fn t30_malformed_histories_are_errors_not_verdicts() {
    let orphan = vec![client(0, OpType::Ok, F::Write, "k1").token(1).at(5)];
    let err = checker::check(&orphan, &CheckConfig::default()).unwrap_err();
    assert!(format!("{err:#}").contains("never invoked"), "{err:#}");

    let twice = vec![
        client(0, OpType::Invoke, F::Acquire, "k1").at(1),
        client(0, OpType::Invoke, F::Acquire, "k2").at(2),
    ];
    assert!(checker::check(&twice, &CheckConfig::default()).is_err());

    let backwards = vec![
        client(0, OpType::Invoke, F::Acquire, "k1").at(5),
        client(0, OpType::Fail, F::Acquire, "k1")
            .error(ERROR_CONTENDED)
            .at(4),
    ];
    assert!(checker::check(&backwards, &CheckConfig::default()).is_err());
}

#[test]
fn t40_history_round_trips_through_the_file_format() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("history.jsonl");
    let ops = history(&Knobs::default());
    lock_jepsen::history::write(&path, &ops).unwrap();
    assert_eq!(lock_jepsen::history::read(&path).unwrap(), ops);
}

#[test]
fn t50_report_has_results_and_pictures() {
    let dir = tempfile::tempdir().unwrap();
    let ops = history(&Knobs {
        first_release_ms: 900,
        ..Knobs::default()
    });
    let config = CheckConfig::default();
    let analysis = checker::Analysis::new(&ops).unwrap();
    let v = checker::check_analysis(&analysis, &config);
    let results = lock_jepsen::report::results(&ops, &analysis, &v, &config, None);
    lock_jepsen::report::write(dir.path(), &analysis, &v, &results).unwrap();
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("results.json")).unwrap()).unwrap();
    assert_eq!(json["status"], "fail");
    assert_eq!(json["violations"], 1);
    let html = std::fs::read_to_string(dir.path().join("index.html")).unwrap();
    assert_eq!(
        html.matches("<svg").count(),
        3,
        "timeline, latency, throughput"
    );
    assert!(html.contains("no_overlap") && html.contains("FAIL"));
}
