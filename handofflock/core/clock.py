"""Time, from one injectable object.

Wall time (``time()``) goes into records, because other machines read them.
Monotonic time (``monotonic()``) measures intervals and deadlines inside this
process, because the wall clock can jump. Boot time (``boottime()``) is
monotonic time that also counts while the host is suspended (Linux's
``CLOCK_BOOTTIME``; ``CLOCK_MONOTONIC`` stops then): a lease is checked on it
too, since a suspended host's lease runs out for everyone else. Each
comparison stays on one time base: a boot-time reading is only ever compared
with another (a shim that fakes ``time.monotonic``, as tools/fresh_boot does,
leaves it alone). Tests pass a :class:`~handofflock.testing.clock.FakeClock`
and advance it instead of sleeping.
"""

from __future__ import annotations

import threading
import time as _time

_REAL_TIMEBASE = "time.monotonic"
_BOOTTIME: int | None = getattr(_time, "CLOCK_BOOTTIME", None)  # Linux only


class Clock:
    """The real clock. ``offset`` shifts wall time (to simulate a skewed host)."""

    def __init__(self, offset: float = 0.0) -> None:
        self.offset = offset

    def time(self) -> float:
        """Wall-clock Unix seconds, as written into records."""
        return _time.time() + self.offset

    def monotonic(self) -> float:
        """Seconds on a clock that never jumps; keeps counting while the process is stopped."""
        return _time.monotonic()

    def boottime(self) -> float:
        """Seconds on a clock that never jumps and keeps counting while the host is suspended.

        ``CLOCK_BOOTTIME`` on Linux; elsewhere (and for a clock that keeps its own
        monotonic time, a simulated one) the same as :meth:`monotonic`. Compare it
        only with other ``boottime()`` readings.
        """
        if _BOOTTIME is None or type(self).monotonic is not Clock.monotonic:
            return self.monotonic()
        return _time.clock_gettime(_BOOTTIME)

    @property
    def timebase(self) -> object:
        """What ``monotonic()`` readings may be compared across: every real clock shares one.

        A clock that keeps its own monotonic time (a fake one) is its own timebase.
        """
        return _REAL_TIMEBASE if type(self).monotonic is Clock.monotonic else self

    def wait(self, event: threading.Event, timeout: float | None) -> bool:
        """Wait for ``event`` at most ``timeout`` seconds (none at all for 0 or less); return whether it is set."""
        return event.wait(timeout)

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            _time.sleep(seconds)
