"""The request book: who wants the lock now, the most urgent request, and the waiter's own request.

A release request comes from a waiter (the owner's check saw it), a signal
handler, a preemption notice or an operator; several may stand at once, and
``release_request`` is the most urgent. A waiter's request goes away with the
waiter (it left, its slot expired, another took it); a signal's stays for the
hold. Each new request and each withdrawal is queued, in order, as a signal
(``queue``: the notifier's, which sends them off the renewal path).

Requests arrive from places the lock's transitions do not control (a signal
handler may add one while the scheduler thread withdraws another): the book is
written so that such a race never hides a request, and it never takes a lock
(a signal handler calls :meth:`RequestBook.request`).
A hold that ends, however it ends, takes its requests with it
(:meth:`RequestBook.end_hold`).

A holder that does not yield (``yields=False``: ``yield_to_requests=False``,
``handofflock run --no-yield``) notes each waiter's request and declines it:
no request stands for it, so ``release_requested`` stays False and no
``on_release_requested`` is sent; the renewal writes the decline into the
record (``declinedWaiter``) for others to see. A signal's, a preemption
notice's or an operator's request is this process's own and still stands.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

from ..core.clock import Clock
from ..core.errors import ConfigurationError
from ..core.protocol import WaiterSeen
from ..core.record import LockRecord, WaiterRequest
from . import events as signals
from .logfields import Described, LockLog, weakly
from .types import ReleaseRequest, RequestReason


def checked_request(reason: RequestReason | str, deadline: float | None) -> RequestReason:
    """``reason`` as a :class:`RequestReason` (``"manual"`` with a DeprecationWarning); refuse a bad deadline."""
    if reason == "manual":
        warnings.warn(
            'request_release("manual") is deprecated: use RequestReason.OPERATOR ("operator")',
            DeprecationWarning,
            stacklevel=3,
        )
        reason = RequestReason.OPERATOR
    try:
        why = RequestReason(reason)
    except ValueError:
        choices = ", ".join(repr(r.value) for r in RequestReason)
        raise ConfigurationError(f"release request reason must be one of {choices}, got {reason!r}") from None
    if deadline is not None and (
        isinstance(deadline, bool) or not isinstance(deadline, (int, float)) or not math.isfinite(deadline)
    ):
        raise ConfigurationError(f"release request deadline must be a finite Unix time or None, got {deadline!r}")
    return why


def acquire_request(blocking: object, timeout: object, request_release: object, priority: object) -> WaiterRequest:
    """Check ``acquire()``'s arguments before any I/O; what we would ask as waiter. ``timeout=-1`` is no timeout."""
    if not isinstance(blocking, bool):
        raise ConfigurationError(f"blocking must be True or False, got {blocking!r}")
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
            raise ConfigurationError(f"timeout must be a number of seconds or None, got {timeout!r}")
        if not (timeout >= 0 or timeout == -1):  # also refuses NaN
            raise ConfigurationError(f"timeout must be >= 0, -1 (no timeout, as filelock) or None, got {timeout!r}")
        if not blocking and timeout != -1:  # -1 is threading.Lock.acquire's own default: no timeout
            # threading.Lock.acquire refuses this too: a non-blocking acquire never waits.
            raise ConfigurationError(
                f"blocking=False never waits, so timeout={timeout!r} would be ignored: pass one or the other"
            )
    return WaiterRequest(request_release, priority)  # type: ignore[arg-type]  # checked there


def most_urgent(requests: list[ReleaseRequest]) -> ReleaseRequest | None:
    """The request with the earliest deadline (one without a deadline last; the first of equals)."""
    return min(requests, key=lambda request: (request.deadline is None, request.deadline or 0.0), default=None)


#: The reasons whose requests are for the process, not the hold: they outlive a hold that was lost.
_FOR_THE_PROCESS = (RequestReason.SIGNAL, RequestReason.PREEMPTION)


