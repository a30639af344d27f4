"""The exceptions of lockd, and the one place that turns a failed gRPC call into one of them.

The exception classes mirror the Rust ``lock_api::LockError`` variants (C2 §2.4). The split that
matters is *retry the lock operation* versus *stop*: a transient failure (a timeout, a lost
connection, a leader change) is :class:`Contention` or :class:`NotLeader`, never
:class:`LockLost`. Reporting a blip as a loss makes a caller abandon work it still owns;
reporting a loss as a blip lets two holders proceed (C2 §2.5, docs/DESIGN.md D-errors).

A lockd server answers a failed call with a gRPC status whose ``grpc-status-details-bin``
trailer holds a ``lockd.v1.RpcStatus`` (wire-identical to ``google.rpc.Status``) packing one
``lockd.v1.ErrorDetail``. :func:`error_from_rpc_error` decodes that detail and never reads the
status message text, which is for humans and may change wording at any time. A status without a
decodable detail is mapped by its code, with everything unknown read as :class:`Contention`:
whatever failed without lockd's verdict (a proxy, a deadline, a dropped connection) is
transient, and transient is never reported as lost. This mirrors ``lock_error_from_status`` in
the Rust crate ``lock-proto`` (proto/src/error.rs), with one addition: a status coded
``UNAUTHENTICATED`` or ``PERMISSION_DENIED`` is :class:`Unauthenticated` or
:class:`PermissionDenied` (not retry-safe), because retrying a call the server refused on
credentials cannot succeed.
"""

from __future__ import annotations

from typing import Any, ClassVar, Optional, Sequence, Tuple

import grpc

from lockd.v1 import error_pb2

__all__ = [
    "ERROR_DETAIL_TYPE_URL",
    "Contention",
    "FencedOut",
    "InvalidArgument",
    "LockError",
    "LockLost",
    "NotAcquired",
    "NotLeader",
    "PermissionDenied",
    "SESSION_OWNER_ROLE",
    "Unauthenticated",
    "error_from_detail",
    "error_from_rpc_error",
    "error_from_status",
]

#: The ``google.protobuf.Any`` type URL of an encoded ``lockd.v1.ErrorDetail``.
ERROR_DETAIL_TYPE_URL = "type.googleapis.com/lockd.v1.ErrorDetail"

#: The part of a type URL after its last ``/``, which is all that identifies the type.
_ERROR_DETAIL_TYPE_NAME = "lockd.v1.ErrorDetail"

#: The trailer that carries the rich-error envelope.
_DETAILS_TRAILER = "grpc-status-details-bin"


class LockError(Exception):
    """Base class of every failure of a lock operation (Rust ``lock_api::LockError``).

    ``retry_safe`` (a class attribute) says whether retrying the *lock operation* may succeed:
    ``True`` only for :class:`Contention` and :class:`NotLeader`. It never licenses repeating
    a side effect that a resource fenced out. ``message`` is for logs, never to be parsed.
    """

    retry_safe: ClassVar[bool] = False

    def __init__(self, message: str) -> None:
        super().__init__(message)
        #: What happened, for logs.
        self.message: str = message

    def __str__(self) -> str:
        return self.message

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self.args == getattr(other, "args", None)

    def __hash__(self) -> int:
        return hash((type(self), self.args))


class LockLost(LockError):
    """The grant is gone: its local deadline passed, a renewal found it expired, revoked or taken
    over, or a confirmed check found it missing.

    **Not retry-safe, terminal.** Abort the critical section; do not re-acquire inside the same
    unit of work. ``key`` is the lock key whose grant was lost.
    """

    retry_safe: ClassVar[bool] = False

    def __init__(self, key: str) -> None:
        super().__init__(f"lock lost: the grant on {key!r} is gone")
        self.args = (key,)
        #: The key whose grant was lost.
        self.key: str = key


class FencedOut(LockError):
    """A resource rejected a write because the presented fencing token is not greater than the
    token it stores (C2 §2.4, INV-04).

    **Never retry-safe.** This holder has been superseded by a later one, which may already have
    performed the side effect; stop and treat it as an incident (log ``key``, ``presented`` and
    ``stored``).
    """

    retry_safe: ClassVar[bool] = False

    def __init__(self, key: str, presented: int, stored: int) -> None:
        super().__init__(
            f"fenced out on {key!r}: presented token {presented} is not greater than "
            f"stored token {stored}"
        )
        self.args = (key, presented, stored)
        #: The key the write was made under.
        self.key: str = key
        #: The token the writer presented.
        self.presented: int = presented
        #: The highest token the resource had already accepted.
        self.stored: int = stored


