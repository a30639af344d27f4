//! Crash durability of the log store: SIGKILL a process that is appending entries and saving
//! votes, at random moments, and check after each kill that the store opens cleanly and holds
//! every entry and vote the process had acknowledged, intact.
//!
//! The test binary plays both roles. Run normally, [`t50_sigkill_loses_no_acknowledged_write`]
//! is the parent: it re-executes this binary, filtered to the same test, with
//! [`CHILD_DIR_ENV`] set; there the test is the child, which opens the store and loops appending
//! and voting, printing `ACK entry <index>` only after `append`'s callback fired (the store said
//! "durable") and `ACK vote <term>` only after `save_vote` returned. The parent reads those lines
//! and kills the child after a random number of them, plus a random sub-millisecond delay, so the
//! kill lands anywhere in the write/flush/fdatasync cycle. Acknowledgements printed before the
//! kill are drained from the pipe and count too.
//!
//! Randomized and seeded: the seed is printed; `SEED=<n>` reruns a scenario (kill timing still
//! varies with the machine). `CRASH_ROUNDS=<n>` runs more rounds than the default.
//!
//! A SIGKILL tests the process crash; the page cache survives it, so this cannot by itself show
//! that `fdatasync` reached the disk (that needs a power cut: `src/storage/power_cut_test.rs`
//! runs the storage on a simulated disk that loses unsynced writes); it shows that what the
//! engines and the log store acknowledge is what comes back, and that recovery never refuses a
//! killed store.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command as Process, Stdio};
use std::time::Duration;

use lock_raft_store::storage;
use lock_raft_store::{Command, Entry, EntryPayload, LeaderId, LogId, NodeId, Request, Vote};
use openraft::RaftLogReader;
use openraft::storage::{RaftLogStorage, RaftLogStorageExt};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Set in the child: the storage directory to write to.
const CHILD_DIR_ENV: &str = "LOCK_RAFT_STORE_CRASH_CHILD_DIR";
/// Set in the child: the seed of its append sizes and vote cadence.
const CHILD_SEED_ENV: &str = "LOCK_RAFT_STORE_CRASH_CHILD_SEED";
/// This test's name, to re-execute only it.
const TEST_NAME: &str = "t50_sigkill_loses_no_acknowledged_write";
/// Kill rounds by default: enough to hit every phase of the cycle a few times within seconds.
const ROUNDS_DEFAULT: usize = 20;
/// Most acknowledgements to wait for before a kill.
const ACKS_BEFORE_KILL_MAX: usize = 40;
/// Most extra delay after the chosen acknowledgement before the kill, in microseconds.
const KILL_DELAY_US_MAX: u64 = 1_500;
/// Most appends a child makes: an orphaned child (parent gone) stops on its own.
const CHILD_APPENDS_MAX: u64 = 100_000;
/// Most entries per append.
const ENTRIES_PER_APPEND_MAX: u64 = 8;
/// The node id the child votes for and stamps its entries with.
const NODE_ID: NodeId = 1;

/// The entry the child writes at `index`: its content derives from the index alone, so the
/// parent can check any entry it finds. Every 97th entry is large (200 KB, stored as several
/// engine chunks); the others vary in size.
fn expected_entry(index: u64) -> Entry {
    let filler_len = if index.is_multiple_of(97) {
        200_000
    } else {
        (index * 7_919 % 400) as usize
    };
    let filler_char = char::from(b'a' + (index % 26) as u8);
    Entry {
        log_id: LogId::new(
            LeaderId {
                term: 1,
                node_id: NODE_ID,
            },
            index,
        ),
        payload: EntryPayload::Normal(Request {
            stamp_ms: index,
            command: Command::OpenSession {
                session_id: format!("session-{index}"),
                owner_id: std::iter::repeat_n(filler_char, filler_len).collect(),
                ttl_ms: index,
            },
        }),
    }
}

fn child(dir: &Path, seed: u64) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("child runtime");
    runtime.block_on(async {
        let (mut log, _state_machine) = storage::open(dir, None).expect("child: open storage");
        let mut rng = StdRng::seed_from_u64(seed);
        let state = log.get_log_state().await.expect("child: log state");
        let mut next = state.last_log_id.map_or(1, |id| id.index + 1);
        let mut term = log
            .read_vote()
            .await
            .expect("child: read vote")
            .map_or(0, |v| v.leader_id().term);
        println!("READY next={next} term={term}");
        for _ in 0..CHILD_APPENDS_MAX {
            let count = rng.gen_range(1..=ENTRIES_PER_APPEND_MAX);
            let last = next + count - 1;
            log.blocking_append((next..=last).map(expected_entry))
                .await
                .expect("child: append");
            println!("ACK entry {last}");
            next = last + 1;
            if rng.gen_bool(0.25) {
                term += 1;
                log.save_vote(&Vote::new(term, NODE_ID))
                    .await
                    .expect("child: save vote");
                println!("ACK vote {term}");
            }
            if rng.gen_bool(0.25) {
                // Not acknowledged (committed need not be durable), but written alongside.
                log.save_committed(Some(LogId::new(
                    LeaderId {
                        term: 1,
                        node_id: NODE_ID,
                    },
                    last,
                )))
                .await
                .expect("child: save committed");
            }
        }
    });
}

