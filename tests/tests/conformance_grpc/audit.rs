//! Cases on the force-revoke audit log (`AdminService.ListRevocations`, docs/SECURITY.md §4):
//! every revoke is a record with every field the revoke had, newest first, filtered by key,
//! paged by an opaque token that a revoke arriving between pages does not shift, and a token
//! the service did not issue is `INVALID_ARGUMENT`. Raw stubs, so the cases see the wire's
//! fields and codes exactly; where there are several nodes consecutive calls go to different
//! ones, which must answer from one log.
//!
//! The PostgreSQL and etcd logs outlive runs and other cases revoke concurrently, so a case
//! filters by its own keys, or looks for its own records among the others in order; it never
//! assumes the log holds only its records.
//!
//! The targets serve TLS and the harness's clients present the `admin` certificate, so a
//! revoke names [`HARNESS_IDENTITY`] as its operator (a revoke may record only its caller's
//! name); [`principal`] checks that rule with the `operator` and `client` certificates.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lock_api::{LockError, REVOKE_AS_SELF_ROLE};
use lock_proto::v1::{ListRevocationsRequest, ListRevocationsResponse, RevocationRecord};
use lock_tests::pki::HARNESS_IDENTITY;
use lock_tests::{NodeClient, next_request_id};
use tonic::{Code, Status};

use super::{Findings, LONG_TTL, Target};

/// How far a record's `revoked_at_unix_ms` (the backend's clock: the Raft leader's stamp,
/// PostgreSQL's `now()`, a stateless node's clock) may be from this process's clock around the
/// revoke: all run on this machine, so only scheduling separates them.
const CLOCK_SLACK_MS: u64 = 5_000;

/// Most pages a case reads of the whole log looking for its records: the log holds at most
/// `AUDIT_LOG_MAX` (1,024) records, fewer than this many full pages.
const PAGES_MAX: usize = 16;

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// One `ListRevocations` call at `node`, with a deadline.
async fn list(
    node: &NodeClient,
    key: &str,
    page_size: u32,
    page_token: &str,
) -> Result<ListRevocationsResponse, Status> {
    let mut request = tonic::Request::new(ListRevocationsRequest {
        key: key.to_owned(),
        page_size,
        page_token: page_token.to_owned(),
    });
    request.set_timeout(Duration::from_secs(10));
    node.admin_service()
        .list_revocations(request)
        .await
        .map(|r| r.into_inner())
}

/// The floors of `records`, in order.
fn floors(records: &[RevocationRecord]) -> Vec<u64> {
    records.iter().map(|r| r.new_token_floor).collect()
}

