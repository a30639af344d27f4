//! The key layout of the etcd store under its prefix, and the records stored at each key.
//!
//! Owns every key encoding and every value format of the etcd backend, in one place, so that
//! the transactions in the other modules never format a key by hand. Does no IO.
//!
//! Lock keys may contain `/` (they name resources, "payout/2026-11-30"), so a key is never
//! followed by `/` where a range over "everything of this key" must not also match another key
//! that extends it: such keys end in NUL (`\0`), which `lock_api::validate` forbids in keys
//! and session ids (control characters), so `waiter/a\0` can never be a prefix of key `a/b`'s
//! waiters.

use serde::{Deserialize, Serialize};

use lock_api::LockError;

/// The first byte of every stored record: its format version.
const RECORD_FORMAT: u8 = 1;

/// The separator after a lock key inside a longer etcd key (see the module docs).
const KEY_END: char = '\0';

/// Builds and parses the etcd keys of one store (one prefix).
#[derive(Clone, Debug)]
pub(super) struct Layout {
    prefix: String,
}

impl Layout {
    pub(super) fn new(prefix: &str) -> Self {
        Layout {
            prefix: prefix.to_owned(),
        }
    }

    fn k(&self, rest: std::fmt::Arguments<'_>) -> Vec<u8> {
        format!("{}{rest}", self.prefix).into_bytes()
    }

    /// `session/<id>`: the owner id, on the session's lease.
    pub(super) fn session(&self, session_id: &str) -> Vec<u8> {
        self.k(format_args!("session/{session_id}"))
    }

    /// `principal/<id>`: the principal the session is bound to (docs/SECURITY.md §3), on the
    /// session's lease; absent for an unbound session. A key of its own rather than a field of
    /// the session's value, so sessions written before it, and every reader of the owner id,
    /// stay as they were.
    pub(super) fn principal(&self, session_id: &str) -> Vec<u8> {
        self.k(format_args!("principal/{session_id}"))
    }

    /// `lock/<key>`: the [`GrantRecord`], on the holder's lease.
    pub(super) fn lock(&self, key: &str) -> Vec<u8> {
        self.k(format_args!("lock/{key}"))
    }

    /// Every `lock/` key: the range start.
    pub(super) fn locks(&self) -> Vec<u8> {
        self.k(format_args!("lock/"))
    }

    /// The lock key named by a `lock/<key>` etcd key.
    pub(super) fn key_of_lock(&self, etcd_key: &[u8]) -> String {
        let full = String::from_utf8_lossy(etcd_key);
        full.strip_prefix(&format!("{}lock/", self.prefix))
            .unwrap_or(&full)
            .to_owned()
    }

    /// `waiter/<key>\0<session>`: one queued acquire ([`WaiterRecord`]), on the waiting
    /// session's lease. A session waits at most once per key, so the session names the waiter;
    /// the queue order is the keys' CreateRevision.
    pub(super) fn waiter(&self, key: &str, session_id: &str) -> Vec<u8> {
        self.k(format_args!("waiter/{key}{KEY_END}{session_id}"))
    }

    /// The range start of `key`'s queue (with [`prefix_end`] its end).
    pub(super) fn queue(&self, key: &str) -> Vec<u8> {
        self.k(format_args!("waiter/{key}{KEY_END}"))
    }

    /// Every `waiter/` key: the range start.
    pub(super) fn waiters(&self) -> Vec<u8> {
        self.k(format_args!("waiter/"))
    }

    /// `(key, session_id)` of a `waiter/` etcd key.
    pub(super) fn parse_waiter(&self, etcd_key: &[u8]) -> Option<(String, String)> {
        let full = std::str::from_utf8(etcd_key).ok()?;
        let rest = full.strip_prefix(&format!("{}waiter/", self.prefix))?;
        let (key, session) = rest.split_once(KEY_END)?;
        Some((key.to_owned(), session.to_owned()))
    }

    /// `slot/<session>/`: the range of a session's lock slots (its grants and its waits), the
    /// index that bounds them (LOCKS_PER_SESSION_MAX, WAITS_PER_SESSION_MAX) and that lists
    /// `locks_of` without a scan of every grant. On the session's lease.
    pub(super) fn slots(&self, session_id: &str) -> Vec<u8> {
        self.k(format_args!("slot/{session_id}/"))
    }

