//! The bounds `apply` enforces, as replicated state (issue 18, point 5).
//!
//! Every replica that replays the same log must give the same answers, whichever binary it
//! runs. If `apply` read the constants compiled into the binary (`lock_api::limits`,
//! `crate::limits`), a release that changed one would make an upgraded node answer an old entry
//! differently from its peers — a key of 300 bytes granted on one replica, rejected on another —
//! and the replicas' tables would diverge for good. So `apply` reads its bounds only from the
//! [`ApplyLimits`] the table carries: they travel in the snapshot, and a table that never
//! recorded any (every table before this change, and every table today) holds
//! [`ApplyLimits::V1`], a frozen copy of the values lockd shipped with. Changing a bound means
//! adding a new set of limits applied by a replicated command, never editing `V1`.
//!
//! This module owns the limit values and the argument checks that use them; the checks give
//! the same messages as `lock_api::validate` for the same bounds, so the node's early check and
//! the replicated one tell a client the same thing.

use lock_api::LockError;
use serde::{Deserialize, Serialize};

/// Every bound the state machine enforces while applying a command.
///
/// Counts are `u32` and times `u64` milliseconds, so the encoding in a snapshot does not depend
/// on the width of `usize`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApplyLimits {
    /// Shortest lock or session TTL (`lock_api::limits::TTL_MIN`).
    pub ttl_min_ms: u64,
    /// Longest lock or session TTL (`lock_api::limits::TTL_MAX`).
    pub ttl_max_ms: u64,
    /// Longest `wait_ms` of one acquire (`lock_api::limits::MAX_WAIT_MAX`).
    pub max_wait_max_ms: u64,
    /// Longest key, in bytes.
    pub key_len_max: u32,
    /// Longest owner id, in bytes.
    pub owner_id_len_max: u32,
    /// Longest session id, in bytes.
    pub session_id_len_max: u32,
    /// Longest force-revoke operator, in bytes.
    pub operator_len_max: u32,
    /// Longest force-revoke reason, in bytes.
    pub reason_len_max: u32,
    /// Most waiters queued on one key (`crate::limits::WAITERS_PER_KEY_MAX`).
    pub waiters_per_key_max: u32,
    /// Most grants plus queued waits of one session (`LOCKS_PER_SESSION_MAX`).
    pub locks_per_session_max: u32,
    /// Most queued waits of one session (`WAITS_PER_SESSION_MAX`).
    pub waits_per_session_max: u32,
    /// Most live sessions (`SESSIONS_MAX`).
    pub sessions_max: u32,
    /// Force-revoke audit records kept (`AUDIT_LOG_MAX`).
    pub audit_log_max: u32,
    /// Answers remembered per session (`REQUEST_WINDOW`).
    pub request_window: u32,
    /// Most commands in one `Batch` (`BATCH_MAX`).
    pub batch_max: u32,
    /// How long a repeated force-revoke is taken for a retry (`REVOKE_RETRY_WINDOW_MS`).
    pub revoke_retry_window_ms: u64,
}

/// Why a set of limits cannot govern a table. Limits come from a snapshot (the disk or the
/// leader), so a nonsensical set is an input error, not a panic.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("apply limits are inconsistent: {0}")]
pub struct InvalidLimits(pub String);

impl ApplyLimits {
    /// The limits of format version 1: the values every table holds that recorded none.
    ///
    /// **Frozen.** Every log and snapshot written before limits were replicated was applied
    /// under exactly these values, so they must never change, whatever `lock_api::limits` or
    /// `crate::limits` say in a later release (a test checks they agree today).
    pub const V1: ApplyLimits = ApplyLimits {
        ttl_min_ms: 1_000,
        ttl_max_ms: 3_600_000,
        max_wait_max_ms: 300_000,
        key_len_max: 256,
        owner_id_len_max: 128,
        session_id_len_max: 64,
        operator_len_max: 128,
        reason_len_max: 1024,
        waiters_per_key_max: 1024,
        locks_per_session_max: 1024,
        waits_per_session_max: 32,
        sessions_max: 100_000,
        audit_log_max: 1024,
        request_window: 64,
        batch_max: 512,
        revoke_retry_window_ms: 60_000,
    };