/// Two revokes — of a held key, then of a free one, on different nodes where there are
/// several — are two records with every field as revoked, newest first; the key filter answers
/// each key's record alone; the whole log lists the later revoke before the earlier one, in
/// strictly falling floor order throughout.
pub async fn newest_first(t: &mut Target) {
    let mut f = Findings::new(t, "audit log newest first");
    let owner = t.owner("audited-holder");
    let session = t.any().open_session(&owner, LONG_TTL).await.expect("open");
    let held_key = t.key("audit-fields", 0);
    let free_key = t.key("audit-fields", 1);
    let operator = HARNESS_IDENTITY.to_owned();
    let grant = t
        .node(0)
        .await
        .try_acquire(&session.id, &held_key, LONG_TTL)
        .await
        .expect("try_acquire")
        .expect("a fresh key is free");
    let (held_id, free_id) = (next_request_id(), next_request_id());
    let before_ms = now_ms();
    let held = t
        .node(0)
        .await
        .force_revoke_with_request_id(&held_key, &operator, "audit: stuck holder", held_id)
        .await
        .expect("revoke the held key");
    let free = t
        .node(1)
        .await
        .force_revoke_with_request_id(&free_key, &operator, "audit: free key", free_id)
        .await
        .expect("revoke the free key");
    let after_ms = now_ms();
    f.check(held.new_token_floor < free.new_token_floor, || {
        format!("the later revoke's floor {free:?} is not above the earlier one's {held:?}")
    });

    let expected = [
        RevocationRecord {
            key: held_key.clone(),
            operator: operator.clone(),
            reason: "audit: stuck holder".into(),
            previous_owner_id: Some(owner.clone()),
            previous_token: Some(grant.fencing_token),
            new_token_floor: held.new_token_floor,
            revoked_at_unix_ms: 0,
            request_id: held_id,
        },
        RevocationRecord {
            key: free_key.clone(),
            operator: operator.clone(),
            reason: "audit: free key".into(),
            previous_owner_id: None,
            previous_token: None,
            new_token_floor: free.new_token_floor,
            revoked_at_unix_ms: 0,
            request_id: free_id,
        },
    ];
    for (i, want) in expected.iter().enumerate() {
        let node = t.node(i + 1).await;
        let page = match list(&node, &want.key, 0, "").await {
            Ok(page) => page,
            Err(e) => {
                f.fail(format!("ListRevocations(key {:?}) failed: {e:?}", want.key));
                continue;
            }
        };
        let [got] = page.revocations.as_slice() else {
            f.fail(format!(
                "ListRevocations(key {:?}) answered {} records, not the one revoke of the key: \
                 {:?}",
                want.key,
                page.revocations.len(),
                page.revocations
            ));
            continue;
        };
        let stamped = got.revoked_at_unix_ms;
        f.check(
            stamped + CLOCK_SLACK_MS >= before_ms && stamped <= after_ms + CLOCK_SLACK_MS,
            || {
                format!(
                    "revoked_at_unix_ms {stamped} is not within {CLOCK_SLACK_MS} ms of the \
                     revoke ({before_ms}..{after_ms})"
                )
            },
        );
        let got = RevocationRecord {
            revoked_at_unix_ms: 0,
            ..got.clone()
        };
        f.check(&got == want, || {
            format!("the record of the revoke is {got:?}, not {want:?}")
        });
        f.check(page.next_page_token.is_empty(), || {
            format!(
                "a one-record listing of {:?} answered a next page token {:?}",
                want.key, page.next_page_token
            )
        });
    }

    // The whole log: page through it (other cases and runs revoke too) until both are found.
    let node = t.node(0).await;
    let mut token = String::new();
    let mut seen: Vec<RevocationRecord> = Vec::new();
    for _ in 0..PAGES_MAX {
        let page = match list(&node, "", 0, &token).await {
            Ok(page) => page,
            Err(e) => {
                f.fail(format!("ListRevocations of every key failed: {e:?}"));
                break;
            }
        };
        seen.extend(page.revocations);
        if page.next_page_token.is_empty() || seen.iter().any(|r| r.key == held_key) {
            break;
        }
        token = page.next_page_token;
    }
    let order = floors(&seen);
    f.check(order.windows(2).all(|w| w[0] > w[1]), || {
        format!("the whole log is not in strictly falling floor order: {order:?}")
    });
    let at = |key: &str| seen.iter().position(|r| r.key == key);
    match (at(&free_key), at(&held_key)) {
        (Some(later), Some(earlier)) => {
            f.check(later < earlier, || {
                format!(
                    "the later revoke ({free_key:?}) is listed at {later}, after the earlier \
                     one ({held_key:?}) at {earlier}"
                )
            });
        }
        found => f.fail(format!(
            "the whole log lacks a revoke of this case: positions {found:?} in {} records",
            seen.len()
        )),
    }
    f.finish();
}