    /// `slot/<session>/h/<key>`: the session holds `key` (empty value).
    pub(super) fn held(&self, session_id: &str, key: &str) -> Vec<u8> {
        self.k(format_args!("slot/{session_id}/h/{key}"))
    }

    /// The range start of a session's held slots.
    pub(super) fn helds(&self, session_id: &str) -> Vec<u8> {
        self.k(format_args!("slot/{session_id}/h/"))
    }

    /// The lock key named by a `slot/<session>/h/<key>` etcd key.
    pub(super) fn key_of_held(&self, session_id: &str, etcd_key: &[u8]) -> String {
        let full = String::from_utf8_lossy(etcd_key);
        full.strip_prefix(&format!("{}slot/{session_id}/h/", self.prefix))
            .unwrap_or(&full)
            .to_owned()
    }

    /// `slot/<session>/w/<key>`: the session waits on `key`; the value is the wait's deadline
    /// (a [`WaitSlot`]), so a lapsed wait nobody cleared yet does not count against the limit.
    pub(super) fn wait(&self, session_id: &str, key: &str) -> Vec<u8> {
        self.k(format_args!("slot/{session_id}/w/{key}"))
    }

    /// The range start of a session's wait slots.
    pub(super) fn waits(&self, session_id: &str) -> Vec<u8> {
        self.k(format_args!("slot/{session_id}/w/"))
    }

    /// `request/<session>/<request id, 16 hex digits>`: the [`RequestRecord`], on the
    /// session's lease.
    pub(super) fn request(&self, session_id: &str, request_id: u64) -> Vec<u8> {
        self.k(format_args!("request/{session_id}/{request_id:016x}"))
    }

    /// Every `request/` key: the range start.
    pub(super) fn requests(&self) -> Vec<u8> {
        self.k(format_args!("request/"))
    }

    /// `(session_id, request_id)` of a `request/` etcd key.
    pub(super) fn parse_request(&self, etcd_key: &[u8]) -> Option<(String, u64)> {
        let full = std::str::from_utf8(etcd_key).ok()?;
        let rest = full.strip_prefix(&format!("{}request/", self.prefix))?;
        let (session, id) = rest.rsplit_once('/')?;
        Some((session.to_owned(), u64::from_str_radix(id, 16).ok()?))
    }

    /// `forgot/<session>`: the highest request id of the session whose record `reap_expired`
    /// deleted (a [`Forgotten`]), on the session's lease. A request at or below it is one whose
    /// outcome can no longer be told (client request ids grow per session).
    pub(super) fn forgot(&self, session_id: &str) -> Vec<u8> {
        self.k(format_args!("forgot/{session_id}"))
    }

    /// `revocation/<key>\0<uuid>`: a [`RevocationRecord`], the audit trail, on no lease.
    pub(super) fn revocation(&self, key: &str) -> Vec<u8> {
        self.k(format_args!(
            "revocation/{key}{KEY_END}{}",
            uuid::Uuid::new_v4().simple()
        ))
    }

    /// The range start of `key`'s revocations.
    pub(super) fn revocations(&self, key: &str) -> Vec<u8> {
        self.k(format_args!("revocation/{key}{KEY_END}"))
    }

    /// Every `revocation/` key, of every lock key: the range start of the whole audit log.
    pub(super) fn audit_log(&self) -> Vec<u8> {
        self.k(format_args!("revocation/"))
    }

    /// The lock key of a `revocation/<key>\0<uuid>` etcd key.
    pub(super) fn parse_revocation(&self, etcd_key: &[u8]) -> Option<String> {
        let full = std::str::from_utf8(etcd_key).ok()?;
        let rest = full.strip_prefix(&format!("{}revocation/", self.prefix))?;
        let (key, _uuid) = rest.split_once(KEY_END)?;
        Some(key.to_owned())
    }
}

