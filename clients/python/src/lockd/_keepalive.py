"""The keep-alive thread of one client: heartbeats of every session (batched), renewals of the
grants ``Session.lock`` keeps alive, the deadline watchdog, and the ``on_lost`` callbacks.

Owns *when* things happen (the Rust SDK splits the same work between client/src/heartbeat.rs
and client/src/session/keepalive.rs). One daemon thread per client, started with its first
session, sleeps until the earliest instant any session needs (a heartbeat due, a renewal due, a
deadline passing) and then:

- marks lost every grant whose local deadline passed, and kills a session whose own deadline
  passed (no heartbeat answered in time);
- sends the heartbeats due, coalesced: every session due within a quarter of its interval goes
  out with the ones due now, in ``HeartbeatBatch`` calls of at most
  :data:`HEARTBEAT_BATCH_SESSIONS_MAX` ids, or as one unary ``Heartbeat`` when one is due;
- starts the renewals due.

The RPCs themselves run on short-lived daemon worker threads, so a call retrying through a
failover never delays another session's heartbeat. *What* an answer changes is the session's
(``Session._on_heartbeat`` and friends); this module only routes answers there. The callbacks
run on this thread, one after another, in the order the losses were noticed; a callback that
blocks delays every heartbeat of the client, so callbacks must return quickly.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from typing import TYPE_CHECKING, Callable, List, Optional, Sequence, Tuple

import grpc

from lockd.errors import Contention, InvalidArgument, LockError, error_from_detail
from lockd.v1 import session_pb2

if TYPE_CHECKING:
    from lockd._router import Router, Target
    from lockd.handle import Handle
    from lockd.session import Session

_log = logging.getLogger("lockd")

#: Most session ids in one ``HeartbeatBatch`` call: the server's limit (Rust
#: ``lock_proto::session::HEARTBEAT_BATCH_SESSIONS_MAX``); more are split into several calls.
HEARTBEAT_BATCH_SESSIONS_MAX = 1024

#: Longest the thread sleeps with nothing scheduled, in seconds; it is woken early whenever the
#: schedule changes, so this only bounds the cost of a missed wake-up.
IDLE_WAKE = 1.0

#: A callback: ``(handle, reason)``, ``handle`` ``None`` for the death of the whole session.
Callback = Callable[[Optional["Handle"], str], None]


class _Unimplemented:
    """The server answered ``UNIMPLEMENTED`` to ``HeartbeatBatch`` (a server older than it)."""


class KeepAlive:
    """The keep-alive thread of one client and its schedule (see the module docstring)."""

    def __init__(self, router: "Router") -> None:
        self._router = router
        self._cond = threading.Condition()
        self._sessions: "weakref.WeakSet[Session]" = weakref.WeakSet()
        self._callbacks: List[Tuple[Sequence[Callback], Optional["Handle"], str]] = []
        self._woken = False
        self._stopped = False
        self._thread: Optional[threading.Thread] = None
        #: The server does not know ``HeartbeatBatch``: unary heartbeats from now on.
        self._batch_unsupported = False

    # ---- what sessions call ----------------------------------------------------------------

    def register(self, session: "Session") -> None:
        """Puts ``session`` on the schedule (weakly: a session dropped without ``close`` stops
        being heartbeated and ends with its TTL) and starts the thread if needed."""
        with self._cond:
            if self._stopped:
                raise InvalidArgument("the client is closed")
            self._sessions.add(session)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="lockd-keepalive", daemon=True
                )
                self._thread.start()
            self._woken = True
            self._cond.notify()

    def deregister(self, session: "Session") -> None:
        """Takes ``session`` off the schedule (it ended)."""
        with self._cond:
            self._sessions.discard(session)

    def wake(self) -> None:
        """Tells the thread the schedule changed (a deadline moved, a renewal is due)."""
        with self._cond:
            self._woken = True
            self._cond.notify()

    def fire(self, callbacks: Sequence[Callback], handle: Optional["Handle"], reason: str) -> None:
        """Queues one loss to be reported to ``callbacks`` on the keep-alive thread."""
        if not callbacks:
            return
        with self._cond:
            if self._stopped:
                return
            self._callbacks.append((callbacks, handle, reason))
            self._cond.notify()

    def stop(self) -> None:
        """Stops the thread (the client closed). Queued callbacks are dropped: only sessions the
        caller closed remain, and closing reports no loss."""
        with self._cond:
            self._stopped = True
            self._callbacks.clear()
            self._cond.notify()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=IDLE_WAKE * 5)

    def spawn(self, what: str, job: Callable[[], None]) -> None:
        """Runs ``job`` on a new daemon worker thread, logging anything it raises."""

        def run() -> None:
            try:
                job()
            except Exception:  # A bug in a job must not kill the schedule; say so loudly.
                _log.exception("lockd keep-alive job %s failed", what)
            finally:
                self.wake()

        threading.Thread(target=run, name=f"lockd-{what}", daemon=True).start()

    # ---- the thread ----------------------------------------------------------------------

    def _run(self) -> None:
        next_at = time.monotonic()
        while True:
            with self._cond:
                timeout = max(0.0, next_at - time.monotonic())
                if not self._stopped and not self._callbacks and not self._woken and timeout > 0:
                    self._cond.wait(timeout)
                if self._stopped:
                    return
                callbacks, self._callbacks = self._callbacks, []
                self._woken = False
                sessions = list(self._sessions)
            for listeners, handle, reason in callbacks:
                for callback in listeners:
                    try:
                        callback(handle, reason)
                    except Exception:  # One broken callback must not silence the others.
                        _log.exception("an on_lost callback raised")
            try:
                next_at = self._tick(sessions, time.monotonic())
            except Exception:
                # A bug here must not stop every session's heartbeats for good: say so loudly
                # and look again shortly.
                _log.exception("the lockd keep-alive schedule failed; retrying")
                next_at = time.monotonic() + IDLE_WAKE

    def _tick(self, sessions: List["Session"], now: float) -> float:
        """Does what is due at ``now``; answers when to look again."""
        next_at = now + IDLE_WAKE
        heartbeats: List["Session"] = []
        for session in sessions:
            plan = session._plan(now)
            if plan is None:
                continue
            beat, renewals, session_next = plan
            next_at = min(next_at, session_next)
            if beat:
                heartbeats.append(session)
            for grant in renewals:
                self.spawn("renew", _bind_renewal(session, grant))
        if len(heartbeats) > 1 and not self._batch_unsupported:
            for start in range(0, len(heartbeats), HEARTBEAT_BATCH_SESSIONS_MAX):
                chunk = heartbeats[start : start + HEARTBEAT_BATCH_SESSIONS_MAX]
                self.spawn("heartbeat", _bind(self._beat_batch, chunk))
        else:
            for session in heartbeats:
                self.spawn("heartbeat", _bind(self._beat_one, session))
        return next_at

    # ---- the heartbeat jobs (worker threads) -----------------------------------------------

    def _beat_one(self, session: "Session") -> None:
        until = session._heartbeat_deadline()
        if until is None:
            return
        sent_at = time.monotonic()
        request = session_pb2.HeartbeatRequest(session_id=session.session_id)
        try:
            answer = self._router.call(
                "heartbeat",
                lambda target, timeout: target.session.Heartbeat(request, timeout=timeout),
                deadline=until,
            )
        except LockError as err:
            session._on_heartbeat(sent_at, None, err)
            return
        session._on_heartbeat(sent_at, answer.ttl_ms / 1000.0 if answer.alive else None, None)

    def _beat_batch(self, sessions: List["Session"]) -> None:
        live: List[Tuple["Session", float]] = []
        for session in sessions:
            deadline = session._heartbeat_deadline()
            if deadline is not None:
                live.append((session, deadline))
        if not live:
            return
        # The earliest local deadline bounds the retries: past it that session is dead, and
        # the others are retried in the next round.
        until = min(d for _, d in live)
        request = session_pb2.HeartbeatBatchRequest(session_ids=[s.session_id for s, _ in live])

        def attempt(target: "Target", timeout: float) -> object:
            try:
                return target.session.HeartbeatBatch(request, timeout=timeout)
            except grpc.RpcError as err:
                # Answered, not failed: the router must not retry it elsewhere.
                if getattr(err, "code", lambda: None)() == grpc.StatusCode.UNIMPLEMENTED:
                    return _Unimplemented()
                raise

        sent_at = time.monotonic()
        try:
            answer = self._router.call("heartbeat batch", attempt, deadline=until)
        except InvalidArgument as err:
            # A refusal of the call as a whole (e.g. a batch over a server's limit) must not
            # kill any session: heartbeat each on its own.
            _log.warning("the server refused a heartbeat batch (%s); heartbeating each session", err)
            for session, _ in live:
                self.spawn("heartbeat", _bind(self._beat_one, session))
            return
        except LockError as err:
            for session, _ in live:
                session._on_heartbeat(sent_at, None, err)
            return
        if isinstance(answer, _Unimplemented):
            _log.info("the server does not know HeartbeatBatch; heartbeating each session on its own")
            self._batch_unsupported = True
            for session, _ in live:
                self.spawn("heartbeat", _bind(self._beat_one, session))
            return
        results = list(answer.results)  # type: ignore[attr-defined]
        if len(results) != len(live):
            mismatch = Contention(
                f"the server answered {len(results)} heartbeat results for {len(live)} sessions"
            )
            for session, _ in live:
                session._on_heartbeat(sent_at, None, mismatch)
            return
        for (session, _), result in zip(live, results):
            outcome = result.WhichOneof("outcome")
            if outcome == "heartbeat":
                beat = result.heartbeat
                session._on_heartbeat(sent_at, beat.ttl_ms / 1000.0 if beat.alive else None, None)
            elif outcome == "error":
                session._on_heartbeat(sent_at, None, error_from_detail(result.error))
            else:
                session._on_heartbeat(
                    sent_at, None, Contention("the server answered a heartbeat result without an outcome")
                )


def _bind(function: Callable[..., None], *args: object) -> Callable[[], None]:
    return lambda: function(*args)


def _bind_renewal(session: "Session", grant: Tuple[str, int]) -> Callable[[], None]:
    return lambda: session._keep_alive_renew(grant)