/// Three revokes of one key read two to a page: the first page is the newest two with a
/// token; a fourth revoke arriving before the second page neither repeats a record nor hides
/// the oldest one, and the last page says it is the last; a new listing starts at the fourth.
/// A token that is not one the service issued, or one issued for another key, is
/// `INVALID_ARGUMENT` on every node; an oversized page size is served, capped.
pub async fn paging(t: &mut Target) {
    let mut f = Findings::new(t, "audit log paging");
    let key = t.key("audit-paging", 0);
    let other_key = t.key("audit-paging", 1);
    let operator = HARNESS_IDENTITY;
    let mut revoked = Vec::new();
    for n in 0..3 {
        let outcome = t
            .node(n)
            .await
            .force_revoke(&key, operator, &format!("audit: page {n}"))
            .await
            .expect("force_revoke");
        revoked.push(outcome.new_token_floor);
    }
    for n in 0..2 {
        t.node(n)
            .await
            .force_revoke(&other_key, operator, "audit: other key")
            .await
            .expect("force_revoke");
    }

    let first = list(&t.node(0).await, &key, 2, "")
        .await
        .expect("the first page");
    f.check(
        floors(&first.revocations) == [revoked[2], revoked[1]],
        || {
            format!(
                "the first page of two is {:?}, not the newest two revokes {:?}",
                floors(&first.revocations),
                [revoked[2], revoked[1]]
            )
        },
    );
    f.check(!first.next_page_token.is_empty(), || {
        "the first of two pages answered no next page token".to_owned()
    });
    f.check(first.revocations.iter().all(|r| r.key == key), || {
        format!(
            "the page filtered by {key:?} holds another key's record: {:?}",
            first.revocations
        )
    });

    let between = t
        .node(1)
        .await
        .force_revoke(&key, operator, "audit: between pages")
        .await
        .expect("force_revoke between pages");
    let second = list(&t.node(1).await, &key, 2, &first.next_page_token)
        .await
        .expect("the second page");
    f.check(floors(&second.revocations) == [revoked[0]], || {
        format!(
            "after a revoke between pages the second page is {:?}, not the oldest revoke {:?} \
             alone",
            floors(&second.revocations),
            revoked[0]
        )
    });
    f.check(second.next_page_token.is_empty(), || {
        format!(
            "the last page answered a next page token {:?}",
            second.next_page_token
        )
    });
    let fresh = list(&t.node(0).await, &key, 2, "")
        .await
        .expect("a new listing");
    f.check(
        floors(&fresh.revocations) == [between.new_token_floor, revoked[2]],
        || {
            format!(
                "a new listing is {:?}, not the revoke made between pages then the newest \
                 before it",
                floors(&fresh.revocations)
            )
        },
    );
    let all = list(&t.node(1).await, &key, u32::MAX, "")
        .await
        .expect("an oversized page");
    f.check(
        all.revocations.len() == 4 && all.next_page_token.is_empty(),
        || {
            format!(
                "page_size u32::MAX over four records answered {} records and token {:?}",
                all.revocations.len(),
                all.next_page_token
            )
        },
    );

    let foreign = list(&t.node(0).await, &other_key, 1, "")
        .await
        .expect("the other key's page");
    let mut bad = vec![
        ("garbage".to_owned(), key.clone()),
        ("0".repeat(34), key.clone()),
        (
            first.next_page_token.replace(char::is_alphanumeric, "z"),
            key.clone(),
        ),
        // The first page's token was issued for `key`: it means nothing for another filter.
        (first.next_page_token.clone(), other_key.clone()),
        (first.next_page_token.clone(), String::new()),
    ];
    f.check(!foreign.next_page_token.is_empty(), || {
        "one record a page of two revokes answered no next page token".to_owned()
    });
    bad.push((foreign.next_page_token, key.clone()));
    for (n, (token, filter)) in bad.into_iter().enumerate() {
        match list(&t.node(n).await, &filter, 2, &token).await {
            Err(e) if e.code() == Code::InvalidArgument => {}
            other => f.fail(format!(
                "page token {token:?} with key {filter:?} answered {other:?}, not \
                 INVALID_ARGUMENT"
            )),
        }
    }
    f.finish();
}