/// What the parent has seen acknowledged so far.
#[derive(Debug, Default)]
struct Acked {
    last_entry: u64,
    last_vote_term: u64,
    lines: usize,
}

impl Acked {
    /// Records one line of the child's output; returns whether it was an acknowledgement.
    fn record(&mut self, line: &str) -> bool {
        let mut words = line.split_whitespace();
        let (Some("ACK"), Some(kind), Some(value)) = (words.next(), words.next(), words.next())
        else {
            return false;
        };
        let value: u64 = value
            .parse()
            .unwrap_or_else(|_| panic!("bad ack line {line:?}"));
        match kind {
            "entry" => {
                assert!(
                    value > self.last_entry,
                    "acks go forward: {line:?} after {self:?}"
                );
                self.last_entry = value;
            }
            "vote" => {
                assert!(
                    value > self.last_vote_term,
                    "votes go forward: {line:?} after {self:?}"
                );
                self.last_vote_term = value;
            }
            _ => panic!("unknown ack {line:?}"),
        }
        self.lines += 1;
        true
    }
}

/// Opens the store after a kill and checks every acknowledged write is there and intact.
async fn verify(dir: &Path, acked: &Acked, round: usize) {
    let (mut log, _state_machine) = storage::open(dir, None)
        .unwrap_or_else(|e| panic!("round {round}: the store must open after a kill: {e}"));
    let vote = log.read_vote().await.expect("read vote");
    if let Some(vote) = vote {
        assert_eq!(vote.leader_id().node_id, NODE_ID, "round {round}: {vote:?}");
    }
    let vote_term = vote.map_or(0, |v| v.leader_id().term);
    assert!(
        vote_term >= acked.last_vote_term,
        "round {round}: vote term {vote_term} is below the acknowledged {}",
        acked.last_vote_term
    );
    let state = log.get_log_state().await.expect("log state");
    let last = state.last_log_id.map_or(0, |id| id.index);
    assert!(
        last >= acked.last_entry,
        "round {round}: last log index {last} is below the acknowledged {}",
        acked.last_entry
    );
    let entries = log.try_get_log_entries(..).await.expect("read entries");
    assert_eq!(
        entries.len() as u64,
        last,
        "round {round}: entries 1..={last} must all be present"
    );
    for (entry, index) in entries.into_iter().zip(1..) {
        assert_eq!(
            entry,
            expected_entry(index),
            "round {round}: entry {index} differs"
        );
    }
    drop(log);
}

fn run_round(dir: &Path, rng: &mut StdRng, acked: &mut Acked, round: usize) {
    let kill_after = rng.gen_range(1..=ACKS_BEFORE_KILL_MAX);
    let kill_delay = Duration::from_micros(rng.gen_range(0..=KILL_DELAY_US_MAX));
    let exe = std::env::current_exe().expect("test binary path");
    let mut child = Process::new(exe)
        .args(["--exact", TEST_NAME, "--nocapture", "--test-threads=1"])
        .env(CHILD_DIR_ENV, dir)
        .env(CHILD_SEED_ENV, rng.r#gen::<u64>().to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn child");
    let stdout = child.stdout.take().expect("child stdout");
    let mut lines = BufReader::new(stdout).lines();
    let mut acks_this_round = 0;
    let mut killed = false;
    for line in lines.by_ref() {
        let line = line.expect("read child output");
        if acked.record(&line) {
            acks_this_round += 1;
            if acks_this_round == kill_after {
                // The delay is the point of the test (a random moment of the write cycle to
                // kill in), not a wait for a condition.
                std::thread::sleep(kill_delay);
                child.kill().expect("SIGKILL the child");
                killed = true;
                break;
            }
        }
    }
    // Acknowledgements already in the pipe were printed before the kill: they count.
    for line in lines {
        acked.record(&line.expect("read child output"));
    }
    let status = child.wait().expect("reap child");
    assert!(
        killed,
        "round {round}: the child exited on its own ({status}) before the kill"
    );
}

#[test]
fn t50_sigkill_loses_no_acknowledged_write() {
    if let Ok(dir) = std::env::var(CHILD_DIR_ENV) {
        let seed = std::env::var(CHILD_SEED_ENV)
            .ok()
            .and_then(|s| s.parse().ok())
            .expect("child seed");
        child(Path::new(&dir), seed);
        return;
    }
    let seed = std::env::var("SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::thread_rng().r#gen());
    let rounds = std::env::var("CRASH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(ROUNDS_DEFAULT);
    println!("SEED={seed} CRASH_ROUNDS={rounds}");
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().expect("temp dir");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut acked = Acked::default();
    for round in 0..rounds {
        run_round(dir.path(), &mut rng, &mut acked, round);
        runtime.block_on(verify(dir.path(), &acked, round));
    }
    println!(
        "{rounds} kills survived: {} acknowledgements, last entry {}, last vote term {}",
        acked.lines, acked.last_entry, acked.last_vote_term
    );
    assert!(acked.last_entry > 0, "the children acknowledged nothing");
}
