"""Unit tests of error decoding: statuses built by hand, as a lockd server (proto/src/error.rs
``status_from_lock_error``) or something on the way would send them."""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import grpc
import pytest
from google.protobuf import any_pb2

import lockd
from lockd.errors import ERROR_DETAIL_TYPE_URL, error_from_detail, error_from_rpc_error, error_from_status
from lockd.v1 import error_pb2


class FakeRpcError(grpc.RpcError, grpc.Call):
    """A failed call as a stub raises it: a status code, a message and trailing metadata."""

    def __init__(self, code: grpc.StatusCode, message: str, trailers: Sequence[Tuple[str, object]] = ()) -> None:
        super().__init__()
        self._code = code
        self._message = message
        self._trailers = tuple(trailers)

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._message

    def trailing_metadata(self) -> Tuple[Tuple[str, object], ...]:
        return self._trailers

    def initial_metadata(self) -> Tuple[()]:
        return ()

    def is_active(self) -> bool:
        return False

    def time_remaining(self) -> Optional[float]:
        return None

    def cancel(self) -> bool:
        return False

    def add_callback(self, callback: object) -> bool:
        return False


def envelope(detail: error_pb2.ErrorDetail, code: grpc.StatusCode, type_url: str = ERROR_DETAIL_TYPE_URL) -> bytes:
    """The ``grpc-status-details-bin`` bytes a lockd server sends for ``detail``."""
    status = error_pb2.RpcStatus(code=code.value[0], message="for humans")
    status.details.append(any_pb2.Any(type_url=type_url, value=detail.SerializeToString()))
    return status.SerializeToString()


def status_error(detail: error_pb2.ErrorDetail, code: grpc.StatusCode) -> FakeRpcError:
    return FakeRpcError(code, "message text that must not be parsed", [("grpc-status-details-bin", envelope(detail, code))])


EVERY_KIND = [
    (
        error_pb2.ErrorDetail(not_leader=error_pb2.NotLeader(leader_id=2, leader_addr="127.0.0.1:7102")),
        grpc.StatusCode.UNAVAILABLE,
        lockd.NotLeader(2, "127.0.0.1:7102"),
    ),
    (
        error_pb2.ErrorDetail(not_leader=error_pb2.NotLeader(leader_id=3)),
        grpc.StatusCode.UNAVAILABLE,
        lockd.NotLeader(3, None),
    ),
    (error_pb2.ErrorDetail(not_leader=error_pb2.NotLeader()), grpc.StatusCode.UNAVAILABLE, lockd.NotLeader(None, None)),
    (
        error_pb2.ErrorDetail(fenced_out=error_pb2.FencedOut(key="payout/42", presented=7, stored=9)),
        grpc.StatusCode.FAILED_PRECONDITION,
        lockd.FencedOut("payout/42", 7, 9),
    ),
    (
        error_pb2.ErrorDetail(contention=error_pb2.Contention(message="proposal timed out")),
        grpc.StatusCode.UNAVAILABLE,
        lockd.Contention("proposal timed out"),
    ),
    (
        error_pb2.ErrorDetail(invalid_argument=error_pb2.InvalidArgument(message="key must not be blank")),
        grpc.StatusCode.INVALID_ARGUMENT,
        lockd.InvalidArgument("key must not be blank"),
    ),
    (
        error_pb2.ErrorDetail(lock_lost=error_pb2.LockLost(key="payout/42")),
        grpc.StatusCode.FAILED_PRECONDITION,
        lockd.LockLost("payout/42"),
    ),
    (
        error_pb2.ErrorDetail(unauthenticated=error_pb2.Unauthenticated(message="no client certificate")),
        grpc.StatusCode.UNAUTHENTICATED,
        lockd.Unauthenticated("not authenticated: no client certificate"),
    ),
    (
        error_pb2.ErrorDetail(permission_denied=error_pb2.PermissionDenied(principal="client", required_role="operator")),
        grpc.StatusCode.PERMISSION_DENIED,
        lockd.PermissionDenied(
            "permission denied: principal 'client' does not have the role 'operator' this call requires",
            "client",
            "operator",
        ),
    ),
]


@pytest.mark.parametrize("detail,code,expected", EVERY_KIND)
def test_every_kind_decodes_from_a_status(detail: error_pb2.ErrorDetail, code: grpc.StatusCode, expected: lockd.LockError) -> None:
    err = error_from_rpc_error(status_error(detail, code))
    assert type(err) is type(expected)
    assert err == expected
    assert isinstance(err, lockd.LockError)
    assert err.retry_safe == isinstance(expected, (lockd.Contention, lockd.NotLeader))
    # The same detail inside an answer (a HeartbeatBatch result) decodes the same.
    assert error_from_detail(detail) == expected


