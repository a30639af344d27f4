//! The lock state machine as openraft sees it: [`RaftStateMachine`] and
//! [`RaftSnapshotBuilder`] around the pure [`LockTable`].
//!
//! Owns the applied state `{last_applied, last_membership, table}`, its snapshots (through
//! `snapshot`), the hand-off of each applied batch's events to an [`ApplyObserver`], and the
//! read view [`StateReader`] the node serves reads from. It decides nothing about locks: every
//! answer comes from [`LockTable::apply`], which also checks the table's invariants after every
//! command in debug builds.
//!
//! # Durability
//!
//! The state machine lives in memory and is **not** written on apply. Durable are the log (in
//! the log engine the node runs: lockd's own write-ahead log by default, or sled; see
//! `storage::engine`) and the snapshots (files). On restart the state machine is the last snapshot, and
//! openraft re-applies the log from the snapshot's last applied entry up to the saved committed
//! log id (`RaftLogStorage::read_committed`) before the node serves anything; since `apply` is
//! deterministic, that rebuilds the same table. openraft purges log entries only once a
//! snapshot covering them is durable, so nothing applied can be lost. Observers see replayed
//! entries again after a restart. A large snapshot is decoded behind the node's start
//! (`own_load`): until it is in, the state machine holds no table, as during an install.

use std::fmt;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Instant;

use futures::{Stream, TryStreamExt};
use openraft::storage::{EntryResponder, RaftStateMachine};
use openraft::{OptionalSend, RaftSnapshotBuilder};
use tokio::sync::watch;

use super::StorageError;
use super::disk::Disk;
use super::observer::StorageObserver;
use super::own_load::{BACKGROUND_LOAD_MIN_BYTES, OwnLoad, Replay, Target};
use super::snapshot::{self, SnapshotDir};
use super::snapshot_data::SnapshotInbox;
use super::snapshot_policy::{LogBytes, SnapshotPolicy, worth_building_at_stop};
use crate::command::{Command, Event, Response};
use crate::table::LockTable;
use crate::{
    Entry, EntryPayload, LogId, Request, Snapshot, SnapshotData, SnapshotMeta, StoredMembership,
    TypeConfig,
};

/// Learns what each applied batch of log entries did. Called on every replica after each
/// `apply` call with the index of the batch's last entry and the events of all its entries in
/// apply order (possibly none, e.g. for a blank entry). Called outside the state lock, so it may
/// read through a [`StateReader`]; it runs on openraft's apply path, so it must not block.
pub trait ApplyObserver: Send + Sync + 'static {
    /// Entries up to `log_index` were applied, producing `events`.
    fn applied(&self, log_index: u64, events: &[Event]);
}

/// What the state machine holds.
#[derive(Debug, Default)]
pub(super) struct AppliedState {
    /// The last applied entry's log id; `None` before any.
    last_applied: Option<LogId>,
    /// The last applied membership change.
    last_membership: StoredMembership,
    /// The lock table: the applied state only while `table_state` is
    /// [`TableState::Present`], else empty.
    pub(super) table: LockTable,
    /// Commands applied since the store opened (an entry counts its batch's commands, a blank
    /// or membership entry one): what the snapshot policy bounds a restart's replay by.
    commands_applied: u64,
    /// Whether `table` is the applied state.
    pub(super) table_state: TableState,
}

/// Whether [`AppliedState::table`] holds the applied state. While it does not, nothing may be
/// read from, applied to or snapshotted of the table.
#[derive(Debug, Default)]
pub(super) enum TableState {
    /// It does.
    #[default]
    Present,
    /// The node's own snapshot is being decoded behind the start (`own_load`); the entries of
    /// the node's own log applied meanwhile wait in the queue.
    Loading(Replay),
    /// The background load failed (the reason): nothing can be applied, and a snapshot from
    /// the leader can still be installed.
    LoadFailed(String),
    /// A snapshot install let go of the table and has not put the installed one in its
    /// place. Stays so if the install failed, which stops the node (openraft stops on any
    /// state machine error); a restart rebuilds the table from this node's own disk.
    Released,
}

impl TableState {
    fn is_present(&self) -> bool {
        matches!(self, TableState::Present)
    }
}

/// What [`TableState`] says of the table, as a watch publishes it: readers check it without
/// the state lock, an apply or a build waits on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Presence {
    /// The table holds the applied state.
    Present,
    /// It is loading, or an install holds it.
    Absent,
    /// The background load failed.
    LoadFailed,
}

impl Presence {
    /// Whether waiting for the table is over: it is there, or will not come.
    fn settled(&self) -> bool {
        *self != Presence::Absent
    }
}

impl AppliedState {
    /// Records `entry` as applied, all but its effect on the table: its log id, its
    /// membership, its commands.
    fn note_applied(&mut self, entry: &Entry) {
        self.last_applied = Some(entry.log_id);
        self.commands_applied += commands_of(entry);
        if let EntryPayload::Membership(membership) = &entry.payload {
            self.last_membership = StoredMembership::new(Some(entry.log_id), membership.clone());
        }
    }
}

/// What `payload` does to `table` ([`AppliedState::note_applied`] records the rest): a
/// command's answer, [`Response::NoCommand`] for a blank or membership entry.
pub(super) fn apply_to_table(
    table: &mut LockTable,
    payload: EntryPayload,
    events: &mut Vec<Event>,
) -> Response {
    match payload {
        EntryPayload::Normal(request) => table.apply(request.stamp_ms, request.command, events),
        EntryPayload::Blank | EntryPayload::Membership(_) => Response::NoCommand,
    }
}

/// The commands `entry` counts for the snapshot policy: a batch's commands, else one.
fn commands_of(entry: &Entry) -> u64 {
    match &entry.payload {
        EntryPayload::Normal(Request {
            command: Command::Batch(commands),
            ..
        }) => commands.len().max(1) as u64,
        _ => 1,
    }
}

/// The applied state, shared by the state machine, its readers, builds and the own load.
pub(super) type SharedState = Arc<RwLock<AppliedState>>;

fn read_state(state: &RwLock<AppliedState>) -> RwLockReadGuard<'_, AppliedState> {
    // A poisoned lock means an apply panicked half-way (an invariant broke): the table cannot be
    // trusted, and the node is already going down with that panic.
    state
        .read()
        .unwrap_or_else(|_| panic!("lock state machine poisoned: an earlier apply panicked"))
}

pub(super) fn write_state(state: &RwLock<AppliedState>) -> RwLockWriteGuard<'_, AppliedState> {
    state
        .write()
        .unwrap_or_else(|_| panic!("lock state machine poisoned: an earlier apply panicked"))
}

