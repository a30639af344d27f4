//! [`LockError`] ↔ [`tonic::Status`]: the one place that maps lock errors to
//! gRPC and back (like etcd's `toGRPCErrorMap`). Every service and every
//! client goes through these two functions; nothing else builds a lockd error
//! status or decodes one.
//!
//! The error travels as a structured [`ErrorDetail`] inside the status
//! details, so a `NotLeader` answer carries the leader's id and address in
//! fields. The decoder never reads the status message text: the message is
//! for humans and logs, and may change wording at any time.
//!
//! # Encoding
//!
//! The status details (the `grpc-status-details-bin` trailer) hold an
//! [`RpcStatus`], which is wire-identical to `google.rpc.Status`, with one
//! `google.protobuf.Any` of type [`ERROR_DETAIL_TYPE_URL`] packing the
//! [`ErrorDetail`]. This is the standard gRPC rich-error model, so other gRPC
//! clients parse the trailer instead of failing the call on it.
//!
//! # Codes
//!
//! | [`LockError`] | [`Code`] | why |
//! |---|---|---|
//! | `NotLeader` | `Unavailable` | transient; retry (at the hinted leader) |
//! | `Contention` | `Unavailable` | transient; retry with backoff (see below) |
//! | `InvalidArgument` | `InvalidArgument` | caller bug; same call fails again |
//! | `LockLost` | `FailedPrecondition` | the grant the call depends on is gone |
//! | `FencedOut` | `FailedPrecondition` | the presented token is not above the fence |
//! | `Unauthenticated` | `Unauthenticated` | no accepted identity; fix the credentials |
//! | `PermissionDenied` | `PermissionDenied` | the principal lacks the role, or the session is another's |
//!
//! `Contention` is `Unavailable` rather than `Aborted`: docs/DESIGN.md D-errors folds
//! timeouts, network failures and leader changes into it, which is what
//! gRPC's `Unavailable` means ("transient, retry with backoff"), and every
//! lockd mutation is idempotent by `(session_id, request_id)`, so a retry is
//! safe. `FencedOut` is `FailedPrecondition` rather than `PermissionDenied`
//! because it is about state (a newer holder exists), not about credentials.
//!
//! Without a decodable detail the decoder maps by code: `InvalidArgument` (and
//! `OutOfRange`, `Unimplemented`) becomes `InvalidArgument`, `Unauthenticated` and
//! `PermissionDenied` keep their meaning (a proxy or an older node refusing the
//! caller's credentials is no transient trouble, and retrying it would only repeat
//! the refusal), and everything else becomes `Contention`: a status from a proxy, a
//! deadline, a dropped connection or an older server is transient, and
//! transient is never reported as lost (docs/DESIGN.md D-errors).

use lock_api::LockError;
use prost::Message;
use tonic::{Code, Status};

use crate::v1::{self, ErrorDetail, RpcStatus, error_detail::Kind};

/// The `google.protobuf.Any` type URL of an encoded [`ErrorDetail`].
pub const ERROR_DETAIL_TYPE_URL: &str = "type.googleapis.com/lockd.v1.ErrorDetail";

/// The fully qualified protobuf name of [`ErrorDetail`]: the part of a type
/// URL after its last `/`, which is all that identifies the type.
const ERROR_DETAIL_TYPE_NAME: &str = "lockd.v1.ErrorDetail";

/// Builds the gRPC status a server answers for `err`.
///
/// The status has the code in the table of this module, `err`'s
/// [`Display`](std::fmt::Display) text as its message, and the structured
/// [`ErrorDetail`] in its details, so [`lock_error_from_status`] gives back an
/// equal [`LockError`]. A variant added to [`LockError`] after this crate was
/// written maps to `Unknown` without a detail, which the decoder reads as
/// `Contention`.
pub fn status_from_lock_error(err: &LockError) -> Status {
    // `LockError` is #[non_exhaustive]; a new variant needs a new detail.
    let Some(kind) = kind_of(err) else {
        return Status::unknown(err.to_string());
    };
    let code = code_of(err);
    let message = err.to_string();
    let detail = ErrorDetail { kind: Some(kind) };
    let envelope = RpcStatus {
        code: code as i32,
        message: message.clone(),
        details: vec![prost_types::Any {
            type_url: ERROR_DETAIL_TYPE_URL.to_owned(),
            value: detail.encode_to_vec(),
        }],
    };
    Status::with_details(code, message, envelope.encode_to_vec().into())
}

