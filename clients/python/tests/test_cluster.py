"""The client against a real three-node cluster (the ``cluster`` fixture, conftest.py): the
contract of the Rust SDK, call by call. Every wait is for a condition, with a generous bound."""

from __future__ import annotations

import threading
import time
from typing import Dict, List, Optional, Tuple

import grpc
import pytest

import lockd
from cluster import Cluster, wait_for
from lockd.errors import error_from_rpc_error
from lockd.v1 import lock_pb2, lock_pb2_grpc, session_pb2, session_pb2_grpc
from test_errors import FakeRpcError

#: Generous bound on anything that needs a few round trips on a loaded two-core machine.
WAIT = 30.0


@pytest.fixture
def client(cluster: Cluster):
    with lockd.Client(cluster.endpoints()) as c:
        yield c


def raw_channel(addr: str) -> grpc.Channel:
    return grpc.insecure_channel(addr, options=[("grpc.enable_http_proxy", 0)])


def test_acquire_release(client: lockd.Client, key: str) -> None:
    with client.session("worker-1") as session:
        handle = session.acquire(key, ttl=10, max_wait=5)
        assert handle is not None
        assert handle.key == key and handle.owner_id == "worker-1"
        assert handle.session_id == session.session_id
        assert handle.fencing_token > 0
        # The deadline counts from before the send, minus the margin max(0.1, ttl/10).
        assert handle.deadline <= time.monotonic() + 10 - 1.0
        handle.check_still_held()
        handle.check_still_held(confirm=True)
        info = client.inspect(key, leader_confirmed=True)
        assert info is not None
        assert (info.key, info.owner_id, info.session_id, info.fencing_token) == (
            key, "worker-1", session.session_id, handle.fencing_token,
        )
        assert info.expires_at > info.acquired_at
        assert session.release(handle) is True
        assert client.inspect(key, leader_confirmed=True) is None
        # Releasing again is informational, and the released handle proves nothing any more.
        assert session.release(handle) is False
        with pytest.raises(lockd.LockLost):
            handle.check_still_held()


def test_fifo_hand_off_between_sessions(client: lockd.Client, key: str) -> None:
    with client.session("a") as a, client.session("b") as b, client.session("c") as c:
        first = a.acquire(key, ttl=10, max_wait=0)
        assert first is not None
        results: List[Tuple[str, Optional[lockd.Handle]]] = []

        def wait_on(session: lockd.Session, name: str) -> None:
            results.append((name, session.acquire(key, ttl=10, max_wait=WAIT)))

        waiters = []
        for session, name, queued in ((b, "b", 1), (c, "c", 2)):
            thread = threading.Thread(target=wait_on, args=(session, name))
            thread.start()
            waiters.append(thread)
            # Queue them in a known order: wait until the server counts this waiter.
            wait_for(
                f"{name} to queue",
                lambda: (client.inspect(key, leader_confirmed=True) or None)
                and client.inspect(key, leader_confirmed=True).waiter_count >= queued,
                WAIT,
            )
        assert a.release(first)
        wait_for("the first hand-off", lambda: len(results) >= 1, WAIT)
        name, second = results[0]
        assert name == "b" and second is not None
        assert second.fencing_token > first.fencing_token
        assert b.release(second)
        for thread in waiters:
            thread.join(WAIT)
        name, third = results[1]
        assert name == "c" and third is not None
        assert third.fencing_token > second.fencing_token
        assert c.release(third)


def test_lock_context_manager_renews_and_releases(client: lockd.Client, key: str) -> None:
    with client.session("ctx") as session:
        with session.lock(key, ttl=5, max_wait=5) as handle:
            assert client.inspect(key, leader_confirmed=True).fencing_token == handle.fencing_token
            # Keep-alive renews the grant every third of its TTL; wait past the handle's own
            # deadline and the grant is still held, because the session counts the renewals.
            wait_for("the handle's own deadline to pass", lambda: time.monotonic() > handle.deadline + 0.2, WAIT)
            handle.check_still_held()
            handle.check_still_held(confirm=True)
            assert session.latest(handle).deadline > handle.deadline
            assert session.latest(handle).fencing_token == handle.fencing_token
        assert client.inspect(key, leader_confirmed=True) is None
        with pytest.raises(lockd.LockLost):
            handle.check_still_held()
        # Held by someone else for the whole wait: NotAcquired, which is not a LockError.
        with client.session("other") as other:
            held = other.acquire(key, ttl=10, max_wait=0)
            assert held is not None
            with pytest.raises(lockd.NotAcquired):
                with session.lock(key, ttl=10, max_wait=0.3):
                    pytest.fail("the block must not run")


