"""The lock's public surface that makes no transition: ``with``, ``status()``, ``cancel()``, release at exit.

A base of :class:`~handofflock.lock.handoff.HandoffLock`, as :class:`.views.LockViews`
is. Each member here either reads the store without keeping anything
(``status()``), or starts a transition the lock carries out (``__enter__`` and
``__exit__`` call ``acquire()`` and ``release()``; ``cancel()`` sets the event an
acquire waits on), or says what happens at the end of the lock's life
(:mod:`.lifetime`). Kept apart so that :mod:`.handoff` reads as the state
machine alone.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from ..core.clock import Clock
from ..core.errors import ConfigurationError, LockLost
from ..core.timing import Timing
from . import lifetime
from .duties import Duties
from .lifetime import Lifetime
from .record_io import RecordIO
from .reentry import ReentryGuard
from .state import State
from .types import LockStatus

_log_release = logging.getLogger("handofflock.release")

T = TypeVar("T")
S = TypeVar("S", bound="LockSurface")


class LockSurface:
    """The no-transition surface of a lock (see the module)."""

    url: str
    owner_id: str
    timing: Timing
    _state: State
    _io: RecordIO
    _clock: Clock
    _policy: Timing
    _cancel: threading.Event
    _guard: ReentryGuard
    _lifetime: Lifetime
    _duties: Duties

    if TYPE_CHECKING:  # the lock's own (its transitions)

        def acquire(self, blocking: bool = True, timeout: float | None = None) -> Any: ...

        def release(self) -> str | None: ...

        def _guarded(self, fn: Callable[[], T], *, deferrable: bool = False) -> T: ...

    def __enter__(self: S) -> S:
        self.acquire()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self._state not in (State.HELD, State.LOST):
            return
        try:
            self.release()
        except LockLost:
            if exc_type is None:
                raise
            _log_release.warning("lock %s had been lost; not masking the exception in flight", self.url)

    def cancel(self) -> None:
        """Stop a blocking ``acquire()`` running in another thread; it gives the waiter slot back.

        Only an acquire that is running is cancelled: a cancel while none runs (or while the lock is
        held) does nothing, so a stray one never spoils the next acquire. To stop an acquire just
        started in another thread, call it again until that thread ends (as ``run`` and the async lock do).
        """
        if self._state == State.WAITING:
            self._cancel.set()

    def status(self, timeout: float = 30.0) -> LockStatus:
        """Read the lock object now and describe it. One read; raises LockRecordCorrupt if bad.

        ``timeout`` bounds the read's retries of transient errors (then the last one is raised).
        """
        if not timeout >= 0:  # also refuses NaN
            raise ConfigurationError(f"timeout must be >= 0, got {timeout!r}")
        # A read only, of nothing this instance keeps: never under the I/O mutex, so a status()
        # that rides out a read outage never holds up a renewal or a waiter check.
        clock, policy, read = self._clock, self._policy, functools.partial(self._io.read, interruptible=True)
        return self._guarded(lambda: LockStatus.of(self.url, *read(clock.monotonic() + timeout), clock.time(), policy))

    def _then_after_deferred_release(self, fn: Callable[[], Any]) -> bool:
        """See :meth:`.reentry.ReentryGuard.then_after_deferred_release` (for :mod:`handofflock.os_signals`)."""
        return self._guard.then_after_deferred_release(fn)

    def _unschedule(self) -> None:
        """Stop the background duties (tests use it to make a process that dies holding the lock)."""
        self._lifetime.releases = False  # a dead process releases nothing, at exit or when collected
        self._duties.unschedule()

    @property
    def release_at_exit(self) -> bool:
        """Whether the lock is released (handed off) at interpreter exit, and when collected while held.

        True by default (False on an injected fake clock); settable. See :mod:`.lifetime`.
        """
        return self._lifetime.releases

    @release_at_exit.setter
    def release_at_exit(self, value: bool) -> None:
        self._lifetime.releases = bool(value)

    def __del__(self) -> None:
        lifetime.collected(self)  # type: ignore[arg-type]  # only queues a held lock for the reaper thread
