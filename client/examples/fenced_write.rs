//! Acquire a lock, write to a fenced resource with its token, handle `FencedOut` and lock loss,
//! release.
//!
//! Run it against the cluster `lockd dev` starts:
//!
//! ```sh
//! cargo run -p lockd -- dev &                       # 127.0.0.1:7101..7103
//! cargo run -p lock-client --example fenced_write   # or: -- host:port,host:port
//! ```
//!
//! The resource here is an in-process ledger guarded by a [`Fence`]; a real one keeps the fence
//! in its own storage, next to the data, and checks it in the same transaction as the write.
//! The example also plays a *stale holder*: after a newer holder has written, a write with the
//! old token is rejected with `FencedOut` — the case no deadline check can prevent.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use lock_client::{Fence, LockClient, LockError};

const KEY: &str = "example/ledger";

/// The protected resource: it accepts a write only with a token above every token it accepted.
struct Ledger {
    fence: Fence,
    entries: Vec<(u64, String)>,
}

impl Ledger {
    /// One fenced write: all of `entries`, or none. The fence admits each token once (equal is
    /// rejected), so a holder makes its changes in one write per grant, as a database would in
    /// one transaction that also stores the token.
    fn append(&mut self, token: u64, entries: &[&str]) -> Result<(), LockError> {
        self.fence.admit(token)?; // FencedOut if this or a newer holder already wrote
        self.entries
            .extend(entries.iter().map(|e| (token, (*e).to_owned())));
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let endpoints: Vec<String> = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("LOCKD_ENDPOINTS").ok())
        .unwrap_or_else(|| "127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103".into())
        .split(',')
        .map(str::to_owned)
        .collect();
    let client = LockClient::connect(&endpoints).await?;
    let mut ledger = Ledger {
        fence: Fence::new(KEY),
        entries: Vec::new(),
    };

    // --- The holder: acquire, keep alive, write with the token, release. ---
    let session = client.open_session("example-writer").await?;
    let lost = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&lost);
    // Runs on the SDK's pool: only raise a flag, never do the stopping here.
    session.on_lock_lost(move |handle| {
        eprintln!("lost {} (token {})", handle.key, handle.fencing_token);
        flag.store(true, Ordering::SeqCst);
    });
    let Some(handle) = session
        .acquire(KEY, Duration::from_secs(10), Duration::from_secs(5))
        .await?
    else {
        println!("{KEY} is held by someone else; not proceeding (FR-27)");
        session.close().await?;
        return Ok(());
    };
    session.keep_alive(&handle)?;
    println!("acquired {KEY} with fencing token {}", handle.fencing_token);

    // Stops doomed work early; it does not prove the lock is held at the write.
    if lost.load(Ordering::SeqCst) {
        println!("lock lost before the write; abandoning the work");
    } else {
        match session.check_still_held(&handle) {
            Err(LockError::LockLost { .. }) => println!("lock lost; abandoning the work"),
            Err(other) => return Err(other.into()),
            // The token, presented to the resource, is what decides.
            Ok(()) => match ledger.append(handle.fencing_token, &["debit 10", "credit 10"]) {
                Ok(()) => println!("wrote with token {}", handle.fencing_token),
                Err(err @ LockError::FencedOut { .. }) => {
                    // Superseded: another holder may already have done this work. Never retry.
                    println!("{err}; stopping");
                }
                Err(other) => return Err(other.into()),
            },
        }
    }
    let stale_token = handle.fencing_token;
    println!("released: {}", session.release(&handle).await?);
    session.close().await?;

    // --- A newer holder writes; then the old token is fenced out. ---
    let newer = client.open_session("example-newer").await?;
    if let Some(h) = newer.try_acquire(KEY, Duration::from_secs(10)).await? {
        ledger.append(h.fencing_token, &["newer holder"])?;
        println!("newer holder wrote with token {}", h.fencing_token);
        match ledger.append(stale_token, &["stale write"]) {
            Err(LockError::FencedOut {
                presented, stored, ..
            }) => println!(
                "stale write with token {presented} rejected: the ledger has seen {stored}"
            ),
            other => return Err(format!("the stale write was not fenced: {other:?}").into()),
        }
        newer.release(&h).await?;
    }
    newer.close().await?;
    println!("ledger: {:?}", ledger.entries);
    Ok(())
}
