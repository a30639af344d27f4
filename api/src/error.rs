//! [`LockError`]: the only failure type of the contract (C2 §2.4).
//!
//! The split that matters is *retry the acquire* versus *stop*. Transient trouble (a timeout, a
//! lost connection, a leader change) is [`LockError::Contention`] or [`LockError::NotLeader`],
//! never [`LockError::LockLost`]: reporting a blip as a loss makes callers abandon work they still
//! own, and reporting a loss as a blip makes two holders proceed (C2 §2.5,
//! docs/DESIGN.md D-errors).

use std::fmt;

/// Every way a lock operation can fail.
///
/// "Retry-safe" always means retrying the **lock operation** (the acquire), never the protected
/// side effect: a [`LockError::FencedOut`] means another holder may already have performed it,
/// and repeating it is exactly the duplicate effect fencing exists to prevent.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LockError {
    /// The grant is gone: the local deadline passed, `renew` found the grant expired, revoked or
    /// taken over, or `check_still_held` found it missing; also returned for a handle already
    /// known to be lost.
    ///
    /// **Not retry-safe — terminal.** Abort the critical section; do not re-acquire inside the
    /// same unit of work; log `session_lost` / `lease_expired`.
    LockLost {
        /// The key whose grant was lost.
        key: String,
    },
    /// A resource rejected a write because `presented <= stored` (C2 §2.4, INV-04).
    ///
    /// **Never retry-safe.** This process has been superseded by a later holder, which may
    /// already have performed the side effect. Stop; treat it as an incident (NFR-06): log
    /// `fenced_out` with the key and both tokens.
    FencedOut {
        /// The key the write was made under.
        key: String,
        /// The token the writer presented.
        presented: u64,
        /// The highest token the resource had already accepted.
        stored: u64,
    },
    /// A store-level conflict or a transient failure (serialization failure, timeout, lost
    /// connection, exhausted retry budget) prevented a decision within the deadline.
    ///
    /// **Retry-safe, with jittered backoff, bounded** (FR-28). The outcome of a mutating call
    /// that failed this way may be unknown; lockd's request ids make retrying it idempotent.
    Contention {
        /// What happened, for logs.
        message: String,
    },
    /// The addressed node is not the leader (or no leader is known yet).
    ///
    /// **Retry-safe after a short delay**, at the hinted leader if there is one (NFR-02).
    NotLeader {
        /// The leader's node id, if this node knows it.
        leader_id: Option<u64>,
        /// The leader's client address (`host:port`), if this node knows it.
        leader_addr: Option<String>,
    },
    /// The call was malformed: a blank or over-long key, owner, operator or reason, a TTL or
    /// wait outside its bounds, an unknown session. A caller bug, never a lock outcome
    /// (C2 §2.8).
    ///
    /// **Not retry-safe:** the same call fails the same way. Fix the caller.
    InvalidArgument {
        /// Which argument and why, naming the limit that was broken.
        message: String,
    },
    /// The call carried no identity the node accepts: over TLS without a client certificate
    /// and without a valid bearer token, or with a token that matches no principal.
    ///
    /// **Not retry-safe:** a configuration or caller fault. The same call fails the same way
    /// until the caller presents a certificate or a token; fix its credentials.
    Unauthenticated {
        /// Why the call is not authenticated (never the token itself).
        message: String,
    },
    /// The caller is authenticated but may not make this call: its principal lacks the role
    /// the method requires, or it presented a session that another principal opened
    /// (`required_role` is then [`SESSION_OWNER_ROLE`]), or it asked to record a force-revoke
    /// in another principal's name (`required_role` is then [`REVOKE_AS_SELF_ROLE`]).
    ///
    /// **Not retry-safe:** a configuration or caller fault. Map the principal to the role in
    /// the node's configuration, or use the caller's own session.
    PermissionDenied {
        /// The caller's principal.
        principal: String,
        /// The role the call requires (`client`, `operator`, `admin`, `node`), or
        /// [`SESSION_OWNER_ROLE`], or [`REVOKE_AS_SELF_ROLE`].
        required_role: String,
    },
}

/// The `required_role` of a [`LockError::PermissionDenied`] for a call that presented a session
/// (or a grant of one) that another principal opened: only the principal that opened a session
/// may use it, whatever roles the caller has.
pub const SESSION_OWNER_ROLE: &str = "session-owner";

/// The `required_role` of a [`LockError::PermissionDenied`] for a force-revoke whose `operator`
/// names another principal than the authenticated caller: the audit log records who revoked,
/// so a caller may record a revoke only in its own name (leave `operator` blank, or give its
/// own principal), whatever roles it has.
pub const REVOKE_AS_SELF_ROLE: &str = "revoke-as-self";

