"""The client over TLS against ``lockd dev`` (the ``dev_cluster`` fixture: three nodes serving
TLS with the CA and certificates ``lockd dev`` mints, client certificates required): with the
``export`` lines it prints the client works, from arguments or from ``LOCKD_CA``,
``LOCKD_CERT``, ``LOCKD_KEY``; in plaintext, or without a client certificate, it is refused.
"""

from __future__ import annotations

import time
import grpc
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


def _as(dev_cluster: DevCluster, name: str) -> lockd.Client:
    cert, key_file = dev_cluster.identity(name)
    return lockd.Client(
        dev_cluster.endpoints(), ca=dev_cluster.exports["LOCKD_CA"], cert=cert, key=key_file
    )


def _list_revocations(dev_cluster: DevCluster, name: str, key: str):
    """``AdminService.ListRevocations`` through the raw stub as ``name``, at whichever node
    leads (a follower answers ``NotLeader``)."""
    from lockd.v1 import admin_pb2, admin_pb2_grpc

    cert, key_file = dev_cluster.identity(name)
    creds = grpc.ssl_channel_credentials(
        root_certificates=open(dev_cluster.exports["LOCKD_CA"], "rb").read(),
        private_key=open(key_file, "rb").read(),
        certificate_chain=open(cert, "rb").read(),
    )
    last = None
    for endpoint in dev_cluster.endpoints():
        with grpc.secure_channel(endpoint, creds) as channel:
            try:
                return admin_pb2_grpc.AdminServiceStub(channel).ListRevocations(
                    admin_pb2.ListRevocationsRequest(key=key, page_size=10), timeout=5
                )
            except grpc.RpcError as e:
                if e.code() in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED):
                    raise  # the same answer on every node: the caller's, not the node's
                last = e
    raise AssertionError(f"no node answered ListRevocations: {last}")


def test_only_an_operator_revokes_and_the_audit_log_names_its_principal(
    dev_cluster: DevCluster, key: str
) -> None:
    with _as(dev_cluster, "client") as client, client.session("py-held") as session:
        handle = session.acquire(key, ttl=30, max_wait=5)
        assert handle is not None
        # The client role may not revoke: PERMISSION_DENIED, with the ErrorDetail decoded.
        with pytest.raises(lockd.PermissionDenied) as refused:
            client.force_revoke(key, "client", "not mine to revoke")
        assert refused.value.principal == "client"
        assert refused.value.required_role == "operator"
        assert client.inspect(key, leader_confirmed=True).fencing_token == handle.fencing_token
        # Nor read the audit log.
        with pytest.raises(grpc.RpcError) as denied:
            _list_revocations(dev_cluster, "client", key)
        assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
        # The operator may, and the record names the operator certificate's principal.
        with _as(dev_cluster, "operator") as operator:
            outcome = operator.force_revoke(key, "operator", "stuck job")
            assert outcome.revoked and outcome.previous_token == handle.fencing_token
        records = _list_revocations(dev_cluster, "operator", key).revocations
        assert records, "the revoke is in the audit log"
        assert records[0].key == key
        assert records[0].operator == "operator"
        assert records[0].reason == "stuck job"
        assert records[0].previous_token == handle.fencing_token


def test_a_revoke_as_the_caller_is_recorded_under_its_certificate(
    dev_cluster: DevCluster, key: str
) -> None:
    with _as(dev_cluster, "operator") as operator:
        outcome = operator.force_revoke_as_caller(key, "no name typed")
        assert outcome.key == key and not outcome.revoked
    records = _list_revocations(dev_cluster, "operator", key).revocations
    assert [r.operator for r in records] == ["operator"]
    assert records[0].reason == "no name typed"
