//! Whom a force-revoke is recorded for, and the one log event each revoke makes
//! (docs/SECURITY.md §4).
//!
//! On a node that authenticates its callers the audit record's `operator` is the caller's
//! principal ([`Caller`]), never a name the caller typed: a request may leave `operator` blank
//! (it is filled in) or repeat its own principal, and one that names somebody else is refused
//! with `PERMISSION_DENIED` before anything is revoked — nobody records a revoke in another's
//! name. On an `--insecure` node nobody is authenticated and the request's `operator` is
//! recorded as given (and must not be blank, as before).
//!
//! Owns that rule and the event's fields only; the revoke itself is the backend's.

use lock_api::{LockError, REVOKE_AS_SELF_ROLE, validate};

use crate::backend::Revocation;
use crate::peer::Caller;

/// The operator to record for a revoke of `key` for `reason` that `caller` (absent on an
/// `--insecure` node) asked for with the request field `asked`. A blank `asked` is the
/// caller's principal; an `asked` naming another principal is `PermissionDenied` with
/// `required_role` [`REVOKE_AS_SELF_ROLE`] (`PERMISSION_DENIED` with its `ErrorDetail` on the
/// wire).
///
/// The arguments are checked first, in the backends' order (key, operator, reason), so a
/// malformed request is the same `InvalidArgument` on a TLS node as on an `--insecure` one,
/// and only a well-formed request meets the question of whose name it carries.
pub fn operator(
    caller: Option<&Caller>,
    key: &str,
    asked: &str,
    reason: &str,
) -> Result<String, LockError> {
    validate::key(key)?;
    let Some(caller) = caller else {
        validate::operator(asked)?;
        validate::reason(reason)?;
        return Ok(asked.to_owned());
    };
    let blank = asked.trim().is_empty();
    if !blank {
        validate::operator(asked)?;
    }
    validate::reason(reason)?;
    if blank || asked == caller.principal {
        return Ok(caller.principal.clone());
    }
    // The refusal names the caller, not `asked`: it says whose name the caller may use.
    tracing::warn!(
        target: "lockd::audit",
        principal = %caller.principal,
        operator = asked,
        key,
        "force revoke refused: the request names another operator than the caller"
    );
    Err(LockError::PermissionDenied {
        principal: caller.principal.clone(),
        required_role: REVOKE_AS_SELF_ROLE.to_owned(),
    })
}

/// The one structured event of a revoke, on the node that served it (the Raft leader that
/// proposed it, or the stateless node that ran its transaction): replicas applying the entry
/// log nothing, so one revoke is one line however many nodes there are. A retry answered from
/// the first outcome (same request id) logs again with the same `new_token_floor`, which tells
/// it apart from a second revoke. Target `lockd::audit`, so a deployment can route it.
pub fn log(
    revocation: &Revocation,
    operator: &str,
    reason: &str,
    request_id: u64,
    authenticated: bool,
) {
    tracing::warn!(
        target: "lockd::audit",
        key = %revocation.key,
        operator,
        authenticated,
        reason,
        previous_owner_id = revocation.previous_owner_id.as_deref(),
        previous_token = revocation.previous_token,
        new_token_floor = revocation.new_token_floor,
        request_id,
        "force revoke"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(principal: &str) -> Caller {
        Caller {
            principal: principal.to_owned(),
        }
    }

    fn invalid(result: Result<String, LockError>, names: &str) {
        match result {
            Err(LockError::InvalidArgument { message }) => {
                assert!(message.contains(names), "{message}")
            }
            other => panic!("not InvalidArgument naming {names}: {other:?}"),
        }
    }

    #[test]
    fn without_a_caller_the_request_names_the_operator() {
        assert_eq!(operator(None, "k", "oncall", "r").unwrap(), "oncall");
        invalid(operator(None, "k", " ", "r"), "operator");
    }

    #[test]
    fn a_caller_is_recorded_as_the_operator() {
        let op = caller("operator");
        assert_eq!(operator(Some(&op), "k", "", "r").unwrap(), "operator");
        assert_eq!(operator(Some(&op), "k", "  ", "r").unwrap(), "operator");
        assert_eq!(
            operator(Some(&op), "k", "operator", "r").unwrap(),
            "operator"
        );
    }

    #[test]
    fn a_malformed_request_is_invalid_before_its_operator_is_compared() {
        let op = caller("operator");
        let long = "o".repeat(lock_api::limits::OPERATOR_LEN_MAX + 1);
        for who in [None, Some(&op)] {
            invalid(operator(who, " ", "someone-else", "r"), "key");
            invalid(operator(who, "k", &long, "r"), "operator");
            invalid(operator(who, "k", "someone-else\n", "r"), "operator");
            invalid(operator(who, "k", "operator", " "), "reason");
        }
        invalid(operator(Some(&op), "k", "someone-else", ""), "reason");
    }

    #[test]
    fn a_caller_naming_someone_else_is_permission_denied() {
        let op = caller("operator");
        for other in ["admin", "Operator", "operator "] {
            assert_eq!(
                operator(Some(&op), "k", other, "r"),
                Err(LockError::PermissionDenied {
                    principal: "operator".to_owned(),
                    required_role: REVOKE_AS_SELF_ROLE.to_owned(),
                }),
                "{other:?}"
            );
        }
    }
}
