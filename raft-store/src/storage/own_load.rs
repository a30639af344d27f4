//! The node's own snapshot, decoded on a thread of its own while the node starts.
//!
//! At a million held locks the decode takes about a second (docs/PERFORMANCE.md, session 27).
//! A node restarted after the leader purged past its log throws that table away for the
//! leader's snapshot as soon as the leader sends it. Decoded before the node starts, it made
//! every such catch-up a second longer; decoded behind the start, the node answers the leader
//! at once, the leader's snapshot travels while the own one decodes, and the install stops
//! the load instead of waiting for it. A node that does need its own table (the leader still
//! holds the log it missed) waits for the load at its first new entry, as it waited before.
//!
//! Owns the loader thread, its cancellation, and the entries queued meanwhile. openraft
//! re-applies the committed log after the snapshot before `Raft::new` returns
//! (`RaftLogStorage::read_committed`), and applies the rest of the node's log as the leader's
//! commit index reaches it. Entries the log held as it opened were proposed before this start,
//! so no caller waits for their answers: they are counted as applied at once (their log ids,
//! memberships and commands) and applied to the table once it is in, in log order, before any
//! later entry. An entry past them (a new leader's, this node's own as a leader), one whose
//! proposer waits for its answer, or more than the queue holds waits for the load instead.
//! Until the table is in, the state machine answers as during an install: nothing is read
//! from the applied state and a build waits. A snapshot smaller than
//! [`BACKGROUND_LOAD_MIN_BYTES`] is decoded as the node opens.

use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Instant;

use tokio::sync::watch;

use super::StorageError;
use super::snapshot;
use super::snapshot_data::SnapshotData;
use super::state_machine::{
    ApplyObserver, Presence, SharedState, TableState, apply_to_table, write_state,
};
use crate::Entry;

/// Snapshot data below this size is decoded as the node opens: a background load gains
/// nothing on a decode of a few tens of milliseconds.
pub(crate) const BACKGROUND_LOAD_MIN_BYTES: u64 = 16 << 20;

/// The nice value of the loader thread. The load may be thrown away: a restarted node that
/// receives the leader's snapshot meanwhile should receive it as fast as it can, and on a
/// machine whose cores are all busy the load goes after the transfer that may end it.
const LOAD_NICE: i32 = 10;

/// The most commands queued while the load runs (about 15 MB of entries); from there on the
/// applies wait for the load.
const QUEUE_COMMANDS_MAX: u64 = 100_000;

/// The entries of the node's own log applied while the load ran, for the load to apply to the
/// table once it is in.
#[derive(Debug)]
pub(super) struct Replay {
    /// The entries, in log order.
    entries: Vec<Entry>,
    /// Their commands.
    commands: u64,
    /// The last index of the log as it opened.
    until: Option<u64>,
}

impl Replay {
    /// An empty queue for the entries up to index `until`.
    pub(super) fn new(until: Option<u64>) -> Self {
        Replay {
            entries: Vec::new(),
            commands: 0,
            until,
        }
    }

    /// Whether `entries` (of `commands` commands) may wait in the queue: the log held them as
    /// it opened (none past `until`), no proposer waits for their answers (`answered`), and
    /// the queue stays within its bound.
    pub(super) fn accepts(&self, entries: &[Entry], answered: bool, commands: u64) -> bool {
        let last = entries.last().map(|e| e.log_id.index);
        let logged = matches!((last, self.until), (Some(last), Some(until)) if last <= until);
        !answered && logged && self.commands + commands <= QUEUE_COMMANDS_MAX
    }

    /// Queues `entries`, which [`Replay::accepts`].
    pub(super) fn push(&mut self, entries: Vec<Entry>, commands: u64) {
        self.commands += commands;
        self.entries.extend(entries);
    }

    /// The entries queued so far, leaving the queue empty.
    pub(super) fn take(&mut self) -> Vec<Entry> {
        self.commands = 0;
        std::mem::take(&mut self.entries)
    }
}

