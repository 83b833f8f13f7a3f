"""What ``acquire()`` returns when it got the lock: filelock's ``AcquireReturnProxy`` idiom.

``with lock.acquire(timeout=5):`` must release at the end of the block, as it
does with filelock; a plain ``True`` there raised TypeError *after* taking the
lock and left it held. So a successful acquire returns an :class:`Acquired`:
true, equal to ``True``, and a context manager whose exit is the lock's own
(release, handing off to a waiter). A failed non-blocking acquire still
returns the plain ``False``.

A seam of its own because both locks return one (the async lock's twin is
:class:`handofflock.aio.AsyncAcquired`) and neither needs more of it than this.
"""

from __future__ import annotations

from typing import Any, Generic, Protocol, TypeVar


class _Exits(Protocol):
    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None: ...


L = TypeVar("L", bound=_Exits)


class Acquired(Generic[L]):
    """A successful :meth:`HandoffLock.acquire`: true, ``== True``, and a context manager that releases.

    >>> with lock.acquire(timeout=5):      # as with filelock
    ...     work()                         # released (or handed off) here
    >>> if lock.acquire(blocking=False):   # truthiness as before
    ...     ...

    ``lock.acquire() is True`` no longer holds (no object but ``True`` is
    ``True``); test it for truth, or compare it with ``==``. ``__enter__``
    gives the lock back, as filelock's proxy does.
    """

    __slots__ = ("lock",)

    def __init__(self, lock: L) -> None:
        #: The lock that was acquired.
        self.lock = lock

    def __bool__(self) -> bool:
        return True

    def __eq__(self, other: object) -> bool:
        return True if isinstance(other, Acquired) else bool(other == True)  # noqa: E712

    def __hash__(self) -> int:
        return hash(True)

    def __enter__(self) -> L:
        return self.lock

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.lock.__exit__(exc_type, exc, tb)

    def __repr__(self) -> str:
        return f"<Acquired {self.lock!r}>"
