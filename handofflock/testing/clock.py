"""A clock that moves only when told to, for deterministic tests of code that takes a :class:`Clock`."""

from __future__ import annotations

import threading
from collections.abc import Callable

from ..core.clock import Clock


class FakeClock(Clock):
    """A clock that moves only when told to. Thread-safe.

    ``wait()`` returns when the event is set or when :meth:`advance` has moved
    the clock past the deadline, so background loops run on test time.

    With ``step`` set, waiting *is* the passage of time, for tests that have no
    other thread to advance the clock: a bounded ``wait()`` advances the clock
    itself, ``step`` seconds at a time, and after each step runs the
    :attr:`on_tick` callbacks (typically ``scheduler.run_pending``), so a lock
    polling in the test's thread and the background duties of other locks
    interleave deterministically. Callbacks are not re-entered: a wait inside a
    callback (a backoff, say) just lets time pass. An unbounded wait raises.

    Every bounded wait asked for is noted in :attr:`waits`, in order (backoffs,
    polls, gates); :meth:`wait_for_waits` lets a test block until a thread has
    begun its n-th one. :attr:`on_wait` callbacks run as each wait begins (a
    test parks a background loop there). :meth:`skewed` gives a view of the
    same clock with a wall time off by some seconds (another host).
    :meth:`jump_wall` steps the wall clock alone (NTP), and :meth:`suspend`
    is a host asleep: wall and boot time move on, monotonic time stands still::

        clock = FakeClock(step=0.25)
        clock.on_tick.append(scheduler.run_pending)
        lock.acquire(timeout=30)     # polls, and the owner's duties run, on simulated time
    """

    def __init__(
        self, start: float = 1_700_000_000.0, monotonic_start: float = 1000.0, *, step: float | None = None
    ) -> None:
        super().__init__()
        if step is not None and not step > 0:
            raise ValueError("step must be a positive number of seconds")
        self._wall = start
        self._mono = monotonic_start
        self._cond = threading.Condition()
        self.step = step
        #: Run after each step of a self-advancing wait (``step`` set).
        self.on_tick: list[Callable[[], object]] = []
        #: Run with the timeout as each wait begins, before it waits.
        self.on_wait: list[Callable[[float | None], object]] = []
        #: Every bounded wait asked for, in order.
        self.waits: list[float] = []
        self._ticking = False
        self._suspended = 0.0

    def time(self) -> float:
        with self._cond:
            return self._wall + self.offset

    def monotonic(self) -> float:
        with self._cond:
            return self._mono

    def boottime(self) -> float:
        """Monotonic time plus every :meth:`suspend` so far."""
        with self._cond:
            return self._mono + self._suspended

    def suspend(self, seconds: float) -> None:
        """The host sleeps ``seconds``: wall and boot time move on, monotonic time does not (as on Linux).

        Nothing runs meanwhile, so no waiter wakes for it: like a resume, the
        next wait or :meth:`advance` finds the time passed.
        """
        if seconds < 0:
            raise ValueError("a clock does not go backwards")
        with self._cond:
            self._wall += seconds
            self._suspended += seconds

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
        for callback in list(self.on_wait):
            callback(timeout)
        if self.step is not None:
            return self._wait_stepping(event, timeout, self.step)
        with self._cond:
            if timeout is not None:
                self.waits.append(timeout)
                self._cond.notify_all()
            deadline = None if timeout is None else self._mono + timeout
            while not event.is_set():
                if deadline is not None and self._mono >= deadline:
                    return False
                # Real-time poll so an event set from another thread is seen promptly.
                self._cond.wait(0.01)
            return True

    def _wait_stepping(self, event: threading.Event, timeout: float | None, step: float) -> bool:
        if event.is_set():
            return True
        if timeout is None:
            raise AssertionError("an unbounded wait would never end on a self-advancing clock")
        with self._cond:
            self.waits.append(timeout)
            self._cond.notify_all()
        end = self.monotonic() + timeout
        while not event.is_set():
            left = end - self.monotonic()
            if left <= 1e-9:
                # A real wait always lets some time pass, however short. Without this, a caller
                # whose deadline is a rounding error away would wait for nothing, again and again.
                self.advance(1e-9)
                return False
            self.advance(min(step, left))
            self.tick()
        return True

    def sleep(self, seconds: float) -> None:
        self.wait(threading.Event(), seconds)

    def tick(self) -> None:
        """Run the :attr:`on_tick` callbacks once (unless already running them)."""
        if self._ticking:
            return
        self._ticking = True
        try:
            for callback in list(self.on_tick):
                callback()
        finally:
            self._ticking = False

    def at(self, when: float, callback: Callable[[], object]) -> None:
        """Run ``callback`` once, at the first tick at or after monotonic time ``when``."""
        done = False

        def once() -> None:
            nonlocal done
            if not done and self.monotonic() >= when:
                done = True
                callback()

        self.on_tick.append(once)

    def run_for(self, seconds: float) -> None:
        """Let ``seconds`` of time pass: ticking as it goes with ``step`` set, else waiting for :meth:`advance`."""
        self.wait(threading.Event(), seconds)

    def wait_for_waits(self, n: int, timeout: float = 10.0) -> None:
        """Block, in real time, until ``n`` bounded waits have begun on this clock (a thread is asleep again)."""
        with self._cond:
            if not self._cond.wait_for(lambda: len(self.waits) >= n, timeout):
                raise TimeoutError(f"only {len(self.waits)} of {n} waits began within {timeout} s")

    def skewed(self, seconds: float) -> Clock:
        """A view of this clock whose wall time is ``seconds`` off: the same monotonic time and waits (another host)."""
        return _SkewedView(self, seconds)


class _SkewedView(Clock):
    """One host's view of a shared :class:`FakeClock`, its wall clock off by ``skew``."""

    def __init__(self, base: FakeClock, skew: float) -> None:
        super().__init__()
        self.base, self.skew = base, skew

    def time(self) -> float:
        return self.base.time() + self.skew

    def monotonic(self) -> float:
        return self.base.monotonic()

    def boottime(self) -> float:
        return self.base.boottime()

    @property
    def timebase(self) -> object:
        return self.base.timebase

    def wait(self, event: threading.Event, timeout: float | None) -> bool:
        return self.base.wait(event, timeout)

    def sleep(self, seconds: float) -> None:
        self.base.sleep(seconds)
