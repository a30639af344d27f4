//! [`WatchHub`]: the one etcd watch stream of a store, multiplexing the watches of every local
//! waiter (D-wait: a waiter is woken by the hand-off itself, never by polling).
//!
//! Owns the stream and the registry of watches on it; knows nothing about locks. Each
//! [`Subscription`] names the keys it watches and the revision to start from (the revision at
//! which its owner read the state, plus one), so no change between that read and the watch
//! is missed, and no delay is needed to let a watch "sync" (etcd's own v3lock recipe waits
//! 100 ms for that). When the stream fails — a member restarts, the connection drops, the
//! member loses its leader (the stream asks for `hasleader`, so a partitioned member cancels
//! it instead of going silent) — the hub reconnects with backoff and re-creates every watch
//! from the revision after the last event it delivered, so subscribers notice nothing. Only
//! when etcd can no longer replay from there (the revision was compacted) does a subscription
//! get [`WatchNote::Lost`]: its owner then reads the state again and subscribes anew.
//!
//! Failures are logged once per episode and then summarised (`LogLimit`).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use lock_proto::etcd::mvccpb::Event;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::transport::Channel;

use super::wire;
use crate::log_limit::{LogLimit, Note};
use wire::watch_client::WatchClient;
use wire::watch_request::RequestUnion;
use wire::{WatchCancelRequest, WatchCreateRequest, WatchRequest, WatchResponse};

/// First pause before reconnecting a failed watch stream.
pub const RECONNECT_BACKOFF_MIN: Duration = Duration::from_millis(50);
/// Longest pause between reconnects: an outage is retried at least this often, so a waiter
/// learns of a hand-off at most this long after etcd is back.
pub const RECONNECT_BACKOFF_MAX: Duration = Duration::from_secs(2);

/// What a subscription receives.
#[derive(Debug)]
pub(super) enum WatchNote {
    /// A change of a watched key, in revision order.
    Event(Event),
    /// The watch could not be kept (its start revision was compacted away): read the state
    /// again and subscribe anew.
    Lost,
}

enum Cmd {
    Add {
        id: i64,
        key: Vec<u8>,
        range_end: Vec<u8>,
        start_revision: i64,
        notes: mpsc::UnboundedSender<WatchNote>,
    },
    Remove {
        id: i64,
    },
}

/// The handle to a store's watch stream. Cheap to share; the stream's task ends when the last
/// handle is dropped.
#[derive(Debug)]
pub(super) struct WatchHub {
    cmds: mpsc::UnboundedSender<Cmd>,
    next_id: AtomicI64,
}

/// Watches on a few keys, all delivered to one receiver; dropping it cancels them.
pub(super) struct Subscription {
    cmds: mpsc::UnboundedSender<Cmd>,
    ids: Vec<i64>,
    notes: mpsc::UnboundedReceiver<WatchNote>,
}

impl Subscription {
    /// The next note; `None` only if the hub is gone (the store was dropped).
    pub(super) async fn next(&mut self) -> Option<WatchNote> {
        self.notes.recv().await
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        for &id in &self.ids {
            let _ = self.cmds.send(Cmd::Remove { id });
        }
    }
}

impl WatchHub {
    /// Starts the stream's task on the current tokio runtime; it connects on the first
    /// subscription.
    pub(super) fn start(channel: Channel) -> Arc<WatchHub> {
        let (cmds, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(WatchClient::new(channel), rx));
        Arc::new(WatchHub {
            cmds,
            next_id: AtomicI64::new(1),
        })
    }

    /// Watches each `(key, range_end)` (empty end: the one key) from `start_revision` on.
    pub(super) fn subscribe(
        &self,
        keys: Vec<(Vec<u8>, Vec<u8>)>,
        start_revision: i64,
    ) -> Subscription {
        let (tx, notes) = mpsc::unbounded_channel();
        let mut ids = Vec::with_capacity(keys.len());
        for (key, range_end) in keys {
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            ids.push(id);
            let _ = self.cmds.send(Cmd::Add {
                id,
                key,
                range_end,
                start_revision,
                notes: tx.clone(),
            });
        }
        Subscription {
            cmds: self.cmds.clone(),
            ids,
            notes,
        }
    }
}

struct Entry {
    key: Vec<u8>,
    range_end: Vec<u8>,
    /// The revision to (re)start from: one past the last event delivered.
    next_revision: i64,
    notes: mpsc::UnboundedSender<WatchNote>,
}

