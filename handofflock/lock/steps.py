"""The yield-to-checkpoint idiom: ``for step in lock.steps(...)``.

A training loop asks two questions before each step: may I still work (the
lease is held and was renewed recently enough), and does anybody want the lock
(a waiter, a signal, a preemption notice)? :class:`Steps` asks both without I/O
and without taking a lock, so it costs well under a microsecond per step; the
background scheduler keeps the answers fresh.

>>> with HandoffLock(url) as lock:
...     steps = lock.steps(range(resume_from(), total))
...     for step in steps:
...         train(step)
...     if steps.last is not None:
...         save_checkpoint(steps.last, fence=lock.token)
...     # leaving the block hands the lock to the waiter, if there is one

The loop ends after the step in progress finishes, never in the middle of one:
``steps.last`` is then the last step completed, and the next owner resumes at
the item after it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Generic, Protocol, TypeVar

from .types import ReleaseRequest

T = TypeVar("T")


class Checked(Protocol):
    """What :class:`Steps` asks of a lock before each step (a :class:`~handofflock.lock.handoff.HandoffLock`)."""

    def check(self) -> None: ...

    @property
    def release_requested(self) -> bool: ...

    @property
    def release_request(self) -> ReleaseRequest | None: ...


class Steps(Generic[T]):
    """Iterate ``iterable`` while ``lock`` is held and nobody asked for it.

    Before handing out each item it calls ``lock.check()``, which raises
    :class:`~handofflock.LockLost` if the lock is no longer safely held (work
    done past that point is unprotected), then stops, without taking the
    item, as soon as ``lock.release_requested`` is True.

    After the loop:

    * ``last``: the last item handed out (so, the last step completed), or
      None if none was;
    * ``count``: how many items were handed out;
    * ``stopped``: True if the loop ended because a release was requested,
      False if the iterable ran out;
    * ``request``: the :class:`~handofflock.ReleaseRequest` that stopped it.
    """

    __slots__ = ("_items", "count", "last", "lock", "request", "stopped")

    def __init__(self, lock: Checked, iterable: Iterable[T]) -> None:
        self.lock = lock
        self.last: T | None = None
        self.count = 0
        self.stopped = False
        self.request: ReleaseRequest | None = None
        self._items = iter(iterable)

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        lock = self.lock
        lock.check()  # raises LockLost: never start a step without the lock
        if lock.release_requested:
            self.stopped = True
            self.request = lock.release_request
            raise StopIteration
        item = next(self._items)  # StopIteration here means the work is done
        self.last = item
        self.count += 1
        return item

    def __repr__(self) -> str:
        return f"<Steps last={self.last!r} count={self.count} stopped={self.stopped}>"