/// How a state machine opens with its own snapshot.
#[derive(Clone, Debug)]
pub(crate) struct OwnSnapshot {
    /// Snapshot data of at least this many bytes is decoded behind the start (`own_load`);
    /// smaller data as the store opens.
    pub(crate) background_from: u64,
    /// The last index of the log as it opened: the entries up to it, proposed before this
    /// start, may be queued while the snapshot loads.
    pub(crate) queue_until: Option<u64>,
    /// Tests: a barrier the load meets once before it decodes.
    #[cfg(test)]
    pub(crate) gate: Option<Arc<std::sync::Barrier>>,
}

impl Default for OwnSnapshot {
    /// A large snapshot loads behind the start; no replay is known.
    fn default() -> Self {
        OwnSnapshot {
            background_from: BACKGROUND_LOAD_MIN_BYTES,
            queue_until: None,
            #[cfg(test)]
            gate: None,
        }
    }
}

/// The lock state machine. Give it to `openraft::Raft::new`; keep a [`StateReader`] from
/// [`StateMachineStore::reader`] to serve reads.
pub struct StateMachineStore {
    state: SharedState,
    snapshots: Arc<SnapshotDir>,
    observer: Option<Arc<dyn ApplyObserver>>,
    /// Learns each snapshot build's duration and size.
    storage: Option<Arc<dyn StorageObserver>>,
    /// When a snapshot openraft asks for is worth building.
    policy: SnapshotPolicy,
    /// The log store's count of bytes written; `None` (a state machine opened alone) builds
    /// every snapshot openraft asks for.
    log_bytes: Option<Arc<LogBytes>>,
    /// Where the last snapshot left the policy's inputs.
    mark: Arc<SnapshotMark>,
    /// Whether the table is there, for a build or an apply to wait on and for readers to
    /// check without the state lock.
    presence: Arc<watch::Sender<Presence>>,
    /// The background load of this node's own snapshot, while it may still run.
    own_load: Option<OwnLoad>,
    /// Set by [`StopSnapshot::request`]: the next build openraft asks for goes ahead whatever
    /// the policy says.
    stop_request: Arc<AtomicBool>,
    /// Tests: a barrier every build meets twice between taking its view and encoding it.
    #[cfg(test)]
    build_gate: Option<Arc<std::sync::Barrier>>,
    /// Tests: a barrier every install meets twice once it has let go of the old table.
    #[cfg(test)]
    install_gate: Option<Arc<std::sync::Barrier>>,
}

/// The last snapshot as the policy sees it.
#[derive(Debug, Default)]
struct SnapshotMark {
    /// Its data's size.
    snapshot_bytes: AtomicU64,
    /// The log store's byte count when its state was taken.
    log_bytes_at: AtomicU64,
    /// The state machine's count of applied commands when its state was taken.
    commands_at: AtomicU64,
    /// Snapshots this node built since it opened (the stagger's round).
    built: AtomicU64,
}

impl SnapshotMark {
    /// Commands applied to `state` since the state of the last snapshot.
    fn commands_since(&self, state: &RwLock<AppliedState>) -> u64 {
        read_state(state)
            .commands_applied
            .saturating_sub(self.commands_at.load(Ordering::Relaxed))
    }

    fn set(&self, snapshot_bytes: u64, log_bytes_at: u64, commands_at: u64) {
        self.snapshot_bytes.store(snapshot_bytes, Ordering::Relaxed);
        self.log_bytes_at.store(log_bytes_at, Ordering::Relaxed);
        self.commands_at.store(commands_at, Ordering::Relaxed);
    }
}

impl fmt::Debug for StateMachineStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StateMachineStore")
            .field("snapshots", &self.snapshots.dir())
            .field("observer", &self.observer.is_some())
            .finish_non_exhaustive()
    }
}

impl StateMachineStore {
    /// Opens the snapshot directory and starts from its newest snapshot (or an empty table).
    /// A corrupt snapshot file refuses to open, naming the file.
    pub fn open(
        snapshot_dir: &Path,
        observer: Option<Arc<dyn ApplyObserver>>,
    ) -> Result<StateMachineStore, StorageError> {
        StateMachineStore::open_on(
            Disk::Os,
            snapshot_dir,
            observer,
            None,
            OwnSnapshot::default(),
        )
    }

    /// [`StateMachineStore::open`] with the snapshot files on `disk`, loading its own snapshot
    /// as `own` says.
    pub(crate) fn open_on(
        disk: Disk,
        snapshot_dir: &Path,
        observer: Option<Arc<dyn ApplyObserver>>,
        storage: Option<Arc<dyn StorageObserver>>,
        own: OwnSnapshot,
    ) -> Result<StateMachineStore, StorageError> {
        let (snapshots, current) = SnapshotDir::open(disk, snapshot_dir)?;
        let mark = SnapshotMark::default();
        let mut background = None;
        let state = match current {
            None => AppliedState::default(),
            Some((meta, data)) => {
                mark.set(data.len(), 0, 0);
                let origin = snapshots
                    .current_path()
                    .unwrap_or_else(|| snapshot_dir.to_path_buf());
                let (table, table_state) = if data.len() >= own.background_from {
                    let index = meta.last_log_id.map(|id| id.index);
                    background = Some((data, origin, index));
                    (
                        LockTable::default(),
                        TableState::Loading(Replay::new(own.queue_until)),
                    )
                } else {
                    // Read from the file a buffer at a time, as an install reads the one it
                    // received: the file was verified as the directory opened.
                    let started = Instant::now();
                    let table = snapshot::decode_table_streamed(&data, &origin, None)?;
                    tracing::info!(
                        path = %origin.display(),
                        index = meta.last_log_id.map(|id| id.index),
                        bytes = data.len(),
                        locks = table.grant_count(),
                        sessions = table.session_count(),
                        took_ms = started.elapsed().as_millis() as u64,
                        "state loaded from the node's own snapshot"
                    );
                    (table, TableState::Present)
                };
                AppliedState {
                    last_applied: meta.last_log_id,
                    last_membership: meta.last_membership,
                    table,
                    commands_applied: 0,
                    table_state,
                }
            }
        };
        let state = Arc::new(RwLock::new(state));
        let presence = Arc::new(watch::Sender::new(if background.is_some() {
            Presence::Absent
        } else {
            Presence::Present
        }));
        let own_load = match background {
            Some((data, origin, index)) => {
                let target = Target {
                    state: state.clone(),
                    presence: presence.clone(),
                    observer: observer.clone(),
                    #[cfg(test)]
                    gate: own.gate.clone(),
                };
                Some(OwnLoad::start(target, data, origin, index)?)
            }
            None => None,
        };
        Ok(StateMachineStore {
            state,
            snapshots: Arc::new(snapshots),
            observer,
            storage,
            policy: SnapshotPolicy::default(),
            log_bytes: None,
            mark: Arc::new(mark),
            presence,
            own_load,
            stop_request: Arc::new(AtomicBool::new(false)),
            #[cfg(test)]
            build_gate: None,
            #[cfg(test)]
            install_gate: None,
        })
    }

