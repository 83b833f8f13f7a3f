"""The one retry policy: exponential backoff with full jitter, bounded by a deadline.

Every retry loop in the package (storage reads and writes, renewals, the
preemption watcher) asks :data:`RETRY` or its own :class:`Backoff` how long to
wait before try number ``attempt``. The policy keeps no state: the caller keeps
the attempt count, so one policy value is shared by every thread and lock.

Full jitter (a uniform draw over ``[0, min(cap, base * 2**attempt)]``) spreads
parties that failed together, which is what contending lock holders do.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from .errors import ConfigurationError
from .timing import seconds

#: A retry the draw would put past the deadline goes this long before it instead: one last try.
LAST_TRY_MARGIN = 0.05
#: Less room than this before the deadline is no room: stop rather than spin on slivers of time.
MIN_ROOM = 0.001


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with full jitter: ``uniform(0, min(cap, base * 2**attempt))``."""

    base: float = 0.1
    cap: float = 2.0

    def __post_init__(self) -> None:
        for name in ("base", "cap"):
            seconds(f"backoff {name}", getattr(self, name))
        if self.cap < self.base:
            raise ConfigurationError(f"backoff cap ({self.cap}) must be at least its base ({self.base})")

    def ceiling(self, attempt: int) -> float:
        """The most the draw for retry ``attempt`` (0 for the first retry) can be."""
        return min(self.cap, self.base * 2.0 ** min(max(attempt, 0), 60))

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait before retry ``attempt`` (0 for the first), with no deadline."""
        return (rng or random).random() * self.ceiling(attempt)

    def delay_within(
        self, attempt: int, *, now: float, deadline: float | None, rng: random.Random | None = None
    ) -> float | None:
        """Seconds to wait before retry ``attempt``, or None when no try fits before ``deadline``.

        A draw that would carry the next try past the deadline is cut short so
        that one last try goes :data:`LAST_TRY_MARGIN` before it. After that try
        there is no room left and the answer is None. So an operation keeps
        trying until its deadline instead of stopping early on an unlucky draw,
        and never sleeps past it. ``now`` and ``deadline`` are on one clock.
        """
        drawn = self.delay(attempt, rng)
        if deadline is None:
            return drawn
        room = deadline - LAST_TRY_MARGIN - now
        if room < MIN_ROOM:
            return None
        return min(drawn, room)


#: The policy of storage retries and renewals: 0.1 s doubling to 2 s.
RETRY = Backoff(base=0.1, cap=2.0)
