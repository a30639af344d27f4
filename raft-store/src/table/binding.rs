//! Sessions bound to principals: `Command::AsCaller` (docs/SECURITY.md §3,
//! docs/DESIGN.md D-session-principal).
//!
//! A session opened by an authenticated caller records its principal; a later command that
//! caller's peers make presenting that session — or presenting a grant `(key, token)` held by
//! it — is refused with `Rejection::PermissionDenied` before anything else looks at it, so it
//! changes nothing and learns nothing (not even a remembered answer). The decision is a
//! function of the table and the command, like every other, so every replica refuses the same
//! commands at the same index, and a leader that accepted a call before it had applied the
//! session's `OpenSession` still cannot let it through: the log orders the open first.
//!
//! An unbound session (opened without a caller) accepts every caller, and a command without a
//! caller is never refused here: both exist only on an `--insecure` node, where everything is
//! allowed, or come from the leader itself (reaper, promote).

use lock_api::validate;

use super::LockTable;
use crate::command::{Command, Event, Rejection, Response};

impl LockTable {
    /// Applies `command` as `principal` called it.
    pub(super) fn apply_as_caller(
        &mut self,
        stamp_ms: u64,
        principal: String,
        command: Command,
        events: &mut Vec<Event>,
    ) -> Response {
        // The principal's length is bounded where it is proposed (the node's authorization
        // layer and backend, `lock_api::validate::principal`), not here: the apply rules take
        // no bound from the binary's constants (issue 18), and this one is not replicated.
        match command {
            Command::OpenSession {
                session_id,
                owner_id,
                ttl_ms,
            } => self.open_session(
                stamp_ms,
                session_id,
                owner_id,
                Some(principal),
                ttl_ms,
                events,
            ),
            Command::Batch(_) | Command::AsCaller { .. } => {
                Response::Rejected(Rejection::InvalidArgument {
                    message: "an AsCaller must not contain a Batch or another AsCaller".to_owned(),
                })
            }
            command => {
                if let Some(session_id) = self.foreign_session(&principal, &command) {
                    return Response::Rejected(Rejection::PermissionDenied {
                        principal,
                        session_id,
                    });
                }
                self.apply_one(stamp_ms, command, events)
            }
        }
    }