    /// Checks the relations the table's rules rely on (the same ones `crate::limits` checks at
    /// compile time): every bound is positive, the TTL range is not empty, a session's waits fit
    /// in its lock slots and its request window holds twice its waits.
    pub fn check(&self) -> Result<(), InvalidLimits> {
        let positive = [
            ("ttl_min_ms", self.ttl_min_ms),
            ("key_len_max", u64::from(self.key_len_max)),
            ("owner_id_len_max", u64::from(self.owner_id_len_max)),
            ("session_id_len_max", u64::from(self.session_id_len_max)),
            ("operator_len_max", u64::from(self.operator_len_max)),
            ("reason_len_max", u64::from(self.reason_len_max)),
            ("waiters_per_key_max", u64::from(self.waiters_per_key_max)),
            (
                "locks_per_session_max",
                u64::from(self.locks_per_session_max),
            ),
            ("sessions_max", u64::from(self.sessions_max)),
            ("audit_log_max", u64::from(self.audit_log_max)),
            ("request_window", u64::from(self.request_window)),
            ("batch_max", u64::from(self.batch_max)),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(InvalidLimits(format!("{name} is 0")));
        }
        if self.ttl_min_ms >= self.ttl_max_ms {
            return Err(InvalidLimits(format!(
                "ttl_min_ms {} is not below ttl_max_ms {}",
                self.ttl_min_ms, self.ttl_max_ms
            )));
        }
        if self.waits_per_session_max > self.locks_per_session_max {
            return Err(InvalidLimits(format!(
                "waits_per_session_max {} is above locks_per_session_max {}",
                self.waits_per_session_max, self.locks_per_session_max
            )));
        }
        if u64::from(self.request_window) < 2 * u64::from(self.waits_per_session_max) {
            return Err(InvalidLimits(format!(
                "request_window {} is below twice waits_per_session_max {}",
                self.request_window, self.waits_per_session_max
            )));
        }
        Ok(())
    }

    /// A key: non-blank, at most `key_len_max` bytes, no control characters.
    pub fn key(&self, key: &str) -> Result<(), LockError> {
        text("key", key, self.key_len_max)
    }

    /// An owner id: non-blank, at most `owner_id_len_max` bytes, no control characters.
    pub fn owner_id(&self, owner_id: &str) -> Result<(), LockError> {
        text("owner id", owner_id, self.owner_id_len_max)
    }

    /// A session id: non-blank, at most `session_id_len_max` bytes, no control characters.
    pub fn session_id(&self, session_id: &str) -> Result<(), LockError> {
        text("session id", session_id, self.session_id_len_max)
    }

    /// A force-revoke operator: non-blank, at most `operator_len_max` bytes.
    pub fn operator(&self, operator: &str) -> Result<(), LockError> {
        text("operator", operator, self.operator_len_max)
    }

    /// A force-revoke reason: non-blank, at most `reason_len_max` bytes.
    pub fn reason(&self, reason: &str) -> Result<(), LockError> {
        text("reason", reason, self.reason_len_max)
    }

    /// A lock or session TTL within `ttl_min_ms..=ttl_max_ms`.
    pub fn ttl(&self, ttl_ms: u64) -> Result<u64, LockError> {
        if ttl_ms < self.ttl_min_ms || ttl_ms > self.ttl_max_ms {
            return Err(LockError::invalid(format!(
                "ttl is {ttl_ms} ms; it must be between {} ms and {} ms",
                self.ttl_min_ms, self.ttl_max_ms
            )));
        }
        Ok(ttl_ms)
    }

    /// An acquire's wait: at most `max_wait_max_ms` (zero is a single attempt).
    pub fn max_wait(&self, wait_ms: u64) -> Result<u64, LockError> {
        if wait_ms > self.max_wait_max_ms {
            return Err(LockError::invalid(format!(
                "max_wait is {wait_ms} ms; the limit is {} ms",
                self.max_wait_max_ms
            )));
        }
        Ok(wait_ms)
    }
}

impl Default for ApplyLimits {
    /// [`ApplyLimits::V1`]: what a table that recorded no limits was applied under.
    fn default() -> Self {
        ApplyLimits::V1
    }
}