    /// Decides the snapshots openraft asks for by `log_bytes`, the log store's count of bytes
    /// written ([`SnapshotPolicy`]); `storage::open` wires it.
    pub fn with_log_bytes(mut self, log_bytes: Arc<LogBytes>) -> Self {
        self.log_bytes = Some(log_bytes);
        self
    }

    /// Builds snapshots by `policy` from now on (the default is [`SnapshotPolicy::default`],
    /// not staggered by a node id).
    pub fn set_snapshot_policy(&mut self, policy: SnapshotPolicy) {
        self.policy = policy;
    }

    /// The snapshot policy in force.
    pub fn snapshot_policy(&self) -> &SnapshotPolicy {
        &self.policy
    }

    /// Whether a snapshot is due now by the policy (always, without a log byte count): by the
    /// log bytes written since the last one, or by the commands applied since it (replayed ones
    /// included: a node that restarted counts the log it re-applied).
    pub fn snapshot_due(&self) -> bool {
        let Some(log_bytes) = &self.log_bytes else {
            return true;
        };
        let since = log_bytes
            .get()
            .saturating_sub(self.mark.log_bytes_at.load(Ordering::Relaxed));
        let built = self.mark.built.load(Ordering::Relaxed);
        self.policy.due(
            since,
            self.mark.snapshot_bytes.load(Ordering::Relaxed),
            built,
        ) || self
            .policy
            .replay_due(self.commands_since_snapshot(), built)
    }

    /// Commands applied since the state of the last snapshot (built, installed or opened).
    pub fn commands_since_snapshot(&self) -> u64 {
        self.mark.commands_since(&self.state)
    }

    /// The handle a node keeps, once openraft owns this state machine, to build a last
    /// snapshot as it stops ([`StopSnapshot`]).
    pub fn stop_snapshot(&self) -> StopSnapshot {
        StopSnapshot {
            state: self.state.clone(),
            mark: self.mark.clone(),
            request: self.stop_request.clone(),
        }
    }

    fn builder(&self) -> SnapshotBuilder {
        SnapshotBuilder {
            state: self.state.clone(),
            snapshots: self.snapshots.clone(),
            storage: self.storage.clone(),
            log_bytes: self.log_bytes.clone(),
            mark: self.mark.clone(),
            presence: self.presence.clone(),
            #[cfg(test)]
            build_gate: self.build_gate.clone(),
        }
    }

    /// Applies committed entries in order under one write lock, tells the observer once, and
    /// returns each entry's answer ([`Response::NoCommand`] for blank and membership entries).
    /// openraft's `apply` goes through here; tools and tests may drive the state machine with
    /// it directly. The observer runs before any answer leaves: whoever gets an answer may rely
    /// on the observer having seen its events. Not after a failed install
    /// ([`RaftStateMachine::install_snapshot`]): openraft's `apply` refuses to then.
    pub fn apply_entries(&self, entries: impl IntoIterator<Item = Entry>) -> Vec<Response> {
        let entries = entries.into_iter();
        let mut answers = Vec::with_capacity(entries.size_hint().0);
        let mut events = Vec::new();
        let mut last_index = None;
        {
            let mut state = write_state(&self.state);
            for entry in entries {
                last_index = Some(entry.log_id.index);
                state.note_applied(&entry);
                answers.push(apply_to_table(&mut state.table, entry.payload, &mut events));
            }
        }
        if let (Some(observer), Some(log_index)) = (&self.observer, last_index) {
            observer.applied(log_index, &events);
        }
        answers
    }

    /// `entries` while the table is absent: queued for the load if they may wait there (the
    /// answer is `None`: they count as applied), else given back once the table is in. An
    /// error if it never will be (a failed load or install). Only a load or an install
    /// changes the table's presence, and an install never runs beside an apply.
    async fn queue_or_wait(
        &self,
        mut entries: Vec<Entry>,
        answered: bool,
    ) -> Result<Option<Vec<Entry>>, io::Error> {
        let commands: u64 = entries.iter().map(commands_of).sum();
        let mut presence = self.presence.subscribe();
        loop {
            {
                let mut guard = write_state(&self.state);
                let state = &mut *guard;
                let failed = match &state.table_state {
                    TableState::Present => return Ok(Some(entries)),
                    TableState::Loading(replay) if replay.accepts(&entries, answered, commands) => {
                        // Counted as applied now (openraft goes on with its start, or with
                        // the leader's commit); the load applies them to the table before
                        // any later entry.
                        for entry in &entries {
                            state.note_applied(entry);
                        }
                        if let TableState::Loading(replay) = &mut state.table_state {
                            replay.push(std::mem::take(&mut entries), commands);
                        }
                        return Ok(None);
                    }
                    TableState::Loading(_) => None,
                    TableState::LoadFailed(why) => Some(format!(
                        "the node's own snapshot did not load ({why}); the state machine has \
                         no table to apply to until the leader sends a snapshot"
                    )),
                    TableState::Released => Some(
                        "a failed snapshot install left the state machine without its table; \
                         restart the node to rebuild it from its own snapshot and log"
                            .to_string(),
                    ),
                };
                if let Some(message) = failed {
                    return Err(to_io(StorageError::Layout {
                        path: self.snapshots.dir().to_path_buf(),
                        message,
                    }));
                }
            }
            // Not for the queue: these entries need the table.
            if presence.wait_for(Presence::settled).await.is_err() {
                return Err(to_io(StorageError::Layout {
                    path: self.snapshots.dir().to_path_buf(),
                    message: "the state machine closed while its snapshot loaded".to_string(),
                }));
            }
        }
    }

    /// Where the transport writes the snapshots a leader sends, for this state machine to
    /// install.
    pub fn inbox(&self) -> SnapshotInbox {
        SnapshotInbox(self.snapshots.clone())
    }

    /// A read view of the applied state, for serving reads.
    pub fn reader(&self) -> StateReader {
        StateReader {
            state: self.state.clone(),
            presence: self.presence.subscribe(),
        }
    }
}