    /// The session `command` presents — itself, or the holder of the grant it names — if
    /// that session is bound to a principal other than `principal`.
    fn foreign_session(&self, principal: &str, command: &Command) -> Option<String> {
        let (session_id, grant) = match command {
            Command::CloseSession { session_id }
            | Command::ExpireSession { session_id }
            | Command::Acquire { session_id, .. }
            | Command::CancelWait { session_id, .. } => (session_id, None),
            Command::Release {
                session_id,
                key,
                token,
                ..
            }
            | Command::Renew {
                session_id,
                key,
                token,
                ..
            } => (session_id, Some((key, *token))),
            _ => return None,
        };
        let bound_elsewhere = |id: &str| {
            let opened_by = self.sessions.get(id).and_then(|s| s.principal.as_deref());
            validate::session_principal(Some(principal), opened_by).is_err()
        };
        if bound_elsewhere(session_id) {
            return Some(session_id.clone());
        }
        // Release and renew act on `(key, token)` whichever session presents them (C2 §2.5);
        // a caller's own session must not carry another principal's token.
        let holder = grant.and_then(|(key, token)| {
            self.grants
                .get(key.as_str())
                .filter(|g| g.token == token)
                .map(|g| g.session_id())
        });
        holder.filter(|id| bound_elsewhere(id)).map(str::to_owned)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::Grant;
    use crate::table::HeldGrant;

    fn as_caller(principal: &str, command: Command) -> Command {
        Command::AsCaller {
            principal: principal.to_owned(),
            command: Box::new(command),
        }
    }

    fn open(session_id: &str) -> Command {
        Command::OpenSession {
            session_id: session_id.into(),
            owner_id: "worker".into(),
            ttl_ms: 10_000,
        }
    }

    fn acquire(session_id: &str, request_id: u64, key: &str) -> Command {
        Command::Acquire {
            session_id: session_id.into(),
            request_id,
            key: key.into(),
            ttl_ms: 5_000,
            wait_ms: 0,
        }
    }

    fn denied(principal: &str, session_id: &str) -> Response {
        Response::Rejected(Rejection::PermissionDenied {
            principal: principal.into(),
            session_id: session_id.into(),
        })
    }

    /// alice's session `a` holding `k` (token 1), bob's session `b`.
    fn table() -> (LockTable, Grant) {
        let mut t = LockTable::new();
        let mut events = Vec::new();
        t.apply(1, as_caller("alice", open("a")), &mut events);
        t.apply(1, as_caller("bob", open("b")), &mut events);
        let Response::Granted(grant) =
            t.apply(2, as_caller("alice", acquire("a", 1, "k")), &mut events)
        else {
            panic!("alice gets k");
        };
        (t, grant)
    }

    #[test]
    fn another_principal_presenting_a_session_is_refused_and_changes_nothing() {
        let (mut t, grant) = table();
        assert_eq!(t.session("a").and_then(|s| s.principal()), Some("alice"));
        let before = t.clone();
        let hijacks = [
            Command::CloseSession {
                session_id: "a".into(),
            },
            acquire("a", 2, "other"),
            // The same request id as alice's: not even her remembered answer is given.
            acquire("a", 1, "k"),
            Command::Release {
                session_id: "a".into(),
                request_id: 3,
                key: "k".into(),
                token: grant.token,
            },
            Command::Renew {
                session_id: "a".into(),
                request_id: 4,
                key: "k".into(),
                token: grant.token,
                ttl_ms: 9_000,
            },
            Command::CancelWait {
                session_id: "a".into(),
                request_id: 1,
                key: "k".into(),
                release_if_granted: true,
            },
        ];
        for hijack in hijacks {
            let mut events = Vec::new();
            let what = format!("{hijack:?}");
            assert_eq!(
                t.apply(3, as_caller("bob", hijack), &mut events),
                denied("bob", "a"),
                "{what}"
            );
            assert!(events.is_empty(), "{what}: {events:?}");
            assert_eq!(t.grant("k"), before.grant("k"), "{what}");
            assert_eq!(t.session("a"), before.session("a"), "{what}");
        }
    }

    #[test]
    fn a_grant_of_another_principal_is_refused_through_ones_own_session() {
        let (mut t, grant) = table();
        let mut events = Vec::new();
        let mut release = Command::Release {
            session_id: "b".into(),
            request_id: 1,
            key: "k".into(),
            token: grant.token,
        };
        assert_eq!(
            t.apply(3, as_caller("bob", release.clone()), &mut events),
            denied("bob", "a")
        );
        assert_eq!(t.grant("k").map(HeldGrant::to_grant), Some(grant));
        // alice presenting bob's session is refused too, her token notwithstanding.
        assert_eq!(
            t.apply(3, as_caller("alice", release.clone()), &mut events),
            denied("alice", "b")
        );
        let mut events = Vec::new();
        t.apply(3, as_caller("alice", open("a2")), &mut events);
        let Command::Release { session_id, .. } = &mut release else {
            unreachable!("a release");
        };
        *session_id = "a2".into();
        assert_eq!(
            t.apply(3, as_caller("alice", release), &mut events),
            Response::Released { released: true },
            "the holder's principal may release it, as before, through another of its sessions"
        );
    }

    #[test]
    fn the_owner_and_callers_of_an_open_node_are_served_as_before() {
        let (mut t, grant) = table();
        let mut events = Vec::new();
        let renew = |request_id| Command::Renew {
            session_id: "a".into(),
            request_id,
            key: "k".into(),
            token: grant.token,
            ttl_ms: 9_000,
        };
        assert!(matches!(
            t.apply(3, as_caller("alice", renew(5)), &mut events),
            Response::Renewed(_)
        ));
        // No caller: the leader itself, or an --insecure node.
        assert!(matches!(
            t.apply(3, renew(6), &mut events),
            Response::Renewed(_)
        ));
        // An unbound session takes any caller.
        t.apply(3, open("u"), &mut events);
        assert_eq!(t.session("u").and_then(|s| s.principal()), None);
        assert!(matches!(
            t.apply(4, as_caller("bob", acquire("u", 1, "q")), &mut events),
            Response::Granted(_)
        ));
    }

    #[test]
    fn a_retried_open_must_name_the_same_principal() {
        let (mut t, _) = table();
        let mut events = Vec::new();
        assert!(matches!(
            t.apply(5, as_caller("alice", open("a")), &mut events),
            Response::SessionOpened { .. }
        ));
        assert!(matches!(
            t.apply(5, as_caller("bob", open("a")), &mut events),
            Response::Rejected(Rejection::InvalidArgument { .. })
        ));
    }

    #[test]
    fn nesting_is_refused() {
        let mut t = LockTable::new();
        let mut events = Vec::new();
        let nested = as_caller("a", as_caller("b", open("s")));
        assert!(matches!(
            t.apply(1, nested, &mut events),
            Response::Rejected(Rejection::InvalidArgument { .. })
        ));
        let batch = as_caller("a", Command::Batch(vec![open("s")]));
        assert!(matches!(
            t.apply(1, batch, &mut events),
            Response::Rejected(Rejection::InvalidArgument { .. })
        ));
        assert_eq!(t.session_count(), 0);
        // Inside a batch, as the proposer writes them, each is its own caller's.
        let batch = Command::Batch(vec![as_caller("a", open("s1")), as_caller("b", open("s2"))]);
        t.apply(2, batch, &mut events);
        assert_eq!(t.session("s2").and_then(|s| s.principal()), Some("b"));
    }
}
