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
const PROPERTIES: [&str; 10] = [
    "unique_tokens",
    "token_order",
    "no_overlap",
    "fenced_writes",
    "no_lost_grants",
    "linearizable",
    "removed_not_leader",
    "damage_detected",
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

/// The lease every hand-made acquire asks for (the workload's default).
const TTL_MS: u64 = 2_000;

fn client(p: u32, kind: OpType, f: F, key: &str) -> Op {
    let mut op = Op::new(Process::Client(p), kind, f).key(key);
    if kind == OpType::Invoke && f == F::Acquire {
        op.ttl_ms = Some(TTL_MS);
    }
    op
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
    assert_only_these(verdict, &[failing], failing_status);
}

/// Asserts every property in `failing` fails (or is `failing_status`) and every other passes.
fn assert_only_these(verdict: &Verdict, failing: &[&str], failing_status: Status) {
    for name in PROPERTIES {
        let p = verdict.property(name).expect("every property is reported");
        let failing = if failing.contains(&name) { name } else { "" };
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
            p.design_ref.starts_with("DESIGN.md §") || p.design_ref == "DESIGN.md D-cost",
            "{}",
            p.design_ref
        );
        let nothing_to_check = match p.name {
            "outage_cost" => Some("no outage in this run"),
            "removed_not_leader" => Some("no membership change in this run"),
            "damage_detected" => Some("no damaged node restarted in this run"),
            _ => None,
        };
        if let Some(note) = nothing_to_check {
            // This history has no such fault: nothing to check, and the note says so.
            assert_eq!(p.checked, 0);
            assert_eq!(p.note.as_deref(), Some(note));
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
    // The lease-mutex model sees the same thing: a grant not above the floor.
    assert_only_these(&v, &["token_order", "linearizable"], Status::Fail);
}

#[test]
fn t22_two_holders_at_once_fail_no_overlap() {
    // Client 0 still holds k1 (releases at 900 ms) when client 1 is granted it at 800 ms.
    let v = verdict(&Knobs {
        first_release_ms: 900,
        ..Knobs::default()
    });
    // No order fits either: client 1's grant would need client 0's lease ended.
    assert_only_these(&v, &["no_overlap", "linearizable"], Status::Fail);
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
    // A lease answered lost while it must still run has no place in the model either.
    assert_only_these(&v, &["no_lost_grants", "linearizable"], Status::Fail);
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

/// A grant's acquire: invoked at `invoke_ms`, granted `token` at `ok_ms`.
fn grant(ops: &mut Vec<(u64, Op)>, p: u32, key: &str, invoke_ms: u64, ok_ms: u64, token: u64) {
    ops.push((invoke_ms, client(p, OpType::Invoke, F::Acquire, key)));
    ops.push((
        ok_ms,
        client(p, OpType::Ok, F::Acquire, key)
            .token(token)
            .deadline((invoke_ms + TTL_MS) * MS),
    ));
}

/// A release of `token` from `invoke_ms` to `ok_ms` that did (or did not) remove the grant.
fn release(
    ops: &mut Vec<(u64, Op)>,
    p: u32,
    key: &str,
    (invoke_ms, ok_ms): (u64, u64),
    token: u64,
    released: bool,
) {
    ops.push((
        invoke_ms,
        client(p, OpType::Invoke, F::Release, key).token(token),
    ));
    let mut done = client(p, OpType::Ok, F::Release, key).token(token);
    done.released = Some(released);
    ops.push((ok_ms, done));
}

fn timed(mut ops: Vec<(u64, Op)>) -> Vec<Op> {
    ops.sort_by_key(|(ms, _)| *ms);
    ops.into_iter().map(|(ms, op)| op.at(ms * MS)).collect()
}

/// One key under concurrency that a lease mutex explains: grants handed over while the release
/// is still in flight, a holder that never releases and whose lease runs out, and a revoke of
/// unknown outcome that must have displaced a holder for the next grant to fit.
fn concurrent_history(with_unknown_revoke: bool) -> Vec<Op> {
    let mut ops = Vec::new();
    grant(&mut ops, 0, "k", 0, 50, 10);
    // Client 1 waits from 20 ms and is granted while client 0's release is in flight.
    release(&mut ops, 0, "k", (300, 400), 10, true);
    grant(&mut ops, 1, "k", 20, 350, 11);
    // Client 1 never releases; client 2, waiting since 100 ms, gets the key once client 1's
    // lease (from 300 ms, at the earliest) may have run out.
    grant(&mut ops, 2, "k", 100, 2_500, 12);
    release(&mut ops, 2, "k", (2_600, 2_650), 12, true);
    grant(&mut ops, 3, "k", 2_550, 2_620, 13);
    if with_unknown_revoke {
        ops.push((
            2_700,
            Op::new(Process::Nemesis, OpType::Invoke, F::Revoke).key("k"),
        ));
    }
    // Client 4's grant fits only if the revoke displaced client 3 (whose lease runs to 4.5 s).
    grant(&mut ops, 4, "k", 2_750, 2_900, 20);
    release(&mut ops, 3, "k", (3_000, 3_050), 13, false);
    ops.push((3_100, client(4, OpType::Invoke, F::Renew, "k").token(20)));
    ops.push((
        3_150,
        client(4, OpType::Ok, F::Renew, "k")
            .token(20)
            .deadline(5_100 * MS),
    ));
    release(&mut ops, 4, "k", (3_200, 3_250), 20, true);
    timed(ops)
}

#[test]
fn t31_a_concurrent_history_a_lease_mutex_explains_is_linearizable() {
    let ops = concurrent_history(true);
    let v = checker::check(&ops, &CheckConfig::default()).unwrap();
    let p = v.property("linearizable").unwrap();
    assert_eq!(p.status, Status::Pass, "{p:#?}");
    assert_eq!(p.checked, 11, "{p:#?}");
    // Without the revoke, client 4 is granted while client 3's lease must still run.
    let v = checker::check(&concurrent_history(false), &CheckConfig::default()).unwrap();
    let p = v.property("linearizable").unwrap();
    assert_eq!(p.status, Status::Fail, "{p:#?}");
    assert!(p.violations[0].message.contains("no order"), "{p:#?}");
}

/// A renewal of a grant the server already handed to someone else: every client-side window is
/// disjoint (the renewal came after the holder's deadline, so its window is not revived) and no
/// per-property check sees anything wrong — but the server acted as if both held the key.
#[test]
fn t32_a_renewal_after_the_next_grant_is_not_linearizable() {
    let mut ops = Vec::new();
    grant(&mut ops, 0, "k", 0, 10, 1);
    grant(&mut ops, 1, "k", 1_900, 2_100, 2);
    ops.push((2_050, client(0, OpType::Invoke, F::Renew, "k").token(1)));
    ops.push((
        2_150,
        client(0, OpType::Ok, F::Renew, "k")
            .token(1)
            .deadline(4_050 * MS),
    ));
    release(&mut ops, 1, "k", (2_200, 2_210), 2, true);
    let v = checker::check(&timed(ops), &CheckConfig::default()).unwrap();
    for p in v.properties.iter().filter(|p| p.name != "linearizable") {
        assert_ne!(p.status, Status::Fail, "{}: {:#?}", p.name, p.violations);
    }
    let p = v.property("linearizable").unwrap();
    assert_eq!(p.status, Status::Fail, "{p:#?}");
    assert!(p.violations[0].message.contains("no order"), "{p:#?}");
}

/// A blocking acquire that gave up ("contended") after the server granted it, and a revoke
/// that displaced that grant before the SDK's cancel could release it: the revoke names a
/// token no acknowledged acquire carries (seen in a `t15_revoke` run at load average 16). The
/// grant fits only inside the gave-up acquire; without that acquire, the revoke's token has no
/// origin and the history is not linearizable.
fn revoke_of_an_abandoned_grant(with_abandoned_acquire: bool) -> Vec<Op> {
    let mut ops = Vec::new();
    grant(&mut ops, 0, "k", 0, 50, 10);
    release(&mut ops, 0, "k", (100, 150), 10, true);
    if with_abandoned_acquire {
        ops.push((200, client(1, OpType::Invoke, F::Acquire, "k")));
        ops.push((
            3_300,
            client(1, OpType::Fail, F::Acquire, "k").error("contended"),
        ));
    }
    ops.push((
        2_900,
        Op::new(Process::Nemesis, OpType::Invoke, F::Revoke).key("k"),
    ));
    let mut revoke = Op::new(Process::Nemesis, OpType::Ok, F::Revoke).key("k");
    revoke.revoked = Some(true);
    revoke.previous_token = Some(12);
    revoke.new_token_floor = Some(13);
    ops.push((3_200, revoke));
    grant(&mut ops, 2, "k", 3_250, 3_400, 14);
    release(&mut ops, 2, "k", (3_450, 3_500), 14, true);
    timed(ops)
}

#[test]
fn t36_a_revoke_may_displace_the_grant_of_an_acquire_that_gave_up() {
    let v = checker::check(&revoke_of_an_abandoned_grant(true), &CheckConfig::default()).unwrap();
    let p = v.property("linearizable").unwrap();
    assert_eq!(p.status, Status::Pass, "{p:#?}");
    let v = checker::check(
        &revoke_of_an_abandoned_grant(false),
        &CheckConfig::default(),
    )
    .unwrap();
    let p = v.property("linearizable").unwrap();
    assert_eq!(p.status, Status::Fail, "{p:#?}");
}

/// A revoke names the token of a grant whose acquire ended unknown (`info`: the SDK found the
/// grant already gone when its answer came), while another client's acquire, invoked later, gave
/// up ("contended") — the shape of the 30-minute combined run's `k2` at 442 s. Only the owner the
/// revoke names tells the two apart: the later acquire cannot have held token 12, since client
/// 2's acknowledged grant of token 14 came before it.
fn revoke_of_an_unknown_acquire(name_the_owner: bool) -> Vec<Op> {
    let mut ops = Vec::new();
    grant(&mut ops, 0, "k", 0, 50, 10);
    release(&mut ops, 0, "k", (100, 150), 10, true);
    ops.push((200, client(4, OpType::Invoke, F::Acquire, "k")));
    ops.push((
        3_400,
        client(4, OpType::Info, F::Acquire, "k").error("the grant lapsed before it reached us"),
    ));
    ops.push((
        2_900,
        Op::new(Process::Nemesis, OpType::Invoke, F::Revoke).key("k"),
    ));
    grant(&mut ops, 2, "k", 3_100, 3_150, 14);
    ops.push((3_190, client(1, OpType::Invoke, F::Acquire, "k")));
    let mut revoke = Op::new(Process::Nemesis, OpType::Ok, F::Revoke).key("k");
    revoke.revoked = Some(true);
    revoke.previous_token = Some(12);
    revoke.previous_owner = name_the_owner.then(|| "jepsen-client-4".to_owned());
    revoke.new_token_floor = Some(13);
    ops.push((3_200, revoke));
    release(&mut ops, 2, "k", (3_450, 3_500), 14, true);
    ops.push((
        6_000,
        client(1, OpType::Fail, F::Acquire, "k").error("contended"),
    ));
    timed(ops)
}

#[test]
fn t37_a_revoke_names_whose_grant_it_displaced() {
    let named = revoke_of_an_unknown_acquire(true);
    let v = checker::check(&named, &CheckConfig::default()).unwrap();
    let p = v.property("linearizable").unwrap();
    assert_eq!(p.status, Status::Pass, "{p:#?}");
    // Without the owner the newest candidate is taken, the wrong one here: the checker errs
    // towards a failure, never towards a pass.
    let anonymous = revoke_of_an_unknown_acquire(false);
    let v = checker::check(&anonymous, &CheckConfig::default()).unwrap();
    let p = v.property("linearizable").unwrap();
    assert_eq!(p.status, Status::Fail, "{p:#?}");
}

/// A search that hits its bound says so: unknown, never pass.
#[test]
fn t33_the_search_bound_gives_unknown_not_pass() {
    let ops = concurrent_history(true);
    let analysis = Analysis::new(&ops).unwrap();
    let p = checker::linearizable::check_bounded(&analysis, 3);
    assert_eq!(p.status, Status::Unknown, "{p:#?}");
    assert!(p.note.as_deref().unwrap().contains("undecided"), "{p:#?}");
    assert_eq!(
        checker::linearizable::check_bounded(&analysis, 10_000).status,
        Status::Pass
    );
}

/// The good history with one membership fault (node 2 removed and added back) whose heal
/// reports `answers` leader answers from the removed node.
fn membership_history(answers: serde_json::Value) -> Vec<Op> {
    let mut ops = history(&Knobs::default());
    ops.push(
        Op::nemesis(
            F::Membership,
            Phase::Start,
            Outcome::Installed,
            json!({"added": 4, "removed": 2, "leader": true, "voters": [1, 3, 4], "term": 3}),
        )
        .at(1_200 * MS),
    );
    ops.push(
        Op::nemesis(
            F::Membership,
            Phase::Heal,
            Outcome::Installed,
            json!({"node": 2, "probes": 20, "leader_answers": answers, "voters": [1, 2, 3, 4]}),
        )
        .at(2_000 * MS),
    );
    ops.sort_by_key(|o| o.t_ns);
    ops
}

#[test]
fn t34_a_removed_node_answering_as_leader_fails_removed_not_leader() {
    let quiet = checker::check(&membership_history(json!([])), &CheckConfig::default()).unwrap();
    assert_only(&quiet, "", Status::Pass);
    assert_eq!(quiet.property("removed_not_leader").unwrap().checked, 1);
    let leads = checker::check(
        &membership_history(json!([{"t_ns": 1_900 * MS, "term": 4, "after_removal_ms": 2400}])),
        &CheckConfig::default(),
    )
    .unwrap();
    assert_only(&leads, "removed_not_leader", Status::Fail);
    let message = &leads.property("removed_not_leader").unwrap().violations[0].message;
    assert!(
        message.contains("node 2 answered as leader (term 4)"),
        "{message}"
    );
}

/// The good history with one corrupt fault on node 3 whose restart went as `heal` says.
fn corrupt_history(heal: serde_json::Value) -> Vec<Op> {
    let mut ops = history(&Knobs::default());
    ops.push(
        Op::nemesis(
            F::Corrupt,
            Phase::Start,
            Outcome::Installed,
            json!({"node": 3, "file": "0000000000000001.wal", "kind": "wal",
                   "what": {"damage": "flip", "bits": [[100, 3]]}}),
        )
        .at(1_200 * MS),
    );
    ops.push(Op::nemesis(F::Corrupt, Phase::Heal, Outcome::Installed, heal).at(2_000 * MS));
    ops.sort_by_key(|o| o.t_ns);
    ops
}

#[test]
fn t35_a_refusal_that_does_not_name_the_file_fails_damage_detected() {
    for good in [
        json!({"node": 3, "result": "recovered"}),
        json!({"node": 3, "result": "refused-rebuilt", "named_file": true, "new_id": 5}),
    ] {
        let v = checker::check(&corrupt_history(good.clone()), &CheckConfig::default()).unwrap();
        assert_only(&v, "", Status::Pass);
        assert_eq!(v.property("damage_detected").unwrap().checked, 1, "{good}");
    }
    let v = checker::check(
        &corrupt_history(
            json!({"node": 3, "result": "refused-rebuilt", "named_file": false,
                                "log": "Error: storage broken"}),
        ),
        &CheckConfig::default(),
    )
    .unwrap();
    assert_only(&v, "damage_detected", Status::Fail);
    let message = &v.property("damage_detected").unwrap().violations[0].message;
    assert!(
        message.contains("without naming the file") && message.contains("storage broken"),
        "{message}"
    );
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
    // The overlap, seen by no_overlap and by the linearizability check.
    assert_eq!(json["violations"], 2);
    let html = std::fs::read_to_string(dir.path().join("index.html")).unwrap();
    assert_eq!(
        html.matches("<svg").count(),
        3,
        "timeline, latency, throughput"
    );
    assert!(html.contains("no_overlap") && html.contains("FAIL"));
}
