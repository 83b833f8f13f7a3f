"""What a caller reads of a lock, and asks of it, without I/O and without its mutex.

A base of :class:`~handofflock.lock.handoff.HandoffLock`, as :class:`.options.TimingViews`
is: the properties a training loop polls between steps (``is_held``, ``healthy``,
``release_requested``, ``token``), ``check()``, ``steps()`` and ``request_release()``,
which a signal handler may call. Each reads plain attributes that the lock's
transitions write atomically (the state, the lease, the request book), so none
takes a lock and none can block behind a renewal; the transitions themselves stay
in :mod:`.handoff`. Kept apart so that the state machine reads as transitions.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NoReturn, TypeVar

from ..core.clock import Clock
from ..core.protocol import Me
from ..core.timing import Timing
from ..storage import Storage
from . import messages
from .lease import Lease
from .record_io import RecordIO
from .requests import RequestBook, checked_request
from .state import State
from .steps import Steps
from .types import ReleaseRequest, RequestReason

T = TypeVar("T")


class LockViews:
    """The no-I/O surface of a lock (see the module): reads of its state, lease and requests."""

    url: str
    timing: Timing
    _state: State
    _lease: Lease
    _book: RequestBook
    _io: RecordIO
    _me: Me
    _clock: Clock
    _pid: int

    def __copy__(self) -> NoReturn:
        # A copy would share this party's lease and requests but have a life of its own: collected,
        # it would release (lifetime.py) the lock the original still holds and renews.
        raise TypeError(
            f"a {type(self).__name__} is one party of the lock (its id, lease and renewals): it cannot be "
            "copied or pickled; share the instance, or make a new one for another party"
        )

    def __deepcopy__(self, memo: object) -> NoReturn:
        self.__copy__()

    def __reduce_ex__(self, protocol: object) -> NoReturn:
        self.__copy__()

    @property
    def storage(self) -> Storage:
        """The store holding the lock object (fenced objects beside the lock live there too)."""
        return self._io.storage

    @property
    def key(self) -> str:
        """The lock object's key inside :attr:`storage`."""
        return self._io.key

    @property
    def token(self) -> int | None:
        """The fencing token of the current (or last) hold; None before the first."""
        return self._lease.token

    @property
    def release_requested(self) -> bool:
        """True while a release request stands (a waiter, a signal, a preemption notice, an operator)."""
        return self._book.release_requested

    @property
    def release_request(self) -> ReleaseRequest | None:
        """The most urgent request that stands (earliest deadline), or None."""
        return self._book.release_request

    @property
    def give_up_budget(self) -> float:
        """How long giving back the waiter slot (after a timeout, cancel or error) may take: a read
        and an urgent write, each allowed a retry. acquire() returns within its timeout plus this."""
        return max(2.0, 2 * self.timing.min_write_interval + 1.0)

    @property
    def instance(self) -> str:
        """This lock object's random id, written beside ``owner_id``: it tells twins sharing an ``owner_id`` apart."""
        return self._me.instance or ""

    @property
    def is_held(self) -> bool:
        """True from a successful acquire until release or loss. No I/O."""
        return self._state is State.HELD

    @property
    def healthy(self) -> bool:
        """True while the lock is held and renewed recently enough to be safe. No I/O.

        False once ``renew_deadline`` has passed since the last successful renewal, even if the background
        thread has not run yet (the process was stopped, or the host suspended): counted on the monotonic
        clock and on one that counts a suspend, with the wall clock as a second opinion (:meth:`.Lease.healthy`).
        """
        return self._state is State.HELD and self._lease.healthy(self._clock)

    def check(self) -> None:
        """Raise :class:`LockLost` unless the lock is held and healthy: call it before each unit of work. No I/O."""
        if not self.healthy:
            lease = self._lease
            raise messages.not_healthy(self.url, self._state, lease.lost_reason, self.timing.renew_deadline, self._pid)

    def steps(self, iterable: Iterable[T]) -> Steps[T]:
        """Iterate ``iterable`` until a release is requested: the yield-to-checkpoint idiom (:mod:`.steps`).

        No I/O per step; raises :class:`LockLost` before a step if the lock is no longer safely held.
        """
        return Steps(self, iterable)

    def request_release(
        self,
        reason: RequestReason | str = RequestReason.OPERATOR,
        *,
        requester: str | None = None,
        deadline: float | None = None,
    ) -> None:
        """Ask the holder of this instance to release, as a waiter would.

        Safe in a signal handler: it only assigns attributes; ``on_release_requested`` is sent from
        the scheduler thread. The most urgent request (earliest deadline) is kept. ``reason`` is a
        :class:`RequestReason` or its value (``"manual"``, the old name of ``"operator"``, is deprecated).
        """
        why = checked_request(reason, deadline)
        self._book.request(why, requester or why.value, deadline)
