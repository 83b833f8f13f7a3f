"""One background thread that renews and checks every lock of the process.

The scheduler asks each registered lock when its next duty is due
(``lock._due()``) and runs the due ones (``lock._run_due()``) on a small fixed
pool of I/O workers, so a slow request for one lock does not hold up the
others, and the thread count does not grow with the number of locks. A duty
that raises is logged and the loop goes on; a lock whose duty is still running
is not started again until it returns.

It also wakes at least every :data:`MAX_IDLE` seconds while it has locks, so a
release request recorded by a signal handler (which may only set attributes)
is announced promptly.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .clock import Clock

_log = logging.getLogger("handofflock.scheduler")

#: Longest sleep while locks are registered (seconds).
MAX_IDLE = 0.2

_default: "Scheduler | None" = None
_default_lock = threading.Lock()


class Scheduler:
    """Runs the background duties of many locks from one thread plus ``io_workers`` workers.

    With ``autostart=False`` no thread is started; tests call :meth:`run_pending`
    to run what is due on their own (fake) clock.
    """

    def __init__(self, clock: Clock | None = None, *, io_workers: int = 4, autostart: bool = True, name: str = "handofflock") -> None:
        self._clock = clock or Clock()
        self._locks: dict[int, Any] = {}
        self._running: set[int] = set()
        self._mutex = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._io_workers = io_workers
        self._autostart = autostart
        self._name = name

    # -- registration ---------------------------------------------------------

    def add(self, lock: Any) -> None:
        with self._mutex:
            self._locks[id(lock)] = lock
        if self._autostart:
            self._ensure_thread()
        self._wake.set()

    def discard(self, lock: Any) -> None:
        with self._mutex:
            self._locks.pop(id(lock), None)

    def __len__(self) -> int:
        return len(self._locks)

    @property
    def threads(self) -> int:
        """Threads this scheduler currently runs (its loop plus live pool workers)."""
        n = 1 if self._thread is not None and self._thread.is_alive() else 0
        if self._pool is not None:
            n += len(getattr(self._pool, "_threads", ()))
        return n

    # -- running --------------------------------------------------------------

    def run_pending(self) -> int:
        """Run every due duty now, in this thread. Returns how many ran."""
        now = self._clock.monotonic()
        with self._mutex:
            due = [lock for lock in self._locks.values() if lock._due() <= now]
        for lock in due:
            self._run_one(lock, track=False)
        return len(due)

    def _ensure_thread(self) -> None:
        with self._mutex:
            if self._thread is not None and self._thread.is_alive():
                return
            self._stop.clear()
            self._pool = self._pool or ThreadPoolExecutor(self._io_workers, thread_name_prefix=f"{self._name}-io")
            self._thread = threading.Thread(target=self._loop, name=f"{self._name}-scheduler", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._wake.clear()
                now = self._clock.monotonic()
                next_due = float("inf")
                to_run = []
                with self._mutex:
                    for key, lock in self._locks.items():
                        if key in self._running:
                            continue
                        due = lock._due()
                        if due <= now:
                            self._running.add(key)
                            to_run.append(lock)
                        else:
                            next_due = min(next_due, due)
                    have_locks = bool(self._locks)
                for lock in to_run:
                    assert self._pool is not None
                    self._pool.submit(self._run_one, lock)
                timeout = None if not have_locks else min(MAX_IDLE, max(0.0, next_due - now))
                self._clock.wait(self._wake, timeout)
            except Exception:  # the loop must not die; say so and go on
                _log.exception("scheduler loop error; continuing")
                self._clock.wait(self._stop, MAX_IDLE)

    def _run_one(self, lock: Any, track: bool = True) -> None:
        try:
            lock._run_due()
        except Exception:
            _log.exception("background duty of %r raised; carrying on", lock)
        finally:
            if track:
                with self._mutex:
                    self._running.discard(id(lock))
                self._wake.set()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread and the workers. Locks still registered stop being renewed."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


def default_scheduler() -> Scheduler:
    """The process-wide scheduler, created on first use."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Scheduler()
        return _default
