//! The decision for one call: who the caller is and whether its role allows the method
//! (docs/SECURITY.md §2, §5). Pure: given the method's requirement, the connection's identity
//! and the request's `authorization` header, it answers the caller or the refusal, and does
//! no IO and no logging (the layer does both).

use std::collections::BTreeMap;

use lock_api::LockError;

use super::methods::Requirement;
use super::roles::{Role, check_principal};
use super::tokens::Tokens;
use crate::peer::{Caller, PeerIdentity};

/// The metadata key a bearer token travels in.
pub const AUTHORIZATION_HEADER: &str = "authorization";

/// Who may call what on an enforcing node: its role map and its tokens.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Policy {
    roles: BTreeMap<String, Role>,
    tokens: Tokens,
}

impl Policy {
    /// A policy of `roles` (principal → role) and `tokens`.
    pub fn new(roles: BTreeMap<String, Role>, tokens: Tokens) -> Self {
        Self { roles, tokens }
    }

    /// The role mapped to `principal`, if any.
    pub fn role_of(&self, principal: &str) -> Option<Role> {
        self.roles.get(principal).copied()
    }

    /// Decides one call. `Ok(None)`: allowed without a caller (health, reflection).
    /// `Ok(Some(caller))`: allowed, as `caller`. `Err`: `Unauthenticated` (no certificate
    /// principal and no valid bearer token) or `PermissionDenied` (the principal's role does
    /// not include the method's).
    ///
    /// The certificate wins over a token: a client that presents both is the principal its
    /// certificate names, as the TLS handshake proved. `authorization` is the header's value,
    /// if the request carried one.
    pub fn decide(
        &self,
        requirement: Requirement,
        peer: Option<&PeerIdentity>,
        authorization: Option<&[u8]>,
    ) -> Result<Option<Caller>, LockError> {
        let Requirement::Role(required) = requirement else {
            return Ok(None);
        };
        let principal = match peer.and_then(|p| p.principal.as_deref()) {
            Some(principal) => {
                check_principal(principal).map_err(|reason| LockError::Unauthenticated {
                    message: format!("the client certificate's principal is unusable: {reason}"),
                })?;
                principal
            }
            None => self.token_principal(authorization)?,
        };
        let held = self.role_of(principal);
        if !held.is_some_and(|role| role.includes(required)) {
            return Err(LockError::PermissionDenied {
                principal: principal.to_owned(),
                required_role: required.name().to_owned(),
            });
        }
        Ok(Some(Caller {
            principal: principal.to_owned(),
        }))
    }

