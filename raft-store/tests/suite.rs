//! openraft's own storage test suite (`openraft::testing::Suite`) against the log store, on
//! each log engine, and the lock state machine: log state, vote, purge, truncate, append,
//! membership bookkeeping, apply and snapshot transfer, each on a fresh storage directory.

use lock_raft_store::TypeConfig;
use lock_raft_store::storage::{self, EngineKind, LogStore, StateMachineStore};
use openraft::testing::log::{StoreBuilder, Suite};
use openraft::{ErrorSubject, ErrorVerb};
use tempfile::TempDir;

type StorageError = openraft::StorageError<TypeConfig>;

fn setup_error(e: impl std::error::Error + Send + Sync + 'static) -> StorageError {
    StorageError::from_io_error(
        ErrorSubject::Store,
        ErrorVerb::Write,
        std::io::Error::other(e),
    )
}

/// Builds a store on `0`'s engine in a new temporary directory; the directory is the guard the
/// suite drops.
struct Builder(EngineKind);

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, TempDir> for Builder {
    async fn build(&self) -> Result<(TempDir, LogStore, StateMachineStore), StorageError> {
        let dir = tempfile::tempdir().map_err(setup_error)?;
        let (log_store, state_machine) =
            storage::open_with(dir.path(), self.0, None).map_err(setup_error)?;
        assert_eq!(log_store.engine_kind(), self.0);
        Ok((dir, log_store, state_machine))
    }
}

#[tokio::test]
async fn t10_openraft_storage_suite_on_the_wal() -> Result<(), Box<StorageError>> {
    Suite::test_all(Builder(EngineKind::Wal))
        .await
        .map_err(Box::new)
}

#[tokio::test]
async fn t11_openraft_storage_suite_on_sled() -> Result<(), Box<StorageError>> {
    Suite::test_all(Builder(EngineKind::Sled))
        .await
        .map_err(Box::new)
}