class Contention(LockError):
    """A transient failure prevented a decision in time: a timeout, a lost connection, a leader
    change mid-request, a store conflict, an exhausted retry budget.

    **Retry-safe, with backoff.** The outcome of a mutating call that failed this way may be
    unknown; lockd's request ids make retrying it idempotent. It never means the lock is lost.
    """

    retry_safe: ClassVar[bool] = True


class NotLeader(LockError):
    """The addressed node is not the leader, or no leader is known yet (an election is running).

    **Retry-safe after a short delay**, at the hinted leader if there is one. The client follows
    these hints itself; it raises this only once its time budget is spent. ``leader_id`` and
    ``leader_addr`` (``host:port``) name the leader the node believes in, or are ``None``.
    """

    retry_safe: ClassVar[bool] = True

    def __init__(self, leader_id: Optional[int] = None, leader_addr: Optional[str] = None) -> None:
        if leader_id is not None and leader_addr:
            text = f"not the leader; the leader is node {leader_id} at {leader_addr}"
        elif leader_id is not None:
            text = f"not the leader; the leader is node {leader_id}"
        else:
            text = "not the leader; no leader is known"
        super().__init__(text)
        self.args = (leader_id, leader_addr)
        #: The leader's node id, if the node knows it.
        self.leader_id: Optional[int] = leader_id
        #: The leader's client address (``host:port``), if the node knows it.
        self.leader_addr: Optional[str] = leader_addr


class InvalidArgument(LockError):
    """The call was malformed: a blank or over-long key, owner, operator or reason, a TTL or
    wait outside its bounds, an unknown or ended session, a bad endpoint. A caller bug, never a
    lock outcome (C2 §2.8).

    **Not retry-safe:** the same call fails the same way. Fix the caller.
    """

    retry_safe: ClassVar[bool] = False


#: The ``required_role`` of a :class:`PermissionDenied` for a call that presented a session (or
#: a grant of one) another principal opened (Rust ``lock_api::SESSION_OWNER_ROLE``).
SESSION_OWNER_ROLE = "session-owner"


class PermissionDenied(LockError):
    """The server refused the call for this caller's identity (it is authenticated but not
    allowed to do this): its principal lacks the role the method requires, or it presented a
    session another principal opened (``required_role`` is then :data:`SESSION_OWNER_ROLE`).

    **Not retry-safe:** the same credentials are refused again. Fix the credentials or the
    server's policy. ``principal`` and ``required_role`` come from the server's
    ``ErrorDetail.permission_denied``; both are ``None`` when the refusal carried none (a proxy).
    """

    retry_safe: ClassVar[bool] = False

    def __init__(
        self,
        message: str,
        principal: Optional[str] = None,
        required_role: Optional[str] = None,
    ) -> None:
        super().__init__(message)
        self.args = (message, principal, required_role)
        #: The caller's principal, as the server named it.
        self.principal: Optional[str] = principal
        #: The role the call requires, as the server named it.
        self.required_role: Optional[str] = required_role


class Unauthenticated(LockError):
    """The server could not establish who the caller is (missing or rejected credentials).

    **Not retry-safe:** fix the client certificate or key (``LOCKD_CERT``, ``LOCKD_KEY``).
    """

    retry_safe: ClassVar[bool] = False


class NotAcquired(Exception):
    """Raised by :meth:`lockd.Session.lock` when ``max_wait`` passed while someone else held the
    lock. This is the normal outcome under contention, not a failure of lockd, which is why it
    is not a :class:`LockError`: "not mine, do not proceed". Do not retry in a tight loop.
    """

    def __init__(self, key: str, max_wait: float) -> None:
        super().__init__(f"{key!r} was held by someone else for the whole wait of {max_wait} s")
        #: The key that was not acquired.
        self.key: str = key
        #: How long the acquire waited, in seconds.
        self.max_wait: float = max_wait


def error_from_detail(detail: error_pb2.ErrorDetail) -> LockError:
    """The :class:`LockError` an ``ErrorDetail`` describes (as carried inside an answer, e.g. one
    session's outcome in ``HeartbeatBatch``). A detail without a kind this client knows (from a
    newer server) is :class:`Contention`: transient, never a loss."""
    kind = _kind_error(detail)
    if kind is None:
        return Contention("the server answered an error detail of an unknown kind")
    return kind


