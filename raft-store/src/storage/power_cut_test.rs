//! Power-cut durability of the whole storage: the log store and the snapshot store run on a
//! [`PowerCutDisk`]; rounds of appends (acknowledged only once their flush callback fired),
//! appends never flushed, votes, committed ids, truncations, snapshots and purges each end in a
//! power cut that keeps a random part of whatever was not synced. After every cut the storage
//! must open, and hold every entry, vote, purge and snapshot acknowledged before it.
//!
//! Seeded: the seed is printed, `SEED=<n>` reruns a scenario exactly (each step waits for the
//! flush thread's sync, and writes that must stay unsynced bypass it, so nothing depends on
//! timing). `CUT_ROUNDS=<n>` runs more rounds than the default.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::{RaftLogReader, RaftSnapshotBuilder};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::disk::Disk;
use super::disk::power_cut::{self, PowerCutDisk};
use super::{EngineKind, LogStore, StateMachineStore};
use crate::{Command, Entry, EntryPayload, LeaderId, LogId, Request, Vote};

/// Cuts by default: a few seconds in a debug build.
const ROUNDS_DEFAULT: usize = 40;
/// Most steps between two cuts.
const STEPS_PER_ROUND_MAX: usize = 30;
/// Most unflushed appends in flight at a cut.
const UNFLUSHED_AT_CUT_MAX: usize = 8;
/// Most entries per append.
const ENTRIES_PER_APPEND_MAX: u64 = 6;
/// The node the votes are for.
const NODE_ID: u64 = 1;

/// The entry a leader of `term` writes at `index`: its content follows from both, so a check
/// can tell an entry from the one a later leader wrote at the same index. Sizes vary so frames
/// straddle pages; every 41st entry is large (several pages, and segment rotations).
fn entry(term: u64, index: u64) -> Entry {
    let filler_len = if index.is_multiple_of(41) {
        60_000
    } else {
        (index * 7_919 % 5_000) as usize
    };
    Entry {
        log_id: log_id(term, index),
        payload: EntryPayload::Normal(Request {
            stamp_ms: index,
            command: Command::OpenSession {
                session_id: format!("s-{term}-{index}"),
                owner_id: "o".repeat(filler_len),
                ttl_ms: 10_000,
            },
        }),
    }
}

fn log_id(term: u64, index: u64) -> LogId {
    LogId::new(
        LeaderId {
            term,
            node_id: NODE_ID,
        },
        index,
    )
}

/// What the storage acknowledged, and what it wrote without acknowledging.
#[derive(Debug, Default)]
struct Model {
    /// Entries the log must hold: acknowledged appends, less acknowledged truncations and
    /// purges.
    acked: BTreeMap<u64, Entry>,
    /// Entries written after the last sync: each may or may not survive a cut, in order.
    unsynced: BTreeMap<u64, Entry>,
    vote: Option<Vote>,
    /// Committed ids saved, oldest first; the first `committed_synced` of them were covered by
    /// a sync, so after a cut the store holds the last of those or a later one.
    committed: Vec<Option<LogId>>,
    committed_synced: usize,
    last_purged: Option<LogId>,
    /// The last applied index of the last snapshot built (0 for none) and of the state machine.
    snapshot: u64,
    applied: u64,
    term: u64,
}

impl Model {
    fn next_index(&self) -> u64 {
        let last = |m: &BTreeMap<u64, Entry>| m.keys().next_back().copied();
        let purged = self.last_purged.map_or(0, |id| id.index);
        last(&self.unsynced)
            .or(last(&self.acked))
            .unwrap_or(purged)
            .max(purged)
            + 1
    }

    /// A sync completed: everything written so far is durable.
    fn synced(&mut self) {
        let unsynced = std::mem::take(&mut self.unsynced);
        self.acked.extend(unsynced);
        self.committed_synced = self.committed.len();
    }
}