/// A stopping node's say over its last snapshot, from [`StateMachineStore::stop_snapshot`].
///
/// A restart re-applies every command since the node's last snapshot before it serves, up to
/// [`SnapshotPolicy::replay_commands_max`] (1–2 s at a million held locks). A node that stops
/// cleanly can build a snapshot first when that replay would take longer than the build
/// ([`worth_building_at_stop`]); openraft builds only when asked, and asks the state machine,
/// whose policy would refuse, so [`StopSnapshot::request`] makes the next ask go ahead.
#[derive(Clone)]
pub struct StopSnapshot {
    state: SharedState,
    mark: Arc<SnapshotMark>,
    request: Arc<AtomicBool>,
}

impl fmt::Debug for StopSnapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StopSnapshot")
            .field("requested", &self.request.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl StopSnapshot {
    /// The commands a restart would re-apply now, if building a snapshot first costs less
    /// than that replay; `None` if it does not (nothing to replay, or too little for the
    /// size of the table).
    pub fn worth_building(&self) -> Option<u64> {
        let commands = self.mark.commands_since(&self.state);
        worth_building_at_stop(commands, self.mark.snapshot_bytes.load(Ordering::Relaxed))
            .then_some(commands)
    }

    /// Makes the next snapshot openraft asks for be built whatever the policy says (then ask
    /// openraft with `Raft::trigger().snapshot()`). Only that one build: the request is spent
    /// on it.
    pub fn request(&self) {
        self.request.store(true, Ordering::Release);
    }
}

/// A read view of the applied state. Cheap to clone; every read takes the state's read lock for
/// the duration of the closure only.
#[derive(Clone)]
pub struct StateReader {
    state: SharedState,
    presence: watch::Receiver<Presence>,
}

impl fmt::Debug for StateReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StateReader")
            .field("last_applied", &self.last_applied())
            .finish_non_exhaustive()
    }
}

impl StateReader {
    /// Runs `f` on the lock table as of the last applied entry. Keep `f` short: applies wait
    /// for it.
    ///
    /// While a snapshot install replaces the table, or the node's own snapshot still loads,
    /// the table `f` sees is empty: the leader's paths may use this once
    /// [`StateReader::has_table`] said so (a leader never installs, and a load never comes
    /// back once done); a node's own answers use [`StateReader::read_applied`].
    pub fn read<R>(&self, f: impl FnOnce(&LockTable) -> R) -> R {
        f(&read_state(&self.state).table)
    }

    /// Runs `f` on the lock table as of the last applied entry, or answers `None` while a
    /// snapshot install replaces it (the node has no applied state to answer from then: the
    /// install let go of its own table before decoding the one it received).
    pub fn read_applied<R>(&self, f: impl FnOnce(&LockTable) -> R) -> Option<R> {
        let state = read_state(&self.state);
        state.table_state.is_present().then(|| f(&state.table))
    }

    /// Whether the table holds the applied state: `false` while a snapshot install replaces
    /// it, and while the node's own snapshot still loads behind its start (`own_load`). A
    /// node can lead before its own snapshot has loaded (a whole cluster restarted); its
    /// leader paths check this before they [`StateReader::read`].
    pub fn has_table(&self) -> bool {
        *self.presence.borrow() == Presence::Present
    }

    /// The last applied entry's log id; `None` before any.
    pub fn last_applied(&self) -> Option<LogId> {
        read_state(&self.state).last_applied
    }

    /// The last applied membership.
    pub fn membership(&self) -> StoredMembership {
        read_state(&self.state).last_membership.clone()
    }
}

/// Wraps a storage error for openraft, which stops the node on any.
fn to_io(e: StorageError) -> io::Error {
    io::Error::other(e)
}