def _kind_error(detail: error_pb2.ErrorDetail) -> Optional[LockError]:
    kind = detail.WhichOneof("kind")
    if kind == "not_leader":
        hint = detail.not_leader
        leader_id = hint.leader_id if hint.HasField("leader_id") else None
        # An empty address names no leader; a client must not dial "".
        leader_addr = hint.leader_addr if hint.HasField("leader_addr") and hint.leader_addr else None
        return NotLeader(leader_id, leader_addr)
    if kind == "fenced_out":
        f = detail.fenced_out
        return FencedOut(f.key, f.presented, f.stored)
    if kind == "contention":
        return Contention(detail.contention.message)
    if kind == "invalid_argument":
        return InvalidArgument(detail.invalid_argument.message)
    if kind == "lock_lost":
        return LockLost(detail.lock_lost.key)
    if kind == "unauthenticated":
        return Unauthenticated(f"not authenticated: {detail.unauthenticated.message}")
    if kind == "permission_denied":
        d = detail.permission_denied
        if d.required_role == SESSION_OWNER_ROLE:
            text = (
                f"permission denied: principal {d.principal!r} did not open this session; "
                "only the principal that opened a session may use it"
            )
        else:
            text = (
                f"permission denied: principal {d.principal!r} does not have the role "
                f"{d.required_role!r} this call requires"
            )
        return PermissionDenied(text, d.principal, d.required_role)
    return None


def _decode_details(details: Optional[bytes]) -> Optional[LockError]:
    """The error of the first well-formed ``ErrorDetail`` of a known kind in an ``RpcStatus``'s
    bytes; ``None`` for no bytes, malformed bytes, or no such detail. Never raises."""
    if not details:
        return None
    envelope = error_pb2.RpcStatus()
    try:
        envelope.ParseFromString(details)
    except Exception:  # protobuf raises DecodeError, or RuntimeWarning-derived errors, on junk.
        return None
    for any_detail in envelope.details:
        if any_detail.type_url.rsplit("/", 1)[-1] != _ERROR_DETAIL_TYPE_NAME:
            continue
        detail = error_pb2.ErrorDetail()
        try:
            detail.ParseFromString(any_detail.value)
        except Exception:
            continue
        err = _kind_error(detail)
        if err is not None:
            return err
    return None


def _error_from_code(code: grpc.StatusCode, message: str) -> LockError:
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return InvalidArgument(message)
    # The same call fails the same way every time: a message over the server's size limit, or a
    # method the server does not know (a version mismatch). Retrying either forever would hang.
    if code in (grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.UNIMPLEMENTED):
        return InvalidArgument(f"gRPC {code.name}: {message}")
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return Unauthenticated(f"gRPC {code.name}: {message}")
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return PermissionDenied(f"gRPC {code.name}: {message}")
    # Transient, unknown-outcome or foreign: never a loss (docs/DESIGN.md D-errors).
    return Contention(f"gRPC {code.name}: {message}")


def error_from_status(
    code: grpc.StatusCode, message: str, details: Optional[bytes] = None
) -> LockError:
    """The :class:`LockError` a status with this code, message and ``grpc-status-details-bin``
    value describes.

    If ``details`` hold an ``ErrorDetail`` of a known kind, the error is rebuilt from it,
    whatever the code (the detail is lockd's verdict; the code only summarises it). Otherwise
    the code decides, as described in the module docstring. The message is carried along for
    logs, never parsed. Never raises, whatever bytes ``details`` hold.
    """
    decoded = _decode_details(details)
    if decoded is not None:
        return decoded
    return _error_from_code(code, message)


def _trailer(metadata: Optional[Sequence[Tuple[str, Any]]]) -> Optional[bytes]:
    for key, value in metadata or ():
        if key == _DETAILS_TRAILER:
            return value if isinstance(value, bytes) else None
    return None


def error_from_rpc_error(error: grpc.RpcError) -> LockError:
    """The :class:`LockError` a failed gRPC call (a ``grpc.RpcError`` raised by a stub, which is
    also a ``grpc.Call``) answered; see :func:`error_from_status`. An ``RpcError`` that carries
    no status at all is :class:`Contention`."""
    code_of = getattr(error, "code", None)
    if code_of is None:
        return Contention(f"gRPC call failed without a status: {error!r}")
    code = code_of()
    details_of = getattr(error, "details", None)
    message = (details_of() if details_of is not None else None) or ""
    trailing = getattr(error, "trailing_metadata", None)
    metadata = trailing() if trailing is not None else None
    return error_from_status(code, message, _trailer(metadata))
