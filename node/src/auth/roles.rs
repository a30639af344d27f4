//! The roles a principal may hold and the map from principals to roles (`--role P=R`,
//! docs/SECURITY.md §2).
//!
//! `client` ⊂ `operator` ⊂ `admin`: each includes the one before. `node` stands apart: it is the
//! role of the cluster's own members, the only one that may send Raft traffic, and it includes
//! no client role (a node's certificate opens no session). Owns the names, the order and the
//! parsing; which method needs which role is `methods`.

use std::collections::BTreeMap;
use std::fmt;

use lock_api::limits::PRINCIPAL_LEN_MAX;

/// Most principal → role mappings one node takes. Each is checked at start and held in memory;
/// ten thousand covers every client fleet a lock service serves by certificate, and a larger
/// list is a generated file gone wrong.
pub const ROLE_MAPPINGS_MAX: usize = 10_000;

/// What a principal may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    /// Sessions, lock calls, `Inspect`, `Status`.
    Client,
    /// Also `ForceRevoke` and reading the audit log.
    Operator,
    /// Also `Init`, `AddLearner`, `ChangeMembership`.
    Admin,
    /// A member of the cluster: Raft traffic only.
    Node,
}

impl Role {
    /// Every role, in the order of the docs.
    pub const ALL: [Role; 4] = [Role::Client, Role::Operator, Role::Admin, Role::Node];

    /// The role's name as configured and as a refusal reports it.
    pub fn name(self) -> &'static str {
        match self {
            Role::Client => "client",
            Role::Operator => "operator",
            Role::Admin => "admin",
            Role::Node => "node",
        }
    }

    /// Whether a principal holding `self` may make a call that requires `required`.
    pub fn includes(self, required: Role) -> bool {
        match (self, required) {
            (Role::Node, Role::Node) => true,
            (Role::Node, _) | (_, Role::Node) => false,
            // client < operator < admin, in declaration order.
            (held, required) => held >= required,
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Role {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Role::ALL
            .into_iter()
            .find(|role| role.name() == text)
            .ok_or_else(|| {
                format!("{text:?} is not a role; the roles are client, operator, admin and node")
            })
    }
}

/// Checks that `principal` can be one: not blank, no whitespace or control characters (a
/// token file separates fields by whitespace, and a log line must show the name as it is), at
/// most [`PRINCIPAL_LEN_MAX`] bytes.
pub fn check_principal(principal: &str) -> Result<(), String> {
    if principal.is_empty() {
        return Err("the principal is blank".to_owned());
    }
    if principal.len() > PRINCIPAL_LEN_MAX {
        return Err(format!(
            "the principal is {} bytes; the limit PRINCIPAL_LEN_MAX is {PRINCIPAL_LEN_MAX}",
            principal.len()
        ));
    }
    if principal
        .chars()
        .any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(format!(
            "the principal {principal:?} holds whitespace or a control character"
        ));
    }
    Ok(())
}

/// Parses one `PRINCIPAL=ROLE` (`--role`, `LOCKD_ROLES`). The principal is everything before
/// the last `=`, so a URI SAN holding `=` (a query) still maps.
pub fn parse_mapping(text: &str) -> Result<(String, Role), String> {
    let (principal, role) = text
        .trim()
        .rsplit_once('=')
        .ok_or_else(|| format!("{text:?} is not of the form PRINCIPAL=ROLE"))?;
    check_principal(principal).map_err(|e| format!("{text:?}: {e}"))?;
    let role = role.parse().map_err(|e| format!("{text:?}: {e}"))?;
    Ok((principal.to_owned(), role))
}

/// Builds the role map from `(principal, role)` pairs: refuses more than
/// [`ROLE_MAPPINGS_MAX`], a bad principal, and a principal mapped twice to different roles (one
/// of them would be silently ignored).
pub fn role_map(
    pairs: impl IntoIterator<Item = (String, Role)>,
) -> Result<BTreeMap<String, Role>, String> {
    let mut map = BTreeMap::new();
    for (principal, role) in pairs {
        check_principal(&principal)?;
        match map.insert(principal.clone(), role) {
            Some(other) if other != role => {
                return Err(format!(
                    "principal {principal:?} is mapped to both {other} and {role}"
                ));
            }
            _ => {}
        }
        if map.len() > ROLE_MAPPINGS_MAX {
            return Err(format!(
                "more than ROLE_MAPPINGS_MAX = {ROLE_MAPPINGS_MAX} principals are mapped"
            ));
        }
    }
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_client_role_includes_the_one_before_and_node_stands_apart() {
        use Role::*;
        let includes = |held: Role| -> Vec<Role> {
            Role::ALL
                .into_iter()
                .filter(|r| held.includes(*r))
                .collect()
        };
        assert_eq!(includes(Client), vec![Client]);
        assert_eq!(includes(Operator), vec![Client, Operator]);
        assert_eq!(includes(Admin), vec![Client, Operator, Admin]);
        assert_eq!(includes(Node), vec![Node]);
    }

    #[test]
    fn mappings_parse_and_bad_ones_name_the_problem() {
        assert_eq!(
            parse_mapping("spiffe://lockd/a=b=operator"),
            Ok(("spiffe://lockd/a=b".to_owned(), Role::Operator))
        );
        assert_eq!(
            parse_mapping(" node-1=node "),
            Ok(("node-1".into(), Role::Node))
        );
        for (text, says) in [
            ("admin", "PRINCIPAL=ROLE"),
            ("=admin", "blank"),
            ("a b=admin", "whitespace"),
            ("alice=root", "not a role"),
        ] {
            let err = parse_mapping(text).expect_err(text);
            assert!(err.contains(says), "{text}: {err}");
        }
        let long = format!("{}=client", "p".repeat(PRINCIPAL_LEN_MAX + 1));
        assert!(
            parse_mapping(&long)
                .unwrap_err()
                .contains("PRINCIPAL_LEN_MAX")
        );
    }

    #[test]
    fn a_principal_mapped_twice_to_different_roles_is_refused() {
        let same = role_map([("a".into(), Role::Client), ("a".into(), Role::Client)]);
        assert_eq!(same.map(|m| m.len()), Ok(1));
        let err = role_map([("a".into(), Role::Client), ("a".into(), Role::Admin)]).unwrap_err();
        assert!(err.contains("both client and admin"), "{err}");
        let many = (0..=ROLE_MAPPINGS_MAX).map(|i| (format!("p{i}"), Role::Client));
        assert!(role_map(many).unwrap_err().contains("ROLE_MAPPINGS_MAX"));
    }
}