def test_try_acquire_under_contention(client: lockd.Client, key: str) -> None:
    with client.session("holder") as holder, client.session("contender") as contender:
        held = holder.try_acquire(key, ttl=10)
        assert held is not None
        assert contender.try_acquire(key, ttl=10) is None
        assert contender.acquire(key, ttl=10, max_wait=0.2) is None
        assert holder.release(held)
        mine = contender.try_acquire(key, ttl=10)
        assert mine is not None and mine.fencing_token > held.fencing_token


def test_renew_after_revoke_returns_none(client: lockd.Client, key: str) -> None:
    lost: List[Tuple[Optional[lockd.Handle], str]] = []
    with client.session("revoked") as session:
        session.on_lost(lambda handle, reason: lost.append((handle, reason)))
        handle = session.acquire(key, ttl=10, max_wait=5)
        assert handle is not None
        renewed = session.renew(handle)
        assert renewed is not None and renewed.fencing_token == handle.fencing_token
        assert renewed.deadline > handle.deadline
        outcome = client.force_revoke(key, "pytest", "testing renew after revoke")
        assert isinstance(outcome, lockd.LockOutcome)
        assert outcome.revoked and outcome.key == key
        assert outcome.previous_owner_id == "revoked"
        assert outcome.previous_token == handle.fencing_token
        assert outcome.new_token_floor >= handle.fencing_token
        assert session.renew(renewed) is None
        with pytest.raises(lockd.LockLost):
            handle.check_still_held()
        wait_for("on_lost", lambda: lost, WAIT)
        assert lost[0][0] is not None and lost[0][0].fencing_token == handle.fencing_token
        nothing = client.force_revoke(key, "pytest", "nothing held")
        assert not nothing.revoked and nothing.previous_owner_id == "" and nothing.previous_token == 0
        # The session is still alive: only the grant was lost.
        assert session.is_alive()
        again = session.try_acquire(key, ttl=10)
        assert again is not None and again.fencing_token > outcome.new_token_floor


def test_session_death_fires_on_lost_and_releases(client: lockd.Client, cluster: Cluster, key: str) -> None:
    calls: List[Tuple[Optional[lockd.Handle], str]] = []
    threads: List[str] = []
    session = client.session("doomed", ttl=5)

    def on_lost(handle: Optional[lockd.Handle], reason: str) -> None:
        threads.append(threading.current_thread().name)
        calls.append((handle, reason))

    session.on_lost(on_lost)
    handle = session.acquire(key, ttl=30, max_wait=5)
    assert handle is not None
    # The server ends the session (as an operator closing it by id would): the next heartbeat
    # is answered "not alive", and the session is lost with every grant on it.
    leader = cluster.wait_for_leader()
    with raw_channel(cluster.addrs[leader]) as channel:
        closed = session_pb2_grpc.SessionServiceStub(channel).CloseSession(
            session_pb2.CloseSessionRequest(session_id=session.session_id), timeout=10
        )
    assert closed.locks_released == 1
    wait_for("on_lost for the session", lambda: any(h is None for h, _ in calls), WAIT)
    assert [h.fencing_token if h else None for h, _ in calls] == [handle.fencing_token, None]
    assert all(reason for _, reason in calls)
    assert set(threads) == {"lockd-keepalive"}
    assert not session.is_alive()
    with pytest.raises(lockd.LockLost):
        handle.check_still_held()
    with pytest.raises(lockd.InvalidArgument):
        session.try_acquire(key, ttl=10)
    assert session.close() == 0
    assert client.inspect(key, leader_confirmed=True) is None
    with client.session("next") as other:
        assert other.try_acquire(key, ttl=10) is not None
    time.sleep(0.1)
    assert len(calls) == 2, "each loss is reported once"


