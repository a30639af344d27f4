//! A session as the replicated state records it: its lease, the keys it holds and waits on, and
//! its window of remembered answers (D-idempotency). Owns no logic beyond keeping those three
//! consistent with each other; the lock table decides what changes.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::ser::SerializeSeq;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::chunked::{ChunkedMap, Cursor, Entry};
use super::decoded::SharedStr;
use super::shared::Shared;

use crate::command::Response;

/// One live session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Session {
    /// The owner the session acts for; every grant of the session carries it.
    pub owner_id: String,
    /// Session lease length.
    pub ttl_ms: u64,
    /// Stamp-clock expiry as last recorded in the log (open, `Promote`). Informational, like a
    /// grant's: the leader keeps the live deadline and applies `ExpireSession` (D-lease).
    pub expires_at_ms: u64,
    /// Stamp of the `OpenSession`.
    pub opened_at_ms: u64,
    /// The principal that opened the session (`Command::AsCaller`), `None` for a session
    /// opened without one (unbound: an `--insecure` node). Never changes while the session
    /// lives. Not in the session's own encoding, which stays the one earlier snapshots used:
    /// the snapshot data carries the principals beside the table (`storage::snapshot`).
    #[serde(skip)]
    pub(crate) principal: Option<String>,
    /// Keys this session holds a grant on.
    pub(crate) locks: LockSet,
    /// Keys this session has a waiter queued on, with the request id of the `Acquire` that
    /// queued it. A session waits at most once per key.
    pub(crate) waits: BTreeMap<String, u64>,
    /// Remembered answers by request id; at most the table's `request_window`, smallest id evicted
    /// first. Each answer is [`Shared`]: a copy of the session (the snapshot builder's
    /// copy-on-write, for every session an apply touches while a build runs) then copies a
    /// pointer per answer, not the answer and its strings, and the map's nodes stay small.
    pub(crate) answers: BTreeMap<u64, Shared<Remembered>>,
}

/// The keys a session holds, in key order, in a `ChunkedMap` of the keys alone. Each key is
/// the allocation its grant holds (`Arc<str>`), so a key costs the set 16 bytes.
///
/// Chunked rather than one sorted `Vec`, for a session that holds many keys (a million held
/// locks in W5 are a thousand per session):
///
/// - a search reads the chunks' packed fences, then searches one chunk of at most 128 keys:
///   about seven of its keys' strings read at a thousand keys, not ten. The set's search was
///   the largest single cost of an acquire at a million held locks (docs/PERFORMANCE.md,
///   session 18);
/// - the copy of a session an apply makes while a snapshot build holds it (copy-on-write)
///   copies one pointer per chunk, and an insert then copies one chunk, not every key.
///
/// An empty set allocates nothing. Encodes as the `BTreeSet` it replaced did: a sequence in
/// key order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LockSet(ChunkedMap<SetKey>);

/// One key of a [`LockSet`]: the key is the entry and its value both.
#[derive(Clone, Debug, PartialEq, Eq)]
struct SetKey(Arc<str>);

impl Entry for SetKey {
    type Value = Arc<str>;
    fn key(&self) -> &str {
        &self.0
    }
    fn value(&self) -> &Arc<str> {
        &self.0
    }
    fn value_mut(&mut self) -> &mut Arc<str> {
        &mut self.0
    }
    fn from_parts(key: &str, value: Arc<str>) -> Result<Self, String> {
        if *value != *key {
            return Err(format!("a lock set's key {key:?} listed as {value:?}"));
        }
        Ok(SetKey(value))
    }
}

impl LockSet {
    /// Number of keys.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the session holds no key.
    pub fn is_empty(&self) -> bool {
        self.0.len() == 0
    }

    /// Whether `key` is held.
    pub fn contains(&self, key: &str) -> bool {
        self.0.contains_key(key)
    }

    /// The keys, in order.
    pub fn iter(&self) -> impl Iterator<Item = &str> {
        self.0.entries().map(|k| &*k.0)
    }

    /// Adds `key`; `false` if it was there (the set then keeps `key`'s allocation, equal to
    /// the one it had).
    pub(crate) fn insert(&mut self, key: Arc<str>) -> bool {
        self.0.insert(SetKey(key)).is_none()
    }

    /// Removes `key`; `false` if it was not there.
    pub(crate) fn remove(&mut self, key: &str) -> bool {
        self.0.remove(key).is_some()
    }

    /// Whether `key` is held, looking first where `cursor` points: a caller visiting the
    /// grants in key order meets each session's keys in this set's order, so the look is
    /// nearly always right and a search is the exception. Moves `cursor` past the key found.
    pub(crate) fn holds_from(&self, key: &str, cursor: &mut Cursor) -> bool {
        self.0.find_from(key, cursor).is_some()
    }

    /// Points the set's copy of `key` at `key`'s own allocation (the grant's), found as by
    /// [`LockSet::holds_from`]; nothing if the set lacks the key (the invariant check names
    /// that).
    pub(crate) fn share_key(&mut self, key: &Arc<str>, cursor: &mut Cursor) {
        if let Some(own) = self.0.find_from_mut(key, cursor) {
            *own = key.clone();
        }
    }

