//! The background load of a node's own snapshot (`own_load`) as openraft drives the state
//! machine around it: the start-up replay goes on at once and reaches the table in order, an
//! entry past the log as it opened waits for the table, an install stops the load, and a load that fails leaves
//! a state machine that applies nothing but still installs the leader's snapshot.
//!
//! Each load waits at a gate before it decodes, so what happens meanwhile does not depend on
//! how fast the decode is.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Barrier};

use futures::stream;
use openraft::RaftSnapshotBuilder;
use openraft::storage::RaftStateMachine;

use super::disk::Disk;
use super::snapshot::SnapshotDir;
use super::state_machine::tests::{Recorder, entry, open_session, snapshot_holding};
use super::state_machine::{OwnSnapshot, StateMachineStore};
use crate::table::LockTable;
use crate::{Command, EntryPayload, LeaderId, LogId, Request, SnapshotMeta};

/// Entry `index` of the test log: a session, then acquires of one key each.
fn payload(index: u64) -> EntryPayload {
    if index == 1 {
        return open_session("own");
    }
    EntryPayload::Normal(Request {
        stamp_ms: 1_000 + index,
        command: Command::Acquire {
            session_id: "own".to_string(),
            request_id: index,
            key: format!("key-{index}"),
            ttl_ms: 5_000,
            wait_ms: 0,
        },
    })
}

/// The table after entries `1..=last` of the test log.
fn table_after(last: u64) -> LockTable {
    let dir = tempfile::tempdir().expect("temp dir");
    let sm = StateMachineStore::open(dir.path(), None).expect("open");
    sm.apply_entries((1..=last).map(|i| entry(i, payload(i))));
    sm.reader().read(LockTable::clone)
}

/// A node's snapshot directory in `dir` holding a snapshot of entries `1..=at`.
async fn own_snapshot_at(dir: &Path, at: u64) {
    let mut sm = StateMachineStore::open(dir, None).expect("open");
    sm.apply_entries((1..=at).map(|i| entry(i, payload(i))));
    sm.get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .expect("built");
}

/// Opens `dir` loading its snapshot in the background, whatever its size, behind `gate`, its
/// log as it opened ending at `queue_until`.
fn open_loading(
    dir: &Path,
    observer: Arc<Recorder>,
    queue_until: Option<u64>,
    gate: Option<Arc<Barrier>>,
) -> StateMachineStore {
    StateMachineStore::open_on(
        Disk::Os,
        dir,
        Some(observer),
        None,
        OwnSnapshot {
            background_from: 0,
            queue_until,
            gate,
        },
    )
    .expect("open")
}

/// A node's storage whose snapshot holds entries `1..=4`, opened with its load held at the
/// returned gate and its log as it opened ending at `queue_until`, and the observer it tells.
async fn gated(
    queue_until: Option<u64>,
) -> (
    tempfile::TempDir,
    StateMachineStore,
    Arc<Barrier>,
    Arc<Recorder>,
) {
    let dir = tempfile::tempdir().expect("temp dir");
    own_snapshot_at(dir.path(), 4).await;
    let gate = Arc::new(Barrier::new(2));
    let observer = Arc::new(Recorder::default());
    let sm = open_loading(
        dir.path(),
        observer.clone(),
        queue_until,
        Some(gate.clone()),
    );
    (dir, sm, gate, observer)
}

/// Applies `indexes` of the test log as openraft does, no proposer waiting.
async fn apply(
    sm: &mut StateMachineStore,
    indexes: impl IntoIterator<Item = u64>,
) -> std::io::Result<()> {
    let entries: Vec<_> = indexes
        .into_iter()
        .map(|i| Ok((entry(i, payload(i)), None)))
        .collect();
    sm.apply(stream::iter(entries)).await
}

/// [`apply`] of the start-up replay, which must not wait for the load: a guard against a hang
/// (the load is held at its gate), far longer than any apply of a few entries takes.
async fn apply_replay(sm: &mut StateMachineStore, indexes: impl IntoIterator<Item = u64>) {
    tokio::time::timeout(std::time::Duration::from_secs(60), apply(sm, indexes))
        .await
        .expect("the start-up replay must not wait for the snapshot to load")
        .expect("the replay is queued");
}

/// The last indexes of the batches `observer` learned.
fn observed(observer: &Recorder) -> Vec<u64> {
    let batches = observer.0.lock().expect("recorder lock");
    batches.iter().map(|(index, _)| *index).collect()
}

/// Applies entry `index` of the test log, which must wait for the table (`what` it is): it is
/// not done while the load is held at `gate`, and is once the gate lets the load go on.
async fn applied_once_loaded(
    mut sm: StateMachineStore,
    index: u64,
    gate: Arc<Barrier>,
    what: &str,
) -> StateMachineStore {
    let mut next = tokio::spawn(async move { apply(&mut sm, [index]).await.map(|()| sm) });
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    assert!(
        !next.is_finished(),
        "{what} must wait for the table (the load is held at its gate)"
    );
    open_gate(gate).await;
    (&mut next)
        .await
        .expect("task")
        .expect("applied once loaded")
}