/// Opens the storage on `disk`, checks it against `model`, and resets the model to what the
/// store holds (opening syncs whatever survived, so all of it is durable from here on).
async fn open_and_check(
    disk: &PowerCutDisk,
    dir: &Path,
    model: &mut Model,
    context: &str,
) -> (LogStore, StateMachineStore) {
    let (mut log, mut state_machine) = super::open_on(
        Disk::PowerCut(disk.clone()),
        dir,
        EngineKind::Wal,
        None,
        None,
        None,
    )
    .unwrap_or_else(|e| panic!("{context}: the storage must open after a power cut: {e}"));
    let state = log.get_log_state().await.expect("log state");
    assert_eq!(
        state.last_purged_log_id, model.last_purged,
        "{context}: last purged"
    );
    let entries = log.try_get_log_entries(..).await.expect("read the log");
    let held: BTreeMap<u64, Entry> = entries.into_iter().map(|e| (e.log_id.index, e)).collect();
    for (index, acked) in &model.acked {
        assert_eq!(
            held.get(index),
            Some(acked),
            "{context}: acknowledged entry {index}"
        );
    }
    for (index, entry) in &held {
        if !model.acked.contains_key(index) {
            assert_eq!(
                model.unsynced.get(index),
                Some(entry),
                "{context}: entry {index} was never written"
            );
        }
    }
    assert_eq!(
        log.read_vote().await.expect("vote"),
        model.vote,
        "{context}: vote"
    );
    let committed = log.read_committed().await.expect("committed");
    let allowed = &model.committed[model.committed_synced.saturating_sub(1)..];
    assert!(
        allowed.contains(&committed) || (model.committed_synced == 0 && committed.is_none()),
        "{context}: committed {committed:?}, expected one of {allowed:?}"
    );
    let (applied, _) = state_machine.applied_state().await.expect("applied");
    assert_eq!(
        applied.map_or(0, |id| id.index),
        model.snapshot,
        "{context}: the state machine starts from the last snapshot"
    );

    model.acked = held;
    model.unsynced.clear();
    model.committed = vec![committed];
    model.committed_synced = 1;
    model.applied = model.snapshot;
    model.term = model
        .acked
        .values()
        .map(|e| e.log_id.leader_id.term)
        .chain(model.vote.map(|v| v.leader_id().term))
        .max()
        .unwrap_or(1)
        .max(model.term);
    (log, state_machine)
}

/// An append written but never flushed: the node loses power before its sync.
fn append_unflushed(rng: &mut StdRng, log: &LogStore, model: &mut Model) {
    let first = model.next_index();
    let count = rng.gen_range(1..=ENTRIES_PER_APPEND_MAX);
    let entries: Vec<Entry> = (first..first + count)
        .map(|i| entry(model.term, i))
        .collect();
    log.append_unflushed(entries.clone()).expect("append");
    model
        .unsynced
        .extend(entries.into_iter().map(|e| (e.log_id.index, e)));
}

/// One random step against the storage, recorded in `model`.
async fn step(
    rng: &mut StdRng,
    log: &mut LogStore,
    state_machine: &mut StateMachineStore,
    model: &mut Model,
) {
    match rng.gen_range(0..100) {
        // An append, acknowledged once its flush callback fired.
        0..=39 => {
            let first = model.next_index();
            let count = rng.gen_range(1..=ENTRIES_PER_APPEND_MAX);
            let entries: Vec<Entry> = (first..first + count)
                .map(|i| entry(model.term, i))
                .collect();
            log.blocking_append(entries.clone()).await.expect("append");
            model.synced();
            model
                .acked
                .extend(entries.into_iter().map(|e| (e.log_id.index, e)));
        }
        40..=54 => append_unflushed(rng, log, model),
        55..=62 => {
            model.term += 1;
            let vote = Vote::new(model.term, NODE_ID);
            log.save_vote(&vote).await.expect("save vote");
            model.synced();
            model.vote = Some(vote);
        }
        63..=72 => {
            let Some(entry) = model.acked.values().next_back() else {
                return;
            };
            let committed = Some(entry.log_id);
            log.save_committed(committed).await.expect("save committed");
            model.committed.push(committed);
        }
        // A new leader's truncation of entries not applied yet; its entries follow in a
        // higher term.
        73..=77 => {
            let floor = model
                .applied
                .max(model.last_purged.map_or(0, |id| id.index));
            let Some(&last) = model.acked.keys().next_back() else {
                return;
            };
            if last <= floor {
                return;
            }
            let keep = rng.gen_range(floor..last);
            let keep_id = model.acked.get(&keep).map(|e| e.log_id);
            if keep_id.is_none() && keep > 0 {
                return;
            }
            log.truncate_after(keep_id).await.expect("truncate");
            model.synced();
            model.acked.split_off(&(keep + 1));
            model.term += 1;
        }
        // Apply some acknowledged entries and snapshot the state machine.
        78..=87 => {
            let Some(&last) = model.acked.keys().next_back() else {
                return;
            };
            if last <= model.applied {
                return;
            }
            let upto = rng.gen_range(model.applied + 1..=last);
            let entries: Vec<Entry> = model
                .acked
                .range(model.applied + 1..=upto)
                .map(|(_, e)| e.clone())
                .collect();
            state_machine.apply_entries(entries);
            model.applied = upto;
            let mut builder = state_machine.get_snapshot_builder().await;
            builder.build_snapshot().await.expect("build snapshot");
            model.snapshot = upto;
        }
        // Purge up to the snapshot, as openraft does.
        _ => {
            let purged = model.last_purged.map_or(0, |id| id.index);
            if model.snapshot <= purged {
                return;
            }
            let upto = rng.gen_range(purged + 1..=model.snapshot);
            let Some(id) = model.acked.get(&upto).map(|e| e.log_id) else {
                return;
            };
            log.purge(id).await.expect("purge");
            model.synced();
            model.acked = model.acked.split_off(&(upto + 1));
            model.last_purged = Some(id);
        }
    }
}