    /// Replaces each key by the allocation `shared` answers for it (the grant's), so a decoded
    /// set holds no copy of its own; a key `shared` does not know keeps its own.
    pub(crate) fn share_keys<'a>(&mut self, shared: impl Fn(&str) -> Option<&'a Arc<str>>) {
        for key in self.0.values_mut() {
            if let Some(same) = shared(key).filter(|same| ***same == **key) {
                *key = same.clone();
            }
        }
    }

    /// The key allocations, for the tests of their sharing.
    #[cfg(test)]
    pub(crate) fn arcs(&self) -> impl Iterator<Item = &Arc<str>> {
        self.0.entries().map(|k| &k.0)
    }
}

impl Serialize for LockSet {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.len()))?;
        for key in self.iter() {
            seq.serialize_element(key)?;
        }
        seq.end()
    }
}

impl<'de> Deserialize<'de> for LockSet {
    /// Reads what a `BTreeSet<String>` wrote; keys out of order or repeated (never written so)
    /// are put in order once, as the set did. Each key is allocated once, as the `Arc<str>` the
    /// set keeps (`table::decoded::SharedStr`).
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let keys = Vec::<SharedStr>::deserialize(deserializer)?;
        Ok(LockSet(
            keys.into_iter().map(|SharedStr(key)| SetKey(key)).collect(),
        ))
    }
}

/// What the window remembers about one request id.
///
/// `CancelWait` names the `Acquire` it withdraws by that acquire's request id, so both answers
/// live under one id: `answer` is the acquire's (or release's, renew's) answer, kept up to date
/// when a queued acquire is later granted or dropped; `cancel` is the answer of a `CancelWait`
/// for that id, returned again if the cancel is retried.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Remembered {
    pub(crate) answer: Response,
    pub(crate) cancel: Option<Response>,
}

/// Whether a request id can be acted on, per the session's window.
pub(crate) enum WindowCheck<'a> {
    /// The id is remembered: this is a retry.
    Seen(&'a Remembered),
    /// The id is older than everything in a full window: its outcome can no longer be told.
    Stale,
    /// A new request.
    New,
}

impl Session {
    pub(crate) fn new(
        owner_id: String,
        principal: Option<String>,
        ttl_ms: u64,
        stamp_ms: u64,
    ) -> Self {
        Session {
            owner_id,
            ttl_ms,
            expires_at_ms: stamp_ms.saturating_add(ttl_ms),
            opened_at_ms: stamp_ms,
            principal,
            locks: LockSet::default(),
            waits: BTreeMap::new(),
            answers: BTreeMap::new(),
        }
    }

    /// The principal the session is bound to, `None` if it is unbound.
    pub fn principal(&self) -> Option<&str> {
        self.principal.as_deref()
    }

    /// Keys this session holds a grant on, in key order.
    pub fn locks(&self) -> &LockSet {
        &self.locks
    }

    /// Keys this session waits on, in key order, each with the request id of the `Acquire` that
    /// queued the waiter.
    pub fn waits(&self) -> impl Iterator<Item = (&str, u64)> {
        self.waits.iter().map(|(key, id)| (key.as_str(), *id))
    }

    /// Number of waits this session has queued.
    pub fn wait_count(&self) -> usize {
        self.waits.len()
    }

    /// The remembered answer of request `request_id`, if it is still in the window. For a
    /// queued acquire this is `Queued` until it is granted (`Granted`) or leaves the queue
    /// ungranted (`NotGranted`).
    pub fn remembered(&self, request_id: u64) -> Option<&Response> {
        self.answers.get(&request_id).map(|r| &r.answer)
    }

