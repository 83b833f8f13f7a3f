"""The end of a lock's life: released at interpreter exit, and when it is garbage-collected while held.

A process that ends without ``release()`` (``sys.exit(0)``, an uncaught
exception, the end of a script) would otherwise hold the lock for the whole
ttl, and a lock whose last reference goes would stay held (and, before this
module, renewed forever by the scheduler). flock(1) and filelock free at
exit; so do we, by default, handing off to a waiter as ``release()`` does:

* **At exit**, one ``atexit`` hook releases every lock of this process that
  is still held. ``atexit`` runs after ``threading`` has joined the
  non-daemon threads and before the interpreter stops the daemon ones, so
  the scheduler and the notifier (daemons: exit never waits for them) still
  run while it releases. Hooks registered after this module was imported
  (a checkpoint saved in an ``atexit`` of the program's own) run first.
* **When collected**, :meth:`HandoffLock.__del__` hands the lock to the
  *reaper*, a daemon thread that releases it. Never in ``__del__`` itself:
  a collection runs in whichever thread allocated at that moment (the
  scheduler's, holding its mutex, say), where a release's I/O and mutexes
  could deadlock or stall it; ``__del__`` only puts the lock on a
  ``queue.SimpleQueue``, which is safe there. ``__del__`` rather than a
  ``weakref.finalize`` because a release needs the whole lock (its lease,
  its waiter, its signals), which a finalizer's callback may not refer to;
  the lock is resurrected by the reaper for that one release (PEP 442 calls
  ``__del__`` once). For a held lock to become garbage at all, nothing may
  keep it alive: the scheduler reaches its duties through a weak reference
  (:func:`weakly`), as python-redis-lock's renewer gets one.
* **Not in a forked child.** The forking registry disarms inherited locks
  there (they hold nothing), and each lock remembers the pid that made it:
  a child's exit never releases its parent's lock.
* **Not on** ``os._exit``, SIGKILL, a signal's default action or a crash of
  the interpreter: nothing runs then, and the lease runs out after ttl (plus
  the skew allowance). ``install_signal_handlers`` releases on a second
  signal for that reason.

The opt-out is ``HandoffLock(..., release_at_exit=False)``: the lock then
stays held at exit (until its lease runs out), and one collected while held
is only no longer renewed. A lock on an injected fake clock or injected
primitives (a test, a simulation) defaults to the opt-out: its time is not
the process's, and a release from the reaper would run outside the
simulation's control.
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Concatenate, ParamSpec, Protocol, TypeVar

from ..core.clock import Clock
from ..core.threads import quiet
from .primitives import THREADING, Primitives

_log = logging.getLogger("handofflock.release")

P = ParamSpec("P")
R = TypeVar("R")
D = TypeVar("D")
O = TypeVar("O")  # noqa: E741

#: How long the exit hook waits for a release the reaper is in the middle of.
EXIT_WAIT = 30.0


class Mortal(Protocol):
    """A lock as this module sees it."""

    url: str
    _lifetime: Lifetime

    @property
    def is_held(self) -> bool: ...

    def release(self) -> str | None: ...

    def _unschedule(self) -> None: ...


class Lifetime:
    """One lock's end-of-life settings: whether it releases at exit and when collected, and whose it is."""

    __slots__ = ("pid", "releases")

    def __init__(self, lock: Mortal, release_at_exit: bool | None, *, clock: Clock, primitives: Primitives) -> None:
        if release_at_exit is None:  # real time and real threads: yes; a simulation: no
            release_at_exit = clock.timebase is Clock().timebase and primitives is THREADING
        #: Release at interpreter exit and when collected while held.
        self.releases = bool(release_at_exit)
        #: The process that made the lock: no other process (a forked child) releases it.
        self.pid = os.getpid()
        _LOCKS.add(lock)

    def held(self) -> None:
        """The lock is held now: have the reaper ready (started here, never in a collection)."""
        _Reaper.ensure()

    def collected(self, lock: Mortal) -> None:
        """From ``__del__``: hand a held lock to the reaper. Only a queue put: safe in any collection."""
        if os.getpid() != self.pid or sys.is_finalizing() or not lock.is_held:
            return
        _Reaper.orphans.put((lock, self.releases))


def collected(lock: Mortal) -> None:
    """``HandoffLock.__del__``: a lock whose constructor failed has no lifetime, and nothing to release."""
    lifetime = getattr(lock, "_lifetime", None)
    if lifetime is not None:
        lifetime.collected(lock)


def weakly(owner: O, fn: Callable[Concatenate[O, P], R], default: D) -> Callable[P, R | D]:
    """``fn`` bound to ``owner`` through a weak reference: ``default`` once ``owner`` is gone.

    What the scheduler calls: a duty must not keep its lock alive, or a held
    lock whose last reference went would be renewed for ever.
    """
    ref = weakref.ref(owner)

    def call(*args: P.args, **kwargs: P.kwargs) -> R | D:
        obj = ref()
        return default if obj is None else fn(obj, *args, **kwargs)

    return call


#: Every lock of this process (weakly): those still held at exit are released.
_LOCKS: weakref.WeakSet[Mortal] = weakref.WeakSet()


def _finish(lock: Mortal, release: bool, why: str) -> None:
    try:
        if release and lock.is_held:
            heir = lock.release()
            _log.info("released %s %s%s", lock.url, why, f", handed off to {heir}" if heir else "")
        else:
            lock._unschedule()  # no longer renewed: the lease runs out by itself
    except Exception as exc:  # the end of a lock's life must not raise into the program
        _log.warning("could not release %s %s: %s; it frees itself when its lease runs out", lock.url, why, exc)


class _Reaper:
    """The daemon thread that releases locks collected while held."""

    orphans: queue.SimpleQueue[tuple[Mortal, bool]] = queue.SimpleQueue()
    thread: threading.Thread | None = None
    start_mutex = threading.Lock()
    busy = threading.Lock()

    @classmethod
    def ensure(cls) -> None:
        if cls.thread is not None and cls.thread.is_alive():
            return
        with cls.start_mutex:
            if cls.thread is None or not cls.thread.is_alive():
                cls.thread = threading.Thread(target=quiet(cls._main), name="handofflock-reaper", daemon=True)
                cls.thread.start()

    @classmethod
    def _main(cls) -> None:
        while True:
            lock, release = cls.orphans.get()
            with cls.busy:
                _finish(lock, release, "when its last reference went")
            del lock  # the last reference: collected for good (its __del__ does not run twice)

    @classmethod
    def drain(cls) -> None:
        """At exit: release what is queued here, and wait (bounded) for what the reaper is releasing."""
        while True:
            try:
                lock, release = cls.orphans.get_nowait()
            except queue.Empty:
                break
            _finish(lock, release, "at exit (its last reference had gone)")
        if cls.busy.acquire(timeout=EXIT_WAIT):
            cls.busy.release()

    @classmethod
    def after_fork(cls) -> None:
        """In a forked child: the parent's reaper thread and its queue are not the child's."""
        cls.orphans, cls.thread = queue.SimpleQueue(), None
        cls.start_mutex, cls.busy = threading.Lock(), threading.Lock()


def _at_exit() -> None:
    _Reaper.drain()
    pid = os.getpid()
    for lock in list(_LOCKS):
        lifetime = lock._lifetime
        if lifetime.releases and lifetime.pid == pid and lock.is_held:
            _finish(lock, True, "at exit")


atexit.register(_at_exit)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_Reaper.after_fork)