#[tokio::test]
async fn t50_power_cuts_lose_no_acknowledged_write() {
    let seed = power_cut::seed();
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = PathBuf::from("/node");
    let mut disk = PowerCutDisk::new();
    let mut model = Model {
        term: 1,
        ..Model::default()
    };
    let mut pages_lost = 0;
    let mut files_lost = 0;
    for round in 0..power_cut::rounds(ROUNDS_DEFAULT) {
        let context = format!("SEED={seed} round {round}");
        let (mut log, mut state_machine) = open_and_check(&disk, &dir, &mut model, &context).await;
        for _ in 0..rng.gen_range(1..=STEPS_PER_ROUND_MAX) {
            step(&mut rng, &mut log, &mut state_machine, &mut model).await;
        }
        // Most cuts land amid writes: a node under load always has some in flight.
        if rng.gen_bool(0.8) {
            for _ in 0..rng.gen_range(1..=UNFLUSHED_AT_CUT_MAX) {
                append_unflushed(&mut rng, &log, &mut model);
            }
        }
        let (next, report) = disk.power_cut(&mut rng);
        pages_lost += report.pages_lost;
        files_lost += report.files_lost;
        // The old boot's handles fail from here on, so dropping the store changes nothing.
        drop(log);
        drop(state_machine);
        disk = next;
    }
    open_and_check(&disk, &dir, &mut model, &format!("SEED={seed} last")).await;
    assert!(pages_lost > 0, "SEED={seed}: the cuts never lost a page");
    println!("pages lost {pages_lost}, files lost {files_lost}");
}

/// A snapshot received from a leader and installed survives a power cut right after the
/// install returned: the install syncs the received file (beside its decode) before it makes
/// it the node's snapshot, and openraft may purge the log behind it from then on.
#[tokio::test]
async fn t51_an_installed_snapshot_survives_a_power_cut() {
    let seed = power_cut::seed();
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = PathBuf::from("/node");
    let disk = PowerCutDisk::new();
    let open = |disk: &PowerCutDisk| {
        super::open_on(
            Disk::PowerCut(disk.clone()),
            &dir,
            EngineKind::Wal,
            None,
            None,
            None,
        )
    };
    let (log, mut state_machine) = open(&disk).expect("open");
    let sent = super::state_machine::tests::snapshot_holding("sent", 7).await;
    // As the transport receives it: into the inbox, then checked whole.
    let mut incoming = state_machine
        .inbox()
        .receive(&sent.meta, sent.snapshot.len())
        .expect("receive");
    incoming
        .write(&sent.snapshot.to_vec().expect("read the sent data"))
        .expect("write");
    let received = incoming.finish().expect("whole and sound");
    state_machine
        .install_snapshot(&sent.meta, received)
        .await
        .expect("installed");
    let (disk, report) = disk.power_cut(&mut rng);
    drop(log);
    drop(state_machine);
    let (_log, mut state_machine) = open(&disk).unwrap_or_else(|e| {
        panic!("SEED={seed}: the storage must open after the cut ({report:?}): {e}")
    });
    let (applied, _) = state_machine.applied_state().await.expect("applied");
    assert_eq!(applied.map(|id| id.index), Some(7), "SEED={seed}");
    assert_eq!(
        state_machine
            .reader()
            .read_applied(|t| t.session("sent").is_some()),
        Some(true),
        "SEED={seed}"
    );
}
