"""The resource side of fencing (C2 §2.4, §2.7; INV-04), mirroring Rust ``lock_api::fence``.

A protected resource accepts a write only if the presented fencing token is **greater** than the
highest token it has already accepted. This check, not any deadline, is what makes a paused or
partitioned stale holder harmless: lockd guarantees tokens strictly increase in grant order, so
once a newer holder has written, the stale holder's token is at most the stored one.
"""

from __future__ import annotations

from lockd.errors import FencedOut, InvalidArgument

__all__ = [
    "HEADER_FENCING_TOKEN",
    "HEADER_IDEMPOTENCY_KEY",
    "HEADER_OWNER_ID",
    "Fence",
    "fence_accepts",
    "parse_fencing_token",
]

#: HTTP header carrying the fencing token, as decimal digits (C2 §2.7).
HEADER_FENCING_TOKEN = "X-Fencing-Token"

#: HTTP header carrying the lock owner's id, for the resource's logs (C2 §2.7).
HEADER_OWNER_ID = "X-Owner-Id"

#: HTTP header carrying the idempotency key of the side effect (C2 §2.7).
HEADER_IDEMPOTENCY_KEY = "X-Idempotency-Key"

#: Tokens are unsigned 64-bit integers on the wire.
_TOKEN_MAX = 2**64 - 1


def fence_accepts(presented: int, stored: int) -> bool:
    """The fence rule: ``True`` iff a write presenting ``presented`` may proceed at a resource
    whose highest accepted token is ``stored``, i.e. ``presented > stored``. Equal is rejected:
    the same token must not authorise two different writers."""
    return presented > stored


def parse_fencing_token(value: str) -> int:
    """Parses a :data:`HEADER_FENCING_TOKEN` value: decimal ASCII digits, no sign, no
    whitespace, not zero, at most 2**64 - 1.

    Raises :class:`lockd.InvalidArgument` for anything else. A missing or malformed token must
    be a rejection, never "no fencing" (C2 §2.7: a code path that defaults to no token silently
    skips the check)."""
    if not isinstance(value, str) or not value or not all("0" <= c <= "9" for c in value):
        raise InvalidArgument(f"{HEADER_FENCING_TOKEN} must be a decimal number, got {value!r}")
    token = int(value)
    if token == 0:
        raise InvalidArgument(f"{HEADER_FENCING_TOKEN} must not be 0")
    if token > _TOKEN_MAX:
        raise InvalidArgument(f"{HEADER_FENCING_TOKEN} {value!r} does not fit in 64 bits")
    return token


class Fence:
    """The stored fence of one protected resource: the highest token it has accepted.

    A resource keeps one ``Fence`` per lock key (persisted with its own data, in the same
    transaction as the write it guards) and calls :meth:`admit` before every side effect. Not
    thread-safe: guard it with the resource's own lock or transaction.
    """

    def __init__(self, key: str, stored: int = 0) -> None:
        """A fence for ``key`` whose highest accepted token is ``stored`` (0, below every real
        token, for a fence that has accepted nothing yet)."""
        self._key = key
        self._stored = stored

    @property
    def key(self) -> str:
        """The lock key this fence guards."""
        return self._key

    @property
    def stored(self) -> int:
        """The highest token accepted so far (0 if none)."""
        return self._stored

    def admit(self, presented: int) -> None:
        """Admits a write presenting ``presented``: if ``presented > stored`` the fence advances
        to it and the write may proceed. Otherwise raises :class:`lockd.FencedOut` naming both
        tokens, and the fence does not move: the write must not happen, and must never be
        retried."""
        if not fence_accepts(presented, self._stored):
            raise FencedOut(self._key, presented, self._stored)
        self._stored = presented

    def __repr__(self) -> str:
        return f"Fence(key={self._key!r}, stored={self._stored})"
