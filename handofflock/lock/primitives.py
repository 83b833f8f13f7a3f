"""The concurrency primitives a lock is built from: mutexes, events, thread-locals, thread starts.

A seam, as ``clock=`` is: :class:`~handofflock.lock.handoff.HandoffLock` and
its parts create every mutex, event, thread-local and thread through one
:class:`Primitives` value, whose default is the :mod:`threading` module. A
deterministic simulation passes its own (a mutex that yields to its
scheduler, an event whose ``wait`` parks a greenlet, a thread start that
spawns one) exactly where the real ones plug in, instead of patching the
lock's private attributes after it was made, as TigerBeetle builds a replica
from the simulated parts it is given.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol


class Mutex(Protocol):
    """What the lock needs of a mutex: ``threading.Lock``'s shape."""

    def acquire(self, blocking: bool = ..., timeout: float = ...) -> bool: ...

    def release(self) -> None: ...

    def __enter__(self) -> bool: ...

    def __exit__(self, *exc: Any) -> None: ...


def start_daemon_thread(target: Callable[[], None], name: str) -> None:
    """Run ``target`` on a new daemon thread called ``name`` (interpreter exit never waits for it)."""
    threading.Thread(target=target, name=name, daemon=True).start()


@dataclass(frozen=True)
class Primitives:
    """Factories for the lock's mutexes, events and thread-locals, and how it starts a thread.

    ``event`` makes a :class:`threading.Event` (or a subclass: a
    :class:`~handofflock.core.clock.Clock` waits on it). ``start_thread``
    runs a callable in the background (the notifier) and returns at once.
    """

    mutex: Callable[[], Mutex] = threading.Lock
    event: Callable[[], threading.Event] = threading.Event
    local: Callable[[], threading.local] = threading.local
    start_thread: Callable[[Callable[[], None], str], None] = start_daemon_thread


#: The real ones: :mod:`threading`.
THREADING = Primitives()
