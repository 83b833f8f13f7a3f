"""Time, from one injectable object.

Wall time (``time()``) goes into records, because other machines read them.
Monotonic time (``monotonic()``) measures intervals and deadlines inside this
process, because the wall clock can jump. Tests pass a :class:`FakeClock` and
advance it instead of sleeping.
"""

from __future__ import annotations

import threading
import time as _time

_REAL_TIMEBASE = "time.monotonic"


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

    @property
    def timebase(self) -> object:
        """What ``monotonic()`` readings may be compared across: every real clock shares one.

        A clock that keeps its own monotonic time (a fake one) is its own timebase.
        """
        return _REAL_TIMEBASE if type(self).monotonic is Clock.monotonic else self

    def wait(self, event: threading.Event, timeout: float | None) -> bool:
        """Wait for ``event`` at most ``timeout`` seconds; return whether it is set."""
        if timeout is not None and timeout <= 0:
            return event.is_set()
        return event.wait(timeout)

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            _time.sleep(seconds)


class FakeClock(Clock):
    """A clock that moves only when told to. Thread-safe.

    ``wait()`` returns when the event is set or when :meth:`advance` has moved
    the clock past the deadline, so background loops run on test time.
    """

    def __init__(self, start: float = 1_700_000_000.0, monotonic_start: float = 1000.0) -> None:
        super().__init__()
        self._wall = start
        self._mono = monotonic_start
        self._cond = threading.Condition()

    def time(self) -> float:
        with self._cond:
            return self._wall + self.offset

    def monotonic(self) -> float:
        with self._cond:
            return self._mono

    def advance(self, seconds: float) -> None:
        """Move both clocks forward and wake every waiter whose deadline passed."""
        if seconds < 0:
            raise ValueError("a clock does not go backwards")
        with self._cond:
            self._wall += seconds
            self._mono += seconds
            self._cond.notify_all()

    def jump_wall(self, seconds: float) -> None:
        """Move only the wall clock (NTP step), forwards or backwards."""
        with self._cond:
            self._wall += seconds
            self._cond.notify_all()

    def wait(self, event: threading.Event, timeout: float | None) -> bool:
        with self._cond:
            deadline = None if timeout is None else self._mono + timeout
            while not event.is_set():
                if deadline is not None and self._mono >= deadline:
                    return False
                # Real-time poll so an event set from another thread is seen promptly.
                self._cond.wait(0.01)
            return True

    def sleep(self, seconds: float) -> None:
        self.wait(threading.Event(), seconds)
