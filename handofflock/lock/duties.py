"""The scheduler's adapter: one lock's background duties, as :class:`~.scheduler.Scheduled` wants them.

The scheduler sees a lock through this object only: its store and key (to
group waiter checks), its check interval, how long one of its requests may take, when its next duties fall due, and
two ways to run them. The lock hands it exactly those (bound to its own
transitions) and nothing else, as python-redis-lock gives its renewer a
weak reference and an event rather than the whole lock. It also knows which
scheduler runs the lock (the process-wide one unless the lock was given its
own), so adding the lock to it and taking it off are one call each.

A seam because the scheduler runs many locks on a few threads and must
touch none of their state: everything crosses here, typed.
"""

from __future__ import annotations

from collections.abc import Callable

from ..storage.base import Storage
from .scheduler import Scheduler, default_scheduler


class Duties:
    """A lock as its scheduler sees it (:class:`~.scheduler.Scheduled`): its duties, nothing else."""

    __slots__ = (
        "check_against",
        "check_interval",
        "describe",
        "key",
        "next_check_at",
        "next_due",
        "next_due_besides_check",
        "request_timeout",
        "run_due",
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
        next_due: Callable[[], float],
        next_due_besides_check: Callable[[], float],
        next_check_at: Callable[[], float],
        run_due: Callable[[], None],
        check_against: Callable[[int], None],
        describe: Callable[[], str],
    ) -> None:
        #: Which scheduler runs these duties (None: the process-wide one, made when first needed).
        self.scheduler = scheduler
        self.store, self.key, self.check_interval = store, key, check_interval
        #: How long one request for the lock may take (its Timing.request_timeout): a listing's bound.
        self.request_timeout = request_timeout
        self.next_due, self.next_due_besides_check, self.next_check_at = next_due, next_due_besides_check, next_check_at
        self.run_due, self.check_against, self.describe = run_due, check_against, describe

    def __repr__(self) -> str:
        return f"<duties of {self.describe()}>"

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
