"""lockd-client: the Python client of lockd, a Raft-replicated distributed lock service, with
the contract of its Rust SDK (lock-client).

A lock is acquired on a session, and proved by its **fencing token**, not by holding a handle
and not by a deadline that has not passed yet: present the token to every protected resource,
which accepts only tokens greater than the last it accepted (:class:`Fence`)::

    import lockd

    with lockd.Client("127.0.0.1:7101") as client, client.session("nightly-report") as session:
        with session.lock("reports/nightly", ttl=30, max_wait=10) as handle:
            handle.check_still_held()
            write_report(fencing_token=handle.fencing_token)

Layout:

- :mod:`lockd.client`: :class:`Client` — endpoints, leader discovery, ``inspect``,
  ``force_revoke``;
- :mod:`lockd.session`: :class:`Session` — acquire, try-acquire, renew, release, ``lock()``,
  ``on_lost``;
- :mod:`lockd.handle`: :class:`Handle`, one grant and its monotonic deadline;
- :mod:`lockd.info`: :class:`LockInfo`, :class:`LockOutcome`;
- :mod:`lockd.errors`: :class:`LockError` and its subclasses, and their decoding from a gRPC
  status;
- :mod:`lockd.fence`: :class:`Fence`, :func:`fence_accepts`, :func:`parse_fencing_token`, the
  header names;
- :mod:`lockd.v1`: the generated protobuf and gRPC stubs of ``proto/lockd/v1``.
"""

from lockd.client import Client
from lockd.errors import (
    Contention,
    FencedOut,
    InvalidArgument,
    LockError,
    LockLost,
    NotAcquired,
    NotLeader,
    PermissionDenied,
    Unauthenticated,
)
from lockd.fence import (
    HEADER_FENCING_TOKEN,
    HEADER_IDEMPOTENCY_KEY,
    HEADER_OWNER_ID,
    Fence,
    fence_accepts,
    parse_fencing_token,
)
from lockd.handle import Handle
from lockd.info import LockInfo, LockOutcome
from lockd.session import Session

__version__ = "0.1.0"

__all__ = [
    "HEADER_FENCING_TOKEN",
    "HEADER_IDEMPOTENCY_KEY",
    "HEADER_OWNER_ID",
    "Client",
    "Contention",
    "Fence",
    "FencedOut",
    "Handle",
    "InvalidArgument",
    "LockError",
    "LockInfo",
    "LockLost",
    "LockOutcome",
    "NotAcquired",
    "NotLeader",
    "PermissionDenied",
    "Session",
    "Unauthenticated",
    "fence_accepts",
    "parse_fencing_token",
]
