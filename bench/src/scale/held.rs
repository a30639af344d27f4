//! The locks W5 holds: S sessions × L locks, the key of each, the token each was granted and
//! when it was last granted or renewed, and each session's next request id. Shared by the
//! fill, the renewer, the failover's sample check and the probes; no I/O.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

/// Lock `n` of the fill is lock `n / sessions` of session `n % sessions`, so the sessions fill
/// up side by side.
#[derive(Debug)]
pub struct Held {
    /// The sessions' ids, by session index.
    pub sessions: Vec<String>,
    /// The TTL every lock is granted (and renewed) with, in milliseconds.
    pub grant_ttl_ms: u64,
    /// Each lock's fencing token (0: not granted yet).
    tokens: Vec<AtomicU64>,
    /// When each lock was last granted or renewed, in ms since `epoch`.
    renewed_ms: Vec<AtomicU64>,
    /// Each session's next request id.
    request_ids: Vec<AtomicU64>,
    /// Locks granted so far: locks `0..filled` are held.
    filled: AtomicUsize,
    epoch: Instant,
}

impl Held {
    /// Room for `locks_per_session` locks on each of `sessions`, granted for `grant_ttl_ms`.
    pub fn new(sessions: Vec<String>, locks_per_session: usize, grant_ttl_ms: u64) -> Self {
        let total = sessions.len() * locks_per_session;
        Self {
            request_ids: (0..sessions.len()).map(|_| AtomicU64::new(1)).collect(),
            sessions,
            grant_ttl_ms,
            tokens: (0..total).map(|_| AtomicU64::new(0)).collect(),
            renewed_ms: (0..total).map(|_| AtomicU64::new(0)).collect(),
            filled: AtomicUsize::new(0),
            epoch: Instant::now(),
        }
    }

    /// Every lock of the fill.
    pub fn total(&self) -> usize {
        self.tokens.len()
    }

    /// Locks granted so far.
    pub fn filled(&self) -> usize {
        self.filled.load(Ordering::Acquire)
    }

    /// Marks locks `0..n` granted (the fill calls it once every lock below `n` is).
    pub fn set_filled(&self, n: usize) {
        self.filled.store(n, Ordering::Release);
    }

    /// The session index of lock `n`.
    pub fn session_of(&self, n: usize) -> usize {
        n % self.sessions.len().max(1)
    }

    /// The key of lock `n`.
    pub fn key(&self, n: usize) -> String {
        let sessions = self.sessions.len().max(1);
        format!("w5/held/{:05}/{:04}", n % sessions, n / sessions)
    }

    /// The session id lock `n` belongs to.
    pub fn session_id(&self, n: usize) -> &str {
        &self.sessions[self.session_of(n)]
    }

    /// A fresh request id of session `session`.
    pub fn request_id(&self, session: usize) -> u64 {
        self.request_ids[session].fetch_add(1, Ordering::Relaxed)
    }

    /// Records lock `n` granted (or renewed) with `token` now.
    pub fn granted(&self, n: usize, token: u64) {
        self.tokens[n].store(token, Ordering::Relaxed);
        self.renewed_ms[n].store(self.epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    /// Lock `n`'s token (0 if not granted).
    pub fn token(&self, n: usize) -> u64 {
        self.tokens[n].load(Ordering::Relaxed)
    }

    /// Milliseconds since lock `n` was granted or last renewed.
    pub fn age_ms(&self, n: usize) -> u64 {
        (self.epoch.elapsed().as_millis() as u64)
            .saturating_sub(self.renewed_ms[n].load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locks_spread_over_the_sessions_and_keys_are_distinct() {
        let held = Held::new(vec!["a".into(), "b".into(), "c".into()], 2, 1_000);
        assert_eq!(held.total(), 6);
        let keys: std::collections::BTreeSet<String> = (0..6).map(|n| held.key(n)).collect();
        assert_eq!(keys.len(), 6);
        assert_eq!(held.session_id(4), "b");
        assert_eq!(held.key(4), "w5/held/00001/0001");
        assert_eq!(held.request_id(1), 1);
        assert_eq!(held.request_id(1), 2);
        held.granted(4, 77);
        assert_eq!(held.token(4), 77);
        assert_eq!(held.token(3), 0);
    }
}
