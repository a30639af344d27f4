"""``Client``: the entry point. Connects to a cluster, opens sessions, and makes the calls that
need no session (inspect, force-revoke).

Owns the router (endpoints, believed leader, retries) and the keep-alive thread its sessions
share, and the proto-to-Python conversions of its own calls. It holds no per-session state;
that is :class:`lockd.Session`'s.
"""

from __future__ import annotations

import logging
import random
import threading
import time
import weakref
from typing import List, Optional, Sequence, Union

from lockd import _validate as validate
from lockd._deadline import check_margin, granted_ttl
from lockd._endpoints import parse_endpoints, tls_config
from lockd._keepalive import KeepAlive
from lockd._router import Router
from lockd.errors import Contention, InvalidArgument, LockError
from lockd.info import LockInfo, LockOutcome
from lockd.session import Session
from lockd.v1 import lock_pb2, session_pb2

__all__ = ["Client", "TIMEOUT_DEFAULT"]

_log = logging.getLogger("lockd")

#: Default budget of one call, retries included, in seconds: outlasts a leader failover (a few
#: election timeouts) with room to spare; past it a call raises ``Contention``/``NotLeader``.
TIMEOUT_DEFAULT = 10.0

#: Longest call budget accepted, in seconds: far beyond any sane budget.
TIMEOUT_MAX = 3600.0


