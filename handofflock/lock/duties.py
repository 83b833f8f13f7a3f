"""The scheduler's adapter: one lock's background duties, as :class:`~.scheduler.Scheduled` wants them.

The scheduler sees a lock through this object only: its store and key (to
group waiter checks), its check interval, how long one of its requests may
take, when its next duties fall due, and two ways to run them. The lock hands
it exactly what that takes (its state and lease, and its notifier, each read
through a callable, since a forked child replaces them; and its transitions)
and nothing else, each bound through a weak reference so that the scheduler
never keeps a lock alive (see :mod:`.lifetime`), as python-redis-lock gives
its renewer a weak reference and an event rather than the whole lock. Which
duty is due, and so which transition runs, is decided here from the lease's
due times; what each transition does stays with the lock (:mod:`.handoff`).
It also knows which scheduler runs the lock (the process-wide one unless the
lock was given its own), so adding the lock to it and taking it off are one
call each.

A seam because the scheduler runs many locks on a few threads and must
touch none of their state: everything crosses here, typed.
"""

from __future__ import annotations

from collections.abc import Callable

from ..core.clock import Clock
from ..storage.base import Storage
from .lease import Lease
from .notifier import Notifier
from .scheduler import Scheduler, default_scheduler
from .state import State


class Duties:
    """A lock as its scheduler sees it (:class:`~.scheduler.Scheduled`): its duties, nothing else."""

    __slots__ = (
        "_check_waiter",
        "_clock",
        "_deadline_passed",
        "_describe",
        "_hold",
        "_notifier",
        "_renew",
        "_retry_release",
        "check_interval",
        "key",
        "request_timeout",
        "scheduler",
        "store",
    )

    def __init__(
        self,
        scheduler: Scheduler | None,
        *,
        store: Storage,
        key: str,
        check_interval: float,
        request_timeout: float,
        clock: Clock,
        hold: Callable[[], tuple[State, Lease]],
        notifier: Callable[[], Notifier | None],
        renew: Callable[[], None],
        check_waiter: Callable[[int | None], None],
        retry_release: Callable[[], None],
        deadline_passed: Callable[[], None],
        describe: Callable[[], str],
    ) -> None:
        #: Which scheduler runs these duties (None: the process-wide one, made when first needed).
        self.scheduler = scheduler
        self.store, self.key, self.check_interval = store, key, check_interval
        #: How long one request for the lock may take (its Timing.request_timeout): a listing's bound.
        self.request_timeout = request_timeout
        self._clock, self._hold, self._notifier = clock, hold, notifier
        self._renew, self._check_waiter, self._retry_release = renew, check_waiter, retry_release
        self._deadline_passed, self._describe = deadline_passed, describe

    def next_due(self, *, check: bool = True) -> float:
        """Monotonic time of the lock's next duty (inf if none): a renewal, the end of the lease's
        validity (it is lost then), a waiter check, a release retry, or signals to send (at once)."""
        state, lease, notifier = *self._hold(), self._notifier()
        if notifier is not None and notifier.unsent:
            return float("-inf")
        if state is State.RELEASING:
            return lease.next_release_try
        if state is not State.HELD:
            return float("inf")
        if not lease.within(self._clock):  # a suspend ran it out: monotonic time does not know
            return float("-inf")
        due = min(lease.next_renew, lease.valid_until)
        return min(due, lease.next_check) if check else due

    def next_due_besides_check(self) -> float:
        """Like :meth:`next_due` without the waiter check, which a scheduler may batch across locks."""
        return self.next_due(check=False)

    def next_check_at(self) -> float:
        """When the next waiter check falls due: never while the lock is not held (releasing, say), when a
        check does nothing. (A past time then had the scheduler start a check that returned at once and
        woke it to start another: a busy loop for as long as a release was being retried.)"""
        state, lease = self._hold()
        return lease.next_check if state is State.HELD else float("inf")

    def run_due(self) -> None:
        """Do whatever is due: the loss at the renew deadline, a renewal, a waiter check or a release
        retry (one of them); then hand the signals to the notifier."""
        now, (state, lease) = self._clock.monotonic(), self._hold()
        if state is State.HELD:
            if not lease.within(self._clock):  # monotonic time, or boot time (a host suspend counts)
                self._deadline_passed()
            elif now >= lease.next_renew:
                self._renew()  # never waits for the write gate: a deferred renewal leaves the check due next
            elif now >= lease.next_check:
                self._check_waiter(None)
        elif self._hold()[0] is State.RELEASING and now >= lease.next_release_try:
            self._retry_release()
        self._notify()

    def check_against(self, generation: int) -> None:
        """A waiter check against a scheduler's listing that shows the object at ``generation`` (0: not listed)."""
        self._check_waiter(generation)
        self._notify()

    def _notify(self) -> None:
        notifier = self._notifier()
        if notifier is not None:  # None: the lock was collected
            notifier.notify()

    def __repr__(self) -> str:
        return f"<duties of {self._describe()}>"

    @property
    def notify_inline(self) -> bool:
        """Whether the scheduler is run by hand, so signals are sent in its caller (see Scheduler)."""
        return bool(getattr(self.scheduler, "notify_inline", False))

    def schedule(self) -> None:
        """Have the scheduler run these duties (the process-wide scheduler unless one was given)."""
        if self.scheduler is None:
            self.scheduler = default_scheduler()
        self.scheduler.add(self)

    def unschedule(self) -> None:
        """Stop running these duties (they may still be running now)."""
        if self.scheduler is not None:
            self.scheduler.discard(self)