impl LockError {
    /// Whether retrying the *lock operation* may succeed (C2 §2.4): `true` for
    /// [`LockError::Contention`] and [`LockError::NotLeader`], `false` otherwise.
    ///
    /// This never licenses repeating a side effect that a resource fenced out.
    pub fn is_retry_safe(&self) -> bool {
        matches!(self, Self::Contention { .. } | Self::NotLeader { .. })
    }

    /// Shorthand for [`LockError::InvalidArgument`].
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::InvalidArgument {
            message: message.into(),
        }
    }

    /// Shorthand for [`LockError::Contention`].
    pub fn contention(message: impl Into<String>) -> Self {
        Self::Contention {
            message: message.into(),
        }
    }
}

impl fmt::Display for LockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::LockLost { key } => write!(f, "lock lost: the grant on {key:?} is gone"),
            Self::FencedOut {
                key,
                presented,
                stored,
            } => write!(
                f,
                "fenced out on {key:?}: presented token {presented} is not greater than stored token {stored}"
            ),
            Self::Contention { message } => write!(f, "contention (retry-safe): {message}"),
            Self::NotLeader {
                leader_id,
                leader_addr,
            } => match (leader_id, leader_addr) {
                (Some(id), Some(addr)) => {
                    write!(f, "not the leader; the leader is node {id} at {addr}")
                }
                (Some(id), None) => write!(f, "not the leader; the leader is node {id}"),
                _ => write!(f, "not the leader; no leader is known"),
            },
            Self::InvalidArgument { message } => write!(f, "invalid argument: {message}"),
            Self::Unauthenticated { message } => write!(f, "not authenticated: {message}"),
            // A refusal relayed without lockd's detail (a proxy) names neither.
            Self::PermissionDenied {
                principal,
                required_role,
            } if principal.is_empty() && required_role.is_empty() => write!(
                f,
                "permission denied: the server refused this call without naming the principal \
                 or the role"
            ),
            Self::PermissionDenied {
                principal,
                required_role,
            } if required_role == SESSION_OWNER_ROLE => write!(
                f,
                "permission denied: principal {principal:?} did not open this session; \
                 only the principal that opened a session may use it"
            ),
            Self::PermissionDenied {
                principal,
                required_role,
            } if required_role == REVOKE_AS_SELF_ROLE => write!(
                f,
                "permission denied: principal {principal:?} may record a force-revoke only in \
                 its own name; leave operator blank or set it to {principal:?}"
            ),
            Self::PermissionDenied {
                principal,
                required_role,
            } => write!(
                f,
                "permission denied: principal {principal:?} does not have the role \
                 {required_role:?} this call requires"
            ),
        }
    }
}

impl std::error::Error for LockError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_contention_and_not_leader_are_retry_safe() {
        let cases = [
            (LockError::LockLost { key: "k".into() }, false),
            (
                LockError::FencedOut {
                    key: "k".into(),
                    presented: 1,
                    stored: 2,
                },
                false,
            ),
            (LockError::contention("x"), true),
            (
                LockError::NotLeader {
                    leader_id: None,
                    leader_addr: None,
                },
                true,
            ),
            (LockError::invalid("x"), false),
            (
                LockError::Unauthenticated {
                    message: "no certificate".into(),
                },
                false,
            ),
            (
                LockError::PermissionDenied {
                    principal: "p".into(),
                    required_role: "admin".into(),
                },
                false,
            ),
        ];
        for (err, safe) in cases {
            assert_eq!(err.is_retry_safe(), safe, "{err}");
        }
    }

    #[test]
    fn display_names_the_leader() {
        let err = LockError::NotLeader {
            leader_id: Some(2),
            leader_addr: Some("127.0.0.1:7002".into()),
        };
        assert_eq!(
            err.to_string(),
            "not the leader; the leader is node 2 at 127.0.0.1:7002"
        );
    }

    #[test]
    fn display_of_a_refusal_names_the_principal_and_the_role() {
        let err = LockError::PermissionDenied {
            principal: "client".into(),
            required_role: "operator".into(),
        };
        assert_eq!(
            err.to_string(),
            "permission denied: principal \"client\" does not have the role \"operator\" \
             this call requires"
        );
        let hijack = LockError::PermissionDenied {
            principal: "mallory".into(),
            required_role: SESSION_OWNER_ROLE.into(),
        };
        assert!(
            hijack
                .to_string()
                .contains("\"mallory\" did not open this session")
        );
    }
}