/// A failed blocking task (a panic while writing or reading a snapshot file) as a storage error.
fn join_error(op: &'static str, dir: &Path, join: tokio::task::JoinError) -> io::Error {
    to_io(StorageError::Io {
        op,
        path: dir.to_path_buf(),
        source: io::Error::other(join.to_string()),
    })
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotData = SnapshotData;
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), io::Error> {
        let state = read_state(&self.state);
        Ok((state.last_applied, state.last_membership.clone()))
    }

    /// Applies the entries ([`StateMachineStore::apply_entries`]), then answers each entry's
    /// proposer through its responder, in log order, outside the state lock. On the leader the
    /// responder is a [`crate::CallbackResponder`]: the callers get their answers in this call.
    async fn apply<Strm>(&mut self, entries: Strm) -> Result<(), io::Error>
    where
        Strm: Stream<Item = Result<EntryResponder<TypeConfig>, io::Error>> + Unpin + OptionalSend,
    {
        // The stream may wait on the log between entries, so it is drained before the
        // (blocking) state lock is taken.
        let (entries, responders): (Vec<_>, Vec<_>) =
            entries.try_collect::<Vec<_>>().await?.into_iter().unzip();
        // The table is there but for a node's first second at a large state: a look at the
        // watch, not the state lock, on every other apply.
        let entries = if *self.presence.borrow() == Presence::Present {
            entries
        } else {
            let answered = responders.iter().any(Option::is_some);
            match self.queue_or_wait(entries, answered).await? {
                Some(entries) => entries,
                None => return Ok(()),
            }
        };
        let answers = self.apply_entries(entries);
        for (responder, answer) in responders.into_iter().zip(answers) {
            if let Some(responder) = responder {
                responder.send(answer);
            }
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.builder()
    }

    /// A builder if `force`d or if the [`SnapshotPolicy`] finds a snapshot due; `None` defers
    /// openraft's periodic ask to its next one.
    async fn try_create_snapshot_builder(&mut self, force: bool) -> Option<Self::SnapshotBuilder> {
        let requested = self.stop_request.swap(false, Ordering::AcqRel);
        if !force && !requested && !self.snapshot_due() {
            tracing::debug!(
                snapshot_bytes = self.mark.snapshot_bytes.load(Ordering::Relaxed),
                "snapshot not due yet by the log written since the last one"
            );
            return None;
        }
        Some(self.builder())
    }

    /// Installs the snapshot a leader sent. Its data is verified (size, version, checksum)
    /// first; then the node lets go of its own table, so that the old table and the new one
    /// are never in memory together (at a million held locks that is the difference between
    /// a peak under 512 MiB and one near 800: docs/PERFORMANCE.md, session 14). Until the new
    /// table is in place, [`StateReader::read_applied`] answers `None` and a build waits. Data
    /// that passes the checksum but does not decode into a table that keeps every invariant
    /// fails the install, which stops the node: its own snapshot file is still current, and a
    /// restart rebuilds its table from that and its log.
    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: SnapshotData,
    ) -> Result<(), io::Error> {
        let data_len = snapshot.len();
        let started = Instant::now();
        // Decoding (and checking) a large table takes a while: off the runtime's threads, and
        // without the state lock, which is taken only to let go of the old table and to put
        // the new one in.
        let snapshots = self.snapshots.clone();
        let state = self.state.clone();
        let presence = self.presence.clone();
        let own_load = self.own_load.take();
        let file_meta = meta.clone();
        #[cfg(test)]
        let gate = self.install_gate.clone();
        let (table, released, decoded) = tokio::task::spawn_blocking(move || {
            // The transport hands over a received file of this directory, written, checked
            // and synced as it arrived (`Incoming`); other data (tests, tools) is copied into
            // one first, which checks it the same way. Either way the data is sound before
            // the node lets go of its table.
            let mut data = if snapshot.is_received() {
                snapshot
            } else {
                received_copy(&snapshots, &file_meta, &snapshot)?
            };
            let prepared = data.take_received().ok_or_else(|| StorageError::Layout {
                path: snapshots.dir().to_path_buf(),
                message: "snapshot: a received snapshot without its file".to_string(),
            })?;
            // A load of the node's own snapshot still running is of no use now: stopped, and
            // what it decoded freed, before the decode below allocates.
            if let Some(load) = own_load {
                load.stop();
            }
            let own = {
                let mut state = write_state(&state);
                // Entries still queued for a load go with the table they were for: openraft
                // applied them, so they were committed, and it installs only a snapshot past
                // its committed index.
                state.table_state = TableState::Released;
                presence.send_replace(Presence::Absent);
                std::mem::take(&mut state.table)
            };
            // Freed here, before the decode allocates: the decode reuses the memory.
            let releasing = Instant::now();
            drop(own);
            let released = releasing.elapsed();
            #[cfg(test)]
            if let Some(gate) = gate {
                gate.wait();
                gate.wait();
            }
            // Read from the file a buffer at a time, while another thread makes the file
            // durable; it becomes the current snapshot only once it is durable and the table
            // decoded and checked, before the table is replaced: once it is, the log before
            // it may be purged.
            let decoding = Instant::now();
            let (table, synced) = std::thread::scope(|scope| {
                let syncing = scope.spawn(|| data.sync());
                let table = snapshot::decode_table_streamed(&data, prepared.temp(), None);
                (table, syncing.join())
            });
            let decoded = decoding.elapsed();
            drop(data);
            let synced = synced.unwrap_or_else(|_| {
                Err(StorageError::Io {
                    op: "fsync snapshot data in",
                    path: prepared.temp().to_path_buf(),
                    source: io::Error::other("the syncing thread panicked"),
                })
            });
            match table.and_then(|table| synced.map(|()| table)) {
                Ok(table) => {
                    snapshots.commit(prepared)?;
                    Ok::<_, StorageError>((table, released, decoded))
                }
                Err(refused) => {
                    snapshots.abandon(prepared);
                    Err(refused)
                }
            }
        })
        .await
        .map_err(|join| join_error("install snapshot into", self.snapshots.dir(), join))?
        .map_err(to_io)?;
        tracing::info!(
            index = meta.last_log_id.map(|id| id.index),
            bytes = data_len,
            locks = table.grant_count(),
            sessions = table.session_count(),
            took_ms = started.elapsed().as_millis() as u64,
            released_ms = released.as_millis() as u64,
            decoded_ms = decoded.as_millis() as u64,
            "installed the leader's snapshot"
        );
        let commands_now = {
            let mut state = write_state(&self.state);
            // The count goes on across the install, so a build that took its view before it
            // cannot move the mark back.
            state.last_applied = meta.last_log_id;
            state.last_membership = meta.last_membership.clone();
            state.table = table;
            state.table_state = TableState::Present;
            state.commands_applied
        };
        self.presence.send_replace(Presence::Present);
        let log_bytes_now = self.log_bytes.as_ref().map_or(0, |l| l.get());
        self.mark.set(data_len, log_bytes_now, commands_now);
        Ok(())
    }

    /// The current snapshot, its data a range of its open file (verified, never read whole
    /// into memory: the transport reads it a chunk at a time as it sends).
    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, io::Error> {
        let snapshots = self.snapshots.clone();
        let current = tokio::task::spawn_blocking(move || snapshots.open_current())
            .await
            .map_err(|join| join_error("read snapshot from", self.snapshots.dir(), join))?
            .map_err(to_io)?;
        Ok(current.map(|(meta, snapshot)| Snapshot { meta, snapshot }))
    }
}

/// `data` copied into a received snapshot file of `snapshots` for `meta`, a buffer at a time,
/// and checked as the transport's are. Blocks on the disk.
fn received_copy(
    snapshots: &SnapshotDir,
    meta: &SnapshotMeta,
    data: &SnapshotData,
) -> Result<SnapshotData, StorageError> {
    let mut incoming = snapshots.receive(meta, data.len())?;
    let mut buffer = vec![0u8; COPY_BUFFER];
    while incoming.written() < data.len() {
        let left = data.len() - incoming.written();
        let chunk =
            &mut buffer[..usize::try_from(left).map_or(COPY_BUFFER, |l| l.min(COPY_BUFFER))];
        data.read_at(incoming.written(), chunk)
            .map_err(|source| StorageError::Io {
                op: "read snapshot data to install from",
                path: data.path().unwrap_or(snapshots.dir()).to_path_buf(),
                source,
            })?;
        incoming.write(chunk)?;
    }
    incoming.finish()
}

/// Bytes [`received_copy`] copies at a time.
const COPY_BUFFER: usize = 1 << 20;

/// Builds a snapshot of the state machine as it is when [`RaftSnapshotBuilder::build_snapshot`]
/// runs, writes it durably, and makes it the current snapshot. The [`Snapshot`] a build
/// returns carries the metadata and **no data** (an empty cursor), which is all openraft reads
/// of it; the data is in the file, and [`RaftStateMachine::get_current_snapshot`] reads it.
pub struct SnapshotBuilder {
    state: SharedState,
    snapshots: Arc<SnapshotDir>,
    storage: Option<Arc<dyn StorageObserver>>,
    log_bytes: Option<Arc<LogBytes>>,
    mark: Arc<SnapshotMark>,
    presence: Arc<watch::Sender<Presence>>,
    #[cfg(test)]
    build_gate: Option<Arc<std::sync::Barrier>>,
}

