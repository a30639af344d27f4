"""A leader SIGKILL while a lock is held (its own cluster, ``fresh_cluster``): the handle stays
valid through the failover, and the next grant's token is greater."""

from __future__ import annotations

import time
from typing import List

import lockd
from cluster import Cluster, wait_for
from lockd._deadline import safety_margin

WAIT = 60.0
#: Long enough that the failover fits in it many times even on a loaded machine (where an
#: election can take several seconds). Keep-alive renews at a third of it, so the test waits
#: about that long for the first renewal after the kill.
TTL = 30.0


def test_a_held_lock_survives_a_leader_kill(fresh_cluster: Cluster, key: str) -> None:
    cluster = fresh_cluster
    lost: List[object] = []
    with lockd.Client(cluster.endpoints()) as client, client.session("survivor", ttl=TTL) as session:
        session.on_lost(lambda handle, reason: lost.append((handle, reason)))
        with session.lock(key, ttl=TTL, max_wait=5) as handle:
            old_leader = cluster.wait_for_leader()
            killed_at = time.monotonic()
            cluster.kill(old_leader)
            new_leader = cluster.wait_for_leader()
            assert new_leader != old_leader
            # Keep-alive renews through the new leader: wait for a renewal sent after the kill,
            # i.e. a tracked deadline that counts from after it.
            wait_for(
                "a renewal after the kill",
                lambda: session.latest(handle).deadline > killed_at + TTL - safety_margin(TTL),
                WAIT,
            )
            handle.check_still_held()
            handle.check_still_held(confirm=True)
            info = client.inspect(key, leader_confirmed=True)
            assert info is not None and info.fencing_token == handle.fencing_token
        assert session.is_alive()
        with client.session("next") as other:
            following = other.acquire(key, ttl=TTL, max_wait=5)
            assert following is not None
            assert following.fencing_token > handle.fencing_token
    assert lost == []