def test_the_fields_of_each_error_are_attributes() -> None:
    fenced = error_from_rpc_error(status_error(EVERY_KIND[3][0], grpc.StatusCode.FAILED_PRECONDITION))
    assert isinstance(fenced, lockd.FencedOut)
    assert (fenced.key, fenced.presented, fenced.stored) == ("payout/42", 7, 9)
    hint = error_from_rpc_error(status_error(EVERY_KIND[0][0], grpc.StatusCode.UNAVAILABLE))
    assert isinstance(hint, lockd.NotLeader)
    assert (hint.leader_id, hint.leader_addr) == (2, "127.0.0.1:7102")
    assert "127.0.0.1:7102" in str(hint)


def test_a_refusal_names_the_principal_and_the_role() -> None:
    denied = error_from_rpc_error(status_error(EVERY_KIND[-1][0], grpc.StatusCode.PERMISSION_DENIED))
    assert isinstance(denied, lockd.PermissionDenied) and not denied.retry_safe
    assert (denied.principal, denied.required_role) == ("client", "operator")
    hijack = error_pb2.ErrorDetail(
        permission_denied=error_pb2.PermissionDenied(principal="mallory", required_role=lockd.errors.SESSION_OWNER_ROLE)
    )
    err = error_from_detail(hijack)
    assert isinstance(err, lockd.PermissionDenied)
    assert "'mallory' did not open this session" in str(err)


def test_the_detail_wins_over_the_code() -> None:
    # A proxy relabelled the status; lockd's verdict is in the detail.
    lost = error_pb2.ErrorDetail(lock_lost=error_pb2.LockLost(key="k"))
    err = error_from_rpc_error(FakeRpcError(grpc.StatusCode.UNAVAILABLE, "x", [("grpc-status-details-bin", envelope(lost, grpc.StatusCode.FAILED_PRECONDITION))]))
    assert err == lockd.LockLost("k")


def test_the_message_text_is_never_parsed() -> None:
    # A message that names a loss, without a detail, is still only a transient failure.
    err = error_from_status(grpc.StatusCode.UNAVAILABLE, "lock lost: NotLeader leader_addr=1.2.3.4:5")
    assert isinstance(err, lockd.Contention)


@pytest.mark.parametrize(
    "code",
    [
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.OK,
    ],
)
def test_a_status_without_a_detail_is_transient(code: grpc.StatusCode) -> None:
    err = error_from_rpc_error(FakeRpcError(code, "boom"))
    assert isinstance(err, lockd.Contention)
    assert "boom" in err.message
    assert err.retry_safe


def test_codes_that_cannot_succeed_again_are_not_retry_safe() -> None:
    assert error_from_status(grpc.StatusCode.INVALID_ARGUMENT, "ttl_ms too large") == lockd.InvalidArgument("ttl_ms too large")
    for code in (grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.UNIMPLEMENTED):
        err = error_from_status(code, "message too large")
        assert isinstance(err, lockd.InvalidArgument) and "too large" in err.message
    assert isinstance(error_from_status(grpc.StatusCode.UNAUTHENTICATED, "no cert"), lockd.Unauthenticated)
    assert isinstance(error_from_status(grpc.StatusCode.PERMISSION_DENIED, "not yours"), lockd.PermissionDenied)
    for cls in (lockd.InvalidArgument, lockd.LockLost, lockd.FencedOut, lockd.PermissionDenied, lockd.Unauthenticated):
        assert cls.retry_safe is False
    for cls in (lockd.Contention, lockd.NotLeader):
        assert cls.retry_safe is True


@pytest.mark.parametrize(
    "details",
    [
        b"\xff\xff\xff",  # not a protobuf at all
        error_pb2.RpcStatus(code=14, message="no details").SerializeToString(),
        envelope(error_pb2.ErrorDetail(lock_lost=error_pb2.LockLost(key="k")), grpc.StatusCode.UNAVAILABLE, "type.googleapis.com/other.Type"),
        envelope(error_pb2.ErrorDetail(), grpc.StatusCode.UNAVAILABLE),  # a kind this client does not know
    ],
)
def test_undecodable_details_fall_back_to_the_code(details: bytes) -> None:
    assert isinstance(error_from_status(grpc.StatusCode.UNAVAILABLE, "x", details), lockd.Contention)
    assert isinstance(error_from_status(grpc.StatusCode.INVALID_ARGUMENT, "bad", details), lockd.InvalidArgument)


def test_an_empty_leader_address_is_no_address() -> None:
    detail = error_pb2.ErrorDetail(not_leader=error_pb2.NotLeader(leader_id=1, leader_addr=""))
    assert error_from_rpc_error(status_error(detail, grpc.StatusCode.UNAVAILABLE)) == lockd.NotLeader(1, None)


def test_a_detail_of_an_unknown_kind_inside_an_answer_is_transient() -> None:
    assert isinstance(error_from_detail(error_pb2.ErrorDetail()), lockd.Contention)


def test_not_acquired_is_not_a_lock_error() -> None:
    assert not issubclass(lockd.NotAcquired, lockd.LockError)
    assert lockd.NotAcquired("k", 1.5).key == "k"
