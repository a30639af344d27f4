//! When a snapshot is worth building: [`SnapshotPolicy`], decided from the bytes of log written
//! since the last snapshot against that snapshot's size, bounded by the commands applied since
//! it (what a restart replays), and staggered across nodes.
//!
//! openraft asks the state machine for a builder every `--snapshot-logs-since-last` entries
//! (`RaftStateMachine::try_create_snapshot_builder`); the state machine answers with this
//! policy. Rewriting a 100 MB table because 5,000 small entries arrived costs far more than
//! replaying them, so a snapshot is due only once the log since the last one is a fraction of
//! the last snapshot's size: the work of snapshots then grows with the log written, not with
//! the state held. A small state (a snapshot smaller than the log since) keeps being
//! snapshotted at every ask, as before.
//!
//! Bytes alone let a large state's log grow long: half of a 125 MiB snapshot is about 60 MiB
//! of log, some 450,000 acquires, which a restarted node re-applies before it serves anything
//! (5–8 µs each at a million held locks, so 2–3.5 s; W5's catch-up, issue 23). So a
//! snapshot is also due once [`SnapshotPolicy::replay_commands_max`] commands were applied
//! since the last one, whatever their bytes: a restart then replays at most that many. It
//! counts commands, not entries, because one entry may batch up to 512 of them and the replay
//! costs by the command. Each node's threshold is raised by its own share of
//! [`SnapshotPolicy::stagger_percent`], drawn from its node id and how many snapshots it built,
//! so the nodes of one cluster do not all build at the same index.
//!
//! openraft's own asks are staggered too ([`ask_interval`]): with one interval every node asks
//! at the same indexes, and the byte stagger alone cannot move a build off them.
//!
//! A node that stops cleanly weighs that replay once more, against a build of its table now
//! ([`worth_building_at_stop`]), so a rolling restart does not pay it.
//!
//! Pure: no IO, no clock; [`LogBytes`] is the one counter the log store feeds.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// The default [`SnapshotPolicy::replay_commands_max`]: at 5–8 µs per acquire re-applied at a
/// million held locks (`restart_from_snapshot` example: 300,000 in 1.5–2.3 s since session 18,
/// 2.2–3.3 s before), a restart replays for 1.25–2 s at most (more with the stagger, and on a
/// loaded machine), and a build of a million-lock table (2–4 s of a blocking thread) comes at
/// most every 250,000 commands.
pub const REPLAY_COMMANDS_MAX: u64 = 250_000;

/// Bytes of snapshot a build writes in the time a restart takes to re-apply one command, at a
/// million held locks: a build writes about 5.7 ns a byte (`held_locks 1000 1000`: 0.61 s for
/// a 106 MiB table, session 19) and a restart re-applies an acquire in 5–8 µs
/// (`restart_from_snapshot restart`, session 18), so one command's replay costs as much as
/// building 900–1,400 bytes. [`worth_building_at_stop`] weighs the two with it.
pub const STOP_SNAPSHOT_BYTES_PER_COMMAND: u64 = 1_000;

/// How often a snapshot is built; see the module docs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SnapshotPolicy {
    /// No snapshot before this many bytes of log since the last one (0: only openraft's entry
    /// count bounds how often a small state is snapshotted).
    pub floor_bytes: u64,
    /// No snapshot before the log since the last one is this percentage of the last snapshot's
    /// size: 50 means a restarted node replays at most about half a snapshot's worth of log.
    pub percent_of_snapshot: u64,
    /// A snapshot is due once this many commands were applied since the last one, whatever
    /// the log's bytes, so a restart never replays more (0: no bound). Staggered as the bytes.
    pub replay_commands_max: u64,
    /// Up to this percentage more, per node and per snapshot (0: no staggering).
    pub stagger_percent: u64,
    /// The node's id, from which its stagger is drawn.
    pub node_id: u64,
}

impl Default for SnapshotPolicy {
    fn default() -> Self {
        SnapshotPolicy {
            floor_bytes: 0,
            percent_of_snapshot: 50,
            replay_commands_max: REPLAY_COMMANDS_MAX,
            stagger_percent: 40,
            node_id: 0,
        }
    }
}

impl SnapshotPolicy {
    /// The default policy for node `node_id`.
    pub fn for_node(node_id: u64) -> Self {
        SnapshotPolicy {
            node_id,
            ..Self::default()
        }
    }

