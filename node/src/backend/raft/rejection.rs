//! The state machine's refusals as the caller's errors, in one place.
//!
//! Owns the map `Rejection → LockError` and the answer to a state-machine response no request
//! expects. Every request of the Raft backend turns a refusal into an error here, so one
//! rejection is one error whichever call met it.

use lock_api::LockError;
use lock_raft_store::{Rejection, Response};

/// Maps a rejection to the caller's error. `UnknownSession` is an invalid argument (terminal
/// for the session: its locks are gone); a stale request id is an unknown outcome.
pub(super) fn rejected(rejection: Rejection) -> LockError {
    match rejection {
        Rejection::UnknownSession { session_id } => LockError::invalid(format!(
            "session {session_id:?} does not exist (never opened, closed or expired); its locks are gone"
        )),
        Rejection::InvalidArgument { message } | Rejection::LimitExceeded { message } => {
            LockError::invalid(message)
        }
        Rejection::StaleRequest {
            session_id,
            request_id,
        } => LockError::contention(format!(
            "unknown outcome: request {request_id} of session {session_id:?} is older than the remembered window; retry with a new request id"
        )),
        // The session is another principal's; which one is not the caller's business.
        Rejection::PermissionDenied { principal, .. } => LockError::PermissionDenied {
            principal,
            required_role: lock_api::SESSION_OWNER_ROLE.to_owned(),
        },
    }
}

/// A response that does not answer the command it came back for: logged as the bug it is, and
/// answered as an unknown outcome so the caller retries rather than trusting it.
pub(super) fn unexpected(what: &str, answer: &Response) -> LockError {
    tracing::error!(what, ?answer, "state machine answered unexpectedly");
    LockError::contention(format!(
        "unknown outcome: {what} was answered with {answer:?}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejections_map_to_the_contract_errors() {
        assert!(matches!(
            rejected(Rejection::UnknownSession {
                session_id: "s".into()
            }),
            LockError::InvalidArgument { .. }
        ));
        assert!(matches!(
            rejected(Rejection::LimitExceeded {
                message: "waiters".into()
            }),
            LockError::InvalidArgument { .. }
        ));
        let LockError::Contention { message } = rejected(Rejection::StaleRequest {
            session_id: "s".into(),
            request_id: 3,
        }) else {
            panic!("stale is contention");
        };
        assert!(message.contains("unknown outcome"), "{message}");
        assert_eq!(
            rejected(Rejection::PermissionDenied {
                principal: "mallory".into(),
                session_id: "s".into(),
            }),
            LockError::PermissionDenied {
                principal: "mallory".into(),
                required_role: lock_api::SESSION_OWNER_ROLE.into(),
            }
        );
    }

    #[test]
    fn an_unexpected_answer_is_an_unknown_outcome() {
        let LockError::Contention { message } = unexpected("Acquire", &Response::Lost) else {
            panic!("unexpected is contention");
        };
        assert!(message.contains("unknown outcome"), "{message}");
    }
}
