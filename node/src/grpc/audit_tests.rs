//! The audit calls through the gRPC services themselves, over the stateless backend and the
//! in-memory store: whom `ForceRevoke` records with and without an authenticated [`Caller`],
//! the refusal of another's name (nothing revoked), and `ListRevocations`' paging and token
//! checks as the wire answers them. The integration suites run the same calls against real
//! nodes on every backend; these pin the handler's rules where a `Caller` can be injected
//! directly.

use std::sync::Arc;

use lock_api::{LockError, REVOKE_AS_SELF_ROLE};
use lock_proto::lock_error_from_status;
use lock_proto::v1::admin_service_server::AdminService;
use lock_proto::v1::lock_service_server::LockService;
use lock_proto::v1::{ForceRevokeRequest, ListRevocationsRequest, ListRevocationsResponse};
use tokio::sync::watch;
use tonic::{Code, Request};

use super::admin::AdminApi;
use super::lock::LockApi;
use crate::backend::stateless::StatelessBackend;
use crate::backend::stateless::memory::MemoryStore;
use crate::clock::ManualClock;
use crate::peer::Caller;

type Backend = StatelessBackend<MemoryStore>;

fn services() -> (LockApi<Backend>, AdminApi<Backend>, watch::Sender<bool>) {
    let (stop, stop_rx) = watch::channel(false);
    let backend = StatelessBackend::new(
        MemoryStore::default(),
        1,
        "127.0.0.1:7101".into(),
        Arc::new(ManualClock::new(1_000)),
        stop_rx,
    );
    (
        LockApi::new(backend.clone()),
        AdminApi::new(backend, "test".into()),
        stop,
    )
}

fn revoke_request(key: &str, operator: &str, caller: Option<&str>) -> Request<ForceRevokeRequest> {
    let mut request = Request::new(ForceRevokeRequest {
        key: key.into(),
        operator: operator.into(),
        reason: "test".into(),
        request_id: 0,
    });
    if let Some(principal) = caller {
        request.extensions_mut().insert(Caller {
            principal: principal.into(),
        });
    }
    request
}

async fn list(
    admin: &AdminApi<Backend>,
    key: &str,
    page_size: u32,
    page_token: &str,
) -> Result<ListRevocationsResponse, tonic::Status> {
    admin
        .list_revocations(Request::new(ListRevocationsRequest {
            key: key.into(),
            page_size,
            page_token: page_token.into(),
        }))
        .await
        .map(|r| r.into_inner())
}

fn operators(page: &ListRevocationsResponse) -> Vec<&str> {
    page.revocations
        .iter()
        .map(|r| r.operator.as_str())
        .collect()
}

#[tokio::test]
async fn a_caller_is_recorded_as_the_operator_whatever_it_left_blank() {
    let (lock, admin, _stop) = services();
    lock.force_revoke(revoke_request("k", "", Some("operator")))
        .await
        .expect("a blank operator is the caller");
    lock.force_revoke(revoke_request("k", "operator", Some("operator")))
        .await
        .expect("the caller's own name");
    let page = list(&admin, "k", 0, "").await.expect("list");
    assert_eq!(operators(&page), ["operator", "operator"]);
}

#[tokio::test]
async fn a_caller_naming_another_operator_is_refused_and_nothing_is_revoked() {
    let (lock, admin, _stop) = services();
    let refused = lock
        .force_revoke(revoke_request("k", "someone-else", Some("operator")))
        .await
        .expect_err("another's name");
    assert_eq!(refused.code(), Code::PermissionDenied);
    assert_eq!(
        lock_error_from_status(&refused),
        LockError::PermissionDenied {
            principal: "operator".into(),
            required_role: REVOKE_AS_SELF_ROLE.into(),
        }
    );
    let page = list(&admin, "", 0, "").await.expect("list");
    assert!(page.revocations.is_empty(), "{page:?}");
}

#[tokio::test]
async fn without_a_caller_the_requests_operator_is_recorded_and_must_not_be_blank() {
    let (lock, admin, _stop) = services();
    lock.force_revoke(revoke_request("k", "oncall", None))
        .await
        .expect("revoke");
    let blank = lock
        .force_revoke(revoke_request("k", " ", None))
        .await
        .expect_err("a blank operator without a caller");
    assert_eq!(blank.code(), Code::InvalidArgument);
    let page = list(&admin, "k", 0, "").await.expect("list");
    assert_eq!(operators(&page), ["oncall"]);
}

#[tokio::test]
async fn pages_follow_their_tokens_and_a_bad_token_is_invalid_argument() {
    let (lock, admin, _stop) = services();
    for operator in ["a", "b", "c"] {
        lock.force_revoke(revoke_request("k", operator, None))
            .await
            .expect("revoke");
    }
    lock.force_revoke(revoke_request("other", "x", None))
        .await
        .expect("revoke");
    let first = list(&admin, "k", 2, "").await.expect("first page");
    assert_eq!(operators(&first), ["c", "b"]);
    assert!(!first.next_page_token.is_empty());
    let second = list(&admin, "k", 2, &first.next_page_token)
        .await
        .expect("second page");
    assert_eq!(operators(&second), ["a"]);
    assert!(second.next_page_token.is_empty(), "the last page says so");
    let all = list(&admin, "", 0, "").await.expect("every key");
    assert_eq!(operators(&all), ["x", "c", "b", "a"]);

    for (token, key) in [
        ("nonsense", "k"),
        (first.next_page_token.as_str(), "other"),
        (first.next_page_token.as_str(), ""),
    ] {
        let refused = list(&admin, key, 2, token).await.expect_err(token);
        assert_eq!(refused.code(), Code::InvalidArgument, "{token:?} / {key:?}");
    }
    let refused = list(&admin, " ", 0, "")
        .await
        .expect_err("a blank key filter");
    assert_eq!(refused.code(), Code::InvalidArgument);
}
