"""The concurrency primitives a lock is built from: mutexes, events, thread-locals, thread starts.

:class:`~handofflock.lock.handoff.HandoffLock` and its parts, as they take
time from ``clock=``, create every mutex, event, thread-local and thread through one
:class:`Primitives` value, whose default is the :mod:`threading` module. A
deterministic simulation passes its own (a mutex that yields to its
scheduler, an event whose ``wait`` parks a greenlet, a thread start that
spawns one) exactly where the real ones plug in, instead of patching the
lock's private attributes after it was made, as TigerBeetle builds a replica
from the simulated parts it is given.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from ..core.threads import leave_signals_to_the_main_thread


class Mutex(Protocol):
    """What the lock needs of a mutex: ``threading.Lock``'s shape."""

    def acquire(self, blocking: bool = ..., timeout: float = ...) -> bool: ...

    def release(self) -> None: ...

    def __enter__(self) -> bool: ...

    def __exit__(self, *exc: Any) -> None: ...


class Pool(Protocol):
    """What the scheduler needs of its I/O pool: :class:`~concurrent.futures.ThreadPoolExecutor`'s shape."""

    def submit(self, fn: Callable[[], None], /) -> object: ...

    def shutdown(self, wait: bool = ..., *, cancel_futures: bool = ...) -> None: ...


def thread_pool(workers: int, name: str) -> Pool:
    """Up to ``workers`` threads called ``name``-N, started as jobs need them, that leave signals to the main thread."""
    return ThreadPoolExecutor(workers, thread_name_prefix=name, initializer=leave_signals_to_the_main_thread)


def start_daemon_thread(target: Callable[[], None], name: str) -> None:
    """Run ``target`` on a new daemon thread called ``name`` (interpreter exit never waits for it)."""
    threading.Thread(target=target, name=name, daemon=True).start()


@dataclass(frozen=True)
class Primitives:
    """Factories for the lock's mutexes, events and thread-locals, and how it starts a thread.

    ``event`` makes a :class:`threading.Event` (or a subclass: a
    :class:`~handofflock.core.clock.Clock` waits on it). ``start_thread``
    runs a callable in the background (the notifier, the scheduler's loop)
    and returns at once. The scheduler also takes from here its I/O ``pool``,
    what its loop runs first (``leave_signals``: a real thread blocks the
    asynchronous signals, see :mod:`~handofflock.core.threads`; a simulated
    one shares the main thread and must not) and how it times its own
    planning (``perf_counter``: real CPU time, which a simulation, where
    planning takes no simulated time, replaces with a constant so that a
    seed replays exactly).
    """

    mutex: Callable[[], Mutex] = threading.Lock
    event: Callable[[], threading.Event] = threading.Event
    local: Callable[[], threading.local] = threading.local
    start_thread: Callable[[Callable[[], None], str], None] = start_daemon_thread
    pool: Callable[[int, str], Pool] = thread_pool
    leave_signals: Callable[[], None] = leave_signals_to_the_main_thread
    perf_counter: Callable[[], float] = time.perf_counter


#: The real ones: :mod:`threading`.
THREADING = Primitives()