class Client:
    """A handle on a lockd cluster; thread-safe, meant to live as long as the process.

    ``endpoints`` are some of the cluster's nodes — ``host:port``, ``http://host:port`` or
    ``https://host:port`` — as a list or one comma-separated string; ``None`` reads
    ``LOCKD_ENDPOINTS``. Followers are fine: the client finds the leader itself. TLS is used
    with ``https://`` endpoints or when ``ca`` (PEM file of the CA to trust), ``cert`` and
    ``key`` (PEM files of a client certificate, for mutual TLS) are given; each defaults to
    ``LOCKD_CA`` / ``LOCKD_CERT`` / ``LOCKD_KEY`` when set.

    ``timeout`` (seconds) is the budget of each call, retries included. Within it the client
    follows ``NotLeader`` hints, moves to another endpoint when one is down and retries with
    jittered exponential backoff; a failure reaches the caller only once it is spent, and then
    as :class:`lockd.Contention` or :class:`lockd.NotLeader` — never as :class:`lockd.LockLost`.

    Constructing it asks every endpoint for its status to find the leader, retrying within
    ``timeout``. Raises :class:`lockd.InvalidArgument` for a malformed endpoint list, timeout or
    TLS file, :class:`lockd.Contention` naming each endpoint's failure if none answered. A
    cluster that answers but has no leader yet is not an error. Close it with :meth:`close` or
    use it as a context manager.
    """

    def __init__(
        self,
        endpoints: Union[Sequence[str], str, None] = None,
        *,
        ca: Optional[str] = None,
        cert: Optional[str] = None,
        key: Optional[str] = None,
        timeout: float = TIMEOUT_DEFAULT,
    ) -> None:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not (
            0 < timeout <= TIMEOUT_MAX
        ):
            raise InvalidArgument(f"timeout must be a number of seconds in (0, {TIMEOUT_MAX:g}]")
        parsed = parse_endpoints(endpoints)
        tls = tls_config(parsed, ca, cert, key)
        self._router = Router(parsed, tls, float(timeout))
        self._keepalive = KeepAlive(self._router)
        self._sessions: "weakref.WeakSet[Session]" = weakref.WeakSet()
        self._lock = threading.Lock()
        # Force-revokes have no session: a random start, then a counter, so two clients are
        # unlikely to share an id and a retry reuses its own.
        self._revoke_ids = random.getrandbits(62) + 1
        self._closed = False
        try:
            self._router.discover(time.monotonic() + float(timeout))
        except BaseException:
            self._router.close()
            raise

    @property
    def endpoints(self) -> List[str]:
        """Every endpoint known (``host:port``): the ones given, then leaders learnt from
        hints."""
        return self._router.endpoints()

    @property
    def believed_leader(self) -> str:
        """The endpoint the next call goes to: the node believed to lead. A belief, not a fact."""
        return self._router.current_endpoint()

    def session(self, owner_id: str, ttl: float = 10.0) -> Session:
        """Opens a session for ``owner_id`` with a TTL of ``ttl`` seconds and keeps it alive from
        the client's keep-alive thread (heartbeats every third of the TTL, batched with the
        client's other sessions). Every lock is acquired on a session and dies with it.

        Returns the :class:`lockd.Session`; use it as a context manager to close it (releasing
        its locks) at the end. Raises :class:`lockd.InvalidArgument` for a blank or over-long
        owner or a ``ttl`` outside 1..3600 s, :class:`lockd.Contention` or
        :class:`lockd.NotLeader` if the cluster could not be reached within the timeout. A
        retry after a lost answer may leave an unused session on the server; it holds nothing
        and ends with its TTL."""
        self._check_open()
        owner_id = validate.owner_id(owner_id)
        ttl_ms = validate.ttl_ms(ttl, "session ttl")
        asked = float(ttl)
        check_margin(asked)
        request = session_pb2.OpenSessionRequest(owner_id=owner_id, ttl_ms=ttl_ms)
        sent_at = time.monotonic()
        answer = self._router.call(
            "open session",
            lambda target, timeout: target.session.OpenSession(request, timeout=timeout),
            deadline=sent_at + self._router.call_timeout,
        )
        try:
            session_id = validate.session_id(answer.session_id)
        except InvalidArgument as err:
            raise Contention(f"the server answered an unusable session id: {err}") from err
        granted = granted_ttl(answer.ttl_ms, asked)
        try:
            validate.ttl_ms(granted)
            check_margin(granted)
        except InvalidArgument as err:
            raise Contention(
                f"the server granted a session TTL of {answer.ttl_ms} ms, outside the limits"
            ) from err
        session = Session(self, session_id, owner_id, granted, sent_at)
        with self._lock:
            self._sessions.add(session)
        self._keepalive.register(session)
        return session

    def inspect(self, key: str, leader_confirmed: bool = False) -> Optional[LockInfo]:
        """A diagnostic snapshot of ``key``: its current grant as a :class:`lockd.LockInfo`,
        or ``None`` if the key was unheld at the instant of the read. **Never usable for a
        correctness decision** (FR-07): it is stale the moment it returns.

        With ``leader_confirmed=False`` any node may answer from state that may lag; with
        ``True`` only the leader answers, after confirming its leadership with a quorum, so the
        answer reflects every acknowledged write. Raises :class:`lockd.InvalidArgument` for a
        bad key, :class:`lockd.Contention` or :class:`lockd.NotLeader` if no node answered in
        time."""
        self._check_open()
        key = validate.key(key)
        request = lock_pb2.InspectRequest(key=key, leader_confirmed=bool(leader_confirmed))
        answer = self._router.call(
            "inspect",
            lambda target, timeout: target.lock.Inspect(request, timeout=timeout),
            deadline=time.monotonic() + self._router.call_timeout,
        )
        if not answer.HasField("info"):
            return None
        return LockInfo._from_proto(answer.info)

    def force_revoke(self, key: str, operator: str, reason: str) -> LockOutcome:
        """Break-glass: deletes the current grant of ``key`` whoever holds it, and advances the
        fencing-token counter past it, so the displaced holder is fenced out at every resource
        (FR-08, INV-04). Audited with ``operator`` and ``reason`` (both non-blank); on a node
        that authenticates its callers ``operator`` must be the caller's own principal (else
        :class:`lockd.PermissionDenied`), and :meth:`force_revoke_as_caller` leaves it to the
        node.

        Returns the :class:`lockd.LockOutcome` (``revoked=False`` if the key was unheld).
        Retries carry one request id, so a lost answer followed by a retry revokes at most once.
        Raises :class:`lockd.InvalidArgument` for a blank key, operator or reason,
        :class:`lockd.Contention` or :class:`lockd.NotLeader` if the cluster was not reached."""
        self._check_open()
        return self._revoke(validate.key(key), validate.operator(operator), validate.reason(reason))

    def force_revoke_as_caller(self, key: str, reason: str) -> LockOutcome:
        """:meth:`force_revoke` recorded under the caller's authenticated principal (its client
        certificate's or its token's), which the node fills in: the request leaves ``operator``
        blank. A node that authenticates nobody (``--insecure``) refuses it with
        :class:`lockd.InvalidArgument`, having no name to record."""
        self._check_open()
        return self._revoke(validate.key(key), "", validate.reason(reason))

    def _revoke(self, key: str, operator: str, reason: str) -> LockOutcome:
        """The ``ForceRevoke`` call of both revokes, on arguments already checked."""
        with self._lock:
            request_id = self._revoke_ids
            self._revoke_ids += 1
        request = lock_pb2.ForceRevokeRequest(
            key=key, operator=operator, reason=reason, request_id=request_id
        )
        answer = self._router.call(
            "force revoke",
            lambda target, timeout: target.lock.ForceRevoke(request, timeout=timeout),
            deadline=time.monotonic() + self._router.call_timeout,
        )
        if not answer.HasField("outcome"):
            raise Contention("the server answered a force-revoke without an outcome")
        return LockOutcome._from_proto(answer.outcome)

    def _close_session(self, session_id: str) -> int:
        """Closes session ``session_id`` on the server; how many grants that released."""
        request = session_pb2.CloseSessionRequest(session_id=session_id)
        answer = self._router.call(
            "close session",
            lambda target, timeout: target.session.CloseSession(request, timeout=timeout),
            deadline=time.monotonic() + self._router.call_timeout,
        )
        return int(answer.locks_released)

    def _check_open(self) -> None:
        if self._closed:
            raise InvalidArgument("the client is closed")

    def close(self) -> None:
        """Closes every session still open (releasing its locks, best effort: a failure is
        logged and the session then ends with its TTL), stops the keep-alive thread and closes
        the connections. Calls after this raise :class:`lockd.InvalidArgument`. Closing twice
        does nothing."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            sessions = list(self._sessions)
        for session in sessions:
            try:
                session.close()
            except LockError as err:
                _log.warning("could not close session %s: %s", session.session_id, err)
        self._keepalive.stop()
        self._router.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client(endpoints={self.endpoints!r})"
