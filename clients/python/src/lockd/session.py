"""``Session``: one server session, the unit that owns grants, and everything it knows about
them (the Python form of the Rust SDK's client/src/session/).

Owns the session's knowledge — whether it is open, until when it is alive, which grants it
holds until when, which it lost, who to tell — and the calls that change it: acquire,
try-acquire, renew, release, close. Every mutating call carries a request id from the
session's counter, and every retry of that call reuses it, so a lost answer followed by a retry
never creates a second grant (docs/DESIGN.md D-idempotency).

It never decides that a grant is lost because of a transient failure: only the server's answer
(a renewal without a grant, a heartbeat ``alive = false``) or a passed *local* deadline marks a
grant lost (docs/DESIGN.md D-errors, FR-11). Endpoint choice and retries are the router's; the
schedule of heartbeats and renewals is the client's keep-alive thread's.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Deque, Dict, Iterator, List, Optional, Set, Tuple

from lockd import _validate as validate
from lockd._deadline import check_margin, client_deadline, datetime_from_unix_ms, granted_ttl
from lockd._retry import Backoff
from lockd.errors import (
    Contention,
    InvalidArgument,
    LockError,
    LockLost,
    NotAcquired,
)
from lockd.handle import Handle
from lockd.v1 import lock_pb2

if TYPE_CHECKING:
    from lockd._keepalive import Callback
    from lockd._router import Router, Target
    from lockd.client import Client

__all__ = ["RENEW_FRACTION", "Session"]

_log = logging.getLogger("lockd")

#: Heartbeats and keep-alive renewals go every ``ttl / RENEW_FRACTION``: a third of the lease,
#: so two consecutive attempts can fail (or a failover can happen) before the lease runs out.
RENEW_FRACTION = 3

#: A session whose next heartbeat is due within ``interval / COALESCE_AHEAD_FRACTION`` goes out
#: with the sessions due now. Beating early is always safe (the server restarts the lease when
#: it answers), and it merges sessions opened at different instants into one batch.
COALESCE_AHEAD_FRACTION = 4

#: Shortest pause between an answered (or failed) heartbeat of a session and its next one, so a
#: node that refuses connections at once does not turn heartbeating into a busy loop.
HEARTBEAT_RETRY_PAUSE = 0.05

#: How many ended grants (lost, or released by the caller) a session remembers, so that
#: ``check_still_held`` on such a handle fails even before its own deadline. Bounded because a
#: long-lived session ends many grants; past this the oldest are forgotten and only their
#: (passed, or soon passing) deadlines speak for them.
ENDED_REMEMBERED_MAX = 1024

#: ``(key, fencing token)``: one grant. A token is unique across the cluster; the key makes the
#: pair readable.
GrantId = Tuple[str, int]

_OPEN, _CLOSED, _DEAD = "open", "closed", "dead"


def _grant_id(handle: Handle) -> GrantId:
    return (handle.key, handle.fencing_token)


@dataclass
class _Held:
    """One grant the session holds."""

    #: The latest handle of the grant (renewals replace it).
    handle: Handle
    #: When the next renewal is due: a third of the TTL after the request that produced
    #: ``handle`` was sent (stored on the answer, since the handle does not carry the send).
    renew_at: float
    #: ``Session.lock`` keeps this grant renewed.
    keep_alive: bool = False
    #: A keep-alive renewal of this grant is running.
    in_flight: bool = False
    backoff: Backoff = field(default_factory=Backoff)


class Session:
    """A lockd session: the unit that owns grants, kept alive by heartbeats from the client's
    keep-alive thread (C2 §2.6 ``openSession``). Obtained from :meth:`lockd.Client.session`;
    thread-safe.

    Every grant belongs to the session it was acquired on and ends with it. The session
    **dies** when the server answers a heartbeat with "not alive", or when no heartbeat is
    answered before the session's local deadline (``sent_at + ttl - margin`` of the last
    answered one); then every grant is lost and the ``on_lost`` callbacks fire. Use it as a
    context manager: leaving the block closes the session, releasing its locks.
    """

    def __init__(
        self, client: "Client", session_id: str, owner_id: str, ttl: float, sent_at: float
    ) -> None:
        """Internal: sessions are opened by :meth:`lockd.Client.session`."""
        self._client = client
        self._router: "Router" = client._router
        self._keepalive = client._keepalive
        self._session_id = session_id
        self._owner_id = owner_id
        self._ttl = ttl
        self._lock = threading.Lock()
        self._request_ids = itertools.count(1)
        self._life = _OPEN
        self._death_reason = ""
        self._dead_by_server = False
        self._close_sent = False
        self._deadline = client_deadline(sent_at, ttl)
        self._next_heartbeat = sent_at + ttl / RENEW_FRACTION
        self._heartbeat_not_before = 0.0
        self._heartbeat_in_flight = False
        self._held: Dict[GrantId, _Held] = {}
        self._lost: Set[GrantId] = set()
        self._ended: Set[GrantId] = set()
        self._ended_order: Deque[GrantId] = deque()
        self._callbacks: List["Callback"] = []

    # ---- identity ---------------------------------------------------------------------------

    @property
    def session_id(self) -> str:
        """The server-issued session id, which every grant of the session carries."""
        return self._session_id

    @property
    def owner_id(self) -> str:
        """The owner the session was opened for: every grant of the session is made to it."""
        return self._owner_id

    @property
    def ttl(self) -> float:
        """The session TTL the server granted, in seconds (at most what was asked)."""
        return self._ttl

    def is_alive(self) -> bool:
        """``True`` while the session is open and not known dead; ``False`` is final."""
        with self._lock:
            return self._life == _OPEN

    def __repr__(self) -> str:
        return f"Session(session_id={self._session_id!r}, owner_id={self._owner_id!r}, ttl={self._ttl})"

    # ---- callbacks -------------------------------------------------------------------------

    def on_lost(self, callback: Callable[[Optional[Handle], str], None]) -> None:
        """Registers ``callback(handle, reason)``, called once for every grant of this session
        that is lost from now on — its local deadline passed, a renewal found it gone,
        keep-alive was refused, a confirmed check found it gone, or the session died — with the
        grant's latest handle; and once with ``handle=None`` when the whole session is lost
        (after the calls for its grants). ``reason`` says why, for logs.

        Callbacks run on the client's keep-alive thread, one after another; one that raises is
        logged and does not stop the others. A callback must return quickly — signal the work
        to stop (set a ``threading.Event``) rather than do the stopping — because while it runs
        no heartbeat of this client is scheduled. A release or close by the caller never fires
        it. There is no way to unregister."""
        if not callable(callback):
            raise InvalidArgument("on_lost needs a callable (handle, reason)")
        with self._lock:
            self._callbacks.append(callback)

    # ---- acquire ---------------------------------------------------------------------------

    def acquire(self, key: str, ttl: float, max_wait: float) -> Optional[Handle]:
        """Acquires ``key`` for the session's owner with a lease of ``ttl`` seconds, waiting up
        to ``max_wait`` seconds on the server for a conflicting holder to go away (C2 §2.2).

        Returns the :class:`Handle` if granted; present its ``fencing_token`` with every
        protected write. Returns ``None`` if ``max_wait`` passed while someone else held the
        key: **not an error, and not to be retried in a tight loop** ("not mine, do not
        proceed"). The waiter joins the key's FIFO queue, so a release hands the key over in
        one commit.

        Raises :class:`lockd.Contention` or :class:`lockd.NotLeader` if the cluster could not
        decide within ``max_wait`` plus the client's ``timeout`` (retry later; the server-side
        wait is cancelled in the background), :class:`lockd.InvalidArgument` for a blank or
        over-long key, a ``ttl`` outside 1..3600 s, a ``max_wait`` outside 0..300 s, or a
        session that ended. Retries of transient failures carry one request id, so they never
        create a second grant. The handle's deadline counts from before the first send, minus
        the safety margin; after a long wait the client renews once, so the handle is not handed
        out nearly expired."""
        return self._acquire(key, ttl, max_wait)

    def try_acquire(self, key: str, ttl: float) -> Optional[Handle]:
        """One attempt at ``key`` for the session's owner, without waiting (C2 ``tryAcquire``).

        Returns the :class:`Handle` if granted, ``None`` if anyone else holds the key now (the
        normal outcome under contention, not an error). The client still finds the leader and
        retries transport failures under the same request id. Raises as :meth:`acquire`."""
        return self._acquire(key, ttl, None)

    def _acquire(self, key: str, ttl: float, max_wait: Optional[float]) -> Optional[Handle]:
        key = validate.key(key)
        ttl_ms = validate.ttl_ms(ttl)
        max_wait_ms = None if max_wait is None else validate.max_wait_ms(max_wait)
        lease = float(ttl)
        check_margin(lease)
        self._check_open()
        request_id = self._next_request_id()
        wait = 0.0 if max_wait_ms is None else max_wait_ms / 1000.0
        sent_at = time.monotonic()
        wait_until = sent_at + wait
        first_attempt = [True]

        def attempt(target: "Target", timeout: float) -> lock_pb2.AcquireResponse:
            if max_wait_ms is None:
                single = lock_pb2.TryAcquireRequest(
                    session_id=self._session_id, request_id=request_id, key=key, ttl_ms=ttl_ms
                )
                return target.lock.TryAcquire(single, timeout=timeout)
            # A retry waits only for what is left of max_wait, so the whole call stays within
            # max_wait plus the retry budget.
            wait_ms = max_wait_ms
            if not first_attempt[0]:
                left_ms = int(max(0.0, wait_until - time.monotonic()) * 1000)
                wait_ms = min(max_wait_ms, left_ms)
            first_attempt[0] = False
            request = lock_pb2.AcquireRequest(
                session_id=self._session_id,
                request_id=request_id,
                key=key,
                ttl_ms=ttl_ms,
                max_wait_ms=wait_ms,
            )
            return target.lock.Acquire(request, timeout=timeout)

        # Until the answer is in hand, giving up (an error of unknown outcome, an interrupt)
        # leaves a waiter, or even a grant, on the server: cancel it then (C2 §2.8).
        armed = True
        token: Optional[int] = None
        try:
            answer = self._router.call(
                "acquire",
                attempt,
                deadline=sent_at + wait + self._router.call_timeout,
                attempt_timeout=wait + self._router.attempt_timeout,
            )
            if not answer.HasField("grant"):
                armed = False
                return None
            token = answer.grant.fencing_token
            handle = self._handle_from_grant(answer.grant, lease, sent_at)
            handle_sent_at = sent_at
            # A long wait may have eaten most of the lease as this process counts it (the
            # deadline counts from the send, the lease from the grant): renew now, re-basing it
            # on an instant after the grant, rather than hand out a nearly expired handle.
            now = time.monotonic()
            if handle.deadline - now < handle.ttl / 2:
                renewed = self._renew_rpc(handle, now + self._router.call_timeout)
                if renewed is None:
                    armed = False
                    raise Contention(
                        f"the grant of {key!r} lapsed before it reached the caller; retry the acquire"
                    )
                handle, handle_sent_at = renewed
            self._track(handle, handle_sent_at)
            armed = False
            return handle
        except LockError as err:
            if not err.retry_safe:
                armed = False  # The server decided the request: nothing was left behind.
            raise
        finally:
            if armed:
                self._cancel_later(key, request_id, token)

    def _cancel_later(self, key: str, request_id: int, token: Optional[int]) -> None:
        """Withdraws an abandoned acquire's waiter and releases a grant it may have left, in the
        background, best effort, within one call budget."""
        if token is not None:
            self._forget((key, token))

        def cancel() -> None:
            request = lock_pb2.CancelAcquireRequest(
                session_id=self._session_id, request_id=request_id, key=key
            )
            try:
                self._router.call(
                    "cancel acquire",
                    lambda target, timeout: target.lock.CancelAcquire(request, timeout=timeout),
                    deadline=time.monotonic() + self._router.call_timeout,
                )
            except LockError as err:
                _log.warning("could not cancel an abandoned acquire of %r: %s", key, err)
            if token is not None:
                try:
                    self._release_rpc(key, token)
                except LockError as err:
                    _log.warning("could not release the abandoned grant of %r: %s", key, err)

        self._keepalive.spawn("cancel-acquire", cancel)

    # ---- lock() ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def lock(self, key: str, ttl: float, max_wait: float) -> Iterator[Handle]:
        """Acquires ``key`` as :meth:`acquire` does, keeps the grant renewed (every third of
        ``ttl``) while the ``with`` block runs, and releases it when the block exits, however it
        exits. Yields the :class:`Handle`.

        Raises :class:`lockd.NotAcquired` (not a :class:`lockd.LockError`) if ``max_wait``
        passed while someone else held the key, and whatever :meth:`acquire` raises.

        The block is **not** interrupted if the grant is lost (renewals failed past the deadline,
        a revoke, the session died): call ``handle.check_still_held()`` before each protected
        side effect, and present ``handle.fencing_token`` to the resource. A failed release at
        exit is logged, not raised: the grant then ends with its lease."""
        handle = self.acquire(key, ttl, max_wait)
        if handle is None:
            raise NotAcquired(key, float(max_wait))
        try:
            self._start_keep_alive(handle)
            yield handle
        finally:
            try:
                self.release(handle)
            except LockError as err:
                _log.warning(
                    "could not release %r (token %d) at the end of its block: %s",
                    handle.key,
                    handle.fencing_token,
                    err,
                )

    def _start_keep_alive(self, handle: Handle) -> None:
        self._check_own(handle)
        gid = _grant_id(handle)
        with self._lock:
            if gid in self._lost:
                raise LockLost(handle.key)
            self._check_open_locked()
            held = self._held.get(gid)
            if held is None:
                # Untracked: its send instant is unknown, and renewing early is always safe.
                held = _Held(handle=handle, renew_at=time.monotonic())
                self._held[gid] = held
            held.keep_alive = True
        self._keepalive.wake()

    def _keep_alive_renew(self, gid: GrantId) -> None:
        """One keep-alive renewal of ``gid`` (on a worker thread). Transient failures are
        retried with backoff at the next due instant; the watchdog reports the loss if they last
        past the deadline."""
        with self._lock:
            held = self._held.get(gid)
            if held is None:
                return
            handle = held.handle
        failed_with: Optional[LockError] = None
        try:
            if self.renew(handle) is None:
                return  # Lost, and reported by renew.
        except LockLost:
            return
        except InvalidArgument as err:
            self._mark_lost(handle, f"keep-alive renewal refused: {err}")
            return
        except LockError as err:
            failed_with = err
        finally:
            now = time.monotonic()
            with self._lock:
                held = self._held.get(gid)
                if held is not None:
                    held.in_flight = False
                    if failed_with is not None:
                        held.renew_at = now + held.backoff.next_delay()
                    else:
                        held.backoff.reset()
                        if held.renew_at <= now:
                            # The state kept a later handle it never renewed by a send it
                            # knows: retry after a pause rather than in a busy loop.
                            held.renew_at = now + held.backoff.next_delay()
        if failed_with is not None:
            _log.debug("keep-alive renewal of %r failed, retrying: %s", gid[0], failed_with)

    # ---- renew, release, check -------------------------------------------------------------

    def renew(self, handle: Handle) -> Optional[Handle]:
        """Extends ``handle``'s lease by its TTL, keeping its fencing token.

        Returns the new :class:`Handle` (use it from now on; the session also counts it for
        ``check_still_held`` of older handles of the same grant). Returns ``None`` when **the
        lock is lost now** — expired, revoked or taken over: abandon the critical section and do
        not retry; the ``on_lost`` callbacks fire. Raises :class:`lockd.LockLost` without a
        round trip for a handle already known lost or past its deadline; transient failures are
        retried only until that deadline, then raise :class:`lockd.Contention` or
        :class:`lockd.NotLeader` (never ``None``: a failure to reach the cluster is not a
        loss). :class:`lockd.InvalidArgument` for a handle of another session."""
        deadline = self._deadline_ahead(handle)
        retry_until = min(deadline, time.monotonic() + self._router.call_timeout)
        renewed = self._renew_rpc(handle, retry_until)
        if renewed is None:
            self._mark_lost(handle, "a renewal found the grant gone (expired, revoked or taken over)")
            return None
        self._track(*renewed)
        return renewed[0]

    def _renew_rpc(self, handle: Handle, retry_until: float) -> Optional[Tuple[Handle, float]]:
        """One Renew call (with retries under one request id), no bookkeeping. ``None`` if the
        server says the grant is gone; otherwise the new handle and its send instant."""
        ttl_ms = validate.ttl_ms(handle.ttl)
        request = lock_pb2.RenewRequest(
            session_id=self._session_id,
            request_id=self._next_request_id(),
            key=handle.key,
            fencing_token=handle.fencing_token,
            ttl_ms=ttl_ms,
        )
        sent_at = time.monotonic()
        try:
            answer = self._router.call(
                "renew",
                lambda target, timeout: target.lock.Renew(request, timeout=timeout),
                deadline=retry_until,
            )
        except LockLost:
            return None  # The server's verdict that the grant is gone: the same as no grant.
        if not answer.HasField("grant"):
            return None
        grant = answer.grant
        if grant.fencing_token != handle.fencing_token or grant.key != handle.key:
            raise Contention(
                f"renew of {handle.key!r} token {handle.fencing_token} was answered for "
                f"{grant.key!r} token {grant.fencing_token}; not trusting it"
            )
        return self._handle_from_grant(grant, handle.ttl, sent_at), sent_at

    def release(self, handle: Handle) -> bool:
        """Releases ``handle``'s grant (compare-and-delete on key and fencing token) and stops
        keeping it alive; no callback fires.

        Returns ``True`` if this grant was the one removed, ``False`` if it had already expired
        or been revoked (informational, not an error). Retries carry one request id. Raises
        :class:`lockd.Contention` or :class:`lockd.NotLeader` if the cluster could not be reached
        (the grant then ends with its lease), :class:`lockd.InvalidArgument` for a handle of
        another session."""
        self._check_own(handle)
        validate.key(handle.key)
        validate.fencing_token(handle.fencing_token)
        self._forget(_grant_id(handle))
        return self._release_rpc(handle.key, handle.fencing_token)

    def _release_rpc(self, key: str, token: int) -> bool:
        request = lock_pb2.ReleaseRequest(
            session_id=self._session_id,
            request_id=self._next_request_id(),
            key=key,
            fencing_token=token,
        )
        answer = self._router.call(
            "release",
            lambda target, timeout: target.lock.Release(request, timeout=timeout),
            deadline=time.monotonic() + self._router.call_timeout,
        )
        return bool(answer.released)

    def latest(self, handle: Handle) -> Handle:
        """The newest handle of ``handle``'s grant (after renewals, keep-alive included), if
        the local check still holds it; raises :class:`lockd.LockLost` otherwise."""
        self._deadline_ahead(handle)
        with self._lock:
            held = self._held.get(_grant_id(handle))
            return held.handle if held is not None else handle

    def _check_still_held(self, handle: Handle, confirm: bool) -> None:
        """See :meth:`Handle.check_still_held`."""
        self._deadline_ahead(handle)
        if not confirm:
            return
        info = self._client.inspect(handle.key, leader_confirmed=True)
        # Tokens are unique across the cluster, so the token alone names this grant.
        if info is None or info.fencing_token != handle.fencing_token:
            self._mark_lost(handle, "the leader shows the grant gone")
            raise LockLost(handle.key)

    def _deadline_ahead(self, handle: Handle) -> float:
        """The instant until which ``handle``'s grant is held as far as this process knows: its
        latest tracked deadline, capped by the session's. Raises :class:`lockd.LockLost` if it
        passed (marking the grant lost), if the grant is known lost or was released, or if the
        session is dead or closed."""
        self._check_own(handle)
        gid = _grant_id(handle)
        with self._lock:
            if gid in self._lost or gid in self._ended or self._life != _OPEN:
                raise LockLost(handle.key)
            held = self._held.get(gid)
            own = max(held.handle.deadline if held is not None else handle.deadline, handle.deadline)
            deadline = min(own, self._deadline)
        if time.monotonic() >= deadline:
            self._mark_lost(handle, "its local deadline passed")
            raise LockLost(handle.key)
        return deadline

    # ---- close -----------------------------------------------------------------------------

    def close(self) -> int:
        """Closes the session: stops keeping it and its grants alive and asks the server to
        close it, which releases every lock of the session. Returns how many grants the server
        released (0 if the session was already gone). No callback fires: the caller gave the
        locks up. Closing again does nothing and returns 0.

        Raises :class:`lockd.Contention` or :class:`lockd.NotLeader` if the close may not have
        arrived; the session then ends with its TTL."""
        with self._lock:
            if self._close_sent:
                return 0
            self._close_sent = True
            if self._life == _OPEN:
                self._life = _CLOSED
            by_server = self._life == _DEAD and self._dead_by_server
            for gid in list(self._held):
                self._remember_ended_locked(gid)
            self._held.clear()
        self._keepalive.deregister(self)
        if by_server:
            return 0  # The server said it is gone: it holds nothing of the session any more.
        return self._client._close_session(self._session_id)

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            self.close()
        except LockError as err:
            _log.warning("could not close session %s (it ends with its TTL): %s", self._session_id, err)

    # ---- what the keep-alive thread calls ----------------------------------------------------

    def _plan(self, now: float) -> Optional[Tuple[bool, List[GrantId], float]]:
        """What is due at ``now``: whether to heartbeat, which renewals to start (both marked in
        flight), and when to look again. ``None`` once the session ended. Reports passed
        deadlines itself."""
        due: List[Handle] = []
        renewals: List[GrantId] = []
        with self._lock:
            if self._life != _OPEN:
                return None
            if self._deadline <= now:
                session_passed = True
            else:
                session_passed = False
                next_at = self._deadline
                for gid, held in self._held.items():
                    if held.handle.deadline <= now:
                        due.append(held.handle)
                        continue
                    next_at = min(next_at, held.handle.deadline)
                    if held.keep_alive and not held.in_flight:
                        if held.renew_at <= now:
                            held.in_flight = True
                            renewals.append(gid)
                        else:
                            next_at = min(next_at, held.renew_at)
                beat = False
                if not self._heartbeat_in_flight:
                    ahead = self._ttl / RENEW_FRACTION / COALESCE_AHEAD_FRACTION
                    if self._next_heartbeat <= now + ahead and self._heartbeat_not_before <= now:
                        beat = True
                        self._heartbeat_in_flight = True
                    else:
                        next_at = min(next_at, max(self._next_heartbeat, self._heartbeat_not_before))
        if session_passed:
            self._die("no heartbeat was answered before the session's local deadline", False)
            return None
        for handle in due:
            self._mark_lost(handle, "its local deadline passed")
        return beat, renewals, next_at

    def _heartbeat_deadline(self) -> Optional[float]:
        """The session's local deadline while it is open (a heartbeat must be answered before
        it); ``None`` once it ended."""
        with self._lock:
            return self._deadline if self._life == _OPEN else None

    def _on_heartbeat(
        self, sent_at: float, alive_ttl: Optional[float], error: Optional[LockError]
    ) -> None:
        """Applies the answer to a heartbeat sent at ``sent_at``: ``alive_ttl`` seconds (0: the
        TTL asked) moves the local deadline to ``sent_at + ttl - margin``; ``alive_ttl=None``
        without an error (the server says the session is gone), ``InvalidArgument`` and
        ``LockLost`` kill the session; any other error is transient and retried after a short
        pause, up to the local deadline. A late answer after the session ended changes
        nothing."""
        now = time.monotonic()
        if error is None and alive_ttl is not None:
            ttl = self._ttl if alive_ttl <= 0 else min(alive_ttl, self._ttl)
            with self._lock:
                self._heartbeat_in_flight = False
                if self._life != _OPEN:
                    return
                self._deadline = max(self._deadline, client_deadline(sent_at, ttl))
                self._next_heartbeat = sent_at + self._ttl / RENEW_FRACTION
                self._heartbeat_not_before = now + HEARTBEAT_RETRY_PAUSE
        elif error is None:
            self._die("the server reports the session dead", True)
        elif isinstance(error, (InvalidArgument, LockLost)):
            self._die(f"the server refused the heartbeat: {error}", True)
        else:
            _log.debug("heartbeat of session %s failed, retrying: %s", self._session_id, error)
            with self._lock:
                self._heartbeat_in_flight = False
                self._next_heartbeat = now + HEARTBEAT_RETRY_PAUSE
                self._heartbeat_not_before = now + HEARTBEAT_RETRY_PAUSE
        self._keepalive.wake()

    # ---- bookkeeping -----------------------------------------------------------------------

    def _next_request_id(self) -> int:
        with self._lock:
            return next(self._request_ids)

    def _check_open_locked(self) -> None:
        if self._life == _CLOSED:
            raise InvalidArgument(f"session {self._session_id} is closed; open a new session")
        if self._life == _DEAD:
            raise InvalidArgument(
                f"session {self._session_id} is dead ({self._death_reason}); its locks are gone "
                "— open a new session"
            )

    def _check_open(self) -> None:
        with self._lock:
            self._check_open_locked()

    def _check_own(self, handle: Handle) -> None:
        if not isinstance(handle, Handle):
            raise InvalidArgument(f"expected a lockd.Handle, got {type(handle).__name__}")
        if handle.session_id != self._session_id:
            raise InvalidArgument(
                f"the handle of {handle.key!r} belongs to session {handle.session_id}, not to "
                f"this session {self._session_id}"
            )

    def _handle_from_grant(self, grant: lock_pb2.Grant, asked: float, sent_at: float) -> Handle:
        ttl = granted_ttl(grant.ttl_ms, asked)
        return Handle(
            key=grant.key,
            owner_id=grant.owner_id,
            session_id=grant.session_id,
            fencing_token=grant.fencing_token,
            deadline=client_deadline(sent_at, ttl),
            server_expiry=datetime_from_unix_ms(grant.server_expiry_unix_ms),
            ttl=ttl,
            _session=self,
        )

    def _track(self, handle: Handle, sent_at: float) -> None:
        """Records (or refreshes) a held grant from the answer to a request sent at
        ``sent_at``. A grant known lost or released stays so, an ended session tracks nothing,
        and an older answer (an earlier deadline) is ignored: a late answer never revives."""
        gid = _grant_id(handle)
        with self._lock:
            if gid in self._lost or gid in self._ended or self._life != _OPEN:
                return
            renew_at = sent_at + handle.ttl / RENEW_FRACTION
            held = self._held.get(gid)
            if held is None:
                self._held[gid] = _Held(handle=handle, renew_at=renew_at)
            elif handle.deadline > held.handle.deadline:
                held.handle = handle
                held.renew_at = renew_at
            else:
                return
        self._keepalive.wake()

    def _remember_ended_locked(self, gid: GrantId) -> None:
        if gid not in self._ended:
            self._ended.add(gid)
            self._ended_order.append(gid)
            if len(self._ended_order) > ENDED_REMEMBERED_MAX:
                oldest = self._ended_order.popleft()
                self._ended.discard(oldest)
                self._lost.discard(oldest)

    def _forget(self, gid: GrantId) -> None:
        """Forgets a grant the caller gave up (released, or an abandoned acquire's): no
        callback fires, and ``check_still_held`` fails for it from now on."""
        with self._lock:
            self._held.pop(gid, None)
            self._remember_ended_locked(gid)

    def _mark_lost(self, handle: Handle, reason: str) -> None:
        """Marks ``handle``'s grant lost and queues the callbacks with its latest handle. A grant
        is reported lost at most once; one the caller released is not reported."""
        gid = _grant_id(handle)
        with self._lock:
            if gid in self._lost or gid in self._ended:
                return
            held = self._held.pop(gid, None)
            self._lost.add(gid)
            self._remember_ended_locked(gid)
            latest = held.handle if held is not None else handle
            callbacks = list(self._callbacks)
        _log.warning(
            "lock lost: key=%r token=%d session=%s: %s",
            latest.key,
            latest.fencing_token,
            self._session_id,
            reason,
        )
        self._keepalive.fire(callbacks, latest, reason)

    def _die(self, reason: str, by_server: bool) -> None:
        """Ends the open session as dead: every held grant is lost (callbacks fire for each,
        then once with ``None``), and it leaves the schedule. ``by_server``: the server said
        so, and holds nothing of the session any more."""
        with self._lock:
            if self._life != _OPEN:
                return
            self._life = _DEAD
            self._death_reason = reason
            self._dead_by_server = by_server
            handles = [held.handle for held in self._held.values()]
            self._held.clear()
            for handle in handles:
                gid = _grant_id(handle)
                self._lost.add(gid)
                self._remember_ended_locked(gid)
            callbacks = list(self._callbacks)
        _log.warning("session %s dead (%d grant(s) lost): %s", self._session_id, len(handles), reason)
        self._keepalive.deregister(self)
        for handle in handles:
            self._keepalive.fire(callbacks, handle, reason)
        self._keepalive.fire(callbacks, None, reason)