    /// The log bytes since the last snapshot after which the next is due, for a last snapshot
    /// of `snapshot_bytes` and `built` snapshots built by this node so far.
    pub fn threshold(&self, snapshot_bytes: u64, built: u64) -> u64 {
        let base = self
            .floor_bytes
            .max(snapshot_bytes.saturating_mul(self.percent_of_snapshot) / 100);
        self.staggered(base, built)
    }

    /// `base` raised by this node's share of the stagger for its `built`-th snapshot.
    fn staggered(&self, base: u64, built: u64) -> u64 {
        let extra = self
            .stagger_percent
            .saturating_mul(self.stagger_share(built))
            / 1_000;
        base.saturating_add(base.saturating_mul(extra) / 100)
    }

    /// Whether a snapshot is due, `log_bytes` after one of `snapshot_bytes`.
    pub fn due(&self, log_bytes: u64, snapshot_bytes: u64, built: u64) -> bool {
        log_bytes >= self.threshold(snapshot_bytes, built)
    }

    /// The commands applied since the last snapshot after which the next is due whatever the
    /// log's bytes (`None`: no such bound), for `built` snapshots built by this node so far.
    pub fn replay_threshold(&self, built: u64) -> Option<u64> {
        (self.replay_commands_max > 0).then(|| self.staggered(self.replay_commands_max, built))
    }

    /// Whether a snapshot is due by the replay bound, `commands` applied since the last one.
    pub fn replay_due(&self, commands: u64, built: u64) -> bool {
        self.replay_threshold(built).is_some_and(|t| commands >= t)
    }

    /// This node's share of the stagger for its `built`-th snapshot, in thousandths: spread
    /// over `0..1000` by a multiplicative hash, so consecutive node ids land far apart and one
    /// node's share changes from one snapshot to the next.
    fn stagger_share(&self, built: u64) -> u64 {
        let mixed = self
            .node_id
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .wrapping_add(built.wrapping_mul(0xBF58_476D_1CE4_E5B9));
        (mixed >> 32) % 1_000
    }
}

/// Whether a node that is stopping should build a snapshot first, `commands` applied since
/// its last one of `snapshot_bytes` (0: none yet): when its next start would spend longer
/// re-applying those commands than the build takes now
/// ([`STOP_SNAPSHOT_BYTES_PER_COMMAND`]). A rolling restart then costs each node a build at
/// its stop instead of up to [`SnapshotPolicy::replay_commands_max`] commands of replay
/// before it serves; a node that crashed still replays them. The stagger does not apply:
/// the node builds alone, as it leaves.
pub fn worth_building_at_stop(commands: u64, snapshot_bytes: u64) -> bool {
    commands > 0 && commands.saturating_mul(STOP_SNAPSHOT_BYTES_PER_COMMAND) >= snapshot_bytes
}

/// How many entries since the last snapshot openraft lets pass before it asks node `node_id`
/// whether a snapshot is due, for `--snapshot-logs-since-last` `entries`: `entries` plus 0,
/// ⅛, ¼ or ⅜ of it, by the node id modulo 4. Every node of a cluster applies the same log, so
/// with one interval they all ask at the same indexes, and nodes whose byte thresholds fall in
/// the same interval build their snapshots at the same index and the same moment (W5 saw all
/// three at every snapshot); apart by an eighth, they ask at different indexes.
pub fn ask_interval(entries: u64, node_id: u64) -> u64 {
    entries.saturating_add(entries / 8 * (node_id % 4))
}

/// The bytes of log the log store has written since it opened, shared with the state machine,
/// which notes the count at each snapshot.
#[derive(Debug, Default)]
pub struct LogBytes(AtomicU64);

impl LogBytes {
    /// A new shared counter at 0.
    pub fn shared() -> Arc<LogBytes> {
        Arc::new(LogBytes::default())
    }

