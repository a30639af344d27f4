"""The client over TLS against ``lockd dev`` (the ``dev_cluster`` fixture: three nodes serving
TLS with the CA and certificates ``lockd dev`` mints, client certificates required): with the
``export`` lines it prints the client works, from arguments or from ``LOCKD_CA``,
``LOCKD_CERT``, ``LOCKD_KEY``; in plaintext, or without a client certificate, it is refused.
"""

from __future__ import annotations

import time
import pytest

import lockd
from cluster import DevCluster

#: The variables the client reads its TLS files from when no argument names them.
TLS_VARS = ("LOCKD_CA", "LOCKD_CERT", "LOCKD_KEY")
#: Budget of a call that must be refused: the refusal is at the handshake, so it comes long
#: before this; the bound only keeps a broken test from hanging.
REFUSAL_TIMEOUT = 3.0
#: How long a refused construction may take: its budget plus scheduling noise.
REFUSED_WITHIN = REFUSAL_TIMEOUT + 10.0


@pytest.fixture(autouse=True)
def no_tls_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sets exactly the variables it means (a developer may have exported some)."""
    for var in TLS_VARS + ("LOCKD_ENDPOINTS",):
        monkeypatch.delenv(var, raising=False)


def test_the_client_certificate_locks_over_tls(dev_cluster: DevCluster, key: str) -> None:
    exports = dev_cluster.exports
    with lockd.Client(
        dev_cluster.endpoints(),
        ca=exports["LOCKD_CA"],
        cert=exports["LOCKD_CERT"],
        key=exports["LOCKD_KEY"],
    ) as client:
        with client.session("py-tls") as session:
            handle = session.acquire(key, ttl=10, max_wait=5)
            assert handle is not None and handle.fencing_token > 0
            info = client.inspect(key, leader_confirmed=True)
            assert info is not None and info.fencing_token == handle.fencing_token
            assert info.owner_id == "py-tls"
            assert session.release(handle) is True
        assert client.inspect(key, leader_confirmed=True) is None


def test_the_export_lines_are_enough(
    dev_cluster: DevCluster, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # README's way: the variables lockd dev prints, nothing passed in code.
    for name, value in dev_cluster.exports.items():
        monkeypatch.setenv(name, value)
    with lockd.Client() as client:
        with client.session("py-tls-env") as session:
            handle = session.acquire(key, ttl=10, max_wait=5)
            assert handle is not None
            assert session.release(handle) is True


def _assert_refused(endpoints, **tls) -> str:
    started = time.monotonic()
    with pytest.raises(lockd.Contention) as refused:
        lockd.Client(endpoints, timeout=REFUSAL_TIMEOUT, **tls)
    took = time.monotonic() - started
    assert took < REFUSED_WITHIN, f"the refusal took {took:.1f} s"
    return str(refused.value)


def test_a_plaintext_client_is_refused(dev_cluster: DevCluster) -> None:
    message = _assert_refused(dev_cluster.endpoints())
    for endpoint in dev_cluster.endpoints():
        assert endpoint in message, message


def test_a_client_without_a_certificate_is_refused(dev_cluster: DevCluster) -> None:
    # The CA alone: the server is trusted, but lockd dev requires a client certificate.
    message = _assert_refused(dev_cluster.endpoints(), ca=dev_cluster.exports["LOCKD_CA"])
    assert dev_cluster.endpoints()[0] in message, message


def test_a_certificate_the_cluster_did_not_sign_is_refused(dev_cluster: DevCluster) -> None:
    # The client's certificate presented with the wrong CA file (its own certificate): the
    # client cannot verify the nodes, so no call gets through.
    cert, key = dev_cluster.identity("client")
    message = _assert_refused(dev_cluster.endpoints(), ca=cert, cert=cert, key=key)
    assert dev_cluster.endpoints()[0] in message, message
