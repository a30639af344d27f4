//! The resource side of fencing (C2 §2.4, §2.7; INV-04): a protected resource accepts a write
//! only if the presented token is **greater** than the highest token it has already accepted.
//!
//! This check, not any deadline, is what makes a paused or partitioned stale holder harmless:
//! the lock service guarantees tokens strictly increase in grant order, so the stale holder's
//! token is at most the stored one once a newer holder has written.

use crate::LockError;

/// HTTP header carrying the fencing token, as decimal digits (C2 §2.7).
pub const HEADER_FENCING_TOKEN: &str = "X-Fencing-Token";

/// HTTP header carrying the lock owner's id, for the resource's logs (C2 §2.7).
pub const HEADER_OWNER_ID: &str = "X-Owner-Id";

/// HTTP header carrying the idempotency key of the side effect (C2 §2.7).
pub const HEADER_IDEMPOTENCY_KEY: &str = "X-Idempotency-Key";

/// The fence rule: `true` iff a write presenting `presented` may proceed at a resource whose
/// highest accepted token is `stored`, i.e. `presented > stored`. Equal is rejected: the same
/// token must not authorise two different writers.
#[inline]
pub const fn fence_accepts(presented: u64, stored: u64) -> bool {
    presented > stored
}

/// Parses an [`HEADER_FENCING_TOKEN`] value: decimal digits, no sign, no whitespace, not zero.
///
/// A missing or malformed token must be a rejection, never "no fencing" (C2 §2.7: a code path
/// that defaults to no token silently skips the check).
pub fn parse_fencing_token(value: &str) -> Result<u64, LockError> {
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return Err(LockError::invalid(format!(
            "{HEADER_FENCING_TOKEN} must be a decimal number, got {value:?}"
        )));
    }
    match value.parse::<u64>() {
        Ok(0) => Err(LockError::invalid(format!(
            "{HEADER_FENCING_TOKEN} must not be 0"
        ))),
        Ok(token) => Ok(token),
        Err(_) => Err(LockError::invalid(format!(
            "{HEADER_FENCING_TOKEN} {value:?} does not fit in 64 bits"
        ))),
    }
}

/// The stored fence of one protected resource: the highest token it has accepted.
///
/// A resource keeps one `Fence` per lock key (persisted with the resource's own data, in the
/// same transaction as the write it guards) and calls [`Fence::admit`] before every side effect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fence {
    key: String,
    stored: u64,
}

impl Fence {
    /// A fence for `key` that has accepted nothing yet (stored token 0, below every real token).
    pub fn new(key: impl Into<String>) -> Self {
        Self::with_stored(key, 0)
    }

    /// A fence restored from the resource's storage, with `stored` the highest accepted token.
    pub fn with_stored(key: impl Into<String>, stored: u64) -> Self {
        Self {
            key: key.into(),
            stored,
        }
    }

    /// The highest token accepted so far (0 if none).
    pub fn stored(&self) -> u64 {
        self.stored
    }

    /// Admits a write presenting `presented`: if `presented > stored` the fence advances to it
    /// and the write may proceed; otherwise the write must not happen and the error is
    /// [`LockError::FencedOut`] naming both tokens. Never retry a fenced-out side effect.
    pub fn admit(&mut self, presented: u64) -> Result<(), LockError> {
        if fence_accepts(presented, self.stored) {
            self.stored = presented;
            Ok(())
        } else {
            Err(LockError::FencedOut {
                key: self.key.clone(),
                presented,
                stored: self.stored,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_only_strictly_greater_tokens() {
        assert!(fence_accepts(2, 1));
        assert!(!fence_accepts(1, 1));
        assert!(!fence_accepts(0, 1));
        assert!(fence_accepts(1, 0));
        assert!(!fence_accepts(u64::MAX, u64::MAX));
    }

    #[test]
    fn fence_advances_and_rejects_stale_holders() {
        let mut fence = Fence::new("payout");
        assert_eq!(fence.admit(5), Ok(()));
        assert_eq!(fence.stored(), 5);
        // The same token twice: a second writer under one grant is rejected.
        assert_eq!(
            fence.admit(5),
            Err(LockError::FencedOut {
                key: "payout".into(),
                presented: 5,
                stored: 5
            })
        );
        // A stale holder (older token) is rejected and does not move the fence.
        assert!(fence.admit(3).is_err());
        assert_eq!(fence.stored(), 5);
        assert_eq!(fence.admit(9), Ok(()));
        assert!(Fence::with_stored("k", 9).admit(9).is_err());
    }

    #[test]
    fn header_values_parse_strictly() {
        assert_eq!(parse_fencing_token("42"), Ok(42));
        assert_eq!(parse_fencing_token("18446744073709551615"), Ok(u64::MAX));
        for bad in [
            "",
            "0",
            "-1",
            "+1",
            " 1",
            "1 ",
            "0x10",
            "18446744073709551616",
            "1.0",
        ] {
            assert!(
                matches!(
                    parse_fencing_token(bad),
                    Err(LockError::InvalidArgument { .. })
                ),
                "{bad:?} must be rejected"
            );
        }
    }
}
