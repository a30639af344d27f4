"""Unit tests of the resource side of fencing, the same cases as api/src/fence.rs."""

from __future__ import annotations

import pytest

import lockd


def test_accepts_only_strictly_greater_tokens() -> None:
    assert lockd.fence_accepts(2, 1)
    assert not lockd.fence_accepts(1, 1)
    assert not lockd.fence_accepts(0, 1)
    assert lockd.fence_accepts(1, 0)
    assert not lockd.fence_accepts(2**64 - 1, 2**64 - 1)


def test_the_fence_advances_and_rejects_stale_holders() -> None:
    fence = lockd.Fence("payout")
    fence.admit(5)
    assert fence.stored == 5
    # The same token twice: a second writer under one grant is rejected.
    with pytest.raises(lockd.FencedOut) as same:
        fence.admit(5)
    assert (same.value.key, same.value.presented, same.value.stored) == ("payout", 5, 5)
    # A stale holder (older token) is rejected and does not move the fence.
    with pytest.raises(lockd.FencedOut):
        fence.admit(3)
    assert fence.stored == 5
    fence.admit(9)
    assert fence.stored == 9
    with pytest.raises(lockd.FencedOut):
        lockd.Fence("k", stored=9).admit(9)
    assert not lockd.FencedOut.retry_safe


def test_header_values_parse_strictly() -> None:
    assert lockd.parse_fencing_token("42") == 42
    assert lockd.parse_fencing_token("18446744073709551615") == 2**64 - 1
    for bad in ["", "0", "-1", "+1", " 1", "1 ", "0x10", "18446744073709551616", "1.0", "١٢"]:
        with pytest.raises(lockd.InvalidArgument):
            lockd.parse_fencing_token(bad)


def test_the_header_names_are_the_contracts() -> None:
    assert lockd.HEADER_FENCING_TOKEN == "X-Fencing-Token"
    assert lockd.HEADER_OWNER_ID == "X-Owner-Id"
    assert lockd.HEADER_IDEMPOTENCY_KEY == "X-Idempotency-Key"