/// The load of the node's own snapshot, running on its thread. Dropping it cancels the load
/// without waiting for it.
#[derive(Debug)]
pub(super) struct OwnLoad {
    cancel: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// What the loader thread needs of the state machine.
pub(super) struct Target {
    /// The state the table goes into; its table state is [`TableState::Loading`].
    pub(super) state: SharedState,
    /// Set once the table is in, or the load failed.
    pub(super) presence: Arc<watch::Sender<Presence>>,
    /// Learns the events of the replayed entries.
    pub(super) observer: Option<Arc<dyn ApplyObserver>>,
    /// Tests: a barrier the load meets once before it decodes.
    #[cfg(test)]
    pub(super) gate: Option<Arc<std::sync::Barrier>>,
}

impl OwnLoad {
    /// Starts decoding `data`, the snapshot file `origin` covering the log up to `index`,
    /// into `target`.
    pub(super) fn start(
        target: Target,
        data: SnapshotData,
        origin: PathBuf,
        index: Option<u64>,
    ) -> Result<OwnLoad, StorageError> {
        let cancel = Arc::new(AtomicBool::new(false));
        let cancelled = cancel.clone();
        let path = origin.clone();
        let thread = std::thread::Builder::new()
            .name("lockd-own-snapshot".to_string())
            .spawn(move || {
                let (state, presence) = (target.state.clone(), target.presence.clone());
                let loading = AssertUnwindSafe(|| load(target, data, origin, index, &cancelled));
                // A panic (a broken invariant in the replay) must not leave the state
                // machine waiting for a table forever: the load failed.
                if std::panic::catch_unwind(loading).is_err() {
                    load_failed(&state, &presence, "the load panicked".to_string());
                }
            })
            .map_err(|source| StorageError::Io {
                op: "start a thread to load the snapshot",
                path,
                source,
            })?;
        Ok(OwnLoad {
            cancel,
            thread: Some(thread),
        })
    }

    /// Stops the load (an install replaces the table) and waits for its thread. Blocks: the
    /// thread notices within one buffer of the file, then frees what it decoded.
    pub(super) fn stop(mut self) {
        self.cancel.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            // A panic in the loader (an invariant check) is already reported by the thread;
            // the install goes on and replaces whatever it left.
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
impl OwnLoad {
    /// Tests: the flag [`OwnLoad::stop`] sets.
    pub(super) fn cancel_flag(&self) -> Arc<AtomicBool> {
        self.cancel.clone()
    }
}

impl Drop for OwnLoad {
    fn drop(&mut self) {
        self.cancel.store(true, Ordering::Release);
    }
}

/// Records that the load failed (`why`), unless an install took over meanwhile, and wakes
/// whoever waits for the table.
fn load_failed(state: &SharedState, presence: &watch::Sender<Presence>, why: String) {
    let mut state = write_state(state);
    if matches!(state.table_state, TableState::Loading(_)) {
        state.table_state = TableState::LoadFailed(why);
        drop(state);
        presence.send_replace(Presence::LoadFailed);
    }
}

/// The loader thread: decodes the table, applies the queued replay to it, puts it in.
fn load(
    target: Target,
    data: SnapshotData,
    origin: PathBuf,
    index: Option<u64>,
    cancel: &AtomicBool,
) {
    // Per thread on Linux (`setpriority(2)`, BUGS): only this thread goes after the others.
    if let Err(error) = rustix::process::setpriority_process(None, LOAD_NICE) {
        tracing::debug!(%error, "cannot lower the priority of the snapshot load");
    }
    #[cfg(test)]
    if let Some(gate) = &target.gate {
        gate.wait();
    }
    let started = Instant::now();
    let bytes = data.len();
    let decoded = snapshot::decode_table_streamed(&data, &origin, Some(cancel));
    drop(data);
    let mut table = match decoded {
        Ok(table) => table,
        Err(_) if cancel.load(Ordering::Acquire) => {
            tracing::info!(
                path = %origin.display(),
                index,
                loading_ms = started.elapsed().as_millis() as u64,
                "stopped loading the node's own snapshot: the leader's snapshot replaces it"
            );
            return;
        }
        Err(e) => {
            tracing::error!(
                path = %origin.display(),
                index,
                error = %e,
                "cannot load the node's own snapshot; this node applies nothing until the \
                 leader sends it a snapshot"
            );
            load_failed(&target.state, &target.presence, e.to_string());
            return;
        }
    };
    let decoded_ms = started.elapsed().as_millis() as u64;
    let mut replayed = 0usize;
    let (locks, sessions) = loop {
        let batch = {
            let mut state = write_state(&target.state);
            let TableState::Loading(replay) = &mut state.table_state else {
                // An install took over; it stops this thread before it does, so only a
                // thread it could not stop in time ends here.
                return;
            };
            let batch = replay.take();
            if batch.is_empty() {
                let counts = (table.grant_count(), table.session_count());
                state.table = std::mem::take(&mut table);
                state.table_state = TableState::Present;
                break counts;
            }
            batch
        };
        // Applied outside the state lock, to the table no one else sees yet; the observer
        // learns each batch in order before the table is in and any later entry applies.
        replayed += batch.len();
        let last = batch.last().map(|e| e.log_id.index);
        let mut events = Vec::new();
        for entry in batch {
            apply_to_table(&mut table, entry.payload, &mut events);
        }
        if let (Some(observer), Some(last)) = (&target.observer, last) {
            observer.applied(last, &events);
        }
    };
    target.presence.send_replace(Presence::Present);
    tracing::info!(
        path = %origin.display(),
        index,
        bytes,
        locks,
        sessions,
        took_ms = started.elapsed().as_millis() as u64,
        decoded_ms,
        replayed,
        "state loaded from the node's own snapshot in the background"
    );
}
