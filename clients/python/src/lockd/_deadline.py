"""Deadline arithmetic of a grant (FR-11, C2 D3), as the Rust SDK's client/src/deadline.rs and
``SafetyMargin::Default``: pure functions of ``time.monotonic()`` instants and durations in
seconds.

The one rule: a grant's client deadline counts from the instant taken *before* the request that
obtained it was first sent, minus the safety margin. The server's lease starts no earlier than
the leader stamps the command, which is after the send, so the send instant is conservative; the
margin absorbs what it cannot: the client's and the leader's clocks running at slightly
different rates, scheduling lag, and the time a side effect takes to leave the process after its
last check. Functions here read no clock; callers pass the instants.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from lockd.errors import InvalidArgument

#: Smallest safety margin, in seconds: scheduling lag on a loaded host.
SAFETY_MARGIN_FLOOR = 0.1
#: The margin is ``ttl / SAFETY_MARGIN_TTL_DIVISOR`` (10 %), never below the floor: longer
#: leases guard longer critical sections, whose pauses are longer too.
SAFETY_MARGIN_TTL_DIVISOR = 10

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
#: Largest millisecond count a ``datetime`` can hold after the epoch (year 9999).
_UNIX_MS_MAX = int((datetime(9999, 12, 31, tzinfo=timezone.utc) - _EPOCH).total_seconds() * 1000)


def safety_margin(ttl: float) -> float:
    """The safety margin of a lease of ``ttl`` seconds: ``max(0.1, ttl / 10)``."""
    return max(SAFETY_MARGIN_FLOOR, ttl / SAFETY_MARGIN_TTL_DIVISOR)


def check_margin(ttl: float) -> None:
    """Raises :class:`lockd.InvalidArgument` for a TTL the safety margin would consume whole."""
    margin = safety_margin(ttl)
    if margin >= ttl:
        raise InvalidArgument(
            f"ttl is {ttl} s but the safety margin is {margin} s; the lease would be expired on "
            "arrival — use a longer ttl"
        )


def client_deadline(sent_at: float, ttl: float) -> float:
    """The client deadline of a lease of ``ttl`` seconds obtained by a request first sent at
    ``sent_at`` (a monotonic instant): ``sent_at + ttl - margin``, never before ``sent_at``."""
    return sent_at + max(0.0, ttl - safety_margin(ttl))


def granted_ttl(ttl_ms: int, asked: float) -> float:
    """The lease to count on: the shorter of what was asked and what the server granted. A
    server may grant less; a larger (or absurd) value from the network is never trusted. A zero
    (a server that left the field out) means what was asked."""
    if ttl_ms <= 0:
        return asked
    return min(ttl_ms / 1000.0, asked)


def datetime_from_unix_ms(unix_ms: int) -> datetime:
    """A UTC ``datetime`` from milliseconds since the Unix epoch (display only). Values past
    what ``datetime`` can hold saturate instead of raising: bytes from the network never crash
    the client."""
    clamped = min(max(unix_ms, 0), _UNIX_MS_MAX)
    return _EPOCH + timedelta(milliseconds=clamped)