    /// Request ids currently remembered, smallest first.
    pub fn remembered_ids(&self) -> impl Iterator<Item = u64> + '_ {
        self.answers.keys().copied()
    }

    /// Where `request_id` stands in a window of `window` answers (the table's limit).
    pub(crate) fn check_window(&self, request_id: u64, window: usize) -> WindowCheck<'_> {
        if let Some(r) = self.answers.get(&request_id) {
            return WindowCheck::Seen(r);
        }
        match self.answers.first_key_value() {
            Some((&smallest, _)) if self.answers.len() >= window && request_id < smallest => {
                WindowCheck::Stale
            }
            _ => WindowCheck::New,
        }
    }

    /// Remembers `answer` for `request_id` (keeping a cancel answer already recorded), evicting
    /// the smallest id when the window of `window` answers overflows.
    pub(crate) fn remember(&mut self, request_id: u64, answer: Response, window: usize) {
        match self.answers.get_mut(&request_id) {
            Some(r) => r.make_mut().answer = answer,
            None => {
                self.answers.insert(
                    request_id,
                    Shared::new(Remembered {
                        answer,
                        cancel: None,
                    }),
                );
                while self.answers.len() > window {
                    self.answers.pop_first();
                }
            }
        }
    }

    /// Records the answer of a `CancelWait` for `request_id` next to the acquire's answer.
    pub(crate) fn remember_cancel(
        &mut self,
        request_id: u64,
        answer: Response,
        cancel: Response,
        window: usize,
    ) {
        self.remember(request_id, answer, window);
        if let Some(r) = self.answers.get_mut(&request_id) {
            r.make_mut().cancel = Some(cancel);
        }
    }

    /// Updates the remembered answer of a queued acquire that was granted or dropped, if the
    /// window still holds it (an evicted id is answered `StaleRequest` anyway).
    pub(crate) fn settle(&mut self, request_id: u64, answer: Response) {
        if let Some(r) = self.answers.get_mut(&request_id) {
            r.make_mut().answer = answer;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn a_lock_set_encodes_and_behaves_as_the_btreeset_it_replaced() {
        let mut set = LockSet::default();
        let mut model = BTreeSet::new();
        for i in [5u32, 1, 9, 3, 7, 1, 5] {
            assert_eq!(
                set.insert(format!("k{i}").into()),
                model.insert(format!("k{i}"))
            );
        }
        assert_eq!(set.remove("k3"), model.remove("k3"));
        assert_eq!(set.remove("k3"), model.remove("k3"));
        assert!(set.iter().eq(model.iter()));
        assert_eq!(set.len(), model.len());
        assert!(set.contains("k9") && !set.contains("k3"));
        let bytes = postcard::to_allocvec(&set).expect("encodes");
        assert_eq!(bytes, postcard::to_allocvec(&model).expect("encodes"));
        assert_eq!(
            postcard::from_bytes::<LockSet>(&bytes).expect("decodes"),
            set
        );
        let unsorted = postcard::to_allocvec(&vec!["b", "a", "b"]).expect("encodes");
        let back: LockSet = postcard::from_bytes(&unsorted).expect("decodes");
        assert!(back.iter().eq(["a", "b"]));
    }

    /// A set of many keys (many chunks) behaves and encodes as a `BTreeSet`; a walk in key
    /// order finds every key from its cursor, including across removals, and misses a key the
    /// set lacks; sharing a key points the set at the caller's allocation.
    #[test]
    fn a_large_lock_set_is_walked_in_order_and_shares_keys() {
        let key = |i: u32| format!("w5/held/00001/{:04}", (i * 7919) % 3001);
        let mut set = LockSet::default();
        let mut model = BTreeSet::new();
        for i in 0..3_000 {
            assert_eq!(set.insert(key(i).into()), model.insert(key(i)));
        }
        for i in (0..3_000).step_by(7) {
            assert_eq!(set.remove(&key(i)), model.remove(&key(i)));
        }
        assert!(set.iter().eq(model.iter()));
        assert_eq!(set.len(), model.len());
        let bytes = postcard::to_allocvec(&set).expect("encodes");
        assert_eq!(bytes, postcard::to_allocvec(&model).expect("encodes"));
        assert_eq!(
            postcard::from_bytes::<LockSet>(&bytes).expect("decodes"),
            set
        );

        let mut cursor = Cursor::default();
        assert!(model.iter().all(|k| set.holds_from(k, &mut cursor)));
        assert!(!set.holds_from("w5/held/00001/9999", &mut cursor));
        let mut cursor = Cursor::default();
        let grants: Vec<Arc<str>> = model.iter().map(|k| Arc::from(k.as_str())).collect();
        for grant in &grants {
            set.share_key(grant, &mut cursor);
        }
        assert!(
            set.arcs()
                .zip(&grants)
                .all(|(own, grant)| Arc::ptr_eq(own, grant))
        );
    }

    /// A copy of a session shares its remembered answers; changing one answer of the original
    /// copies that answer alone, the copy keeps what it had, and the answers encode as the
    /// `BTreeMap<u64, Remembered>` they were before they were shared.
    #[test]
    fn a_copy_shares_remembered_answers_until_one_changes() {
        let mut session = Session::new("owner".into(), None, 10_000, 1);
        for id in 1..=4 {
            session.remember(id, Response::Queued { position: 1 }, 3);
        }
        assert_eq!(session.remembered_ids().collect::<Vec<_>>(), [2, 3, 4]);
        let copy = session.clone();
        session.settle(3, Response::NotGranted);
        session.remember_cancel(
            4,
            Response::NotGranted,
            Response::WaitCancelled {
                removed: true,
                grant: None,
                released: false,
            },
            3,
        );
        let shared = |id: u64| Shared::ptr_eq(&session.answers[&id], &copy.answers[&id]);
        assert!(shared(2) && !shared(3) && !shared(4));
        assert_eq!(copy.remembered(3), Some(&Response::Queued { position: 1 }));
        assert_eq!(session.remembered(3), Some(&Response::NotGranted));
        assert!(copy.answers[&4].cancel.is_none() && session.answers[&4].cancel.is_some());

        let plain: BTreeMap<u64, Remembered> = session
            .answers
            .iter()
            .map(|(id, r)| (*id, (**r).clone()))
            .collect();
        let bytes = postcard::to_allocvec(&session.answers).expect("encodes");
        assert_eq!(bytes, postcard::to_allocvec(&plain).expect("encodes"));
        let back: BTreeMap<u64, Shared<Remembered>> =
            postcard::from_bytes(&bytes).expect("decodes");
        assert_eq!(back, session.answers);
    }
}