class RequestBook:
    """The requests that stand for ``lock``. Plain attributes, each written atomically: no lock taken.

    ``queue`` queues a signal of the lock (its notifier's); ``yields``: whether a waiter's request stands.
    The book reaches its lock weakly: a part of the lock never keeps it alive.
    """

    def __init__(self, lock: Described, clock: Clock, queue: Callable[..., None], *, yields: bool) -> None:
        self._lock, self._clock, self._queue, self._yields = weakly(lock), clock, queue, yields
        self._owner_id, self._url = lock.owner_id, lock.url
        self._log = LockLog("handofflock.renew", lock)
        self.end_hold()
        self._notified: set[str] = set()  # waiters already announced while we hold the lock

    def end_hold(self, *, lost: bool = False) -> None:
        """A hold is over: a release request belonged to it and goes with it, answered by the release or the
        handoff. A hold that was ``lost`` answered none, but a waiter's and an operator's requests were for the
        hold (the lock is free of it now); a signal's and a preemption notice's are for the process, which is
        still going away: they stand for the next hold, as one made while the lock is not held does."""
        kept = [r for r in self._requests if r.reason in _FOR_THE_PROCESS] if lost else []
        self._requests: list[ReleaseRequest] = kept  # the requests that stand (release_request: the most urgent)
        self.release_request: ReleaseRequest | None = most_urgent(kept)
        self.release_requested = bool(kept)
        self._waiter: tuple[tuple[str, str | None], ReleaseRequest] | None = None  # ((waiter id, instance), request)

    @property
    def release_requests(self) -> tuple[ReleaseRequest, ...]:
        """Every request that stands, in the order noted (:attr:`release_request` is the most urgent)."""
        return tuple(self._requests)

    def new_hold(self) -> None:
        """We became the owner: every waiter is news again. A request recorded meanwhile (a SIGTERM) stands."""
        self._notified.clear()

    def request(
        self, reason: RequestReason, requester: str, deadline: float | None, label: str | None = None
    ) -> ReleaseRequest:
        """Note a request; the most urgent one (earliest deadline) is :attr:`release_request`."""
        request = ReleaseRequest(reason, requester, deadline, self._clock.time(), label)
        self._requests.append(request)  # first: a withdrawal running meanwhile must see it
        # Only ever the new request, which stands: a recomputation from a copy of the book could
        # store a waiter request that withdraw() removed meanwhile on the scheduler thread.
        current = self.release_request
        if current is None or most_urgent([current, request]) is request:
            self.release_request = request
        self.release_requested = True
        self._queue(
            signals.on_release_requested,
            request=request,
            requester=requester,
            reason=reason,
            deadline=deadline,
            waiter_id=requester,  # deprecated: the requester, whatever the reason (see CHANGELOG)
        )
        return request

    def withdraw(self, request: ReleaseRequest) -> None:
        """A waiter's request went away (it left, or its slot expired): it no longer stands.

        Runs on the scheduler thread while a signal handler may add a request
        in the main thread: the flags are set from what stands, then checked
        again, so a request added meanwhile is never hidden.
        """
        try:
            self._requests.remove(request)
        except ValueError:
            return
        while True:
            standing = list(self._requests)
            self.release_request = most_urgent(standing)
            self.release_requested = bool(standing)
            if len(self._requests) == len(standing):
                break
        self._queue(signals.on_release_withdrawn, request=request, requester=request.requester, reason=request.reason)

    def note_waiter(self, seen: WaiterSeen | None, record: LockRecord | None) -> None:
        """The owner's read of ``record`` saw ``seen`` (or no waiter): announce a new one, withdraw one that has gone.

        A waiter is its id and its instance as the record names it (a waiter
        replaced by another instance under the same id has gone). The observer
        hears of a waiter as it is announced, before its request is noted. No
        record (nothing was read) changes nothing.
        """
        if record is None:
            return
        waiter = None if seen is None else (seen.waiter_id, record.waiter_instance)
        standing = self._waiter
        if standing is not None and standing[0] != waiter:
            # Only a waiter's own request goes with it; a signal's or a preemption notice's stands.
            self._waiter = None
            self._notified.discard(standing[0][0])  # should it come back, it is announced again
            gone = "left" if waiter is None else f"was replaced by {waiter[0]}"
            self._log.info("%s: waiter %s %s; its release request is withdrawn", self._owner_id, standing[0][0], gone)
            self.withdraw(standing[1])
        if seen is not None and waiter is not None and seen.waiter_id not in self._notified:
            self._notified.add(seen.waiter_id)
            lock = self._lock()
            if lock is not None:
                signals.observer.waiter_noticed(lock, record, self._clock.time())
            if not self._yields:
                self._log.info(
                    "%s: %s asks for %s; declined (this holder does not yield)",
                    self._owner_id,
                    seen.waiter_id,
                    self._url,
                )
                return
            self._log.info("%s: %s is waiting for %s", self._owner_id, seen.waiter_id, self._url)
            label = None if record.waiter_label is None else record.waiter_label.text
            request = self.request(RequestReason.WAITER, seen.waiter_id, seen.deadline, label)
            self._waiter = (waiter, request)