impl fmt::Debug for SnapshotBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SnapshotBuilder")
            .field("snapshots", &self.snapshots.dir())
            .finish_non_exhaustive()
    }
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    type SnapshotData = SnapshotData;

    async fn build_snapshot(&mut self) -> Result<Snapshot, io::Error> {
        let started = std::time::Instant::now();
        // The read lock is held only to clone the table, which shares every chunk with it
        // (`LockTable`'s docs): applies go on while the clone is encoded and written on a
        // blocking thread, copying only the chunks they change meanwhile.
        let mut presence = self.presence.subscribe();
        let (meta, table, log_bytes_at, commands_at) = loop {
            // An install holds no table to build from until it has put the new one in, nor
            // does the node while its own snapshot loads: the build waits for the table and
            // snapshots it then. (If the install failed, the node is stopping and the build
            // never finishes.)
            if presence.wait_for(Presence::settled).await.is_err() {
                return Err(to_io(StorageError::Layout {
                    path: self.snapshots.dir().to_path_buf(),
                    message: "the state machine closed during a snapshot build".to_string(),
                }));
            }
            let state = read_state(&self.state);
            match &state.table_state {
                TableState::Present => {}
                TableState::LoadFailed(why) => {
                    return Err(to_io(StorageError::Layout {
                        path: self.snapshots.dir().to_path_buf(),
                        message: format!(
                            "no snapshot can be built: the node's own snapshot did not load \
                             ({why})"
                        ),
                    }));
                }
                TableState::Loading(_) | TableState::Released => continue,
            }
            let meta = SnapshotMeta {
                last_log_id: state.last_applied,
                last_membership: state.last_membership.clone(),
            };
            let log_bytes_at = self.log_bytes.as_ref().map_or(0, |l| l.get());
            break (
                meta,
                state.table.clone(),
                log_bytes_at,
                state.commands_applied,
            );
        };
        let snapshots = self.snapshots.clone();
        let file_meta = meta.clone();
        // The last snapshot's size (built, installed or found at open) sizes the new file's head.
        let last_len = self.mark.snapshot_bytes.load(Ordering::Relaxed);
        #[cfg(test)]
        let gate = self.build_gate.clone();
        // Encoded straight into the file (`SnapshotDir::write_table`): the build holds a
        // buffer, not a copy of the snapshot.
        let data_len = tokio::task::spawn_blocking(move || {
            #[cfg(test)]
            if let Some(gate) = gate {
                gate.wait();
                gate.wait();
            }
            snapshots.write_table(&file_meta, table, last_len)
        })
        .await
        .map_err(|join| join_error("write snapshot into", self.snapshots.dir(), join))?
        .map_err(to_io)?;
        self.mark.set(data_len, log_bytes_at, commands_at);
        self.mark.built.fetch_add(1, Ordering::Relaxed);
        if let Some(storage) = &self.storage {
            storage.snapshot_built(started.elapsed(), data_len);
        }
        // openraft takes only the metadata of a snapshot it had built (`core/sm/worker.rs`:
        // `BuildSnapshotDone(meta)`) and sends a follower the current one, read from its file
        // (`get_current_snapshot`): the data is not read back.
        Ok(Snapshot {
            meta,
            snapshot: SnapshotData::empty(),
        })
    }
}

#[cfg(test)]
impl StateMachineStore {
    /// Tests: the flag that stops the background load, while one may run.
    pub(super) fn load_cancel(&self) -> Option<Arc<AtomicBool>> {
        self.own_load.as_ref().map(OwnLoad::cancel_flag)
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::storage::snapshot_policy::STOP_SNAPSHOT_BYTES_PER_COMMAND;
    use crate::{Command, LeaderId, Membership, Node, Request};

    /// Records every batch an observer learns: its last index and its events.
    #[derive(Default)]
    pub(in crate::storage) struct Recorder(pub(in crate::storage) Mutex<Vec<(u64, Vec<Event>)>>);

    impl ApplyObserver for Recorder {
        fn applied(&self, log_index: u64, events: &[Event]) {
            self.0
                .lock()
                .expect("recorder lock")
                .push((log_index, events.to_vec()));
        }
    }

    /// An entry of term 1 at `index`.
    pub(in crate::storage) fn entry(index: u64, payload: EntryPayload) -> Entry {
        Entry {
            log_id: LogId::new(
                LeaderId {
                    term: 1,
                    node_id: 1,
                },
                index,
            ),
            payload,
        }
    }

    /// Opens `session_id` for "owner".
    pub(in crate::storage) fn open_session(session_id: &str) -> EntryPayload {
        EntryPayload::Normal(Request {
            stamp_ms: 1_000,
            command: Command::OpenSession {
                session_id: session_id.to_string(),
                owner_id: "owner".to_string(),
                ttl_ms: 5_000,
            },
        })
    }

    /// A build takes its view under the state lock and encodes it without: entries applied
    /// while it encodes go through (a build holding the lock would block them, and this test
    /// with it), and the snapshot is the state as of the view, not as of the applies.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn applies_proceed_while_a_snapshot_is_built_from_the_state_before_them() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut sm = StateMachineStore::open(dir.path(), None).expect("open");
        let gate = Arc::new(std::sync::Barrier::new(2));
        sm.build_gate = Some(gate.clone());
        let reader = sm.reader();
        sm.apply_entries([entry(1, open_session("before"))]);
        let mut builder = sm.get_snapshot_builder().await;
        let build = tokio::spawn(async move { builder.build_snapshot().await });
        let mut sm = tokio::task::spawn_blocking(move || {
            // The builder has taken its view and waits before encoding it.
            gate.wait();
            sm.apply_entries([entry(2, open_session("during"))]);
            gate.wait();
            sm
        })
        .await
        .expect("applier");
        let snapshot = build.await.expect("build task").expect("built");
        assert_eq!(snapshot.meta.last_log_id.map(|id| id.index), Some(1));
        assert!(snapshot.snapshot.is_empty(), "a build returns no data");
        let current = sm
            .get_current_snapshot()
            .await
            .expect("read")
            .expect("the built snapshot is current");
        assert_eq!(current.meta, snapshot.meta);
        let table = snapshot::decode_table(&current.snapshot.to_vec().expect("reads"), dir.path())
            .expect("decodes");
        assert!(table.session("before").is_some());
        assert!(
            table.session("during").is_none(),
            "the snapshot is the view's state"
        );
        assert!(reader.read(|t| t.session("during").is_some()));
        drop(sm);
    }