    /// `bytes` more were written.
    pub fn add(&self, bytes: u64) {
        self.0.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Bytes written so far.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    /// The three nodes of a cluster (ids 1–3, as `lockd dev` and the tests number them) ask at
    /// different intervals, none shorter than the configured one nor more than ⅜ longer.
    #[test]
    fn the_nodes_of_a_cluster_are_asked_at_different_intervals() {
        let asked: Vec<u64> = (1..=3).map(|id| ask_interval(5_000, id)).collect();
        assert_eq!(asked, [5_625, 6_250, 6_875]);
        assert_eq!(ask_interval(5_000, 4), 5_000);
        for id in 0..20 {
            let interval = ask_interval(100, id);
            assert!((100..=137).contains(&interval), "node {id}: {interval}");
        }
        assert_eq!(ask_interval(u64::MAX, 3), u64::MAX);
    }

    #[test]
    fn a_large_snapshot_waits_for_half_its_size_of_log() {
        let policy = SnapshotPolicy {
            stagger_percent: 0,
            ..SnapshotPolicy::default()
        };
        assert!(!policy.due(10 * MIB, 100 * MIB, 0));
        assert!(!policy.due(50 * MIB - 1, 100 * MIB, 0));
        assert!(policy.due(50 * MIB, 100 * MIB, 0));
        // A tiny state is snapshotted at every ask, as openraft's entry count alone did.
        assert!(policy.due(0, 0, 0));
        assert!(policy.due(1_000, 1_500, 0));
        assert!(!policy.due(500, 1_500, 0));
    }

    #[test]
    fn the_floor_holds_small_states_back() {
        let policy = SnapshotPolicy {
            floor_bytes: 4 * MIB,
            stagger_percent: 0,
            ..SnapshotPolicy::default()
        };
        assert!(!policy.due(MIB, 1_000, 0));
        assert!(policy.due(4 * MIB, 1_000, 0));
        assert_eq!(policy.threshold(100 * MIB, 3), 50 * MIB);
    }

    /// However few bytes the commands since the last snapshot took, a restart replays no more
    /// than the bound; nodes reach it at different counts; 0 turns it off.
    #[test]
    fn the_commands_since_the_last_snapshot_are_bounded() {
        let policy = SnapshotPolicy {
            replay_commands_max: 1_000,
            stagger_percent: 0,
            ..SnapshotPolicy::default()
        };
        assert!(!policy.replay_due(999, 0));
        assert!(policy.replay_due(1_000, 0));
        let off = SnapshotPolicy {
            replay_commands_max: 0,
            ..policy
        };
        assert!(!off.replay_due(u64::MAX, 0));
        assert_eq!(off.replay_threshold(0), None);
        let thresholds: std::collections::BTreeSet<u64> = (1..=3)
            .filter_map(|node| SnapshotPolicy::for_node(node).replay_threshold(0))
            .collect();
        assert_eq!(thresholds.len(), 3, "{thresholds:?}");
        for t in &thresholds {
            assert!(
                (REPLAY_COMMANDS_MAX..=REPLAY_COMMANDS_MAX * 14 / 10).contains(t),
                "{thresholds:?}"
            );
        }
    }

    /// A stopping node builds when the replay it saves outweighs the build: never with nothing
    /// to replay, always with no snapshot yet, and for a 125 MiB table from about 131,000
    /// commands.
    #[test]
    fn a_stopping_node_builds_when_its_replay_would_cost_more() {
        assert!(!worth_building_at_stop(0, 0));
        assert!(!worth_building_at_stop(0, 125 * MIB));
        assert!(worth_building_at_stop(1, 0));
        let big = 125 * MIB;
        let even = big.div_ceil(STOP_SNAPSHOT_BYTES_PER_COMMAND);
        assert!(!worth_building_at_stop(even - 1, big));
        assert!(worth_building_at_stop(even, big));
        assert!(worth_building_at_stop(u64::MAX, u64::MAX));
    }

    /// Three nodes of a cluster with the same state get thresholds apart by a good part of the
    /// stagger, and each node's changes from one snapshot to the next.
    #[test]
    fn nodes_are_staggered() {
        let snapshot = 100 * MIB;
        let thresholds: Vec<u64> = (1..=3)
            .map(|node| SnapshotPolicy::for_node(node).threshold(snapshot, 0))
            .collect();
        let base = 50 * MIB;
        for t in &thresholds {
            assert!(*t >= base && *t <= base + base * 40 / 100, "{thresholds:?}");
        }
        let mut sorted = thresholds.clone();
        sorted.sort_unstable();
        for pair in sorted.windows(2) {
            assert!(
                pair[1] - pair[0] >= base / 50,
                "thresholds closer than 1 MiB: {thresholds:?}"
            );
        }
        let node = SnapshotPolicy::for_node(2);
        let rounds: std::collections::BTreeSet<u64> = (0..8)
            .map(|built| node.threshold(snapshot, built))
            .collect();
        assert!(rounds.len() >= 6, "{rounds:?}");
        let unstaggered = SnapshotPolicy {
            stagger_percent: 0,
            ..SnapshotPolicy::for_node(2)
        };
        assert_eq!(unstaggered.threshold(snapshot, 5), base);
    }
}
