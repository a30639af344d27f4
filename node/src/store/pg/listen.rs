//! The PostgreSQL store's notification path: one dedicated `LISTEN` connection per
//! [`PgLockStore`](super::PgLockStore) and the registry of this process's local waiters, keyed
//! by `(session_id, request_id)`, that its notifications wake (`wait_for_grant` without
//! polling; lock_api::request_store).
//!
//! Owns the connection's lifecycle: connect, `LISTEN`, read `AsyncMessage::Notification`s until
//! the connection fails, then reconnect with a doubling backoff. Notifications sent while it is
//! down are lost, so every successful (re)connect wakes **every** local waiter, and each re-reads
//! its request's state; a waiter also reads the state after registering, so a hand-off that
//! committed before the registration is not missed either. A wake-up only ever makes a waiter
//! read the database again: a spurious or duplicated one is harmless, and the registry never
//! decides an outcome. The repeating failure of a database that stays away is logged as a change
//! of state, then summarised (`crate::log_limit`).
//!
//! Does no SQL beyond `LISTEN` and `pg_backend_pid()`; holds no lock state.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio::sync::Notify;
use tokio_postgres::{AsyncMessage, NoTls};

use super::queue::CHANNEL;
use super::request_id_of_sql;
use crate::log_limit::{LogLimit, Note};

/// First pause before reconnecting a lost `LISTEN` connection; doubled after each failure. Long
/// enough that a database refusing connections is not hammered, short enough that a hand-off
/// committed during a blip reaches its waiter within a fraction of a second after it.
pub const LISTEN_BACKOFF_MIN: Duration = Duration::from_millis(100);

/// Longest pause between two reconnect attempts: the worst extra latency a waiter sees after
/// the database comes back.
pub const LISTEN_BACKOFF_MAX: Duration = Duration::from_secs(2);

/// How long one connect (TCP, startup, `LISTEN`) may take before it counts as failed.
pub const LISTEN_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Idle time before the kernel probes the `LISTEN` connection. The connection only receives, so
/// without probes a silently dropped link (a partition, a NAT timeout) would look alive forever
/// and every notification would be lost until it was noticed.
pub const LISTEN_KEEPALIVE_IDLE: Duration = Duration::from_secs(5);

/// `application_name` of the `LISTEN` connection, so an operator finds it in
/// `pg_stat_activity`.
pub const LISTEN_APPLICATION_NAME: &str = "lockd-listen";

/// One registered local waiter: its wake-up and an id that tells it apart from another waiter
/// of the same request.
type Slot = (u64, Arc<Notify>);

/// What the listen task and the store share.
#[derive(Debug, Default)]
struct Shared {
    waiters: Mutex<HashMap<(String, u64), Vec<Slot>>>,
    next_slot: AtomicU64,
    /// The backend pid of the `LISTEN` connection while it is listening.
    pid: Mutex<Option<i32>>,
}

impl Shared {
    /// The registry, even if a thread panicked while holding it: it holds only wake-ups, which
    /// stay valid, and losing them would strand waiters.
    fn waiters(&self) -> MutexGuard<'_, HashMap<(String, u64), Vec<Slot>>> {
        self.waiters.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn set_pid(&self, pid: Option<i32>) {
        *self.pid.lock().unwrap_or_else(|p| p.into_inner()) = pid;
    }

    fn wake(&self, session_id: &str, request_id: u64) {
        if let Some(slots) = self.waiters().get(&(session_id.to_owned(), request_id)) {
            for (_, notify) in slots {
                // `notify_one` stores a permit when the waiter is between reading the state
                // and awaiting, so a wake-up in that gap is not lost.
                notify.notify_one();
            }
        }
    }

    fn wake_all(&self) {
        for slots in self.waiters().values() {
            for (_, notify) in slots {
                notify.notify_one();
            }
        }
    }
}