    /// The principal of the request's bearer token.
    fn token_principal(&self, authorization: Option<&[u8]>) -> Result<&str, LockError> {
        let unauthenticated = |message: &str| LockError::Unauthenticated {
            message: message.to_owned(),
        };
        let Some(value) = authorization else {
            return Err(unauthenticated(
                "the call carried no client certificate and no bearer token \
                 (metadata `authorization: Bearer <token>`)",
            ));
        };
        let token = std::str::from_utf8(value)
            .ok()
            .and_then(|v| {
                let (scheme, token) = v.trim().split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
            })
            .filter(|token| !token.is_empty())
            .ok_or_else(|| {
                unauthenticated("the `authorization` metadata is not of the form `Bearer <token>`")
            })?;
        self.tokens
            .principal_of(token)
            .ok_or_else(|| unauthenticated("the bearer token matches no principal"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::methods::requirement;
    use crate::auth::tokens::hash_line;

    fn policy() -> Policy {
        let roles = [
            ("client", Role::Client),
            ("operator", Role::Operator),
            ("admin", Role::Admin),
            ("node-1", Role::Node),
            ("billing", Role::Client),
        ]
        .into_iter()
        .map(|(p, r)| (p.to_owned(), r))
        .collect();
        let tokens = Tokens::parse(&format!(
            "billing {}\nghost {}\n",
            hash_line("tok-billing"),
            hash_line("tok-ghost")
        ))
        .expect("tokens parse");
        Policy::new(roles, tokens)
    }

    fn cert(principal: &str) -> PeerIdentity {
        PeerIdentity {
            remote: None,
            principal: Some(principal.to_owned()),
        }
    }

    fn denied(principal: &str, role: &str) -> LockError {
        LockError::PermissionDenied {
            principal: principal.into(),
            required_role: role.into(),
        }
    }

    #[test]
    fn a_certificate_principal_gets_what_its_role_includes() {
        let p = policy();
        let revoke = requirement("/lockd.v1.LockService/ForceRevoke");
        let members = requirement("/lockd.v1.AdminService/ChangeMembership");
        let acquire = requirement("/lockd.v1.LockService/Acquire");
        let raft = requirement("/lockd.v1.RaftService/Vote");
        let caller = |name: &str| {
            Some(Caller {
                principal: name.into(),
            })
        };
        assert_eq!(
            p.decide(acquire, Some(&cert("client")), None),
            Ok(caller("client"))
        );
        assert_eq!(
            p.decide(revoke, Some(&cert("client")), None),
            Err(denied("client", "operator"))
        );
        assert_eq!(
            p.decide(members, Some(&cert("client")), None),
            Err(denied("client", "admin"))
        );
        assert_eq!(
            p.decide(revoke, Some(&cert("operator")), None),
            Ok(caller("operator"))
        );
        assert_eq!(
            p.decide(members, Some(&cert("operator")), None),
            Err(denied("operator", "admin"))
        );
        assert_eq!(
            p.decide(members, Some(&cert("admin")), None),
            Ok(caller("admin"))
        );
        assert_eq!(
            p.decide(raft, Some(&cert("admin")), None),
            Err(denied("admin", "node"))
        );
        assert_eq!(
            p.decide(raft, Some(&cert("node-1")), None),
            Ok(caller("node-1"))
        );
        assert_eq!(
            p.decide(acquire, Some(&cert("node-1")), None),
            Err(denied("node-1", "client"))
        );
        // Certified but mapped to nothing: no role at all.
        assert_eq!(
            p.decide(acquire, Some(&cert("stranger")), None),
            Err(denied("stranger", "client"))
        );
    }

    #[test]
    fn a_bearer_token_authenticates_its_principal_and_a_certificate_wins_over_it() {
        let p = policy();
        let acquire = requirement("/lockd.v1.LockService/Acquire");
        let plain = PeerIdentity::default();
        let as_billing = Some(Caller {
            principal: "billing".into(),
        });
        assert_eq!(
            p.decide(acquire, Some(&plain), Some(b"Bearer tok-billing")),
            Ok(as_billing.clone())
        );
        assert_eq!(
            p.decide(acquire, None, Some(b"bearer   tok-billing ")),
            Ok(as_billing)
        );
        assert_eq!(
            p.decide(acquire, Some(&cert("client")), Some(b"Bearer tok-billing")),
            Ok(Some(Caller {
                principal: "client".into()
            }))
        );
        // A valid token of a principal with no role.
        assert_eq!(
            p.decide(acquire, None, Some(b"Bearer tok-ghost")),
            Err(denied("ghost", "client"))
        );
    }

    #[test]
    fn no_identity_or_a_bad_token_is_unauthenticated_without_echoing_it() {
        let p = policy();
        let acquire = requirement("/lockd.v1.LockService/Acquire");
        let cases: [(Option<&[u8]>, &str); 5] = [
            (None, "no client certificate and no bearer token"),
            (Some(b"Bearer wrong-token"), "matches no principal"),
            (Some(b"Basic dXNlcjpwYXNz"), "not of the form"),
            (Some(b"Bearer "), "not of the form"),
            (Some(&[0xff, 0xfe]), "not of the form"),
        ];
        for (header, says) in cases {
            match p.decide(acquire, Some(&PeerIdentity::default()), header) {
                Err(LockError::Unauthenticated { message }) => {
                    assert!(message.contains(says), "{header:?}: {message}");
                    assert!(!message.contains("wrong-token"), "{message}");
                }
                other => panic!("{header:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn health_and_reflection_need_nothing() {
        let p = policy();
        let health = requirement("/grpc.health.v1.Health/Check");
        assert_eq!(p.decide(health, None, None), Ok(None));
    }
}
