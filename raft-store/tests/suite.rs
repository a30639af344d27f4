//! openraft's own storage test suite (`openraft::testing::Suite`) against the sled log store and
//! the lock state machine: log state, vote, purge, truncate, append, membership bookkeeping,
//! apply and snapshot transfer, each on a fresh storage directory.

use lock_raft_store::storage::{self, LogStore, StateMachineStore};
use lock_raft_store::{NodeId, TypeConfig};
use openraft::testing::{StoreBuilder, Suite};
use openraft::{AnyError, StorageError, StorageIOError};
use tempfile::TempDir;

/// Builds a store in a new temporary directory; the directory is the guard the suite drops.
struct SledStoreBuilder;

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, TempDir> for SledStoreBuilder {
    async fn build(&self) -> Result<(TempDir, LogStore, StateMachineStore), StorageError<NodeId>> {
        let dir = tempfile::tempdir().map_err(|e| StorageIOError::write(AnyError::new(&e)))?;
        let (log_store, state_machine) = storage::open(dir.path(), None)
            .map_err(|e| StorageIOError::write(AnyError::new(&e)))?;
        Ok((dir, log_store, state_machine))
    }
}

#[test]
fn t10_openraft_storage_suite() -> Result<(), Box<StorageError<NodeId>>> {
    Suite::test_all(SledStoreBuilder).map_err(Box::new)
}