def test_not_leader_hints_are_followed_from_followers_only(cluster: Cluster, key: str) -> None:
    leader = cluster.wait_for_leader()
    followers = cluster.followers()
    with lockd.Client(cluster.endpoints(followers)) as client, client.session("via-followers") as session:
        handle = session.acquire(key, ttl=10, max_wait=5)
        assert handle is not None and session.release(handle)
        assert cluster.addrs[leader] in client.endpoints
        assert client.believed_leader == cluster.addrs[leader]
    # The router alone (no discovery), pointed at a follower: its first call is answered
    # NotLeader with the leader's address, and it follows the hint.
    from lockd._endpoints import parse_endpoints
    from lockd._router import Router

    router = Router(parse_endpoints([cluster.addrs[followers[0]]]), None, 10.0)
    try:
        answers: List[str] = []

        def open_session(target, timeout):
            answers.append(target.addr)
            return target.session.OpenSession(session_pb2.OpenSessionRequest(owner_id="hinted", ttl_ms=2000), timeout=timeout)

        opened = router.call("open session", open_session, deadline=time.monotonic() + WAIT)
        assert opened.session_id
        assert answers[0] == cluster.addrs[followers[0]] and answers[-1] == cluster.addrs[leader]
        assert router.current_endpoint() == cluster.addrs[leader]
    finally:
        router.close()


def test_bad_input_raises_invalid_argument(client: lockd.Client, cluster: Cluster, key: str) -> None:
    with pytest.raises(lockd.InvalidArgument):
        client.session("")
    with pytest.raises(lockd.InvalidArgument):
        client.session("o", ttl=0.5)
    with client.session("bad-input") as session:
        for args in [("", 10, 1), ("k" * 257, 10, 1), (key, 0.5, 1), (key, 3601, 1), (key, 10, -1), (key, 10, 301)]:
            with pytest.raises(lockd.InvalidArgument):
                session.acquire(*args)
        with pytest.raises(lockd.InvalidArgument):
            client.force_revoke(key, "", "reason")
        with pytest.raises(lockd.InvalidArgument):
            client.force_revoke(key, "op", " ")
        # A handle of another session is refused.
        with client.session("other") as other:
            foreign = other.try_acquire(key, ttl=10)
            assert foreign is not None
            with pytest.raises(lockd.InvalidArgument):
                session.release(foreign)
    # The server's own answers decode to the same errors: a blank key at the leader is
    # InvalidArgument, any lock call at a follower is NotLeader naming the leader.
    leader = cluster.wait_for_leader()
    follower = cluster.followers()[0]
    with raw_channel(cluster.addrs[leader]) as channel:
        with pytest.raises(grpc.RpcError) as blank:
            lock_pb2_grpc.LockServiceStub(channel).Inspect(lock_pb2.InspectRequest(key=""), timeout=10)
    assert isinstance(error_from_rpc_error(blank.value), lockd.InvalidArgument)
    with raw_channel(cluster.addrs[follower]) as channel:
        with pytest.raises(grpc.RpcError) as refused:
            session_pb2_grpc.SessionServiceStub(channel).OpenSession(
                session_pb2.OpenSessionRequest(owner_id="x", ttl_ms=2000), timeout=10
            )
    hint = error_from_rpc_error(refused.value)
    assert isinstance(hint, lockd.NotLeader)
    assert hint.leader_id == leader and hint.leader_addr == cluster.addrs[leader]


class _LoseFirstAnswer:
    """Wraps a LockService stub: the first TryAcquire reaches the server, but its answer is
    replaced by UNAVAILABLE, as a connection dropped after the send would do."""

    def __init__(self, real: lock_pb2_grpc.LockServiceStub, sent: List[lock_pb2.TryAcquireRequest]) -> None:
        self._real = real
        self._sent = sent

    def TryAcquire(self, request, timeout=None):
        self._sent.append(request)
        answer = self._real.TryAcquire(request, timeout=timeout)
        if len(self._sent) == 1:
            raise FakeRpcError(grpc.StatusCode.UNAVAILABLE, "connection reset after the send")
        return answer

    def __getattr__(self, name):
        return getattr(self._real, name)


def test_a_retry_after_a_lost_answer_never_creates_a_second_grant(client: lockd.Client, key: str) -> None:
    sent: List[lock_pb2.TryAcquireRequest] = []
    with client.session("retrier") as session:
        for target in client._router._targets:
            target.lock = _LoseFirstAnswer(target.lock, sent)
        handle = session.try_acquire(key, ttl=10)
        # The retry carried the same request id, so the server answered it from memory with
        # the grant the lost answer carried, instead of "held by someone else" (the session
        # itself) or a second grant.
        assert handle is not None
        # (The retry goes to the next endpoint, which may be a follower that points back.)
        assert len(sent) >= 2 and len({r.request_id for r in sent}) == 1
        info = client.inspect(key, leader_confirmed=True)
        assert info is not None and info.fencing_token == handle.fencing_token
        assert session.release(handle)