/// The [`ErrorDetail`] of `err`, for an error that travels inside an answer rather than as
/// the call's status: the per-session outcome of `SessionService.HeartbeatBatch`.
/// [`lock_error_from_detail`] gives back an equal [`LockError`]. A variant added to
/// [`LockError`] after this crate was written becomes `Contention` carrying its text (retry-safe,
/// never a loss), as it does through a status.
pub fn error_detail_from_lock_error(err: &LockError) -> ErrorDetail {
    let kind = match kind_of(err) {
        Some(kind) => kind,
        None => Kind::Contention(v1::Contention {
            message: err.to_string(),
        }),
    };
    ErrorDetail { kind: Some(kind) }
}

/// The [`LockError`] an [`ErrorDetail`] carried inside an answer describes. A detail without
/// a kind (from a newer server whose kind this build does not know) is `Contention`:
/// transient, never a loss (docs/DESIGN.md D-errors).
pub fn lock_error_from_detail(detail: ErrorDetail) -> LockError {
    match detail.kind {
        Some(kind) => lock_error_from_kind(kind),
        None => LockError::contention("the server answered an error detail of an unknown kind"),
    }
}

/// The status code a server answers for `err` (the table of this module): what
/// [`status_from_lock_error`] gives the status, without building it. `Unknown` for a variant
/// this crate does not know.
pub fn code_of(err: &LockError) -> Code {
    match err {
        LockError::NotLeader { .. } | LockError::Contention { .. } => Code::Unavailable,
        LockError::InvalidArgument { .. } => Code::InvalidArgument,
        LockError::LockLost { .. } | LockError::FencedOut { .. } => Code::FailedPrecondition,
        LockError::Unauthenticated { .. } => Code::Unauthenticated,
        LockError::PermissionDenied { .. } => Code::PermissionDenied,
        _ => Code::Unknown,
    }
}

/// The detail kind of `err`; `None` for a variant this crate does not know.
fn kind_of(err: &LockError) -> Option<Kind> {
    let kind = match err {
        LockError::NotLeader {
            leader_id,
            leader_addr,
        } => Kind::NotLeader(v1::NotLeader {
            leader_id: *leader_id,
            leader_addr: leader_addr.clone(),
        }),
        LockError::Contention { message } => Kind::Contention(v1::Contention {
            message: message.clone(),
        }),
        LockError::InvalidArgument { message } => Kind::InvalidArgument(v1::InvalidArgument {
            message: message.clone(),
        }),
        LockError::LockLost { key } => Kind::LockLost(v1::LockLost { key: key.clone() }),
        LockError::FencedOut {
            key,
            presented,
            stored,
        } => Kind::FencedOut(v1::FencedOut {
            key: key.clone(),
            presented: *presented,
            stored: *stored,
        }),
        LockError::Unauthenticated { message } => Kind::Unauthenticated(v1::Unauthenticated {
            message: message.clone(),
        }),
        LockError::PermissionDenied {
            principal,
            required_role,
        } => Kind::PermissionDenied(v1::PermissionDenied {
            principal: principal.clone(),
            required_role: required_role.clone(),
        }),
        _ => return None,
    };
    Some(kind)
}

/// Reads the [`LockError`] a lockd server (or anything on the way) answered.
///
/// If the status details hold an [`ErrorDetail`], the error is rebuilt from
/// it, whatever the code. Otherwise — no details, or details that do not
/// decode — the code decides: `InvalidArgument` stays
/// [`LockError::InvalidArgument`], and every other code (`Unavailable`,
/// `DeadlineExceeded`, `Cancelled`, `Unknown`, `ResourceExhausted`, `Aborted`,
/// `Internal`, …) becomes [`LockError::Contention`], because a failure without
/// lockd's verdict is transient and never a lost lock (docs/DESIGN.md D-errors). The
/// message text is carried along for logs, never parsed. Never panics, whatever
/// bytes the details hold.
pub fn lock_error_from_status(status: &Status) -> LockError {
    match decode_detail(status.details()) {
        Some(kind) => lock_error_from_kind(kind),
        None => lock_error_from_code(status),
    }
}