/// The `LISTEN` connection's task and the waiter registry; the task ends when this is dropped
/// (with the last clone of the store).
#[derive(Debug)]
pub(super) struct Listener {
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A local waiter's registration; deregisters when dropped (a waiter that gave up leaves no
/// trace).
#[derive(Debug)]
pub(super) struct Registration {
    shared: Arc<Shared>,
    request: (String, u64),
    slot: u64,
    notify: Arc<Notify>,
}

impl Registration {
    /// Resolves at the next wake-up of this request (or at once if one came since the last).
    pub(super) async fn woken(&self) {
        self.notify.notified().await;
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut waiters = self.shared.waiters();
        if let Some(slots) = waiters.get_mut(&self.request) {
            slots.retain(|(id, _)| *id != self.slot);
            if slots.is_empty() {
                waiters.remove(&self.request);
            }
        }
    }
}

impl Listener {
    /// Starts the listen task on the current runtime with `config` (the pool's, which this
    /// adjusts for a long-lived receive-only connection).
    pub(super) fn start(mut config: tokio_postgres::Config) -> Listener {
        config
            .application_name(LISTEN_APPLICATION_NAME)
            .connect_timeout(LISTEN_CONNECT_TIMEOUT)
            .keepalives(true)
            .keepalives_idle(LISTEN_KEEPALIVE_IDLE)
            .keepalives_interval(Duration::from_secs(1))
            .keepalives_retries(3);
        let shared = Arc::new(Shared::default());
        let task = tokio::spawn(run(config, shared.clone()));
        Listener { shared, task }
    }

    /// Registers a local waiter of request `(session_id, request_id)`. Register **before**
    /// reading the request's state, so that no notification falls between the two.
    pub(super) fn register(&self, session_id: &str, request_id: u64) -> Registration {
        let slot = self.shared.next_slot.fetch_add(1, Ordering::Relaxed);
        let notify = Arc::new(Notify::new());
        let request = (session_id.to_owned(), request_id);
        self.shared
            .waiters()
            .entry(request.clone())
            .or_default()
            .push((slot, notify.clone()));
        Registration {
            shared: self.shared.clone(),
            request,
            slot,
            notify,
        }
    }