class _Unreachable:
    """Wraps a LockService stub whose Renew never gets through."""

    def __init__(self, real: lock_pb2_grpc.LockServiceStub) -> None:
        self._real = real

    def Renew(self, request, timeout=None):
        raise FakeRpcError(grpc.StatusCode.UNAVAILABLE, "connection refused")

    def __getattr__(self, name):
        return getattr(self._real, name)


def test_a_transient_failure_is_never_reported_as_lost(cluster: Cluster, key: str) -> None:
    lost: List[object] = []
    with lockd.Client(cluster.endpoints()) as client, client.session("blip") as session:
        session.on_lost(lambda handle, reason: lost.append(handle))
        handle = session.acquire(key, ttl=30, max_wait=5)
        assert handle is not None
        client._router.call_timeout = 1.0  # so the renewal below gives up after a second
        real = {id(t): t.lock for t in client._router._targets}
        for target in client._router._targets:
            target.lock = _Unreachable(target.lock)
        with pytest.raises(lockd.Contention):
            session.renew(handle)
        # Contention says nothing about the grant: it is still held, nobody was told otherwise.
        handle.check_still_held()
        for target in client._router._targets:
            target.lock = real[id(target)]
        assert session.renew(handle) is not None
        assert session.release(handle)
    assert lost == []


class _CountHeartbeats:
    """Wraps a SessionService stub, counting the heartbeat calls of each kind."""

    def __init__(self, real: session_pb2_grpc.SessionServiceStub, counts: Dict[str, int]) -> None:
        self._real = real
        self._counts = counts

    def Heartbeat(self, request, timeout=None):
        self._counts["unary"] += 1
        return self._real.Heartbeat(request, timeout=timeout)

    def HeartbeatBatch(self, request, timeout=None):
        self._counts["batch"] += 1
        self._counts["batched_ids"] = max(self._counts["batched_ids"], len(request.session_ids))
        return self._real.HeartbeatBatch(request, timeout=timeout)

    def __getattr__(self, name):
        return getattr(self._real, name)


def test_the_sessions_of_a_client_are_heartbeated_in_batches(client: lockd.Client) -> None:
    counts = {"unary": 0, "batch": 0, "batched_ids": 0}
    for target in client._router._targets:
        target.session = _CountHeartbeats(target.session, counts)
    sessions = [client.session(f"batched-{i}", ttl=6) for i in range(3)]
    try:
        # Opened a few milliseconds apart, the three are due within a quarter interval (0.5 s)
        # of each other, so they go out together, and the batch keeps all three alive.
        wait_for("a heartbeat batch of all three", lambda: counts["batched_ids"] == 3, WAIT)
        wait_for("a second round", lambda: counts["batch"] >= 2, WAIT)
        assert all(s.is_alive() for s in sessions)
    finally:
        for session in sessions:
            session.close()


def test_closing_the_client_closes_its_sessions(cluster: Cluster, key: str) -> None:
    client = lockd.Client(cluster.endpoints())
    session = client.session("closed-with-client")
    assert session.try_acquire(key, ttl=30) is not None
    client.close()
    client.close()
    assert not session.is_alive()
    with pytest.raises(lockd.InvalidArgument):
        client.session("after-close")
    with lockd.Client(cluster.endpoints()) as other:
        assert other.inspect(key, leader_confirmed=True) is None


def test_a_passed_local_deadline_is_a_loss(client: lockd.Client, key: str) -> None:
    lost: List[Tuple[Optional[lockd.Handle], str]] = []
    with client.session("forgetful") as session:
        session.on_lost(lambda handle, reason: lost.append((handle, reason)))
        # Acquired without keep-alive and never renewed: once its deadline passes, this process
        # no longer holds the grant, whatever the server still shows.
        handle = session.acquire(key, ttl=3, max_wait=5)
        assert handle is not None
        wait_for("on_lost after the deadline", lambda: lost, WAIT)
        assert time.monotonic() >= handle.deadline
        assert lost[0][0] is not None and lost[0][0].fencing_token == handle.fencing_token
        assert "deadline" in lost[0][1]
        with pytest.raises(lockd.LockLost):
            handle.check_still_held()
        with pytest.raises(lockd.LockLost):
            session.renew(handle)
        assert session.is_alive()
