"""What ``acquire()`` returns when it got the lock: filelock's ``AcquireReturnProxy`` idiom.

``with lock.acquire(timeout=5):`` must release at the end of the block, as it
does with filelock; a plain ``True`` there raised TypeError *after* taking the
lock and left it held. So a successful acquire returns an :class:`Acquired`:
an ``int`` equal to 1 like ``True`` (true, ``== True``, sortable and summable
with booleans), and a context manager whose exit is the lock's own (release,
handing off to a waiter). A failed non-blocking acquire still
returns the plain ``False``.

A seam of its own because both locks return one (the async lock's twin is
:class:`handofflock.aio.AsyncAcquired`) and neither needs more of it than this.
"""

from __future__ import annotations

from typing import Any, Generic, Protocol, TypeVar


class _Exits(Protocol):
    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None: ...


L = TypeVar("L", bound=_Exits)


class Acquired(int, Generic[L]):
    """A successful :meth:`HandoffLock.acquire`: the int 1, like ``True``, and a context manager that releases.

    >>> with lock.acquire(timeout=5):      # as with filelock
    ...     work()                         # released (or handed off) here
    >>> if lock.acquire(blocking=False):   # truthiness as before
    ...     ...

    An ``int`` equal to 1, as ``True`` is, so it is true, ``== True``, sorts,
    sums and hashes as ``True`` does; but ``lock.acquire() is True`` no longer
    holds (no other object is ``True``), and JSON writes it as ``1``. Test it
    for truth, or compare it with ``==``. ``__enter__`` gives the lock back,
    as filelock's proxy does.
    """

    lock: L

    def __new__(cls, lock: L) -> Acquired[L]:
        self = super().__new__(cls, 1)
        #: The lock that was acquired.
        self.lock = lock
        return self

    def __reduce__(self) -> tuple[type[bool], tuple[bool]]:
        # Sent to another process (a pipe, a queue), it is the plain True: the lock stays here.
        return bool, (True,)

    def __enter__(self) -> L:
        return self.lock

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.lock.__exit__(exc_type, exc, tb)

    def __repr__(self) -> str:
        return f"<Acquired {self.lock!r}>"