    /// The snapshot data of a state machine holding session `session` at index `index`.
    /// A leader's snapshot at `index` holding one session, `session`.
    pub(in crate::storage) async fn snapshot_holding(session: &str, index: u64) -> Snapshot {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut sm = StateMachineStore::open(dir.path(), None).expect("open");
        sm.apply_entries([entry(index, open_session(session))]);
        sm.get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .expect("built");
        sm.get_current_snapshot()
            .await
            .expect("read")
            .expect("current")
    }

    /// An install lets go of the node's own table before it decodes the one it received, so
    /// the two are never held together: meanwhile the node answers no read from its applied
    /// state, and a build started then waits and snapshots the installed state (one that
    /// went ahead would write an empty table as the state at the node's old index).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_install_lets_go_of_the_old_table_first_and_a_build_meanwhile_waits_for_it() {
        let sent = snapshot_holding("sent", 5).await;
        let dir = tempfile::tempdir().expect("temp dir");
        let mut sm = StateMachineStore::open(dir.path(), None).expect("open");
        let gate = Arc::new(std::sync::Barrier::new(2));
        sm.install_gate = Some(gate.clone());
        let reader = sm.reader();
        let installs = sm.presence.clone();
        let watching = installs.receiver_count();
        sm.apply_entries([entry(1, open_session("own"))]);
        assert_eq!(reader.read_applied(|t| t.session_count()), Some(1));
        let mut builder = sm.get_snapshot_builder().await;
        let install = tokio::spawn(async move {
            sm.install_snapshot(&sent.meta, sent.snapshot)
                .await
                .map(|()| sm)
        });
        let meet = |gate: Arc<std::sync::Barrier>| tokio::task::spawn_blocking(move || gate.wait());
        meet(gate.clone()).await.expect("the install let go");
        assert_eq!(reader.read_applied(|t| t.session_count()), None);
        assert_eq!(
            reader.read(|t| t.session_count()),
            0,
            "the own table is gone"
        );
        let build = tokio::spawn(async move { builder.build_snapshot().await });
        while installs.receiver_count() == watching {
            tokio::task::yield_now().await;
        }
        // Given a moment, a build that did not wait would finish with the empty table.
        for _ in 0..50 {
            if build.is_finished() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
        let waited = !build.is_finished();
        meet(gate).await.expect("the install goes on");
        assert!(waited, "a build waits for the install");
        let mut sm = install.await.expect("install task").expect("installed");
        assert_eq!(
            reader.read_applied(|t| t.session("sent").is_some()),
            Some(true)
        );
        assert_eq!(
            reader.read_applied(|t| t.session("own").is_some()),
            Some(false)
        );
        let built = build.await.expect("build task").expect("built");
        assert_eq!(built.meta.last_log_id.map(|id| id.index), Some(5));
        let current = sm
            .get_current_snapshot()
            .await
            .expect("read")
            .expect("current");
        let table = snapshot::decode_table(&current.snapshot.to_vec().expect("reads"), dir.path())
            .expect("decodes");
        assert!(table.session("sent").is_some());
    }