/// Finds and decodes the [`ErrorDetail`] in a status's details, if there is a
/// well-formed one. Malformed bytes give `None`, never a panic.
fn decode_detail(details: &[u8]) -> Option<Kind> {
    if details.is_empty() {
        return None;
    }
    let envelope = RpcStatus::decode(details).ok()?;
    envelope
        .details
        .iter()
        .filter(|any| any.type_url.rsplit('/').next() == Some(ERROR_DETAIL_TYPE_NAME))
        .find_map(|any| ErrorDetail::decode(any.value.as_slice()).ok()?.kind)
}

/// Rebuilds the [`LockError`] a detail describes.
fn lock_error_from_kind(kind: Kind) -> LockError {
    match kind {
        Kind::NotLeader(v1::NotLeader {
            leader_id,
            leader_addr,
        }) => LockError::NotLeader {
            leader_id,
            // An empty address names no leader; a client must not dial "".
            leader_addr: leader_addr.filter(|addr| !addr.is_empty()),
        },
        Kind::FencedOut(v1::FencedOut {
            key,
            presented,
            stored,
        }) => LockError::FencedOut {
            key,
            presented,
            stored,
        },
        Kind::Contention(v1::Contention { message }) => LockError::Contention { message },
        Kind::InvalidArgument(v1::InvalidArgument { message }) => {
            LockError::InvalidArgument { message }
        }
        Kind::LockLost(v1::LockLost { key }) => LockError::LockLost { key },
        Kind::Unauthenticated(v1::Unauthenticated { message }) => {
            LockError::Unauthenticated { message }
        }
        Kind::PermissionDenied(v1::PermissionDenied {
            principal,
            required_role,
        }) => LockError::PermissionDenied {
            principal,
            required_role,
        },
    }
}

