"""``Handle``: the caller's proof of one grant, as this process knows it.

Owns the grant's identity (key, owner, session, fencing token) and the deadline it had when it
was issued. What the grant's *latest* deadline is (after renewals) is its session's knowledge;
:meth:`Handle.check_still_held` asks the session, so a renewal made by keep-alive counts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Optional, Protocol

from lockd.errors import InvalidArgument, LockLost


class _Tracker(Protocol):
    """What a handle needs of its session (kept abstract so the two modules do not import each
    other)."""

    def _check_still_held(self, handle: "Handle", confirm: bool) -> None: ...


@dataclass(frozen=True)
class Handle:
    """One grant of a lock, as issued to this process (C2 ``LockHandle``).

    Present :attr:`fencing_token` with every protected write: the token, checked by the
    resource (see :class:`lockd.Fence`), is what makes a stale holder harmless. Holding a
    ``Handle`` does not prove holding the lock; the grant can expire, be revoked or die with its
    session at any time. Renewals return new handles with the same token and a later deadline;
    the session tracks the latest one.
    """

    #: The lock key.
    key: str
    #: The owner the session was opened for.
    owner_id: str
    #: The session the grant belongs to.
    session_id: str
    #: The grant's fencing token: never zero, strictly increasing per key in grant order.
    fencing_token: int
    #: A ``time.monotonic()`` instant: the instant taken before the request that produced this
    #: handle was sent, plus the lease, minus the safety margin ``max(0.1 s, ttl / 10)``. Past
    #: it, this handle no longer proves anything. As of issue; later renewals do not change it.
    deadline: float
    #: The leader's wall-clock expiry of the lease (UTC). For logs and dashboards only; never
    #: compare it with a local clock for a safety decision.
    server_expiry: datetime
    #: The lease length in seconds: what was asked, or less if the server granted less.
    ttl: float
    _session: Optional[_Tracker] = field(default=None, repr=False, compare=False, hash=False)

    def remaining(self) -> float:
        """Seconds left until :attr:`deadline` (negative once it passed). As of issue: use
        :meth:`check_still_held`, which counts renewals, for decisions."""
        return self.deadline - time.monotonic()

    def check_still_held(self, confirm: bool = False) -> None:
        """Returns (``None``) if the grant is still held as far as this process can tell;
        raises :class:`lockd.LockLost` otherwise. It never returns a boolean.

        Without ``confirm`` the check is local: the grant is not known lost, and neither its
        latest deadline as its session tracks it (renewals by :meth:`lockd.Session.lock` and
        :meth:`lockd.Session.renew` count) nor its session's deadline has passed. The first
        check to notice a passed deadline fires the session's ``on_lost`` callbacks.

        With ``confirm=True`` it then asks the leader (a leader-confirmed inspect): the key must
        show this grant's token, or :class:`lockd.LockLost` is raised (and the loss recorded).
        If the leader cannot be asked, :class:`lockd.Contention` or :class:`lockd.NotLeader` is
        raised: the grant may still be held, and the local deadline still applies.

        Passing narrows the race window, it does not close it: the lease can lapse between this
        check and the side effect. Present the fencing token to the resource.
        """
        if self._session is not None:
            self._session._check_still_held(self, confirm)
            return
        # A handle built by hand belongs to no session: only its own deadline speaks for it,
        # and there is no server to confirm with.
        if time.monotonic() >= self.deadline:
            raise LockLost(self.key)
        if confirm:
            raise InvalidArgument(
                f"the handle of {self.key!r} belongs to no session; only a session's handle "
                "can be confirmed with the leader"
            )