    /// Data that passes its checksum but is no table fails the install after the old table
    /// was let go of: nothing is applied to the empty table then (openraft stops the node on
    /// the error; a restart rebuilds the table from the node's own snapshot, still current).
    #[tokio::test]
    async fn after_a_failed_install_nothing_is_applied_and_the_own_snapshot_stays_current() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut sm = StateMachineStore::open(dir.path(), None).expect("open");
        let reader = sm.reader();
        sm.apply_entries([entry(1, open_session("own"))]);
        sm.get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .expect("built");
        let own = sm.get_current_snapshot().await.expect("read").expect("own");
        let framed = crate::storage::codec::encode_as(1, &"not a table").expect("framed");
        let mut sent = snapshot_holding("sent", 5).await;
        sent.snapshot = SnapshotData::from(framed);
        let error = sm
            .install_snapshot(&sent.meta, sent.snapshot)
            .await
            .expect_err("not a table");
        assert!(error.to_string().contains("snapshot data"), "{error}");
        assert_eq!(reader.read_applied(|t| t.session_count()), None);
        let refused = sm
            .apply(futures::stream::iter([Ok((
                entry(2, open_session("after")),
                None,
            ))]))
            .await
            .expect_err("no apply to a table let go of");
        assert!(
            refused.to_string().contains("restart the node"),
            "{refused}"
        );
        let current = sm.get_current_snapshot().await.expect("read").expect("own");
        assert_eq!(current.meta, own.meta);
        drop(sm);
        let reopened = StateMachineStore::open(dir.path(), None).expect("reopen");
        assert_eq!(
            reopened
                .reader()
                .read_applied(|t| t.session("own").is_some()),
            Some(true)
        );
    }

    /// A store in `dir` whose policy counts the returned log bytes, unstaggered.
    fn counted_store(dir: &std::path::Path) -> (StateMachineStore, Arc<LogBytes>) {
        let written = LogBytes::shared();
        let mut sm = StateMachineStore::open(dir, None)
            .expect("open")
            .with_log_bytes(written.clone());
        sm.set_snapshot_policy(SnapshotPolicy {
            stagger_percent: 0,
            ..SnapshotPolicy::for_node(1)
        });
        (sm, written)
    }

    /// openraft's periodic ask is answered by the policy: no builder until the log written
    /// since the last snapshot reaches its share of that snapshot's size; a forced build is
    /// never refused, nor is any build of a state machine that counts no log bytes.
    #[tokio::test]
    async fn a_snapshot_is_due_by_the_log_bytes_written_since_the_last_one() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (mut sm, written) = counted_store(dir.path());
        let sessions: Vec<_> = (1..=50)
            .map(|i| entry(i, open_session(&format!("session-{i}"))))
            .collect();
        sm.apply_entries(sessions);
        written.add(10_000);
        let mut builder = sm
            .try_create_snapshot_builder(false)
            .await
            .expect("the log since (10 kB) exceeds half of no snapshot");
        builder.build_snapshot().await.expect("built");
        let size = sm
            .get_current_snapshot()
            .await
            .expect("read")
            .expect("built")
            .snapshot
            .len();
        assert!(sm.try_create_snapshot_builder(false).await.is_none());
        written.add(size / 2 - 1);
        assert!(!sm.snapshot_due());
        assert!(
            sm.try_create_snapshot_builder(true).await.is_some(),
            "forced"
        );
        written.add(1);
        assert!(sm.snapshot_due());
        assert!(sm.try_create_snapshot_builder(false).await.is_some());

        let other = tempfile::tempdir().expect("temp dir");
        let mut uncounted = StateMachineStore::open(other.path(), None).expect("open");
        assert!(uncounted.try_create_snapshot_builder(false).await.is_some());
    }

    /// However few log bytes were written (none: a restarted node re-applying its log writes
    /// none), a snapshot is due once the commands applied since the last one reach the replay
    /// bound; a batch counts its commands; a build starts the count again from its view.
    #[tokio::test]
    async fn a_snapshot_is_due_by_the_commands_applied_since_the_last_one() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut sm = StateMachineStore::open(dir.path(), None)
            .expect("open")
            .with_log_bytes(LogBytes::shared());
        sm.set_snapshot_policy(SnapshotPolicy {
            replay_commands_max: 10,
            stagger_percent: 0,
            floor_bytes: u64::MAX,
            ..SnapshotPolicy::for_node(1)
        });
        let opens: Vec<_> = (1..=4)
            .map(|i| entry(i, open_session(&format!("session-{i}"))))
            .collect();
        sm.apply_entries(opens);
        assert_eq!(sm.commands_since_snapshot(), 4);
        assert!(!sm.snapshot_due(), "4 commands of 10, and no log bytes");
        let batch = EntryPayload::Normal(Request {
            stamp_ms: 1_000,
            command: Command::Batch(
                (5..=9)
                    .map(|i| Command::OpenSession {
                        session_id: format!("session-{i}"),
                        owner_id: "owner".to_string(),
                        ttl_ms: 5_000,
                    })
                    .collect(),
            ),
        });
        sm.apply_entries([entry(5, batch)]);
        assert_eq!(
            sm.commands_since_snapshot(),
            9,
            "a batch counts its commands"
        );
        assert!(!sm.snapshot_due());
        sm.apply_entries([entry(6, EntryPayload::Blank)]);
        assert!(sm.snapshot_due(), "10 commands since no snapshot");
        let mut builder = sm
            .try_create_snapshot_builder(false)
            .await
            .expect("due by the commands");
        builder.build_snapshot().await.expect("built");
        assert_eq!(sm.commands_since_snapshot(), 0);
        assert!(!sm.snapshot_due());
        assert!(sm.try_create_snapshot_builder(false).await.is_none());
    }

    /// A stopping node's handle weighs the replay against the build; its request makes the
    /// next ask build where the policy would refuse, and only that one; the reopened store
    /// starts from that snapshot.
    #[tokio::test]
    async fn a_stop_request_builds_one_snapshot_the_policy_would_refuse() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (mut sm, written) = counted_store(dir.path());
        let stop = sm.stop_snapshot();
        assert_eq!(stop.worth_building(), None, "nothing to replay");
        let opens: Vec<_> = (1..=200)
            .map(|i| entry(i, open_session(&format!("session-{i}"))))
            .collect();
        sm.apply_entries(opens);
        written.add(1_000_000);
        sm.try_create_snapshot_builder(false)
            .await
            .expect("due by the bytes")
            .build_snapshot()
            .await
            .expect("built");
        let size = stop.mark.snapshot_bytes.load(Ordering::Relaxed);
        let need = size.div_ceil(STOP_SNAPSHOT_BYTES_PER_COMMAND);
        assert!(need >= 3, "a {size}-byte table");
        // One command short of the table's bytes / STOP_SNAPSHOT_BYTES_PER_COMMAND: not worth
        // a build at stop; one more is.
        sm.apply_entries([entry(201, open_session("late"))]);
        let blanks: Vec<_> = (202..202 + need - 2)
            .map(|i| entry(i, EntryPayload::Blank))
            .collect();
        sm.apply_entries(blanks);
        assert_eq!(stop.worth_building(), None, "{} commands", need - 1);
        let last = 200 + need;
        sm.apply_entries([entry(last, EntryPayload::Blank)]);
        assert_eq!(stop.worth_building(), Some(need));
        assert!(!sm.snapshot_due(), "the policy itself would wait");
        assert!(sm.try_create_snapshot_builder(false).await.is_none());

        stop.request();
        sm.try_create_snapshot_builder(false)
            .await
            .expect("requested")
            .build_snapshot()
            .await
            .expect("built");
        assert_eq!(stop.worth_building(), None, "nothing left to replay");
        assert!(
            sm.try_create_snapshot_builder(false).await.is_none(),
            "the request is spent on one build"
        );
        drop(sm);
        let mut reopened = StateMachineStore::open(dir.path(), None).expect("reopen");
        let current = reopened
            .get_current_snapshot()
            .await
            .expect("read")
            .expect("a snapshot");
        assert_eq!(current.meta.last_log_id.map(|id| id.index), Some(last));
    }

    #[tokio::test]
    async fn apply_answers_each_entry_and_tells_the_observer_once_per_batch() {
        let dir = tempfile::tempdir().expect("temp dir");
        let recorder = Arc::new(Recorder::default());
        let sm = StateMachineStore::open(dir.path(), Some(recorder.clone())).expect("open");
        let reader = sm.reader();
        let membership = Membership::new(
            vec![[1u64].into()],
            std::collections::BTreeMap::from([(1u64, Node::new("a:1"))]),
        )
        .expect("membership");

        let answers = sm.apply_entries([
            entry(1, EntryPayload::Blank),
            entry(2, EntryPayload::Membership(membership.clone())),
            entry(3, open_session("s1")),
            entry(4, open_session("s2")),
        ]);

        assert_eq!(answers.len(), 4);
        assert_eq!(answers[0], Response::NoCommand);
        assert_eq!(answers[1], Response::NoCommand);
        assert_eq!(
            answers[2],
            Response::SessionOpened {
                session_id: "s1".to_string(),
                ttl_ms: 5_000
            }
        );
        let calls = recorder.0.lock().expect("recorder lock").clone();
        assert_eq!(
            calls,
            vec![(
                4,
                vec![
                    Event::SessionOpened {
                        session_id: "s1".to_string(),
                        ttl_ms: 5_000,
                        principal: None,
                    },
                    Event::SessionOpened {
                        session_id: "s2".to_string(),
                        ttl_ms: 5_000,
                        principal: None,
                    },
                ]
            )]
        );
        assert_eq!(reader.last_applied().map(|id| id.index), Some(4));
        assert_eq!(
            reader.membership(),
            StoredMembership::new(
                Some(LogId::new(
                    LeaderId {
                        term: 1,
                        node_id: 1
                    },
                    2
                )),
                membership
            )
        );
        assert_eq!(reader.read(|table| table.session_count()), 2);
    }
}