fn create(id: i64, e: &Entry) -> WatchRequest {
    WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
            key: e.key.clone(),
            range_end: e.range_end.clone(),
            start_revision: e.next_revision,
            watch_id: id,
            ..Default::default()
        })),
    }
}

fn cancel(id: i64) -> WatchRequest {
    WatchRequest {
        request_union: Some(RequestUnion::CancelRequest(WatchCancelRequest {
            watch_id: id,
        })),
    }
}

/// Applies a command to the registry, and to the live stream if there is one.
fn apply(
    cmd: Cmd,
    registry: &mut HashMap<i64, Entry>,
    live: Option<&mpsc::UnboundedSender<WatchRequest>>,
) {
    match cmd {
        Cmd::Add {
            id,
            key,
            range_end,
            start_revision,
            notes,
        } => {
            let entry = Entry {
                key,
                range_end,
                next_revision: start_revision,
                notes,
            };
            if let Some(live) = live {
                let _ = live.send(create(id, &entry));
            }
            registry.insert(id, entry);
        }
        Cmd::Remove { id } => {
            if registry.remove(&id).is_some()
                && let Some(live) = live
            {
                let _ = live.send(cancel(id));
            }
        }
    }
}

fn deliver(resp: WatchResponse, registry: &mut HashMap<i64, Entry>) {
    let id = resp.watch_id;
    if resp.canceled {
        // Cancelled by etcd, not by us (ours are removed from the registry first).
        if let Some(entry) = registry.remove(&id) {
            tracing::debug!(
                watch_id = id,
                compact_revision = resp.compact_revision,
                reason = %resp.cancel_reason,
                "etcd cancelled a watch; its subscriber reads the state again"
            );
            let _ = entry.notes.send(WatchNote::Lost);
        }
        return;
    }
    let Some(entry) = registry.get_mut(&id) else {
        return;
    };
    for event in resp.events {
        if let Some(kv) = &event.kv {
            entry.next_revision = entry.next_revision.max(kv.mod_revision + 1);
        }
        let _ = entry.notes.send(WatchNote::Event(event));
    }
}

/// Notes a stream failure: once per episode, then a summary a minute.
fn failed(log: &mut LogLimit, error: &str, watches: usize) {
    let now = tokio::time::Instant::now().into_std();
    match log.failed(now, &error) {
        None => {}
        Some(Note::Began) => {
            tracing::warn!(%error, watches, "etcd watch stream lost; reconnecting with backoff")
        }
        Some(Note::Summary(s)) => tracing::warn!(
            failures = s.count,
            for_s = s.lasted.as_secs(),
            last_error = %s.last_error,
            watches,
            "etcd watch stream still down"
        ),
    }
}

async fn run(mut client: WatchClient<Channel>, mut cmds: mpsc::UnboundedReceiver<Cmd>) {
    let mut registry: HashMap<i64, Entry> = HashMap::new();
    let mut log = LogLimit::default();
    let mut backoff = RECONNECT_BACKOFF_MIN;
    loop {
        // Idle until there is something to watch.
        while registry.is_empty() {
            match cmds.recv().await {
                Some(cmd) => apply(cmd, &mut registry, None),
                None => return,
            }
        }
        let (live, requests) = mpsc::unbounded_channel();
        for (id, entry) in &registry {
            let _ = live.send(create(*id, entry));
        }
        let mut request = tonic::Request::new(UnboundedReceiverStream::new(requests));
        // Without it a member cut off from its leader keeps the stream open and silent.
        request.metadata_mut().insert(
            "hasleader",
            tonic::metadata::MetadataValue::from_static("true"),
        );
        let error = match client.watch(request).await {
            Err(s) => format!("{:?}: {}", s.code(), s.message()),
            Ok(answer) => {
                let mut stream = answer.into_inner();
                loop {
                    tokio::select! {
                        cmd = cmds.recv() => match cmd {
                            Some(cmd) => apply(cmd, &mut registry, Some(&live)),
                            None => return,
                        },
                        msg = stream.message() => match msg {
                            Ok(Some(resp)) => {
                                let now = tokio::time::Instant::now().into_std();
                                if let Some(ended) = log.succeeded(now) {
                                    tracing::info!(
                                        failures = ended.total,
                                        for_ms = ended.lasted.as_millis() as u64,
                                        "etcd watch stream is back"
                                    );
                                }
                                backoff = RECONNECT_BACKOFF_MIN;
                                deliver(resp, &mut registry);
                            }
                            Ok(None) => break "the stream ended".to_owned(),
                            Err(s) => break format!("{:?}: {}", s.code(), s.message()),
                        },
                    }
                }
            }
        };
        failed(&mut log, &error, registry.len());
        // Back off, still taking commands so subscriptions come and go meanwhile.
        let pause = tokio::time::sleep(backoff);
        tokio::pin!(pause);
        loop {
            tokio::select! {
                () = &mut pause => break,
                cmd = cmds.recv() => match cmd {
                    Some(cmd) => apply(cmd, &mut registry, None),
                    None => return,
                },
            }
        }
        backoff = (backoff * 2).min(RECONNECT_BACKOFF_MAX);
    }
}

