"""The two diagnostic answers of a client: ``LockInfo`` (``inspect``) and ``LockOutcome``
(``force_revoke``), frozen copies of the proto messages of the same names with times as UTC
``datetime``s.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from lockd._deadline import datetime_from_unix_ms
from lockd.v1 import lock_pb2


@dataclass(frozen=True)
class LockInfo:
    """Diagnostic view of a key's current grant (C2 ``LockInfo``). Advisory only: stale the
    moment it is returned, never usable for a correctness decision (FR-07)."""

    #: The lock key.
    key: str
    #: The owner of the current holder's session.
    owner_id: str
    #: The current holder's session.
    session_id: str
    #: The fencing token of the current grant.
    fencing_token: int
    #: When the current grant was made, by the leader's wall clock (UTC). Display only.
    acquired_at: datetime
    #: When the current lease expires, by the leader's wall clock (UTC). Display only.
    expires_at: datetime
    #: How many acquires are queued for the key.
    waiter_count: int

    @classmethod
    def _from_proto(cls, info: lock_pb2.LockInfo) -> "LockInfo":
        return cls(
            key=info.key,
            owner_id=info.owner_id,
            session_id=info.session_id,
            fencing_token=info.fencing_token,
            acquired_at=datetime_from_unix_ms(info.acquired_at_unix_ms),
            expires_at=datetime_from_unix_ms(info.expires_at_unix_ms),
            waiter_count=info.waiter_count,
        )


@dataclass(frozen=True)
class LockOutcome:
    """What a ``force_revoke`` did, for the audit trail (C2 ``LockOutcome``)."""

    #: The lock key.
    key: str
    #: ``True`` if a grant was deleted; ``False`` if the key was unheld.
    revoked: bool
    #: The owner of the revoked grant; empty if ``revoked`` is ``False``.
    previous_owner_id: str
    #: The fencing token of the revoked grant; 0 if ``revoked`` is ``False``.
    previous_token: int
    #: The token counter after the revoke: every grant from now on carries a fencing token
    #: greater than this (INV-04).
    new_token_floor: int

    @classmethod
    def _from_proto(cls, outcome: lock_pb2.LockOutcome) -> "LockOutcome":
        return cls(
            key=outcome.key,
            revoked=outcome.revoked,
            previous_owner_id=outcome.previous_owner_id,
            previous_token=outcome.previous_token,
            new_token_floor=outcome.new_token_floor,
        )