/// The exclusive end of the range of every key that starts with `start` (etcd's
/// `GetPrefixRangeEnd`): `start` with its last byte incremented (every prefix here ends in `/`
/// or NUL, never in 0xff).
pub(super) fn prefix_end(start: &[u8]) -> Vec<u8> {
    let mut end = start.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // All 0xff (never one of ours): etcd reads "\0" as "to the end of the keyspace".
    vec![0]
}

/// A grant as stored under `lock/<key>`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct GrantRecord {
    /// The holder's owner id (the session's owner).
    pub owner_id: String,
    /// The holder's session id.
    pub session_id: String,
    /// When the grant was made, wall-clock ms since the epoch.
    pub acquired_ms: u64,
    /// When the grant expires unless extended, wall-clock ms since the epoch.
    pub expires_ms: u64,
}

/// The audit record of a force-revoke, under `revocation/<key>\0<uuid>`; its CreateRevision is
/// the new token floor.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RevocationRecord {
    /// Who revoked.
    pub operator: String,
    /// Why.
    pub reason: String,
    /// The displaced holder's owner, if any.
    pub previous_owner_id: Option<String>,
    /// The displaced grant's token, if any.
    pub previous_token: Option<u64>,
    /// When, wall-clock ms since the epoch.
    pub revoked_ms: u64,
    /// The revoke's request id (0: none), for the retry window (D-idempotency).
    pub request_id: u64,
}

/// One queued acquire, under `waiter/<key>\0<session>`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WaiterRecord {
    /// The acquire's request id.
    pub request_id: u64,
    /// The waiting session's owner, whom the hand-off grants the key to.
    pub owner_id: String,
    /// The lease length the grant will get.
    pub ttl_ms: u64,
    /// Wall-clock ms after which the waiter is dropped instead of granted. A waiter whose
    /// deadline equals the clock is still live (as in the Raft table).
    pub deadline_ms: u64,
    /// When the acquire queued, wall-clock ms.
    pub queued_ms: u64,
}

/// The value of `slot/<session>/w/<key>`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WaitSlot {
    /// The wait's deadline, as in its [`WaiterRecord`].
    pub deadline_ms: u64,
}

/// The value of `forgot/<session>`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Forgotten {
    /// The highest request id whose record was deleted for age.
    pub request_id: u64,
}

/// A grant as a request record remembers it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrantAnswer {
    /// The token; 0 means "the ModRevision of this request record": a record written in the
    /// granting transaction cannot name that transaction's revision, but shares it.
    pub token: u64,
    /// The owner granted to.
    pub owner_id: String,
    /// The grant's lease length.
    pub ttl_ms: u64,
    /// The grant's expiry when it was made, wall-clock ms.
    pub expires_ms: u64,
}

/// The remembered answer of one request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Answer {
    /// An acquire that waits; its waiter key exists while it does. A record that says
    /// `Queued` while the waiter key is gone is an acquire that left the queue ungranted.
    Queued,
    /// An acquire that was granted (at once or by a hand-off).
    Granted(GrantAnswer),
    /// An acquire that was not granted and does not wait.
    NotGranted,
    /// A release and whether it released.
    Released(bool),
}

/// The remembered answer of a cancel of an acquire (kept beside the acquire's own).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CancelAnswer {
    /// The grant kept for the caller (cancel with `release_if_granted == false`).
    pub grant: Option<GrantAnswer>,
    /// Whether the cancel released the grant.
    pub released: bool,
}

/// What `request/<session>/<id>` holds: the answer a retry of the request gets.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestRecord {
    /// The key the request was about.
    pub key: String,
    /// When the answer was last written, wall-clock ms; `reap_expired` deletes records older
    /// than `lock_api::limits::REQUEST_RETENTION`.
    pub at_ms: u64,
    /// The request's answer.
    pub answer: Answer,
    /// The answer of a cancel of this acquire, once one was made.
    pub cancel: Option<CancelAnswer>,
}

impl GrantAnswer {
    /// The token, with the "this record's ModRevision" placeholder resolved.
    pub(super) fn token_at(&self, record_mod_revision: i64) -> u64 {
        if self.token != 0 {
            self.token
        } else {
            u64::try_from(record_mod_revision).unwrap_or(0)
        }
    }
}

