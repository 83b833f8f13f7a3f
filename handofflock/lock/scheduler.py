"""One background thread that renews and checks every lock of the process.

The scheduler asks each registered lock when its next duties are due
(``lock.next_due_besides_check()``, ``lock.next_check_at()``) and runs the
due ones (``lock.run_due()``) on a small fixed pool of I/O workers, so a
slow request for one lock does not hold up the others, and the thread count
does not grow with the number of locks. A duty
that raises is logged and the loop goes on; a lock whose duty is still running
is not started again until it returns.

It also wakes at least every :data:`MAX_IDLE` seconds while it has locks, so a
release request recorded by a signal handler (which may only set attributes)
is announced promptly.

When more falls due than the workers can serve (too many locks for the store's
latency), due jobs wait in the scheduler's own queue, not the pool's, and are
served by urgency: renewals (and the lock's other duties) first, the most urgent
lease (the one whose validity ends first) first; waiter checks and group listings
only when no renewal waits. A renewal covers a check anyway: it is conditional on
the generation the lock knew, so it meets any waiter that registered. How late
each renewal starts is measured against its margin (from falling due to the end
of its lease's validity): past :data:`BEHIND_SHARE` of it the scheduler says it
is falling behind, once per episode, with a :class:`RenewalsBehindWarning` and a
log record, and every start is reported to the lock observer (the
``handofflock.renewal.lateness`` metric) and kept in :attr:`Scheduler.lateness`.

Waiter checks are batched. Held locks in one store whose keys share a parent
"directory" (``locks/a.json``, ``locks/b.json``) form a group, checked on one
beat: one listing of the prefix (``{key: generation}``), then a read only of
the objects whose generation is not the one their lock knows. So N quiet locks
cost one request per check interval instead of N. Every member is checked at
each beat, even one not yet due, which keeps the group on one beat; the beat is
the shortest ``waiter_check_interval`` among the members. A member busy
renewing at a beat is covered by the renewal itself: it is a write conditional
on the generation the lock knew, so had a waiter registered it would have
failed and the renewal would have read the record and seen the waiter.

A lone lock keeps its single read (already one request). Keys at the store's
root are never grouped, and a prefix whose listing costs as many pages as it
has members stops being grouped: listing a whole bucket, or a "directory" full
of checkpoint shards, would cost more than the reads it replaces. A listing
refused for good (no ``storage.objects.list`` permission, say) also ends the
grouping of that prefix; a transient failure skips one beat, as a failed read
skips one check.

In money a listing is not a read: GCS bills ``objects.list`` as a Class A
operation, like a write, at about 12.5 times a read (Class B). Grouping saves
requests from two locks on, and money from about thirteen.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import logging
import math
import os
import threading
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from ..core import buggify
from ..core.clock import Clock
from ..core.errors import RenewalsBehindWarning, TransientStorageError
from ..storage.base import Storage
from . import events
from .primitives import THREADING, Pool, Primitives

_log = logging.getLogger("handofflock.lock.scheduler")


class Scheduled(Protocol):
    """What a :class:`Scheduler` runs: one lock's background duties. This is the whole contract.

    Times are on the scheduler's clock (monotonic seconds). A lock hands the
    scheduler an object of this shape that reaches it through a weak reference
    (a scheduler never keeps a lock alive); the scheduler touches nothing else of the lock.
    """

    #: Seconds between waiter checks: the beat of a group of locks checked together.
    check_interval: float
    #: Seconds one request for the lock may take (a listing for its group is held to the shortest).
    request_timeout: float
    #: The store the lock's object lives in (listed once per group beat), and the object's key there.
    store: Storage
    key: str

    def next_due_besides_check(self) -> float:
        """When the next duty but the waiter check (renewal, release retry, loss, signals) falls due; inf if none.

        The waiter check is asked apart (:meth:`next_check_at`): a group beat may do it for many locks at once.
        """
        ...

    def next_check_at(self) -> float:
        """When the next waiter check falls due (inf when the lock is not held)."""
        ...

    def deadline(self) -> float:
        """Until when the lock's hold is safe (its lease's validity; -inf when it holds none).

        The most urgent duty runs first, and a renewal's lateness is measured against it.
        """
        ...

    def run_due(self) -> None:
        """Do whatever is due now. Never blocks on receivers; may do storage I/O."""
        ...

    def check_against(self, generation: int) -> None:
        """A waiter check against a listing that shows the object at ``generation`` (0: not listed: read it).

        May run while :meth:`run_due` runs a renewal: a check never holds one up.
        """
        ...


#: Longest sleep while locks are registered (seconds).
MAX_IDLE = 0.2

#: Default size of the I/O pool. Renewals per second top out near ``io_workers / write latency``:
#: 8 workers at GCS's ~50 ms per write is ~160/s, enough for 1,000 locks at ttl 60 s (133/s).
#: Workers start only as concurrent duties need them; more than 10 outgrow the GCS client's
#: connection pool (urllib3 then warns and drops the extra connections).
IO_WORKERS = 8

#: At most this share of a core goes to planning (see ``_loop``), ...
PLAN_SHARE = 0.1
#: ... by gathering duties that fall due within at most this many seconds into one plan.
MAX_GATHER = 0.05

#: Objects per listing page (GCS's maximum), to estimate what a listing costs.
LIST_PAGE_SIZE = 1000

#: A renewal that starts later than this share of its margin (from falling due to the end of its
#: lease's validity) means the process is falling behind. At half the margin a renewal still has
#: as long again as one request may take (``Timing.request_timeout`` is half the margin): later
#: than that, one stalled request loses the lease. Warned once per episode; the episode ends when
#: a renewal starts within :data:`CAUGHT_UP_SHARE` again.
BEHIND_SHARE = 0.5
CAUGHT_UP_SHARE = 0.25

_default: Scheduler | None = None
_default_lock = threading.Lock()
#: Every live scheduler, so that a forked child can reset those it inherited.
_SCHEDULERS: weakref.WeakSet[Scheduler] = weakref.WeakSet()


class Scheduler:
    """Runs the background duties of many locks from one thread plus ``io_workers`` workers.

    With ``autostart=False`` no thread is started; tests call :meth:`run_pending`
    to run what is due on their own (fake) clock. ``primitives`` make its
    mutex, events, loop thread and I/O pool (:mod:`threading` by default); a
    simulation passes its own, so that its real loop runs on simulated time.
    """

    def __init__(
        self,
        clock: Clock | None = None,
        *,
        io_workers: int = IO_WORKERS,
        autostart: bool = True,
        name: str = "handofflock",
        primitives: Primitives = THREADING,
    ) -> None:
        self._clock = clock or Clock()
        self._prims = primitives
        self._start_empty()
        self._io_workers = io_workers
        self._autostart = autostart
        #: Run by hand (``autostart=False``: tests and simulations), the scheduler's caller also sends
        #: the locks' signals, so a run is deterministic. A live scheduler never does: receivers run on
        #: each lock's notifier thread, off the path that renews (see :mod:`.notifier`).
        self.notify_inline = not autostart
        self._name = name
        _SCHEDULERS.add(self)

    def _start_empty(self) -> None:
        """No locks, no thread, no workers, new mutexes: a new scheduler, and one in a forked child
        (the parent's locks are not the child's, and its threads do not exist there)."""
        self._locks: dict[int, Scheduled] = {}
        self._running: set[int] = set()  # running run_due(): nothing else of theirs is started
        self._checking: set[int] = set()  # in a waiter check, which a due renewal does not wait for
        self._mutex = self._prims.mutex()
        self._wake = self._prims.event()
        self._stop = self._prims.event()
        self._loop_ended: threading.Event | None = None  # set once the loop thread has returned
        self._pool: Pool | None = None
        self._groups: dict[tuple[int, str], _Group] = {}
        self._ungrouped: set[tuple[int, str]] = set()
        # Due jobs waiting for a worker, most urgent first (a heap), under a mutex of their own: a worker
        # taking its next job never waits for the loop's planning, which holds ``_mutex`` over every lock.
        self._queue_mutex = self._prims.mutex()
        self._queue: list[_Job] = []
        self._seq = itertools.count()
        self._workers = 0  # workers taking jobs from the queue now
        self._epoch = 0  # a stopped pool's workers leave without counting
        self.lateness = Lateness()

    # -- registration ---------------------------------------------------------

    def add(self, lock: Scheduled) -> None:
        with self._mutex:
            self._locks[id(lock)] = lock
        if self._autostart:
            self._ensure_thread()
        self._wake.set()

    def discard(self, lock: Scheduled) -> None:
        with self._mutex:
            self._locks.pop(id(lock), None)

    def __len__(self) -> int:
        return len(self._locks)

    @property
    def threads(self) -> int:
        """Threads this scheduler currently runs (its loop plus live pool workers)."""
        n = 1 if self._loop_ended is not None and not self._loop_ended.is_set() else 0
        if self._pool is not None:
            n += len(getattr(self._pool, "_threads", ()))
        return n

    # -- running --------------------------------------------------------------

    def run_pending(self) -> int:
        """Run every due duty now, in this thread. Returns how many jobs ran (a group's beat is one)."""
        now = self._clock.monotonic()
        with self._mutex:
            jobs, _ = self._plan(now, track=False)
        for job in jobs:
            job.run(track=False)
        return len(jobs)

    def _plan(self, now: float, *, track: bool) -> tuple[list[_Job], float]:
        """What to run now, and when the next duty falls due. Called with ``_mutex`` held.

        Returns ``(jobs, next_due)``; each job's ``run`` takes ``track``. With
        ``track`` the locks a job covers are marked running, so they are not
        started again until it returns.
        """
        jobs: list[_Job] = []
        next_due = math.inf
        members: dict[tuple[int, str] | None, list[Scheduled]] = {}
        for lock in self._locks.values():
            members.setdefault(_group_key(lock), []).append(lock)

        for gkey, locks in members.items():
            grouped = gkey is not None and len(locks) > 1 and gkey not in self._ungrouped
            for lock in locks:
                if id(lock) in self._running:
                    continue
                due = lock.next_due_besides_check()
                if due <= now:
                    if track:
                        self._running.add(id(lock))
                    jobs.append(
                        _Job(0, lock.deadline(), next(self._seq), functools.partial(self._run_one, lock), [lock], due)
                    )
                    continue
                if not grouped and id(lock) not in self._checking:
                    # The waiter check is a job of its own: its read may stall, and a renewal that
                    # falls due meanwhile runs beside it instead of waiting for it.
                    check = lock.next_check_at()
                    if check <= now:
                        if track:
                            self._checking.add(id(lock))
                        jobs.append(_Job(1, check, next(self._seq), functools.partial(self._check, lock, 0), [lock]))
                        check = math.inf
                    due = min(due, check)
                next_due = min(next_due, due)
            if not grouped:
                continue
            assert gkey is not None
            group = self._groups.setdefault(gkey, _Group())
            for lock in locks:  # a newcomer is checked no later than it would have been alone
                if id(lock) not in group.members:
                    group.members.add(id(lock))
                    group.next_at = min(group.next_at, lock.next_check_at())
            if group.next_at == math.inf:  # no member held as it joined (releases retried): the first held sets it
                group.next_at = min(lock.next_check_at() for lock in locks)
            if now >= group.next_at and not group.busy:
                batch = [lock for lock in locks if id(lock) not in self._running]
                if not batch:
                    continue  # all busy: the first to finish wakes the loop
                beat, group.next_at = group.next_at, now + min(lock.check_interval for lock in batch)
                group.members = {id(lock) for lock in locks}
                # The beat covers no lock as a whole: its listing may be slow, and a member's
                # renewal must not wait for it. Each member is busy only during its own check.
                group.busy = track
                jobs.append(
                    _Job(1, beat, next(self._seq), functools.partial(self._check_group, gkey, group, batch), [])
                )
            if not group.busy:  # a beat still running (a slow listing) wakes the loop as it ends
                next_due = min(next_due, group.next_at)
        for gkey in [g for g in self._groups if g not in members or len(members[g]) < 2 or g in self._ungrouped]:
            del self._groups[gkey]
        # Forget the verdict on prefixes nobody holds now: a store created later may reuse the
        # id in the key, and the prefix deserves a new look when locks come back to it anyway.
        self._ungrouped.intersection_update(members)
        return jobs, next_due

    def _ensure_thread(self) -> None:
        name = f"{self._name}-scheduler"
        with self._mutex:
            old = self._loop_ended
        # A stop() whose join timed out: that loop is on its way out. Let it finish before
        # starting the next, never two loops at once.
        if old is not None and not old.is_set() and self._stop.is_set() and not old.wait(5.0):
            _log.error("the stopped scheduler loop %s has not ended after 5 s; not starting a second one", name)
            return
        with self._mutex:
            if self._loop_ended is not None and not self._loop_ended.is_set() and not self._stop.is_set():
                return
            self._stop.clear()
            self._pool = self._pool or self._prims.pool(self._io_workers, f"{self._name}-io")
            ended = self._prims.event()

            def run() -> None:
                try:
                    self._prims.leave_signals()
                    self._loop()
                finally:
                    ended.set()

            self._prims.start_thread(run, name)
            self._loop_ended = ended  # only once started: a refused start must leave the next add to try again

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._wake.clear()
                now = self._clock.monotonic()
                cost = self._prims.perf_counter()
                with self._mutex:
                    jobs, next_due = self._plan(now, track=True)
                    have_locks = bool(self._locks)
                cost = self._prims.perf_counter() - cost
                self._dispatch(jobs, now)
                timeout = None if not have_locks else min(MAX_IDLE, max(0.0, next_due - now))
                self._clock.wait(self._wake, timeout)
                # Planning looks at every lock. With many locks, duties falling due a few ms apart
                # are gathered into one plan, so planning takes at most about PLAN_SHARE of a core
                # (with 1,000 locks a duty may start up to ~20 ms late; with a few, microseconds).
                self._stop.wait(min(MAX_GATHER, cost * (1 / PLAN_SHARE - 1)))
            except Exception:  # the loop must not die; say so and go on
                _log.exception("scheduler loop error; continuing")
                self._clock.wait(self._stop, MAX_IDLE)

    def _dispatch(self, jobs: list[_Job], now: float) -> None:
        """Queue ``jobs`` by urgency and start workers for them, at most ``io_workers`` at once; then see
        whether the most urgent renewal still waiting is already late enough to say the process is behind."""
        with self._queue_mutex:
            for job in jobs:
                heapq.heappush(self._queue, job)
            pool = self._pool  # None once stopped: the jobs wait for the next pool
            start = 0 if pool is None else max(0, min(len(self._queue), self._io_workers - self._workers))
            self._workers += start
            epoch, head = self._epoch, self._queue[0] if self._queue else None
        for _ in range(start):
            assert pool is not None
            pool.submit(functools.partial(self._work, epoch))
        share = None if head is None else head.share_late(now)
        if head is not None and share is not None and share >= BEHIND_SHARE:
            self._note_lateness(share, now - head.due, started=False)

    def _work(self, epoch: int) -> None:
        """A worker: take the most urgent queued job and run it, until none is left."""
        while True:
            with self._queue_mutex:
                if epoch != self._epoch:
                    return  # a stopped pool's worker: the next pool counts its own
                if not self._queue or self._stop.is_set():
                    self._workers -= 1
                    return
                job = heapq.heappop(self._queue)
            now = self._clock.monotonic()
            share = job.share_late(now)
            if share is not None:
                self._note_lateness(share, now - job.due, started=True)
            job.run(track=True)

    def _note_lateness(self, share: float, seconds: float, *, started: bool) -> None:
        """A renewal started (or still waits) ``share`` of its margin late: keep the figure, report it, and
        say once per episode that the process is falling behind."""
        with self._queue_mutex:
            before = self.lateness
            behind = share >= BEHIND_SHARE or (before.behind and share > CAUGHT_UP_SHARE)
            if started or share > before.latest:
                self.lateness = Lateness(share, seconds, max(before.worst, share), behind)
            else:
                behind = before.behind
        # The report is not the renewal: an observer that raises, or ``-W error`` turning the warning into
        # an exception, is logged and the renewal still runs (a worker that left here would keep its
        # place in ``io_workers`` and its lock marked running, never renewed again).
        if started:
            try:
                events.observer.renewal_started(self._name, seconds, share)
            except Exception:
                _log.exception("the lock observer's renewal_started raised; carrying on")
        if behind and not before.behind:
            message = (
                f"the handofflock scheduler {self._name!r} is falling behind: a renewal "
                f"{'started' if started else 'is still waiting'} {seconds:.2f} s late, {share:.0%} of its margin "
                f"(from falling due to the end of its lease); {len(self._locks)} locks on {self._io_workers} I/O "
                "workers are more than the store's latency lets it renew. Leases will be lost if it falls further "
                "behind: hold fewer locks per process, give the scheduler more io_workers, or use a longer ttl"
            )
            _log.warning("%s", message)
            try:
                warnings.warn(RenewalsBehindWarning(message), stacklevel=2)
            except Exception:  # a warnings filter that raises: said in the log just above
                _log.debug("RenewalsBehindWarning raised by a warnings filter; carrying on", exc_info=True)
        elif before.behind and not behind:
            _log.info("the handofflock scheduler %r caught up: renewals start within their margin again", self._name)

    def _run_one(self, lock: Scheduled, track: bool = True) -> None:
        try:
            lock.run_due()
        except Exception:
            _log.exception("background duty of %r raised; carrying on", lock)
        finally:
            if track:
                with self._mutex:
                    self._running.discard(id(lock))
                    grouped = _group_key(lock) in self._groups
                # The loop planned its sleep without this lock. Wake it only if the lock's next
                # duty may come before the loop wakes anyway (within MAX_IDLE): with many locks,
                # planning after every finished renewal would cost more than the renewals.
                # (A grouped lock's waiter check is the group's beat, which the loop has planned.)
                due = lock.next_due_besides_check() if grouped else _next_due(lock)
                if due <= self._clock.monotonic() + MAX_IDLE:
                    self._wake.set()

    def _check(self, lock: Scheduled, generation: int = 0, track: bool = True) -> None:
        """A waiter check against a listing's ``generation`` (0: a lone lock's: read it), made while the
        lock's renewals go on. A lone lock's check wakes the loop if its next duty is near (a group's
        beat wakes it as the beat ends)."""
        try:
            lock.check_against(generation)
        except Exception:
            _log.exception("waiter check of %r raised; carrying on", lock)
        finally:
            if track:
                with self._mutex:
                    self._checking.discard(id(lock))
                if not generation and _next_due(lock) <= self._clock.monotonic() + MAX_IDLE:
                    self._wake.set()

    def _check_group(self, gkey: tuple[int, str], group: _Group, batch: list[Scheduled], track: bool = True) -> None:
        """One beat of a group: list the prefix once, then let each lock check against the listing."""
        try:
            storage, prefix = batch[0].store, gkey[1]
            try:
                listing = storage.list(prefix, timeout=min(lock.request_timeout for lock in batch))
            except TransientStorageError as exc:
                _log.debug(
                    "listing %s in %s failed (%s); skipping one waiter check of %d locks",
                    prefix,
                    storage,
                    exc,
                    len(batch),
                )
                return
            except Exception as exc:
                why = "cannot list %r in %s (%s); checking its %d locks one read each from now on"
                self._ungroup(gkey, logging.WARNING, why, prefix, storage, exc, len(batch))
                return
            if math.ceil(len(listing) / LIST_PAGE_SIZE) >= len(batch):
                why = "listing %r in %s returned %d objects for %d locks; checking them one read each from now on"
                self._ungroup(gkey, logging.INFO, why, prefix, storage, len(listing), len(batch))
            for lock in batch[buggify.on(buggify.GROUP_SKIPS_FIRST_LOCK) :]:
                with self._mutex:
                    busy = id(lock) in self._running or id(lock) in self._checking
                    if busy or lock.next_due_besides_check() <= self._clock.monotonic():
                        # Busy, or a renewal (or a loss, or signals) fell due while we listed:
                        # its own job covers it (a renewal that meets a new waiter sees it).
                        continue
                    if track:  # checking, not running: a renewal due during its read runs beside it
                        self._checking.add(id(lock))
                self._check(lock, listing.get(lock.key, 0), track)
        finally:
            if track:
                with self._mutex:
                    group.busy = False
                self._wake.set()

    def _ungroup(self, gkey: tuple[int, str], level: int, why: str, *args: object) -> None:
        """Check the locks under ``gkey``'s prefix one read each from now on, saying why (``why % args``, logged
        at ``level``)."""
        _log.log(level, why, *args)
        with self._mutex:
            self._ungrouped.add(gkey)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread and the workers. Locks still registered stop being renewed."""
        self._stop.set()
        self._wake.set()
        if self._loop_ended is not None and self._loop_ended.wait(timeout):
            self._loop_ended = None  # one still running is remembered: add() must not start a twin
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        with self._queue_mutex:  # queued jobs wait for the next pool, whose workers count afresh
            self._epoch += 1
            self._workers = 0


@dataclass(frozen=True)
class Lateness:
    """How late the scheduler starts renewals, each as a share of its margin (0: on time; 1: its lease ran out).

    ``latest`` is the last renewal started (or the most urgent one still waiting for a worker, if
    later), ``seconds`` that one's lateness in seconds, ``worst`` the largest share since the scheduler
    started, and ``behind`` whether it is falling behind now (past :data:`BEHIND_SHARE`, not yet
    back within :data:`CAUGHT_UP_SHARE`).
    """

    latest: float = 0.0
    seconds: float = 0.0
    worst: float = 0.0
    behind: bool = False


@dataclass(order=True)
class _Job:
    """A due job, queued by urgency: ``rank`` 0 for a lock's duties (renewals), by its lease's end (the
    ``urgency``), and when they fell due (``due``); 1 for waiter checks and group listings, by when they fell
    due (the ``urgency``); then in the order planned."""

    rank: int
    urgency: float
    seq: int
    run: Callable[..., None] = field(compare=False)
    locks: list[Scheduled] = field(compare=False)  # those it covers
    due: float = field(default=math.inf, compare=False)

    def share_late(self, now: float) -> float | None:
        """How much of its margin (from ``due`` to the lease's end) a lock's duty has used by ``now``; None for
        a waiter check or a duty without a margin."""
        if self.rank or not math.isfinite(self.due) or not self.urgency > self.due:
            return None
        return max(0.0, now - self.due) / (self.urgency - self.due)


@dataclass
class _Group:
    """The waiter-check beat of locks sharing a store and a key prefix."""

    next_at: float = math.inf  # the next beat (inf until a member held as it joined sets it)
    members: set[int] = field(default_factory=set)
    busy: bool = False  # a beat is running


def _next_due(lock: Scheduled) -> float:
    """When ``lock``'s next duty, the waiter check included, falls due."""
    return min(lock.next_due_besides_check(), lock.next_check_at())


def _group_key(lock: Scheduled) -> tuple[int, str] | None:
    """``(id(store), "dir/")`` for a lock at ``dir/name``; None at the store's root (never grouped)."""
    parent = lock.key.rpartition("/")[0]
    return (id(lock.store), parent + "/") if parent else None


def default_scheduler() -> Scheduler:
    """The process-wide scheduler, created on first use."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Scheduler()
        return _default


def _reset_after_fork() -> None:
    """In a forked child, every scheduler starts afresh: the threads that ran them exist only in the parent."""
    global _default_lock
    _default_lock = threading.Lock()
    for scheduler in list(_SCHEDULERS):
        scheduler._start_empty()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)