/// Over TLS a revoke records the caller's certificate principal: the `operator` certificate's
/// revoke with a blank operator, or with its own name, is recorded as `operator`; one naming
/// another principal is `PERMISSION_DENIED` (`revoke-as-self`) and leaves the grant as it
/// was; a `client` may neither revoke nor read the log (it lacks the `operator` role).
pub async fn principal(t: &mut Target) {
    let mut f = Findings::new(t, "revoke principal");
    let session = t
        .any()
        .open_session(&t.owner("principal-holder"), LONG_TTL)
        .await
        .expect("open");
    let keys: Vec<String> = (0..3).map(|n| t.key("audit-principal", n)).collect();
    let mut grants = Vec::new();
    for key in &keys {
        grants.push(
            t.node(0)
                .await
                .try_acquire(&session.id, key, LONG_TTL)
                .await
                .expect("try_acquire")
                .expect("a fresh key is free"),
        );
    }

    for (key, asked) in [(&keys[0], ""), (&keys[1], "operator")] {
        if let Err(e) = t
            .node_as(0, "operator")
            .await
            .force_revoke(key, asked, "audit: as the operator")
            .await
        {
            f.fail(format!(
                "the operator's revoke of {key:?} naming {asked:?} failed: {e}"
            ));
        }
        match list(&t.node_as(1, "operator").await, key, 0, "").await {
            Ok(page) => {
                f.check(operators_are(&page, &["operator"]), || {
                    format!(
                        "the operator's revoke naming {asked:?} is recorded as {:?}, not as \
                         the certificate's principal \"operator\"",
                        page.revocations
                    )
                });
            }
            Err(e) => f.fail(format!("the operator's ListRevocations failed: {e:?}")),
        }
    }

    let refused = t
        .node_as(0, "operator")
        .await
        .force_revoke(&keys[2], HARNESS_IDENTITY, "audit: in another's name")
        .await;
    f.check(
        refused
            == Err(LockError::PermissionDenied {
                principal: "operator".into(),
                required_role: REVOKE_AS_SELF_ROLE.into(),
            }),
        || {
            format!(
                "a revoke by \"operator\" naming {HARNESS_IDENTITY:?} answered {refused:?}, not \
                 PermissionDenied(operator, {REVOKE_AS_SELF_ROLE})"
            )
        },
    );
    let by_client = t
        .node_as(1, "client")
        .await
        .force_revoke(&keys[2], "client", "audit: as a client")
        .await;
    f.check(
        matches!(
            &by_client,
            Err(LockError::PermissionDenied { principal, required_role })
                if principal == "client" && required_role == "operator"
        ),
        || format!("a revoke by a client answered {by_client:?}, not PermissionDenied"),
    );
    let held = t.inspect_at(0, &keys[2]).await;
    f.check(
        held.as_ref().map(|i| i.fencing_token) == Some(grants[2].fencing_token),
        || format!("after the refused revokes the key shows {held:?}, not its grant"),
    );
    match list(&t.node(0).await, &keys[2], 0, "").await {
        Ok(page) => {
            f.check(page.revocations.is_empty(), || {
                format!("a refused revoke is in the log: {:?}", page.revocations)
            });
        }
        Err(e) => f.fail(format!("ListRevocations failed: {e:?}")),
    }
    match list(&t.node_as(0, "client").await, "", 0, "").await {
        Err(e) if e.code() == Code::PermissionDenied => {}
        other => f.fail(format!(
            "a client's ListRevocations answered {other:?}, not PERMISSION_DENIED"
        )),
    }
    f.finish();
}

/// Whether `page` holds exactly one record per entry of `operators`, with those operators.
fn operators_are(page: &ListRevocationsResponse, operators: &[&str]) -> bool {
    page.revocations.len() == operators.len()
        && page
            .revocations
            .iter()
            .zip(operators)
            .all(|(r, o)| r.operator == *o)
}
