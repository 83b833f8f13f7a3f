"""The re-entry guard: a release from a signal handler, inside the library, is deferred, not deadlocked.

``release()`` may be called from a signal handler that interrupted this very
thread inside the library (inside ``acquire()``, holding the I/O mutex, even
inside an Event's own lock). Taking any lock there could deadlock, so such a
call only sets a flag, and the outermost call carries the release out on its
way out; callbacks registered meanwhile (a second signal that must kill the
process after the release) run after it.

It is the one part of the lock that must work from a signal handler: it only
assigns attributes. The depth is per thread (a thread-local from the lock's
:class:`~handofflock.lock.primitives.Primitives`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from .primitives import Primitives

T = TypeVar("T")


class ReentryGuard:
    """Counts how deep this thread is in the lock's public operations; defers a re-entrant release.

    ``release()`` is what the outer call runs when a release was deferred (the
    lock decides whether there is anything to release).
    """

    def __init__(self, primitives: Primitives, release: Callable[[], Any]) -> None:
        self._tls = primitives.local()
        self._release = release
        #: A release was asked for from inside the library; the outermost call will carry it out.
        self.deferred = False
        self._after: list[Callable[[], Any]] = []

    def run(self, fn: Callable[[], T], *, deferrable: bool = False) -> T:
        """Run a public operation; a re-entrant ``deferrable`` one (a release) is deferred instead."""
        depth = getattr(self._tls, "depth", 0)
        if depth and deferrable:
            # Only a plain assignment: this may run in a signal handler that interrupted
            # this very thread inside the library, even inside an Event's own lock, so
            # taking any lock here could deadlock. The outer call acts on the flag (a
            # blocking acquire sees it after its current poll).
            self.deferred = True
            return None  # type: ignore[return-value]
        self._tls.depth = depth + 1
        try:
            return fn()
        finally:
            self._tls.depth = depth
            if depth == 0 and self.deferred:
                self.deferred = False
                try:
                    self._release()
                finally:
                    then, self._after = self._after, []
                    for callback in then:
                        callback()

    def nested(self) -> bool:
        """Whether this thread is inside the lock's operations more than once (a re-entrant call)."""
        return getattr(self._tls, "depth", 0) > 1

    def then_after_deferred_release(self, fn: Callable[[], Any]) -> bool:
        """Run ``fn`` once the release deferred by a signal handler has run; False if none is deferred.

        For a handler that must act after the release (a second signal that
        kills the process): called from the handler, in the thread it interrupted.
        """
        if not self.deferred:
            return False
        self._after.append(fn)
        return True
