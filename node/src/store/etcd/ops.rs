//! The etcd transaction vocabulary the store is written in: compares, operations and reading
//! the results of a transaction's branch. Owns only the mapping to etcd's wire types; decides
//! nothing about locks and does no IO.

use lock_api::LockError;
use lock_proto::etcd::mvccpb::KeyValue;

use super::wire;
use wire::compare::{CompareResult, CompareTarget, TargetUnion};
use wire::request_op::Request;
use wire::response_op::Response;
use wire::{
    Compare, DeleteRangeRequest, PutRequest, RangeRequest, RangeResponse, RequestOp, TxnResponse,
};

/// etcd's `SortOrder::ASCEND` / `DESCEND` and `SortTarget::CREATE` (rpc.proto's enums, carried
/// as plain integers in the subset).
const SORT_ASCEND: i32 = 1;
const SORT_DESCEND: i32 = 2;
const SORT_BY_CREATE: i32 = 2;

fn compare(
    key: Vec<u8>,
    range_end: Vec<u8>,
    t: CompareTarget,
    r: CompareResult,
    v: TargetUnion,
) -> Compare {
    Compare {
        result: r as i32,
        target: t as i32,
        key,
        target_union: Some(v),
        range_end,
    }
}

/// `key` does not exist.
pub(super) fn absent(key: Vec<u8>) -> Compare {
    compare(
        key,
        Vec::new(),
        CompareTarget::Create,
        CompareResult::Equal,
        TargetUnion::CreateRevision(0),
    )
}

/// `key` exists.
pub(super) fn exists(key: Vec<u8>) -> Compare {
    compare(
        key,
        Vec::new(),
        CompareTarget::Create,
        CompareResult::Greater,
        TargetUnion::CreateRevision(0),
    )
}

/// `key` was created at `revision` (0: does not exist): the same incarnation of the key.
pub(super) fn created_at(key: Vec<u8>, revision: i64) -> Compare {
    compare(
        key,
        Vec::new(),
        CompareTarget::Create,
        CompareResult::Equal,
        TargetUnion::CreateRevision(revision),
    )
}

/// `key` was last written at `revision` (0: does not exist): unchanged since it was read.
pub(super) fn unchanged(key: Vec<u8>, revision: i64) -> Compare {
    compare(
        key,
        Vec::new(),
        CompareTarget::Mod,
        CompareResult::Equal,
        TargetUnion::ModRevision(revision),
    )
}

/// The range `[start, end)` holds no key. etcd compares every key of a range and compares an
/// empty range as one absent key, so "CreateRevision == 0 over the range" is true iff the
/// range is empty.
pub(super) fn range_empty(start: Vec<u8>, end: Vec<u8>) -> Compare {
    compare(
        start,
        end,
        CompareTarget::Create,
        CompareResult::Equal,
        TargetUnion::CreateRevision(0),
    )
}

/// No key of `[start, end)` was created or written after revision `read`: nothing joined the
/// range since it was read at `read` (a delete does not show, and needs not: it only shrinks
/// what was counted).
pub(super) fn range_unchanged_since(start: Vec<u8>, end: Vec<u8>, read: i64) -> Compare {
    compare(
        start,
        end,
        CompareTarget::Mod,
        CompareResult::Less,
        TargetUnion::ModRevision(read + 1),
    )
}

/// Writes `key` on `lease` (0: none).
pub(super) fn put(key: Vec<u8>, value: Vec<u8>, lease: i64) -> RequestOp {
    RequestOp {
        request: Some(Request::RequestPut(PutRequest {
            key,
            value,
            lease,
            ..Default::default()
        })),
    }
}

/// Deletes `key`.
pub(super) fn delete(key: Vec<u8>) -> RequestOp {
    RequestOp {
        request: Some(Request::RequestDeleteRange(DeleteRangeRequest {
            key,
            ..Default::default()
        })),
    }
}

/// Reads `key`.
pub(super) fn get(key: Vec<u8>) -> RequestOp {
    RequestOp {
        request: Some(Request::RequestRange(RangeRequest {
            key,
            ..Default::default()
        })),
    }
}

/// Reads `[start, end)` oldest-created first (`limit` 0: all), or newest first.
pub(super) fn range_by_age(
    start: Vec<u8>,
    end: Vec<u8>,
    limit: i64,
    newest_first: bool,
) -> RequestOp {
    RequestOp {
        request: Some(Request::RequestRange(RangeRequest {
            key: start,
            range_end: end,
            limit,
            sort_order: if newest_first {
                SORT_DESCEND
            } else {
                SORT_ASCEND
            },
            sort_target: SORT_BY_CREATE,
            ..Default::default()
        })),
    }
}

/// The keys (no values) of `[start, end)`, oldest-created first, at most `limit`.
pub(super) fn oldest_keys(start: Vec<u8>, end: Vec<u8>, limit: i64) -> RequestOp {
    RequestOp {
        request: Some(Request::RequestRange(RangeRequest {
            key: start,
            range_end: end,
            limit,
            sort_order: SORT_ASCEND,
            sort_target: SORT_BY_CREATE,
            keys_only: true,
            ..Default::default()
        })),
    }
}

/// Counts `[start, end)`.
pub(super) fn count(start: Vec<u8>, end: Vec<u8>) -> RequestOp {
    RequestOp {
        request: Some(Request::RequestRange(RangeRequest {
            key: start,
            range_end: end,
            count_only: true,
            ..Default::default()
        })),
    }
}

/// The result of range operation `index` of the branch that ran.
pub(super) fn range_result(resp: &TxnResponse, index: usize) -> Result<&RangeResponse, LockError> {
    match resp.responses.get(index).and_then(|r| r.response.as_ref()) {
        Some(Response::ResponseRange(r)) => Ok(r),
        _ => Err(LockError::contention(format!(
            "etcd answered a transaction without the range result {index}"
        ))),
    }
}

/// The single key range operation `index` returned, if any.
pub(super) fn one(resp: &TxnResponse, index: usize) -> Result<Option<&KeyValue>, LockError> {
    Ok(range_result(resp, index)?.kvs.first())
}

/// The count range operation `index` returned.
pub(super) fn counted(resp: &TxnResponse, index: usize) -> Result<i64, LockError> {
    Ok(range_result(resp, index)?.count)
}

/// The transaction's revision (its header's).
pub(super) fn revision(resp: &TxnResponse) -> i64 {
    resp.header.as_ref().map(|h| h.revision).unwrap_or(0)
}
