//! [`StorageObserver`]: how long the storage's disk work takes, told to whoever keeps the
//! node's metrics. The storage calls it and keeps no metric itself, so this crate has no
//! metrics registry and tools that open a log pay for nothing.

use std::time::Duration;

/// Learns the duration of each log flush and each snapshot build. Called from the log's flush
/// thread and from openraft's snapshot task: it must be cheap and must not block (an atomic
/// update, a histogram observation).
pub trait StorageObserver: Send + Sync + 'static {
    /// One flush of the log made the writes before it durable in `took`: with the WAL engine
    /// one `fdatasync` of the active segment (and of the directory after a rotation), with sled
    /// its flush and the `fdatasync` of its data file. One call per flush group, however many
    /// appends the group covered.
    fn log_synced(&self, took: Duration);

    /// A snapshot of `bytes` bytes (the file's body) was built from the state machine and
    /// written durably in `took`.
    fn snapshot_built(&self, took: Duration, bytes: u64);
}
