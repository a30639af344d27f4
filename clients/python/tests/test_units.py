"""Unit tests of the pieces without a server: endpoints, backoff, deadlines, validation."""

from __future__ import annotations

import random

import pytest

import lockd
from lockd import _validate as validate
from lockd._deadline import check_margin, client_deadline, datetime_from_unix_ms, granted_ttl, safety_margin
from lockd._endpoints import parse_endpoints
from lockd._retry import BACKOFF_INITIAL, BACKOFF_MAX, Backoff
from lockd.handle import Handle


def test_endpoints_are_normalised_and_bad_ones_named(monkeypatch: pytest.MonkeyPatch) -> None:
    parsed = parse_endpoints(" 127.0.0.1:7101 ,http://localhost:7102/, 127.0.0.1:7101")
    assert [e.addr for e in parsed] == ["127.0.0.1:7101", "localhost:7102"]
    assert [e.addr for e in parse_endpoints(["https://[::1]:7101"])] == ["[::1]:7101"]
    for bad in ["", "localhost", "ftp://x:1", "a b:1", "host:1/path", "host:0", "host:70000", "::1:7101"]:
        with pytest.raises(lockd.InvalidArgument):
            parse_endpoints([bad])
    with pytest.raises(lockd.InvalidArgument):
        parse_endpoints(["http://a:1", "https://b:2"])
    monkeypatch.setenv("LOCKD_ENDPOINTS", "10.0.0.1:7101,10.0.0.2:7101,")
    assert [e.addr for e in parse_endpoints(None)] == ["10.0.0.1:7101", "10.0.0.2:7101"]
    monkeypatch.delenv("LOCKD_ENDPOINTS")
    with pytest.raises(lockd.InvalidArgument, match="LOCKD_ENDPOINTS"):
        parse_endpoints(None)


def test_a_client_refuses_bad_arguments_before_dialling(tmp_path) -> None:
    with pytest.raises(lockd.InvalidArgument):
        lockd.Client("not an endpoint")
    with pytest.raises(lockd.InvalidArgument):
        lockd.Client("127.0.0.1:1", timeout=0)
    cert = tmp_path / "cert.pem"
    cert.write_text("x")
    with pytest.raises(lockd.InvalidArgument, match="key"):
        lockd.Client("127.0.0.1:1", cert=str(cert))
    with pytest.raises(lockd.InvalidArgument, match="cannot read"):
        lockd.Client("127.0.0.1:1", ca=str(tmp_path / "missing.pem"))


def test_an_unreachable_cluster_is_contention_not_a_hang() -> None:
    with pytest.raises(lockd.Contention, match="no lockd endpoint answered"):
        lockd.Client("127.0.0.1:1", timeout=0.5)


def test_backoff_delays_stay_within_half_ceiling_and_ceiling() -> None:
    for seed in range(20):
        backoff = Backoff(random.Random(seed))
        ceiling = BACKOFF_INITIAL
        for _ in range(20):
            assert backoff.ceiling == pytest.approx(ceiling)
            delay = backoff.next_delay()
            assert ceiling / 2 <= delay <= ceiling
            ceiling = min(ceiling * 2, BACKOFF_MAX)
        assert backoff.ceiling == BACKOFF_MAX
    backoff.reset()
    assert backoff.ceiling == BACKOFF_INITIAL


def test_the_deadline_counts_from_the_send_minus_the_margin() -> None:
    assert safety_margin(1.0) == pytest.approx(0.1)
    assert safety_margin(30.0) == pytest.approx(3.0)
    assert client_deadline(100.0, 10.0) == pytest.approx(109.0)
    assert granted_ttl(3000, 10.0) == 3.0  # the server may grant less
    assert granted_ttl(2**64 - 1, 2.0) == 2.0  # more is never trusted
    assert granted_ttl(0, 2.0) == 2.0
    check_margin(1.0)
    datetime_from_unix_ms(2**64 - 1)  # absurd wall-clock values do not raise


def test_arguments_are_checked_like_the_rust_sdk() -> None:
    assert validate.ttl_ms(1.5) == 1500
    assert validate.ttl_ms(1.0009) == 1000  # rounded down
    assert validate.max_wait_ms(0) == 0
    for bad_ttl in [0, 0.999, 3600.001, float("nan"), "10", True]:
        with pytest.raises(lockd.InvalidArgument):
            validate.ttl_ms(bad_ttl)
    for bad_wait in [-1, 300.001]:
        with pytest.raises(lockd.InvalidArgument):
            validate.max_wait_ms(bad_wait)
    assert validate.key("k" * 256)
    assert validate.key("é" * 128)
    for bad_key in ["", "  ", "k" * 257, "é" * 129, "a\nb", None]:
        with pytest.raises(lockd.InvalidArgument):
            validate.key(bad_key)
    with pytest.raises(lockd.InvalidArgument):
        validate.fencing_token(0)


def test_a_handle_without_a_session_checks_its_own_deadline() -> None:
    from datetime import datetime, timezone
    import time

    now = time.monotonic()
    alive = Handle("k", "o", "s", 1, now + 60, datetime.now(timezone.utc), 60.0)
    alive.check_still_held()
    expired = Handle("k", "o", "s", 1, now - 1, datetime.now(timezone.utc), 60.0)
    with pytest.raises(lockd.LockLost):
        expired.check_still_held()
    with pytest.raises(lockd.InvalidArgument):
        alive.check_still_held(confirm=True)
