"""Bounded, jittered exponential backoff between retries (FR-28), as the Rust SDK's
client/src/backoff.rs.

Owns the delay arithmetic only: it never sleeps and reads no clock, so it is tested by its
outputs. The delay before retry ``n`` (0-based) is drawn uniformly from ``[ceiling/2, ceiling]``
with ``ceiling = min(BACKOFF_MAX, BACKOFF_INITIAL * BACKOFF_MULTIPLIER**n)`` ("equal jitter"):
the jitter spreads the retries of many clients that failed together (a leader crash fails
every client at once), and the lower half-bound keeps a retry from being immediate.
"""

from __future__ import annotations

import random
from typing import Optional

#: Ceiling of the first delay, in seconds: a leader change is usually resolved by the next
#: attempt, so the first retry comes quickly.
BACKOFF_INITIAL = 0.025
#: Largest ceiling, in seconds: stops a retry storm against an electing cluster, yet a call
#: notices a new leader within a second of its election.
BACKOFF_MAX = 1.0
#: The ceiling doubles after every retry.
BACKOFF_MULTIPLIER = 2.0


class Backoff:
    """The delays of one call's retries. Create one per call; not shared between threads."""

    def __init__(self, rng: Optional[random.Random] = None) -> None:
        self._rng = rng if rng is not None else random.Random()
        self._ceiling = BACKOFF_INITIAL

    @property
    def ceiling(self) -> float:
        """The ceiling the next delay is drawn under, in seconds."""
        return self._ceiling

    def next_delay(self) -> float:
        """The delay before the next retry, in ``[ceiling/2, ceiling]`` seconds; then grows the
        ceiling, up to :data:`BACKOFF_MAX`."""
        ceiling = self._ceiling
        self._ceiling = min(ceiling * BACKOFF_MULTIPLIER, BACKOFF_MAX)
        return self._rng.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        """Starts the ceilings over (after a success, in a long-lived loop)."""
        self._ceiling = BACKOFF_INITIAL
