//! openraft's own storage test suite (`openraft::testing::Suite`) against the log store, on
//! each log engine, and the lock state machine: log state, vote, purge, truncate, append,
//! membership bookkeeping, apply and snapshot transfer, each on a fresh storage directory.

use lock_raft_store::storage::{self, EngineKind, LogStore, StateMachineStore};
use lock_raft_store::{NodeId, TypeConfig};
use openraft::testing::{StoreBuilder, Suite};
use openraft::{AnyError, StorageError, StorageIOError};
use tempfile::TempDir;

/// Builds a store on `0`'s engine in a new temporary directory; the directory is the guard the
/// suite drops.
struct Builder(EngineKind);

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, TempDir> for Builder {
    async fn build(&self) -> Result<(TempDir, LogStore, StateMachineStore), StorageError<NodeId>> {
        let dir = tempfile::tempdir().map_err(|e| StorageIOError::write(AnyError::new(&e)))?;
        let (log_store, state_machine) = storage::open_with(dir.path(), self.0, None)
            .map_err(|e| StorageIOError::write(AnyError::new(&e)))?;
        assert_eq!(log_store.engine_kind(), self.0);
        Ok((dir, log_store, state_machine))
    }
}

#[test]
fn t10_openraft_storage_suite_on_the_wal() -> Result<(), Box<StorageError<NodeId>>> {
    Suite::test_all(Builder(EngineKind::Wal)).map_err(Box::new)
}

#[test]
fn t11_openraft_storage_suite_on_sled() -> Result<(), Box<StorageError<NodeId>>> {
    Suite::test_all(Builder(EngineKind::Sled)).map_err(Box::new)
}