/// Lets the gated load go on, from a blocking thread.
async fn open_gate(gate: Arc<Barrier>) {
    tokio::task::spawn_blocking(move || {
        gate.wait();
    })
    .await
    .expect("gate");
}

/// The start-up replay counts as applied while the snapshot loads (openraft's start goes
/// on), an entry past it waits for the table, and the table ends as the log says, the
/// observer learning the replay before the entry after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_start_up_replay_goes_on_while_the_snapshot_loads_and_reaches_the_table_in_order() {
    let (_dir, mut sm, gate, observer) = gated(Some(6)).await;
    let reader = sm.reader();
    assert!(!reader.has_table());
    assert_eq!(reader.read_applied(LockTable::grant_count), None);

    apply_replay(&mut sm, [5, 6]).await;
    let (applied, _) = sm.applied_state().await.expect("applied state");
    assert_eq!(applied.map(|id| id.index), Some(6));
    assert!(
        observed(&observer).is_empty(),
        "nothing applied to a table yet"
    );

    let mut sm = applied_once_loaded(sm, 7, gate, "an entry past the replay").await;

    assert!(reader.has_table());
    assert_eq!(reader.read(LockTable::clone), table_after(7));
    assert_eq!(observed(&observer), vec![6, 7]);
    // A build now snapshots the whole state.
    let built = sm
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .expect("built");
    assert_eq!(built.meta.last_log_id.map(|id| id.index), Some(7));
}

/// An entry past the log as it opened (a new leader's) is never queued, nor is any entry of a
/// state machine opened without a log: their applies wait for the table. (An entry whose
/// proposer waits for its answer waits too; openraft alone makes such entries.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_past_the_log_wait_for_the_table() {
    for queue_until in [Some(4), None] {
        let (_dir, sm, gate, observer) = gated(queue_until).await;
        let what = format!("entry 5 with the log ending at {queue_until:?}");
        let sm = applied_once_loaded(sm, 5, gate, &what).await;
        assert_eq!(sm.reader().read(LockTable::clone), table_after(5));
        assert_eq!(observed(&observer), vec![5]);
    }
}

/// An install stops a load still running and drops the replay queued for it: the leader's
/// snapshot is the state, and the observer never learns the replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_install_stops_the_load_and_the_leaders_snapshot_is_the_state() {
    let (_dir, mut sm, gate, observer) = gated(Some(6)).await;
    let reader = sm.reader();
    apply_replay(&mut sm, [5, 6]).await;
    let sent = snapshot_holding("sent", 10).await;
    let cancel = sm.load_cancel().expect("a load runs");
    let install = tokio::spawn(async move {
        sm.install_snapshot(&sent.meta, sent.snapshot)
            .await
            .map(|()| sm)
    });
    while !cancel.load(Ordering::Acquire) {
        tokio::task::yield_now().await;
    }
    // The load goes on past its gate only once the install asked it to stop: it stops at
    // its first read.
    open_gate(gate).await;
    let mut sm = install.await.expect("task").expect("installed");
    let (applied, _) = sm.applied_state().await.expect("applied state");
    assert_eq!(applied.map(|id| id.index), Some(10));
    assert_eq!(
        reader.read_applied(|t| (t.session("sent").is_some(), t.session("own").is_some())),
        Some((true, false))
    );
    assert!(observed(&observer).is_empty());
    apply(&mut sm, [11])
        .await
        .expect("applies after the install");
}

/// Snapshot data that passes its checksum but is no table fails the load: nothing is
/// applied or built, and the leader's snapshot is still installed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_load_applies_nothing_and_still_installs_the_leaders_snapshot() {
    let dir = tempfile::tempdir().expect("temp dir");
    {
        let (snapshots, _) = SnapshotDir::open(Disk::Os, dir.path()).expect("open");
        let meta = SnapshotMeta {
            last_log_id: Some(LogId::new(
                LeaderId {
                    term: 1,
                    node_id: 1,
                },
                4,
            )),
            last_membership: Default::default(),
        };
        let framed = crate::storage::codec::encode_as(1, &"not a table").expect("framed");
        let mut incoming = snapshots
            .receive(&meta, framed.len() as u64)
            .expect("receive");
        incoming.write(&framed).expect("write");
        let mut data = incoming.finish().expect("checksum holds");
        snapshots
            .commit(data.take_received().expect("received"))
            .expect("commit");
    }
    let observer = Arc::new(Recorder::default());
    let mut sm = open_loading(dir.path(), observer, Some(4), None);
    let refused = apply(&mut sm, [5]).await.expect_err("no table to apply to");
    assert!(refused.to_string().contains("did not load"), "{refused}");
    assert!(!sm.reader().has_table());
    let build = sm.get_snapshot_builder().await.build_snapshot().await;
    assert!(build.is_err(), "no snapshot of a table that is not there");
    let sent = snapshot_holding("sent", 10).await;
    sm.install_snapshot(&sent.meta, sent.snapshot)
        .await
        .expect("installed");
    assert_eq!(
        sm.reader().read_applied(|t| t.session("sent").is_some()),
        Some(true)
    );
}
