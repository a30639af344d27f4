//! Which role each gRPC method requires: the table of docs/SECURITY.md §2, keyed by the
//! request's path (`/package.Service/Method`).
//!
//! Owns the table only. A method of a lockd service that the table does not name requires
//! `admin`: a method added to the protos later is closed until someone decides who may call
//! it, never open by omission. Health and reflection need no role (a load balancer probes
//! them before it holds any credential).

use super::roles::Role;

/// What a call must present.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Requirement {
    /// Nothing: anyone who completed the TLS handshake may call it.
    Nobody,
    /// An authenticated principal holding this role (or one that includes it).
    Role(Role),
}

/// The gRPC services whose every method anyone may call.
const OPEN_SERVICES: [&str; 3] = [
    "grpc.health.v1.Health",
    "grpc.reflection.v1.ServerReflection",
    "grpc.reflection.v1alpha.ServerReflection",
];

/// `AdminService` methods an `operator` may call: reading the audit log.
const OPERATOR_ADMIN_METHODS: [&str; 1] = ["ListRevocations"];

/// `AdminService` methods a `client` may call.
const CLIENT_ADMIN_METHODS: [&str; 1] = ["Status"];

/// The requirement of the call at `path` (an HTTP/2 `:path`, `/lockd.v1.LockService/Acquire`).
pub fn requirement(path: &str) -> Requirement {
    let Some((service, method)) = path.strip_prefix('/').and_then(|p| p.split_once('/')) else {
        // Not a gRPC path at all: tonic answers it Unimplemented; nobody gets further with it.
        return Requirement::Role(Role::Admin);
    };
    if OPEN_SERVICES.contains(&service) {
        return Requirement::Nobody;
    }
    let role = match service {
        "lockd.v1.RaftService" => Role::Node,
        "lockd.v1.SessionService" => Role::Client,
        "lockd.v1.LockService" if method == "ForceRevoke" => Role::Operator,
        "lockd.v1.LockService" => Role::Client,
        "lockd.v1.AdminService" if CLIENT_ADMIN_METHODS.contains(&method) => Role::Client,
        "lockd.v1.AdminService" if OPERATOR_ADMIN_METHODS.contains(&method) => Role::Operator,
        // Init, AddLearner, ChangeMembership and any admin method added later.
        _ => Role::Admin,
    };
    Requirement::Role(role)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every method of every lockd service in the descriptor set has the role the plan's
    /// table gives it, so a method added to a proto shows up here.
    #[test]
    fn every_lockd_method_requires_the_role_of_the_table() {
        use prost::Message;
        let set = prost_types::FileDescriptorSet::decode(lock_proto::FILE_DESCRIPTOR_SET)
            .expect("the descriptor set decodes");
        let mut seen = 0;
        for file in set.file.iter().filter(|f| f.package() == "lockd.v1") {
            for service in &file.service {
                for method in &service.method {
                    let path = format!("/lockd.v1.{}/{}", service.name(), method.name());
                    let expected = match (service.name(), method.name()) {
                        ("RaftService", _) => Role::Node,
                        ("LockService", "ForceRevoke") => Role::Operator,
                        ("LockService" | "SessionService", _) => Role::Client,
                        ("AdminService", "Status") => Role::Client,
                        ("AdminService", "ListRevocations") => Role::Operator,
                        ("AdminService", _) => Role::Admin,
                        (other, _) => panic!("service {other} is not in the table"),
                    };
                    assert_eq!(requirement(&path), Requirement::Role(expected), "{path}");
                    seen += 1;
                }
            }
        }
        assert!(seen > 20, "only {seen} methods found");
    }

    #[test]
    fn the_named_calls_need_their_roles_and_probes_need_none() {
        let cases = [
            (
                "/lockd.v1.LockService/Acquire",
                Requirement::Role(Role::Client),
            ),
            (
                "/lockd.v1.LockService/Pipeline",
                Requirement::Role(Role::Client),
            ),
            (
                "/lockd.v1.LockService/ForceRevoke",
                Requirement::Role(Role::Operator),
            ),
            (
                "/lockd.v1.SessionService/OpenSession",
                Requirement::Role(Role::Client),
            ),
            (
                "/lockd.v1.AdminService/Status",
                Requirement::Role(Role::Client),
            ),
            (
                "/lockd.v1.AdminService/ListRevocations",
                Requirement::Role(Role::Operator),
            ),
            (
                "/lockd.v1.AdminService/ChangeMembership",
                Requirement::Role(Role::Admin),
            ),
            (
                "/lockd.v1.AdminService/Init",
                Requirement::Role(Role::Admin),
            ),
            (
                "/lockd.v1.AdminService/AddLearner",
                Requirement::Role(Role::Admin),
            ),
            (
                "/lockd.v1.AdminService/SomethingNew",
                Requirement::Role(Role::Admin),
            ),
            (
                "/lockd.v1.RaftService/AppendEntries",
                Requirement::Role(Role::Node),
            ),
            ("/grpc.health.v1.Health/Check", Requirement::Nobody),
            (
                "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
                Requirement::Nobody,
            ),
            ("/lockd.v2.Unknown/X", Requirement::Role(Role::Admin)),
            ("garbage", Requirement::Role(Role::Admin)),
        ];
        for (path, expected) in cases {
            assert_eq!(requirement(path), expected, "{path}");
        }
    }
}