    /// The backend pid of the `LISTEN` connection while it listens (`None` while it is down).
    pub(super) fn pid(&self) -> Option<i32> {
        *self.shared.pid.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Connects, listens, and reconnects for as long as the store lives.
async fn run(config: tokio_postgres::Config, shared: Arc<Shared>) {
    let mut log = LogLimit::default();
    let mut backoff = LISTEN_BACKOFF_MIN;
    loop {
        let error = match listen_once(&config, &shared, &mut log).await {
            Ok(Listened::WasUp(error)) => {
                // It was up: begin the next episode from the shortest pause.
                backoff = LISTEN_BACKOFF_MIN;
                error
            }
            Ok(Listened::NeverUp(error)) | Err(error) => error,
        };
        shared.set_pid(None);
        match log.failed(Instant::now(), &error) {
            Some(Note::Began) => tracing::warn!(
                error = %error,
                "postgres LISTEN connection lost; waiters fall back to re-reading on reconnect"
            ),
            Some(Note::Summary(s)) => tracing::warn!(
                failures = s.count,
                total = s.total,
                lasted_s = s.lasted.as_secs(),
                last_error = %s.last_error,
                "postgres LISTEN connection still down"
            ),
            None => {}
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(LISTEN_BACKOFF_MAX);
    }
}

/// How one connection ended.
enum Listened {
    /// It listened, then failed with this.
    WasUp(String),
    /// It failed before it listened.
    NeverUp(String),
}

/// One connection: connect, `LISTEN`, wake every waiter, then route notifications until the
/// connection ends.
async fn listen_once(
    config: &tokio_postgres::Config,
    shared: &Shared,
    log: &mut LogLimit,
) -> Result<Listened, String> {
    let (client, mut connection) =
        tokio::time::timeout(LISTEN_CONNECT_TIMEOUT, config.connect(NoTls))
            .await
            .map_err(|_| format!("connect timed out after {LISTEN_CONNECT_TIMEOUT:?}"))?
            .map_err(|e| format!("connect: {e}: {e:?}"))?;
    let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
    let client = &client;
    let setup = async move {
        client.batch_execute(&format!("LISTEN {CHANNEL}")).await?;
        let row = client.query_one("SELECT pg_backend_pid()", &[]).await?;
        Ok::<i32, tokio_postgres::Error>(row.get(0))
    };
    tokio::pin!(setup);
    // The connection must be driven while the setup's statements wait for their answers.
    let setup = tokio::time::timeout(LISTEN_CONNECT_TIMEOUT, async {
        loop {
            tokio::select! {
                done = &mut setup => return done.map_err(|e| format!("LISTEN: {e}: {e:?}")),
                message = messages.next() => match message {
                    Some(Ok(message)) => route(shared, message),
                    Some(Err(e)) => return Err(format!("connection: {e}: {e:?}")),
                    None => return Err("connection closed during LISTEN".to_owned()),
                },
            }
        }
    })
    .await;
    let pid = match setup {
        Ok(Ok(pid)) => pid,
        Ok(Err(e)) => return Ok(Listened::NeverUp(e)),
        Err(_) => {
            return Ok(Listened::NeverUp(format!(
                "LISTEN timed out after {LISTEN_CONNECT_TIMEOUT:?}"
            )));
        }
    };
    shared.set_pid(Some(pid));
    if let Some(ended) = log.succeeded(Instant::now()) {
        tracing::info!(
            pid,
            lasted_ms = ended.lasted.as_millis() as u64,
            failures = ended.total,
            "postgres LISTEN connection restored"
        );
    } else {
        tracing::debug!(pid, "postgres LISTEN connection up");
    }
    // Whatever was notified while no connection listened is lost: every waiter re-reads.
    shared.wake_all();
    let error = loop {
        match messages.next().await {
            Some(Ok(message)) => route(shared, message),
            Some(Err(e)) => break format!("connection: {e}: {e:?}"),
            None => break "connection closed".to_owned(),
        }
    };
    // `client` lives until here: dropping it would close the connection.
    Ok(Listened::WasUp(error))
}

/// Wakes the waiters a notification names; anything else on the connection is ignored.
fn route(shared: &Shared, message: AsyncMessage) {
    let AsyncMessage::Notification(n) = message else {
        return;
    };
    if n.channel() != CHANNEL {
        return;
    }
    match parse_payload(n.payload()) {
        Some((session_id, request_id)) => shared.wake(session_id, request_id),
        // Not ours to interpret (another writer on the channel): wake nobody.
        None => tracing::debug!(payload = n.payload(), "unexpected notification payload"),
    }
}

/// `"<biased request id>:<session id>"` → `(session id, request id)`.
fn parse_payload(payload: &str) -> Option<(&str, u64)> {
    let (id, session_id) = payload.split_once(':')?;
    let biased: i64 = id.parse().ok()?;
    Some((session_id, request_id_of_sql(biased)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::pg::request_id_sql;

    #[test]
    fn a_payload_names_its_request_whatever_the_id() {
        for id in [1, 42, i64::MAX as u64, u64::MAX] {
            let payload = format!("{}:abc", request_id_sql(id));
            assert_eq!(parse_payload(&payload), Some(("abc", id)));
        }
        assert_eq!(parse_payload("nonsense"), None);
        assert_eq!(parse_payload("x:abc"), None);
    }

    #[tokio::test]
    async fn a_wake_up_between_the_read_and_the_await_is_not_lost() {
        let shared = Arc::new(Shared::default());
        let listener = Listener {
            shared: shared.clone(),
            task: tokio::spawn(async {}),
        };
        let a = listener.register("s", 7);
        let b = listener.register("s", 7);
        let other = listener.register("s", 8);
        shared.wake("s", 7);
        // Both waiters of request 7 find the permit although neither was awaiting yet.
        tokio::time::timeout(Duration::from_secs(1), a.woken())
            .await
            .expect("a woken");
        tokio::time::timeout(Duration::from_secs(1), b.woken())
            .await
            .expect("b woken");
        assert!(
            tokio::time::timeout(Duration::from_millis(50), other.woken())
                .await
                .is_err(),
            "request 8 was not notified"
        );
        shared.wake_all();
        tokio::time::timeout(Duration::from_secs(1), other.woken())
            .await
            .expect("reconnect wakes everyone");
        drop((a, b, other));
        assert!(shared.waiters().is_empty(), "dropped waiters deregister");
    }
}
