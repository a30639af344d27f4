//! The first program of the crate's front page: connect, open a session, acquire a lock,
//! check that it is still held, release it, close the session.
//!
//! Run it against the cluster `lockd dev` starts, with the `export` lines it prints (the CA
//! and the client's certificate: `LOCKD_CA`, `LOCKD_CERT`, `LOCKD_KEY`):
//!
//! ```sh
//! cargo run -p lockd -- dev &                         # 127.0.0.1:7101..7103, TLS
//! export LOCKD_CA=… LOCKD_CERT=… LOCKD_KEY=…          # as lockd dev prints them
//! cargo run -p lock-client --example first_program    # or: -- host:port,host:port
//! ```
//!
//! The endpoints come from the first argument, else `LOCKD_ENDPOINTS`, else the `lockd dev`
//! cluster; TLS and the token from the environment ([`ClientConfig::from_env`]).
//! `t40_client_sdk` runs [`first_program`] against a real three-node cluster.

use std::time::Duration;

use lock_client::{ClientConfig, LockClient, LockError};

/// The cluster `lockd dev` starts.
const DEV_ENDPOINTS: &str = "127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103";

/// The lock this program takes.
pub const KEY: &str = "payout/2026-11-30";

/// How long the grant lives unless renewed; the session releases it earlier on close.
const TTL: Duration = Duration::from_secs(30);

/// How long to wait for another holder before giving up.
pub const MAX_WAIT: Duration = Duration::from_secs(5);

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let endpoints = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("LOCKD_ENDPOINTS").ok())
        .unwrap_or_else(|| DEV_ENDPOINTS.to_owned());
    let endpoints: Vec<&str> = endpoints.split(',').collect();
    first_program(&endpoints, ClientConfig::from_env()?).await?;
    Ok(())
}

/// The front page's program, given the endpoints and the config (`LockClient::connect` on the
/// front page is `connect_with` of [`ClientConfig::from_env`]). Answers the fencing token it
/// held, or `None` if someone else held [`KEY`] for all of [`MAX_WAIT`].
pub async fn first_program(
    endpoints: &[&str],
    config: ClientConfig,
) -> Result<Option<u64>, LockError> {
    // Any nodes of the cluster will do: the client finds the leader.
    let client = LockClient::connect_with(endpoints, config).await?;
    // A session is one owner; it heartbeats in the background, and its locks die with it.
    let session = client.open_session("worker-7").await?;
    session
        .on_lock_lost(|handle| eprintln!("lost {} (token {})", handle.key, handle.fencing_token));

    let held = match session.acquire(KEY, TTL, MAX_WAIT).await? {
        Some(handle) => {
            // Stops doomed work early; the fencing token is what protects the resource.
            session.check_still_held(&handle)?;
            println!(
                "holding {} with fencing token {}",
                handle.key, handle.fencing_token
            );
            // ... write to the resource, presenting handle.fencing_token ...
            session.release(&handle).await?;
            Some(handle.fencing_token)
        }
        // Someone else holds it: not an error, and not a reason to spin.
        None => {
            println!("{KEY} is held by someone else; not proceeding");
            None
        }
    };
    session.close().await?; // releases whatever the session still holds
    Ok(held)
}
