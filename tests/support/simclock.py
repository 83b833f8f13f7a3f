"""A FakeClock on which waiting *is* the passage of time, for single-threaded fault tests.

``FakeClock.wait`` blocks until another thread advances the clock; these tests
have no other thread. :class:`SimClock` advances the clock itself, in steps of
at most ``step`` seconds, and after each step runs the ``on_tick`` callbacks
(typically ``scheduler.run_pending``), so a lock polling in the test's thread
and the background duties of other locks interleave deterministically on
simulated time. Callbacks are not re-entered: a wait inside a callback (a
backoff, say) just lets time pass.
"""

from __future__ import annotations

import threading
from typing import Callable

from handofflock.core.clock import FakeClock


class SimClock(FakeClock):
    def __init__(self, step: float = 0.25, **kwargs: float) -> None:
        super().__init__(**kwargs)
        self.step = step
        self.on_tick: list[Callable[[], object]] = []
        self.waits: list[float] = []  # every bounded wait asked for, in order (backoffs, polls, gates)
        self._ticking = False

    def wait(self, event: threading.Event, timeout: float | None) -> bool:
        if event.is_set():
            return True
        if timeout is None:
            raise AssertionError("an unbounded wait would never end in a simulation")
        self.waits.append(timeout)
        end = self.monotonic() + timeout
        while not event.is_set():
            left = end - self.monotonic()
            if left <= 1e-9:
                # A real wait always lets some time pass, however short. Without this, a caller
                # whose deadline is a rounding error away would wait for nothing, again and again.
                self.advance(1e-9)
                return False
            self.advance(min(self.step, left))
            self.tick()
        return True

    def tick(self) -> None:
        """Run the callbacks once (unless already running them)."""
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
        """Let ``seconds`` of simulated time pass, ticking as it goes."""
        self.wait(threading.Event(), seconds)
