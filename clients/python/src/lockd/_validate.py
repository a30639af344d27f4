"""The argument checks of the client, the same as Rust ``lock_api::validate`` and its limits
(api/src/limits.rs), so a bad argument is refused before anything is sent, with the same
:class:`lockd.InvalidArgument` the server would answer.

Text is refused when blank (empty or only whitespace), longer than its limit in UTF-8 bytes, or
when it contains control characters (they corrupt logs and the audit trail).
"""

from __future__ import annotations

import math
import unicodedata

from lockd.errors import InvalidArgument

#: Longest key, in bytes of UTF-8: fits any resource name and keeps a grant small on every replica.
KEY_LEN_MAX = 256
#: Longest owner id, in bytes: owner ids identify a process, not a payload.
OWNER_ID_LEN_MAX = 128
#: Longest session id, in bytes: servers issue short ids.
SESSION_ID_LEN_MAX = 64
#: Longest force-revoke operator name, in bytes (recorded in the audit log).
OPERATOR_LEN_MAX = 128
#: Longest force-revoke reason, in bytes: a sentence and a ticket link.
REASON_LEN_MAX = 1024
#: Shortest lease (lock or session TTL), in seconds: a lease must outlive a few round trips.
TTL_MIN = 1.0
#: Longest lease, in seconds: a crashed holder blocks its key until the lease runs out.
TTL_MAX = 3600.0
#: Longest server-side wait of one acquire, in seconds.
MAX_WAIT_MAX = 300.0


def _text(what: str, value: object, len_max: int) -> str:
    if not isinstance(value, str):
        raise InvalidArgument(f"{what} must be a string, got {type(value).__name__}")
    if not value.strip():
        raise InvalidArgument(f"{what} must not be blank")
    size = len(value.encode("utf-8"))
    if size > len_max:
        raise InvalidArgument(f"{what} is {size} bytes long; the limit is {len_max} bytes")
    if any(unicodedata.category(c) == "Cc" for c in value):
        raise InvalidArgument(f"{what} must not contain control characters")
    return value


def key(value: object) -> str:
    """A lock key: non-blank, at most :data:`KEY_LEN_MAX` bytes, no control characters."""
    return _text("key", value, KEY_LEN_MAX)


def owner_id(value: object) -> str:
    """An owner id: non-blank, at most :data:`OWNER_ID_LEN_MAX` bytes, no control characters."""
    return _text("owner id", value, OWNER_ID_LEN_MAX)


def session_id(value: object) -> str:
    """A session id: non-blank, at most :data:`SESSION_ID_LEN_MAX` bytes."""
    return _text("session id", value, SESSION_ID_LEN_MAX)


def operator(value: object) -> str:
    """A force-revoke operator: non-blank, at most :data:`OPERATOR_LEN_MAX` bytes."""
    return _text("operator", value, OPERATOR_LEN_MAX)


def reason(value: object) -> str:
    """A force-revoke reason: non-blank, at most :data:`REASON_LEN_MAX` bytes."""
    return _text("reason", value, REASON_LEN_MAX)


def _seconds(what: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgument(f"{what} must be a number of seconds, got {type(value).__name__}")
    seconds = float(value)
    if math.isnan(seconds):
        raise InvalidArgument(f"{what} must be a number of seconds, got NaN")
    return seconds


def ttl_ms(value: object, what: str = "ttl") -> int:
    """A lease length in seconds, checked against :data:`TTL_MIN`..:data:`TTL_MAX` and returned
    in whole milliseconds, rounded **down** so the server never promises more than asked."""
    seconds = _seconds(what, value)
    if not TTL_MIN <= seconds <= TTL_MAX:
        raise InvalidArgument(
            f"{what} is {seconds} s; it must be between {TTL_MIN:g} s and {TTL_MAX:g} s"
        )
    return int(seconds * 1000)


def max_wait_ms(value: object) -> int:
    """An acquire's ``max_wait`` in seconds (0 allowed, at most :data:`MAX_WAIT_MAX`), returned
    in whole milliseconds."""
    seconds = _seconds("max_wait", value)
    if not 0 <= seconds <= MAX_WAIT_MAX:
        raise InvalidArgument(
            f"max_wait is {seconds} s; it must be between 0 and {MAX_WAIT_MAX:g} s"
        )
    return int(seconds * 1000)


def fencing_token(value: int) -> int:
    """A fencing token: tokens start at 1, so 0 is never one a server issued."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value < 2**64:
        raise InvalidArgument(f"fencing token {value!r} was never issued; tokens are 1..2**64-1")
    return value
