//! The argument checks every implementation shares, so that every backend and every transport
//! rejects the same inputs with the same [`LockError::InvalidArgument`] (C2 §2.8: a blank string
//! is a caller bug, not a lock outcome).
//!
//! Text is rejected when it is empty or only whitespace ("blank"), longer than its limit in
//! bytes, or contains control characters (they corrupt logs and the audit trail).

use std::time::Duration;

use crate::LockError;
use crate::limits::{
    KEY_LEN_MAX, MAX_WAIT_MAX, OPERATOR_LEN_MAX, OWNER_ID_LEN_MAX, PRINCIPAL_LEN_MAX,
    REASON_LEN_MAX, SESSION_ID_LEN_MAX, TTL_MAX, TTL_MIN,
};

fn text(what: &str, value: &str, len_max: usize) -> Result<(), LockError> {
    if value.trim().is_empty() {
        return Err(LockError::invalid(format!("{what} must not be blank")));
    }
    if value.len() > len_max {
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

/// Checks a lock key: non-blank, at most [`KEY_LEN_MAX`] bytes, no control characters.
pub fn key(key: &str) -> Result<(), LockError> {
    text("key", key, KEY_LEN_MAX)
}

/// Checks an owner id: non-blank, at most [`OWNER_ID_LEN_MAX`] bytes, no control characters.
pub fn owner_id(owner_id: &str) -> Result<(), LockError> {
    text("owner id", owner_id, OWNER_ID_LEN_MAX)
}

/// Checks a session id: non-blank, at most [`SESSION_ID_LEN_MAX`] bytes, no control characters.
pub fn session_id(session_id: &str) -> Result<(), LockError> {
    text("session id", session_id, SESSION_ID_LEN_MAX)
}

/// Checks a force-revoke operator: non-blank, at most [`OPERATOR_LEN_MAX`] bytes.
pub fn operator(operator: &str) -> Result<(), LockError> {
    text("operator", operator, OPERATOR_LEN_MAX)
}

/// Checks a caller's principal: non-blank, at most [`PRINCIPAL_LEN_MAX`] bytes, no control
/// characters.
pub fn principal(principal: &str) -> Result<(), LockError> {
    text("principal", principal, PRINCIPAL_LEN_MAX)
}

/// The session rule of docs/SECURITY.md §3, the same on every backend: a session opened by
/// principal `opened_by` may be used only by that principal. `Err(PermissionDenied)` with
/// [`SESSION_OWNER_ROLE`](crate::SESSION_OWNER_ROLE) when `caller` is another principal.
///
/// `caller == None` (an `--insecure` node, where nobody is authenticated and everything is
/// allowed) and `opened_by == None` (a session opened on such a node, unbound) are never
/// refused. A backend must apply this before the call changes or answers anything, including
/// a remembered answer of the session's.
pub fn session_principal(caller: Option<&str>, opened_by: Option<&str>) -> Result<(), LockError> {
    match (caller, opened_by) {
        (Some(caller), Some(opened_by)) if caller != opened_by => {
            Err(LockError::PermissionDenied {
                principal: caller.to_owned(),
                required_role: crate::SESSION_OWNER_ROLE.to_owned(),
            })
        }
        _ => Ok(()),
    }
}

/// Checks a force-revoke reason: non-blank, at most [`REASON_LEN_MAX`] bytes.
pub fn reason(reason: &str) -> Result<(), LockError> {
    text("reason", reason, REASON_LEN_MAX)
}

/// Checks a lock or session TTL against [`TTL_MIN`]..=[`TTL_MAX`] and returns it in whole
/// milliseconds, the unit every replica and the wire use. A TTL with a sub-millisecond part is
/// rounded **down**, so the server never promises more than the caller asked for.
pub fn ttl(ttl: Duration) -> Result<u64, LockError> {
    if ttl < TTL_MIN || ttl > TTL_MAX {
        return Err(LockError::invalid(format!(
            "ttl is {} ms; it must be between {} ms and {} ms",
            ttl.as_millis(),
            TTL_MIN.as_millis(),
            TTL_MAX.as_millis()
        )));
    }
    Ok(ttl.as_millis() as u64)
}

/// Checks an acquire's `max_wait` against [`MAX_WAIT_MAX`] (zero is allowed and means a single
/// attempt) and returns it in whole milliseconds.
pub fn max_wait(max_wait: Duration) -> Result<u64, LockError> {
    if max_wait > MAX_WAIT_MAX {
        return Err(LockError::invalid(format!(
            "max_wait is {} ms; the limit is {} ms",
            max_wait.as_millis(),
            MAX_WAIT_MAX.as_millis()
        )));
    }
    Ok(max_wait.as_millis() as u64)
}

/// Checks a fencing token: tokens start at 1, so zero is never a token a server issued
/// (C2 §2.3: "never zero").
pub fn fencing_token(token: u64) -> Result<u64, LockError> {
    if token == 0 {
        return Err(LockError::invalid(
            "fencing token 0 is never issued; tokens start at 1",
        ));
    }
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_invalid(r: Result<impl std::fmt::Debug, LockError>) -> bool {
        matches!(r, Err(LockError::InvalidArgument { .. }))
    }

    #[test]
    fn blank_text_is_rejected_everywhere() {
        for blank in ["", " ", "\t  "] {
            assert!(is_invalid(key(blank)));
            assert!(is_invalid(owner_id(blank)));
            assert!(is_invalid(session_id(blank)));
            assert!(is_invalid(operator(blank)));
            assert!(is_invalid(reason(blank)));
        }
    }

    #[test]
    fn lengths_are_checked_in_bytes_at_the_limit() {
        assert!(key(&"k".repeat(KEY_LEN_MAX)).is_ok());
        assert!(is_invalid(key(&"k".repeat(KEY_LEN_MAX + 1))));
        // 'é' is two bytes: half the limit in chars is the whole limit in bytes.
        assert!(key(&"é".repeat(KEY_LEN_MAX / 2)).is_ok());
        assert!(is_invalid(key(&"é".repeat(KEY_LEN_MAX / 2 + 1))));
        assert!(owner_id(&"o".repeat(OWNER_ID_LEN_MAX)).is_ok());
        assert!(is_invalid(owner_id(&"o".repeat(OWNER_ID_LEN_MAX + 1))));
        assert!(is_invalid(session_id(&"s".repeat(SESSION_ID_LEN_MAX + 1))));
        assert!(is_invalid(operator(&"o".repeat(OPERATOR_LEN_MAX + 1))));
        assert!(reason(&"r".repeat(REASON_LEN_MAX)).is_ok());
        assert!(is_invalid(reason(&"r".repeat(REASON_LEN_MAX + 1))));
    }

    #[test]
    fn control_characters_are_rejected() {
        assert!(is_invalid(key("a\nb")));
        assert!(is_invalid(reason("done\u{0}")));
        assert!(key("payout/2026-11-30 ü").is_ok());
    }

    #[test]
    fn the_message_names_the_argument_and_the_limit() {
        let Err(LockError::InvalidArgument { message }) = key(&"k".repeat(300)) else {
            panic!("expected InvalidArgument");
        };
        assert!(
            message.contains("key") && message.contains("256"),
            "{message}"
        );
    }

    #[test]
    fn ttl_bounds_are_inclusive_and_rounded_down() {
        assert_eq!(ttl(TTL_MIN), Ok(1000));
        assert_eq!(ttl(TTL_MAX), Ok(3_600_000));
        assert_eq!(ttl(Duration::from_micros(1_500_999)), Ok(1500));
        assert!(is_invalid(ttl(Duration::ZERO)));
        assert!(is_invalid(ttl(TTL_MIN - Duration::from_nanos(1))));
        assert!(is_invalid(ttl(TTL_MAX + Duration::from_millis(1))));
    }

    #[test]
    fn max_wait_allows_zero_and_caps_the_wait() {
        assert_eq!(max_wait(Duration::ZERO), Ok(0));
        assert_eq!(max_wait(MAX_WAIT_MAX), Ok(300_000));
        assert!(is_invalid(max_wait(
            MAX_WAIT_MAX + Duration::from_millis(1)
        )));
    }

    #[test]
    fn token_zero_is_never_valid() {
        assert!(is_invalid(fencing_token(0)));
        assert_eq!(fencing_token(7), Ok(7));
    }
}
