"""Fixtures: ``cluster``, one three-node plaintext cluster shared by the tests that only read
and write their own keys; ``fresh_cluster``, a cluster of its own for a test that kills nodes;
``dev_cluster``, one ``lockd dev`` (TLS, client certificates required) shared by the TLS tests.
All print the nodes' log tails when a test of the run failed, and kill every node at the end.
"""

from __future__ import annotations

import sys
import uuid
from typing import Iterator

import pytest

from cluster import Cluster, DevCluster

sys.dont_write_bytecode = True


def _finish(request: pytest.FixtureRequest, cluster: Cluster) -> None:
    if request.session.testsfailed:
        print(f"\nlockd node logs ({cluster.dir}):\n{cluster.log_tails()}", file=sys.stderr)
    cluster.close()


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """A three-node cluster shared by the whole run; tests must use their own keys."""
    started = Cluster()
    try:
        yield started
    finally:
        _finish(request, started)


@pytest.fixture
def fresh_cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """A three-node cluster for one test, which may kill its nodes."""
    started = Cluster()
    try:
        yield started
    finally:
        _finish(request, started)


@pytest.fixture(scope="session")
def dev_cluster(request: pytest.FixtureRequest) -> Iterator[DevCluster]:
    """``lockd dev`` in a temporary folder, shared by the run; tests must use their own keys."""
    started = DevCluster()
    try:
        yield started
    finally:
        if request.session.testsfailed:
            print(f"\nlockd dev output and node logs:\n{started.log_tail()}", file=sys.stderr)
        started.close()


@pytest.fixture
def key() -> str:
    """A lock key no other test uses."""
    return f"pytest/{uuid.uuid4().hex[:12]}"