#[cfg(test)]
mod tests {
    use lock_proto::etcd::mvccpb::KeyValue;

    use super::*;

    fn event(key: &[u8], mod_revision: i64) -> Event {
        Event {
            r#type: 1,
            kv: Some(KeyValue {
                key: key.to_vec(),
                mod_revision,
                ..Default::default()
            }),
            prev_kv: None,
        }
    }

    fn add(id: i64, start_revision: i64) -> (Cmd, mpsc::UnboundedReceiver<WatchNote>) {
        let (notes, rx) = mpsc::unbounded_channel();
        let cmd = Cmd::Add {
            id,
            key: b"k".to_vec(),
            range_end: Vec::new(),
            start_revision,
            notes,
        };
        (cmd, rx)
    }

    /// A re-created watch resumes one past the last event it delivered, so a reconnect
    /// neither repeats nor skips an event.
    #[test]
    fn events_advance_the_restart_revision() {
        let mut registry = HashMap::new();
        let (cmd, mut rx) = add(7, 10);
        apply(cmd, &mut registry, None);
        deliver(
            WatchResponse {
                watch_id: 7,
                events: vec![event(b"k", 12), event(b"k", 15)],
                ..Default::default()
            },
            &mut registry,
        );
        assert_eq!(registry[&7].next_revision, 16);
        assert!(
            matches!(rx.try_recv(), Ok(WatchNote::Event(e)) if e.kv.as_ref().is_some_and(|kv| kv.mod_revision == 12))
        );
        assert!(matches!(rx.try_recv(), Ok(WatchNote::Event(_))));
        let Some(RequestUnion::CreateRequest(c)) = create(7, &registry[&7]).request_union else {
            panic!("a create request");
        };
        assert_eq!((c.watch_id, c.start_revision), (7, 16));
    }

    /// A watch etcd cancels (its start revision compacted) tells its subscriber to read the
    /// state again, and leaves the registry; other watches are untouched.
    #[test]
    fn a_cancelled_watch_is_lost_to_its_subscriber_only() {
        let mut registry = HashMap::new();
        let (a, mut rx_a) = add(1, 5);
        let (b, mut rx_b) = add(2, 5);
        apply(a, &mut registry, None);
        apply(b, &mut registry, None);
        deliver(
            WatchResponse {
                watch_id: 1,
                canceled: true,
                compact_revision: 9,
                ..Default::default()
            },
            &mut registry,
        );
        assert!(matches!(rx_a.try_recv(), Ok(WatchNote::Lost)));
        assert!(rx_b.try_recv().is_err());
        assert!(!registry.contains_key(&1) && registry.contains_key(&2));
    }

    /// Commands reach a live stream as create and cancel requests, and events for a removed
    /// watch are dropped.
    #[test]
    fn commands_reach_the_live_stream() {
        let mut registry = HashMap::new();
        let (live, mut sent) = mpsc::unbounded_channel();
        let (cmd, _rx) = add(3, 4);
        apply(cmd, &mut registry, Some(&live));
        apply(Cmd::Remove { id: 3 }, &mut registry, Some(&live));
        assert!(matches!(
            sent.try_recv().ok().and_then(|r| r.request_union),
            Some(RequestUnion::CreateRequest(c)) if c.watch_id == 3 && c.start_revision == 4
        ));
        assert!(matches!(
            sent.try_recv().ok().and_then(|r| r.request_union),
            Some(RequestUnion::CancelRequest(c)) if c.watch_id == 3
        ));
        deliver(
            WatchResponse {
                watch_id: 3,
                events: vec![event(b"k", 6)],
                ..Default::default()
            },
            &mut registry,
        );
        assert!(registry.is_empty());
    }
}
