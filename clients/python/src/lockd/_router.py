"""Leader discovery and the retry loop: which node a call goes to, and what happens when it fails
(the Python form of the Rust SDK's client/src/router.rs).

Owns the endpoint list (seeded by the caller, grown by ``NotLeader`` hints), one gRPC channel
per endpoint, and the index of the node believed to lead. Every RPC of the client goes through
:meth:`Router.call`, which:

- follows a ``NotLeader`` hint to the named leader at once (a few times per call, then with
  backoff, so two confused nodes cannot bounce a call between them at full speed);
- on a ``NotLeader`` without a hint, a timeout, a transport failure or ``Contention``, moves on
  to the next endpoint and waits a bounded, jittered, exponential backoff (FR-28);
- stops at the call's deadline and raises the last retry-safe error, ``Contention`` or
  ``NotLeader``, never ``LockLost`` (docs/DESIGN.md D-errors): failing to reach the cluster
  says nothing about a grant;
- raises any other error (``InvalidArgument``, ``LockLost``, ``FencedOut``, ...) at once:
  retrying cannot help.

The attempt function a caller passes must be repeatable: a retry of a mutating call must send
the same request, with the same request id. Failures are decoded only by
:func:`lockd.errors.error_from_rpc_error`. The router knows nothing of sessions or handles.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from concurrent.futures import Future
from typing import Callable, List, Optional, Sequence, Tuple, TypeVar

import grpc

from lockd._endpoints import ENDPOINTS_MAX, Endpoint, Tls, parse_endpoint
from lockd._retry import Backoff
from lockd.errors import Contention, InvalidArgument, LockError, NotLeader, error_from_rpc_error
from lockd.v1 import admin_pb2, admin_pb2_grpc, lock_pb2_grpc, session_pb2_grpc

_log = logging.getLogger("lockd")

T = TypeVar("T")

#: How many ``NotLeader`` hints one call follows immediately before it starts backing off.
#: Three covers a hint that is one election stale; more would let two nodes that each name the
#: other bounce a call without pause.
REDIRECTS_IMMEDIATE_MAX = 3

#: Longest one attempt may take, in seconds (a blocking acquire adds its wait). Several election
#: timeouts (a node's default maximum is 0.8 s), so a healthy leader is never abandoned by
#: mistake, yet a hung node costs one attempt only.
ATTEMPT_TIMEOUT_MAX = 2.0

#: gRPC channel options. Reconnect backoff is capped at a second (gRPC's default grows to two
#: minutes, which would keep a restarted node out of reach long after it is back); HTTP proxies
#: are not used, as the Rust SDK uses none, so an ``http_proxy`` variable meant for the web does
#: not send lock traffic through a proxy.
_CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.enable_http_proxy", 0),
]


class Target:
    """One node: its address, its channel and the stubs of the three services the client uses."""

    def __init__(self, addr: str, tls: Optional[Tls]) -> None:
        self.addr = addr
        if tls is None:
            self.channel = grpc.insecure_channel(addr, options=_CHANNEL_OPTIONS)
        else:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=tls.ca, private_key=tls.key, certificate_chain=tls.cert
            )
            self.channel = grpc.secure_channel(addr, credentials, options=_CHANNEL_OPTIONS)
        self.lock = lock_pb2_grpc.LockServiceStub(self.channel)
        self.session = session_pb2_grpc.SessionServiceStub(self.channel)
        self.admin = admin_pb2_grpc.AdminServiceStub(self.channel)


class Router:
    """The endpoint list, the believed leader and the retry loop; shared by a client and all its
    sessions, thread-safe."""

    def __init__(
        self,
        endpoints: Sequence[Endpoint],
        tls: Optional[Tls],
        call_timeout: float,
        rng: Optional[random.Random] = None,
    ) -> None:
        if not endpoints:
            raise InvalidArgument("no endpoints given; pass at least one host:port")
        self._tls = tls
        #: A whole call's budget including retries, in seconds.
        self.call_timeout = call_timeout
        #: One attempt's timeout, in seconds.
        self.attempt_timeout = min(ATTEMPT_TIMEOUT_MAX, call_timeout)
        self._rng = rng if rng is not None else random.Random()
        self._lock = threading.Lock()
        self._targets: List[Target] = [Target(e.addr, tls) for e in endpoints]
        self._current = 0
        self._closed = threading.Event()

    # ---- the endpoint list ---------------------------------------------------------------

    def endpoints(self) -> List[str]:
        """Every address known now, in order (the caller's, then those learnt from hints)."""
        with self._lock:
            return [t.addr for t in self._targets]

    def current_endpoint(self) -> str:
        """The address the next call goes to: the node believed to lead."""
        with self._lock:
            return self._targets[self._current].addr

    def _current_target(self) -> Tuple[int, Target]:
        with self._lock:
            return self._current, self._targets[self._current]

    def _rotate_from(self, failed: int) -> None:
        """Moves past endpoint ``failed``, unless another call already moved on."""
        with self._lock:
            if self._current == failed:
                self._current = (failed + 1) % len(self._targets)

    def point_to(self, raw_addr: str, from_index: int) -> bool:
        """Points the router at ``raw_addr`` (a hint), adding it to the list if it is new.
        Returns whether the router now points somewhere other than ``from_index``."""
        try:
            addr = parse_endpoint(raw_addr).addr
        except InvalidArgument:
            _log.warning("ignoring a malformed leader hint %r", raw_addr)
            return False
        with self._lock:
            for i, target in enumerate(self._targets):
                if target.addr == addr:
                    self._current = i
                    return i != from_index
            if len(self._targets) >= ENDPOINTS_MAX:
                _log.warning("endpoint list full; ignoring a new leader hint %s", addr)
                return False
            self._targets.append(Target(addr, self._tls))
            self._current = len(self._targets) - 1
            return True

    # ---- the retry loop ------------------------------------------------------------------

    def call(
        self,
        what: str,
        attempt: Callable[[Target, float], T],
        *,
        deadline: float,
        attempt_timeout: Optional[float] = None,
    ) -> T:
        """Runs ``attempt(target, timeout)`` against the believed leader until it answers,
        retrying retry-safe failures elsewhere with backoff until ``deadline`` (a monotonic
        instant); see the module docstring. ``attempt`` must pass ``timeout`` to its stub call
        and be repeatable. ``what`` names the call in error messages."""
        timeout = self.attempt_timeout if attempt_timeout is None else attempt_timeout
        backoff = Backoff(random.Random(self._rng.random()))
        redirects = 0
        attempts = 0
        while True:
            if self._closed.is_set():
                raise InvalidArgument(f"{what}: the client is closed")
            index, target = self._current_target()
            attempts += 1
            try:
                return attempt(target, timeout)
            except grpc.RpcError as rpc_error:
                err: LockError = error_from_rpc_error(rpc_error)
            except ValueError as closed:
                # grpc raises ValueError for a call on a channel closed under it.
                if self._closed.is_set():
                    raise InvalidArgument(f"{what}: the client is closed") from closed
                raise
            immediate = False
            if isinstance(err, NotLeader) and err.leader_addr:
                if self.point_to(err.leader_addr, index):
                    immediate = redirects < REDIRECTS_IMMEDIATE_MAX
                else:
                    # A hint naming the node that just refused (stale), or unusable: elsewhere.
                    self._rotate_from(index)
            elif isinstance(err, (NotLeader, Contention)):
                self._rotate_from(index)
            else:
                raise err
            _log.debug("%s via %s failed (attempt %d): %s; retrying", what, target.addr, attempts, err)
            if isinstance(err, Contention):
                err = Contention(f"{what} via {target.addr}: {err.message} (after {attempts} attempt(s))")
            now = time.monotonic()
            if immediate:
                redirects += 1
                if now >= deadline:
                    raise err
                continue
            delay = backoff.next_delay()
            if now + delay >= deadline:
                raise err
            if self._closed.wait(delay):
                raise InvalidArgument(f"{what}: the client is closed")

    # ---- discovery -------------------------------------------------------------------------

    def discover(self, deadline: float) -> None:
        """Finds the leader by asking every endpoint for its status at once, and points the
        router at it. Returns once at least one endpoint answered, even if none knows a leader
        yet (calls then wait for the election within their budgets); retries with backoff until
        ``deadline``, then raises :class:`lockd.Contention` naming each endpoint's failure."""
        backoff = Backoff(random.Random(self._rng.random()))
        while True:
            with self._lock:
                targets = list(self._targets)
            timeout = max(0.05, min(self.attempt_timeout, deadline - time.monotonic()))
            calls: List[Tuple[Target, Future]] = [
                (t, t.admin.Status.future(admin_pb2.StatusRequest(), timeout=timeout))
                for t in targets
            ]
            failures: List[str] = []
            leader: Optional[str] = None
            reachable = False
            for target, call in calls:
                try:
                    status = call.result()
                except grpc.RpcError as rpc_error:
                    failures.append(f"{target.addr}: {error_from_rpc_error(rpc_error)}")
                    continue
                reachable = True
                if status.HasField("leader_id") and status.leader_addr and leader is None:
                    leader = status.leader_addr
            if leader is not None:
                self.point_to(leader, -1)
            if reachable:
                return
            delay = backoff.next_delay()
            if time.monotonic() + delay >= deadline:
                raise Contention(f"no lockd endpoint answered ({'; '.join(failures)})")
            if self._closed.wait(delay):
                raise InvalidArgument("the client is closed")

    def close(self) -> None:
        """Stops every retry loop (they raise ``InvalidArgument``) and closes every channel."""
        self._closed.set()
        with self._lock:
            targets = list(self._targets)
        for target in targets:
            target.channel.close()