/// Maps a status that carries no lockd detail by its code alone.
fn lock_error_from_code(status: &Status) -> LockError {
    match status.code() {
        Code::InvalidArgument => LockError::InvalidArgument {
            message: status.message().to_owned(),
        },
        // The same call fails the same way every time, so retrying is useless: tonic answers
        // `OutOfRange` for a message over the server's size limit, and `Unimplemented` means
        // the server does not know the method (a version mismatch). Reporting either as
        // retry-safe would make a client retry forever a request that can never succeed.
        code @ (Code::OutOfRange | Code::Unimplemented) => LockError::InvalidArgument {
            message: format!("gRPC {code:?}: {}", status.message()),
        },
        // A refusal of the caller's credentials, from something that sent no lockd detail (a
        // proxy, or the transport): the same call is refused again, so it is never retried.
        // Without the detail the principal and role are unknown; the message says what the
        // refusing side said.
        Code::Unauthenticated => LockError::Unauthenticated {
            message: format!("gRPC Unauthenticated: {}", status.message()),
        },
        Code::PermissionDenied => LockError::PermissionDenied {
            principal: String::new(),
            required_role: String::new(),
        },
        // Transient, unknown-outcome or foreign: never a loss (docs/DESIGN.md D-errors).
        code => LockError::Contention {
            message: format!("gRPC {code:?}: {}", status.message()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One value of every `LockError` variant, with the code it must travel
    /// under.
    fn every_variant() -> Vec<(LockError, Code)> {
        vec![
            (
                LockError::NotLeader {
                    leader_id: Some(2),
                    leader_addr: Some("127.0.0.1:7002".into()),
                },
                Code::Unavailable,
            ),
            (
                LockError::NotLeader {
                    leader_id: Some(3),
                    leader_addr: None,
                },
                Code::Unavailable,
            ),
            (
                LockError::NotLeader {
                    leader_id: None,
                    leader_addr: None,
                },
                Code::Unavailable,
            ),
            (
                LockError::FencedOut {
                    key: "payout/42".into(),
                    presented: 7,
                    stored: 9,
                },
                Code::FailedPrecondition,
            ),
            (
                LockError::contention("proposal timed out"),
                Code::Unavailable,
            ),
            (LockError::invalid("key is blank"), Code::InvalidArgument),
            (
                LockError::LockLost {
                    key: "payout/42".into(),
                },
                Code::FailedPrecondition,
            ),
            (
                LockError::Unauthenticated {
                    message: "no client certificate and no bearer token".into(),
                },
                Code::Unauthenticated,
            ),
            (
                LockError::PermissionDenied {
                    principal: "client".into(),
                    required_role: "operator".into(),
                },
                Code::PermissionDenied,
            ),
        ]
    }

    #[test]
    fn a_refusal_without_a_detail_is_still_a_refusal_never_retried() {
        let err = lock_error_from_status(&Status::unauthenticated("no token"));
        assert!(
            matches!(&err, LockError::Unauthenticated { message } if message.contains("no token")),
            "{err:?}"
        );
        assert!(!err.is_retry_safe());
        let err = lock_error_from_status(&Status::permission_denied("nope"));
        assert!(matches!(err, LockError::PermissionDenied { .. }), "{err:?}");
        assert!(!err.is_retry_safe());
    }

    #[test]
    fn every_variant_round_trips_through_a_status() {
        for (err, code) in every_variant() {
            let status = status_from_lock_error(&err);
            assert_eq!(status.code(), code, "{err}");
            assert_eq!(code_of(&err), code, "{err}");
            assert_eq!(status.message(), err.to_string());
            assert!(!status.details().is_empty(), "{err}: no details");
            assert_eq!(lock_error_from_status(&status), err);
        }
    }

    #[test]
    fn every_variant_round_trips_through_an_error_detail() {
        for (err, _) in every_variant() {
            let detail = error_detail_from_lock_error(&err);
            assert!(detail.kind.is_some(), "{err}: no kind");
            assert_eq!(lock_error_from_detail(detail), err);
        }
        assert!(matches!(
            lock_error_from_detail(ErrorDetail { kind: None }),
            LockError::Contention { .. }
        ));
    }

    #[test]
    fn every_variant_round_trips_through_http_trailers() {
        // The path a real call takes: the status becomes grpc-status,
        // grpc-message and grpc-status-details-bin headers, and back.
        for (err, code) in every_variant() {
            let response = status_from_lock_error(&err).into_http::<()>();
            let status = Status::from_header_map(response.headers()).expect("a grpc-status header");
            assert_eq!(status.code(), code);
            assert_eq!(lock_error_from_status(&status), err);
        }
    }

    #[test]
    fn details_are_a_google_rpc_status_envelope() {
        let err = LockError::LockLost { key: "k".into() };
        let status = status_from_lock_error(&err);
        let envelope = RpcStatus::decode(status.details()).expect("an RpcStatus");
        assert_eq!(envelope.code, Code::FailedPrecondition as i32);
        assert_eq!(envelope.message, status.message());
        assert_eq!(envelope.details.len(), 1);
        assert_eq!(envelope.details[0].type_url, ERROR_DETAIL_TYPE_URL);
    }

    #[test]
    fn the_detail_wins_over_the_code() {
        // A detail is lockd's verdict; the code is only its gRPC summary.
        let lost = status_from_lock_error(&LockError::LockLost { key: "k".into() });
        let status = Status::with_details(
            Code::Unavailable,
            "relabelled by a proxy",
            lost.details().to_vec().into(),
        );
        assert_eq!(
            lock_error_from_status(&status),
            LockError::LockLost { key: "k".into() }
        );
    }

    #[test]
    fn a_status_without_details_maps_by_code() {
        let transient = [
            Code::Unavailable,
            Code::DeadlineExceeded,
            Code::Cancelled,
            Code::Unknown,
            Code::ResourceExhausted,
            Code::Aborted,
            Code::Internal,
            Code::FailedPrecondition,
            Code::NotFound,
            Code::Ok,
        ];
        for code in transient {
            let status = Status::new(code, "boom");
            match lock_error_from_status(&status) {
                LockError::Contention { message } => assert!(message.contains("boom")),
                other => panic!("{code:?} mapped to {other:?}"),
            }
        }
        assert_eq!(
            lock_error_from_status(&Status::invalid_argument("ttl_ms too large")),
            LockError::invalid("ttl_ms too large")
        );
    }

    #[test]
    fn a_request_that_can_never_succeed_is_not_retry_safe() {
        // tonic's answer to a message over the size limit, and an unknown method.
        for code in [Code::OutOfRange, Code::Unimplemented] {
            let err = lock_error_from_status(&Status::new(code, "message too large"));
            assert!(
                matches!(&err, LockError::InvalidArgument { message } if message.contains("too large")),
                "{code:?} mapped to {err:?}"
            );
            assert!(!err.is_retry_safe());
        }
    }

    #[test]
    fn the_message_text_is_never_parsed() {
        // Words that name a terminal error, without a detail, are still transient.
        let status = Status::failed_precondition("lock lost: fenced out, not the leader");
        assert!(matches!(
            lock_error_from_status(&status),
            LockError::Contention { .. }
        ));
    }

    #[test]
    fn malformed_details_fall_back_to_the_code() {
        let detail_with_no_kind = RpcStatus {
            code: Code::Unavailable as i32,
            message: String::new(),
            details: vec![prost_types::Any {
                type_url: ERROR_DETAIL_TYPE_URL.into(),
                value: ErrorDetail { kind: None }.encode_to_vec(),
            }],
        };
        let foreign_detail = RpcStatus {
            code: Code::Unavailable as i32,
            message: String::new(),
            details: vec![prost_types::Any {
                type_url: "type.googleapis.com/google.rpc.RetryInfo".into(),
                value: v1::LockLost { key: "k".into() }.encode_to_vec(),
            }],
        };
        let garbage_in_any = RpcStatus {
            code: Code::Unavailable as i32,
            message: String::new(),
            details: vec![prost_types::Any {
                type_url: ERROR_DETAIL_TYPE_URL.into(),
                value: vec![0xff, 0xff, 0xff, 0xff, 0xff],
            }],
        };
        let mut truncated = status_from_lock_error(&LockError::LockLost { key: "k".into() })
            .details()
            .to_vec();
        truncated.truncate(truncated.len() / 2);
        let cases: Vec<Vec<u8>> = vec![
            vec![0xff; 16],
            vec![0x0a, 0x80],
            b"not a protobuf at all".to_vec(),
            truncated,
            // A bare ErrorDetail, not wrapped in the envelope.
            ErrorDetail {
                kind: Some(Kind::LockLost(v1::LockLost { key: "k".into() })),
            }
            .encode_to_vec(),
            detail_with_no_kind.encode_to_vec(),
            foreign_detail.encode_to_vec(),
            garbage_in_any.encode_to_vec(),
        ];
        for (i, details) in cases.into_iter().enumerate() {
            for code in [Code::Unavailable, Code::FailedPrecondition, Code::Internal] {
                let status = Status::with_details(code, "boom", details.clone().into());
                assert!(
                    matches!(
                        lock_error_from_status(&status),
                        LockError::Contention { .. }
                    ),
                    "case {i} under {code:?}"
                );
            }
            let status = Status::with_details(Code::InvalidArgument, "bad", details.into());
            assert_eq!(
                lock_error_from_status(&status),
                LockError::invalid("bad"),
                "case {i}"
            );
        }
    }

    #[test]
    fn an_empty_leader_address_is_no_address() {
        let err = LockError::NotLeader {
            leader_id: Some(1),
            leader_addr: Some(String::new()),
        };
        assert_eq!(
            lock_error_from_status(&status_from_lock_error(&err)),
            LockError::NotLeader {
                leader_id: Some(1),
                leader_addr: None,
            }
        );
    }

    #[test]
    fn the_descriptor_set_names_every_service() {
        let set = prost_types::FileDescriptorSet::decode(crate::FILE_DESCRIPTOR_SET)
            .expect("a descriptor set");
        let services: Vec<String> = set
            .file
            .iter()
            .filter(|file| file.package() == "lockd.v1")
            .flat_map(|file| file.service.iter().map(|s| s.name().to_owned()))
            .collect();
        for name in [
            "LockService",
            "SessionService",
            "AdminService",
            "RaftService",
        ] {
            assert!(services.iter().any(|s| s == name), "{name} missing");
        }
    }
}
