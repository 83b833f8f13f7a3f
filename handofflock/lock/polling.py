"""When a waiting ``acquire()`` reads the record next, and when it gives up: its deadline and its poll rate.

A waiter reads the record one ``waiter_poll_interval`` after its last read *began*, so a
read's own duration does not stretch the period, and no pause runs past the acquire's
deadline. Kept apart so that the acquire loop in :mod:`.handoff` reads as its decisions,
not as arithmetic; the clock is the lock's (monotonic), read as the loop would read it.
"""

from __future__ import annotations

from ..core.clock import Clock
from ..core.timing import Timing


def deadline_of(clock: Clock, timing: Timing, *, blocking: bool, timeout: float | None) -> float | None:
    """When an acquire gives up (monotonic), or None: never. A non-blocking acquire never waits
    for the lock, nor forever for the store: it has ``renew_deadline`` for its reads and write."""
    if timeout is not None:
        return clock.monotonic() + timeout
    return None if blocking else clock.monotonic() + timing.renew_deadline


def pause(clock: Clock, polled: float, interval: float, deadline: float | None) -> float | None:
    """Seconds to wait before the next read: ``interval`` after the read begun at ``polled``,
    sooner at ``deadline``; None once ``deadline`` has passed (the acquire times out)."""
    wait = max(0.0, polled + interval - clock.monotonic())
    if deadline is None:
        return wait
    left = deadline - clock.monotonic()
    return None if left <= 0 else min(wait, left)