/// The text rule of `lock_api::validate`, with the bound taken from the limits. A copy on
/// purpose, not a call: what apply accepts must not change when a later lock-api changes its
/// rule, or a replica on the new binary would replay old entries differently
/// (`under_v1_the_checks_agree_with_lock_api` checks the two agree today).
fn text(what: &str, value: &str, len_max: u32) -> Result<(), LockError> {
    if value.trim().is_empty() {
        return Err(LockError::invalid(format!("{what} must not be blank")));
    }
    if value.len() > len_max as usize {
        return Err(LockError::invalid(format!(
            "{what} is {} bytes long; the limit is {len_max} bytes",
            value.len()
        )));
    }
    if value.chars().any(char::is_control) {
        return Err(LockError::invalid(format!(
            "{what} must not contain control characters"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use lock_api::{limits as api, validate};

    use super::*;
    use crate::limits as store;

    /// V1 is what this release's constants say. If a constant changes, this fails: the change
    /// needs a new set of limits (and a replicated command that moves a cluster to it), because
    /// V1 is what every existing log was applied under.
    #[test]
    fn v1_is_the_limits_lockd_shipped_with() {
        let ms = |d: Duration| d.as_millis() as u64;
        let today = ApplyLimits {
            ttl_min_ms: ms(api::TTL_MIN),
            ttl_max_ms: ms(api::TTL_MAX),
            max_wait_max_ms: ms(api::MAX_WAIT_MAX),
            key_len_max: api::KEY_LEN_MAX as u32,
            owner_id_len_max: api::OWNER_ID_LEN_MAX as u32,
            session_id_len_max: api::SESSION_ID_LEN_MAX as u32,
            operator_len_max: api::OPERATOR_LEN_MAX as u32,
            reason_len_max: api::REASON_LEN_MAX as u32,
            waiters_per_key_max: store::WAITERS_PER_KEY_MAX as u32,
            locks_per_session_max: store::LOCKS_PER_SESSION_MAX as u32,
            waits_per_session_max: store::WAITS_PER_SESSION_MAX as u32,
            sessions_max: store::SESSIONS_MAX as u32,
            audit_log_max: store::AUDIT_LOG_MAX as u32,
            request_window: store::REQUEST_WINDOW as u32,
            batch_max: store::BATCH_MAX as u32,
            revoke_retry_window_ms: store::REVOKE_RETRY_WINDOW_MS,
        };
        assert_eq!(ApplyLimits::V1, today);
        assert_eq!(ApplyLimits::V1.check(), Ok(()));
    }

    /// Under V1 the replicated checks accept and reject exactly what `lock_api::validate`
    /// does, with the same message, so a client hears the same thing from either.
    #[test]
    fn under_v1_the_checks_agree_with_lock_api() {
        let l = ApplyLimits::V1;
        let texts = [
            String::new(),
            " ".into(),
            "a\nb".into(),
            "ok/key".into(),
            "k".repeat(64),
            "k".repeat(65),
            "k".repeat(128),
            "k".repeat(129),
            "k".repeat(256),
            "k".repeat(257),
            "r".repeat(1024),
            "r".repeat(1025),
        ];
        for t in &texts {
            assert_eq!(l.key(t), validate::key(t), "{t:?}");
            assert_eq!(l.owner_id(t), validate::owner_id(t), "{t:?}");
            assert_eq!(l.session_id(t), validate::session_id(t), "{t:?}");
            assert_eq!(l.operator(t), validate::operator(t), "{t:?}");
            assert_eq!(l.reason(t), validate::reason(t), "{t:?}");
        }
        for ms in [0, 999, 1_000, 3_600_000, 3_600_001, 300_000, 300_001] {
            let d = Duration::from_millis(ms);
            assert_eq!(l.ttl(ms), validate::ttl(d), "{ms}");
            assert_eq!(l.max_wait(ms), validate::max_wait(d), "{ms}");
        }
    }

    #[test]
    fn inconsistent_limits_are_refused_naming_the_bound() {
        let mut l = ApplyLimits::V1;
        l.batch_max = 0;
        assert!(l.check().is_err_and(|e| e.0.contains("batch_max")));
        let mut l = ApplyLimits::V1;
        l.ttl_min_ms = l.ttl_max_ms;
        assert!(l.check().is_err_and(|e| e.0.contains("ttl_min_ms")));
        let mut l = ApplyLimits::V1;
        l.waits_per_session_max = l.locks_per_session_max + 1;
        assert!(l.check().is_err());
        let mut l = ApplyLimits::V1;
        l.request_window = 2 * l.waits_per_session_max - 1;
        assert!(l.check().is_err_and(|e| e.0.contains("request_window")));
    }
}