impl RequestRecord {
    /// The record with every placeholder token resolved against its ModRevision, for a rewrite
    /// (a rewrite changes the ModRevision the placeholder points at).
    pub(super) fn resolved(mut self, mod_revision: i64) -> Self {
        if let Answer::Granted(g) = &mut self.answer {
            g.token = g.token_at(mod_revision);
        }
        if let Some(CancelAnswer { grant: Some(g), .. }) = &mut self.cancel {
            g.token = g.token_at(mod_revision);
        }
        self
    }
}

/// Encodes a record with its format byte.
pub(super) fn encode<T: Serialize>(record: &T) -> Result<Vec<u8>, LockError> {
    let mut bytes = vec![RECORD_FORMAT];
    bytes.extend(
        postcard::to_stdvec(record)
            .map_err(|e| LockError::contention(format!("etcd encoding a record: {e}")))?,
    );
    Ok(bytes)
}

/// Decodes a record read from etcd key `key`; a value in an unknown format is `Contention`
/// (never a panic: these bytes came off the network).
pub(super) fn decode<T: for<'de> Deserialize<'de>>(
    key: &[u8],
    bytes: &[u8],
) -> Result<T, LockError> {
    let fail = |why: String| {
        LockError::contention(format!(
            "etcd decoding a record: {}: {why}",
            String::from_utf8_lossy(key)
        ))
    };
    match bytes.split_first() {
        Some((&RECORD_FORMAT, rest)) => postcard::from_bytes(rest).map_err(|e| fail(e.to_string())),
        _ => Err(fail("unknown format".to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_range_never_matches_a_longer_key() {
        let l = Layout::new("p/");
        let queue = l.queue("a");
        let end = prefix_end(&queue);
        let other = l.waiter("a/b", "s1");
        let own = l.waiter("a", "s1");
        assert!(own >= queue && own < end);
        assert!(
            !(other >= queue && other < end),
            "key a/b's waiter is not in a's queue"
        );
        assert_eq!(l.parse_waiter(&own), Some(("a".into(), "s1".into())));
        assert_eq!(l.parse_waiter(&other), Some(("a/b".into(), "s1".into())));
    }

    #[test]
    fn revocation_keys_parse_back_to_their_lock_key() {
        let l = Layout::new("p/");
        for key in ["a", "a/b", "payout/2026-11-30"] {
            let k = l.revocation(key);
            assert!(k.starts_with(&l.audit_log()));
            assert!(k.starts_with(&l.revocations(key)));
            assert_eq!(l.parse_revocation(&k), Some(key.to_owned()));
        }
        assert_eq!(l.parse_revocation(b"p/lock/a"), None);
    }

    #[test]
    fn request_keys_parse_back() {
        let l = Layout::new("p/");
        let k = l.request("00000000000000ab", 0x1234);
        assert_eq!(
            l.parse_request(&k),
            Some(("00000000000000ab".into(), 0x1234))
        );
    }

    #[test]
    fn a_placeholder_token_resolves_to_the_records_revision() {
        let record = RequestRecord {
            key: "k".into(),
            at_ms: 1,
            answer: Answer::Granted(GrantAnswer {
                token: 0,
                owner_id: "o".into(),
                ttl_ms: 1000,
                expires_ms: 2,
            }),
            cancel: None,
        };
        let resolved = record.resolved(42);
        let Answer::Granted(g) = resolved.answer else {
            panic!("granted")
        };
        assert_eq!(g.token, 42);
        assert_eq!(
            g.token_at(99),
            42,
            "a resolved token no longer follows the record"
        );
    }

    #[test]
    fn records_round_trip_and_reject_unknown_formats() {
        let w = WaiterRecord {
            request_id: 7,
            owner_id: "o".into(),
            ttl_ms: 1000,
            deadline_ms: 5,
            queued_ms: 4,
        };
        let bytes = encode(&w).expect("encodes");
        let back: WaiterRecord = decode(b"k", &bytes).expect("decodes");
        assert_eq!(back.request_id, 7);
        let mut bad = bytes.clone();
        bad[0] = 9;
        assert!(decode::<WaiterRecord>(b"k", &bad).is_err());
        assert!(decode::<WaiterRecord>(b"k", &[]).is_err());
    }
}
