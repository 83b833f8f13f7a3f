"""HandoffLock: one party of a single-waiter handoff lock, with every transition it makes.

What each transition writes is :mod:`handofflock.core.protocol`'s decision; the lock
performs it through its record store (:mod:`handofflock.storage.records`) under one I/O
mutex, and keeps what the result means. ``acquire()`` runs in the caller's thread; the
renewal, the waiter check and a release retry run on the scheduler (:mod:`.scheduler`),
which sees the lock through one weak reference (:class:`_Duties`); ``release()`` runs in
any thread, even a signal handler's (:meth:`HandoffLock._guarded` defers it to the outer call).

Beside the class: what ``acquire()`` and ``steps()`` return (:class:`Acquired`,
:class:`Steps`), the errors it raises, worded from the record or its state, and the end
of a lock's life. A process that ends without ``release()`` would hold the lock for the whole ttl, so
a lock still held at interpreter exit is released then (handed to a waiter), an acquire still
waiting then gives its slot back, one whose last reference goes is released by a daemon thread
at once (nothing of the lock's own keeps it alive), and SIGTERM or SIGHUP left at their default
action release it before they act (:mod:`handofflock.os_signals`); a forked child's inherited
locks hold nothing and do nothing.
"""

from __future__ import annotations

import atexit
import functools
import math
import os
import queue
import secrets
import sys
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, Literal, NoReturn, TypeVar

from ..core import buggify, protocol
from ..core.clock import Clock
from ..core.errors import (
    AcquireCancelled,
    AlreadyAcquired,
    ConfigurationError,
    InheritedAcrossFork,
    LockContended,
    LockLost,
    LockRecordCorrupt,
    LockTimeout,
    PreconditionFailed,
    StorageError,
    StorageTimeout,
    TransientStorageError,
)
from ..core.identity import detect_label
from ..core.protocol import Contended, Kind, Lost, Me, Owned, Released, Write
from ..core.record import Forward, Label, LockRecord, WaiterRequest, id_problem, new_nonce
from ..core.threads import quiet
from ..core.timefmt import when, who
from ..core.timing import MIN_REQUEST_TIME, MIN_ROOM, RETRY, Timing, requests_by
from ..storage import Storage, open_url
from ..storage.records import RecordStore, default_write_interval
from . import events as signals
from .logfields import LockLog
from .notifier import Notifier
from .primitives import THREADING, Primitives
from .requests import RequestBook, acquire_request, checked_request
from .scheduler import Scheduler, default_scheduler
from .types import LockStatus, ReleaseRequest, RequestReason, State, default_owner_id

T = TypeVar("T")

IDLE, WAITING, HELD = State.IDLE, State.WAITING, State.HELD
RELEASING, LOST, FORKED = State.RELEASING, State.LOST, State.FORKED

#: How long the exit hook waits for a release the reaper is in the middle of.
EXIT_WAIT = 30.0


def lease_until(record: LockRecord, mono: float, wall: float, timing: Timing) -> float:
    """Monotonic time until which ``record``'s lease is safe for us, ``mono``/``wall`` read together.

    The lease runs to ``expiresAt``; we stop calling it safe the usual
    margin (``ttl - renew_deadline``, in proportion for a lease of another
    length) before that. For a lease we wrote, stamped at its send, this is
    exactly ``send + renew_deadline``: counted from the write that made it.
    Others take the lock only ``max_clock_skew`` after ``expiresAt`` by
    their clocks, which is where the skew allowance is.
    """
    assert record.owner is not None
    left = record.owner.expires_at - wall
    if buggify.on(buggify.LEASE_PAST_ITS_MARGIN):
        return mono + left + timing.max_clock_skew
    length = record.ttl or timing.ttl
    return mono + left - length * (1 - timing.renew_deadline / timing.ttl)


@dataclass
class Lease:
    """What this lock knows of its hold. The defaults are "holds nothing": nothing is due, nothing is valid.

    The record and generation last written or read, the fencing token, until when the hold is
    safe, when the next renewal, waiter check and release retry fall due, how many renewals
    failed in a row, and why the hold was lost. A new hold starts from a new :class:`Lease`, and
    a forked child's lock gets an empty one, so a reset is one assignment (filelock's context
    dataclass). Mutated in place only by the lock's transitions, under its I/O mutex.
    """

    record: LockRecord | None = None
    generation: int = 0
    token: int | None = None
    valid_until: float = -math.inf  # monotonic
    boot_until: float = -math.inf  # the same instant by Clock.boottime(), which counts a host suspend
    wall_until: float = -math.inf  # wall clock: the cached expiresAt less the margin
    next_renew: float = math.inf
    next_check: float = math.inf
    next_release_try: float = math.inf
    renew_failures: int = 0
    lost_reason: str | None = None
    lost_error: BaseException | None = None
    thread: int | None = None  # the thread that acquired this hold (named by a second acquire's error)

    def set(self, record: LockRecord, generation: int, mono: float, wall: float, timing: Timing, clock: Clock) -> None:
        """A write of ours made ``record`` (or we were handed it): the lease runs from its stamp."""
        self.record, self.generation = record, generation
        self.valid_until = lease_until(record, mono, wall, timing)
        # The same instant on the suspend-counting clock: one offset between the two, read now
        # (each comparison later is boot time with boot time, never boot with monotonic).
        self.boot_until = self.valid_until + (clock.boottime() - clock.monotonic())
        self.wall_until = math.inf if buggify.on(buggify.NO_WALL_SECOND_OPINION) else wall + (self.valid_until - mono)
        # Renew when what is left of the validity falls to renew_deadline - renew_interval.
        self.next_renew = self.valid_until - (timing.renew_deadline - timing.renew_interval)
        self.renew_failures = 0

    def known(self, listed: int | None) -> tuple[LockRecord | None, int] | None:
        """The record and generation we know, if a listing that showed the object at generation ``listed``
        (0: not listed) needs no read to settle what the object holds; else None.

        Generations only grow, so a listed generation equal to the one we know
        means the object holds exactly our record: deciding on that is
        deciding on what a read would return. A listed generation below ours
        means the listing is older than our own last write or read of the
        object (a renewal while the group was being listed), which already
        showed it: no read either. A higher one (someone else wrote), or 0
        (not listed), is settled by a read, never by the listing alone.
        """
        if listed is not None and 0 < listed <= self.generation and self.record is not None:
            return self.record, self.generation
        return None

    def within(self, clock: Clock) -> bool:
        """Still safe by the clocks that count time passing: monotonic, and boot time (a suspend counts)."""
        return clock.monotonic() < self.valid_until and clock.boottime() < self.boot_until

    def left(self, clock: Clock) -> float:
        """Seconds the hold stays safe by every clock :attr:`HandoffLock.healthy` counts (monotonic, boot
        time and the wall clock's second opinion): the least of them; not above zero, and it is not healthy."""
        wall = self.wall_until - clock.time()
        return min(self.valid_until - clock.monotonic(), self.boot_until - clock.boottime(), wall)


class HandoffLock:
    """A single-waiter cooperative handoff lock kept as one JSON object.

    >>> lock = HandoffLock("gs://bucket/locks/train.json", ttl=60.0)
    >>> with lock:                      # waits as the single waiter if held
    ...     for step in steps:
    ...         train(step)
    ...         if lock.release_requested:   # a waiter, SIGTERM or preemption asked
    ...             save_checkpoint(fence=lock.token)
    ...             break                    # leaving the block hands the lock over

    Timing (seconds; None: the default of :meth:`Timing.build`): ``ttl`` is the
    lease (60); the owner renews every ``renew_interval`` (ttl/8) and gives the lock
    up as unhealthy if no renewal succeeded for ``renew_deadline`` (ttl/2). The owner
    reads the record every ``waiter_check_interval`` (2) to notice a waiter; a waiter
    reads it every ``waiter_poll_interval`` (1) and holds its slot for ``waiter_ttl``
    (ttl), refreshing it at half-life. A lease counts as expired for others only
    ``max_clock_skew`` (2) after its ``expiresAt``. ``min_write_interval`` spaces
    writes to the object from this process (1.0 on GCS, whose per-object write rate
    is about 1/s; 0 elsewhere). Or pass them all as one ``timing=``, a :class:`Timing`.

    A blocking acquire that finds another live waiter waits its turn for the slot
    (the oldest waiter of equal rank takes it next; docs/design.md, *Waiting your
    turn*); ``wait_for_slot=False`` makes one without a ``timeout`` raise
    :class:`LockContended` at once instead. ``min_hold`` (30) is how long a holder
    keeps the lock before a waiter's request is acted on: the request is in the record
    at once, ``release_requested`` becomes True only when ``min_hold`` has passed
    since the hold began (a signal, a preemption notice or :meth:`request_release`
    is never held back). With ``yield_to_requests=False``
    the holder must not be cut short: a waiter's request is declined (written to the
    record, shown by ``status`` as "declined"), ``release_requested`` stays False for
    it and no ``on_release_requested`` is sent, as soon as a waiter check sees it; requests of this process's own (a
    signal, a preemption notice, :meth:`request_release`) still stand.

    ``owner_id`` defaults to a fresh ``host:pid:random``; a stable one names the job in the
    record across restarts. Each lock object is its own party all the same: another one with
    the same ``owner_id`` (a restart, or a second job that derived the id) waits for this one's
    lease like anyone, getting it at once when it is released and ``ttl`` + ``max_clock_skew``
    after its last renewal when its holder died without releasing. ``label`` says who this is for
    people (``status`` shows it beside the owner or waiter id): a string, a
    :class:`Label`, or by default what :func:`~handofflock.core.identity.detect_label`
    finds (host, pid, pod, Slurm job, torchrun rank).

    What the lock is built from can be passed in, for tests and simulations: ``clock``
    (wall and monotonic time, waits), ``scheduler`` (what runs the renewals and waiter
    checks; by default one per process), ``storage`` and ``key`` (instead of a URL),
    and ``primitives``, whose factories make every mutex, event, thread-local and
    thread the lock uses (default: :mod:`threading`). ``release_at_exit`` and ``release_on_signal``:
    see the attributes of those names (settable). No I/O happens in the constructor.
    """

    def __init__(
        self,
        url: str | os.PathLike[str],
        *,
        ttl: float | None = None,
        renew_interval: float | None = None,
        renew_deadline: float | None = None,
        waiter_ttl: float | None = None,
        waiter_check_interval: float | None = None,
        waiter_poll_interval: float | None = None,
        max_clock_skew: float | None = None,
        min_write_interval: float | None = None,
        min_hold: float | None = None,
        wait_for_slot: bool | None = None,
        yield_to_requests: bool = True,
        owner_id: str | None = None,
        label: str | Label | None = None,
        clock: Clock | None = None,
        scheduler: Scheduler | None = None,
        storage: Storage | None = None,
        key: str | None = None,
        timing: Timing | None = None,
        primitives: Primitives | None = None,
        release_at_exit: bool | None = None,
        release_on_signal: bool | None = None,
    ) -> None:
        storage, key, self.url = _store_of(url, storage, key)
        given = {
            "ttl": ttl,
            "renew_interval": renew_interval,
            "renew_deadline": renew_deadline,
            "waiter_ttl": waiter_ttl,
            "waiter_check_interval": waiter_check_interval,
            "waiter_poll_interval": waiter_poll_interval,
            "max_clock_skew": max_clock_skew,
            "min_write_interval": min_write_interval,
            "min_hold": min_hold,
        }
        #: The lock's timing, one validated value.
        self.timing = _timing_of(storage, timing, {name: value for name, value in given.items() if value is not None})
        #: None (the default) and True: a blocking acquire that finds another waiter waits for the slot;
        #: False: one without a ``timeout`` raises :class:`LockContended` at once instead.
        self.wait_for_slot: bool | None = None if wait_for_slot is None else bool(wait_for_slot)
        self.owner_id: str = _owner_id_of(owner_id)
        #: Who this is, for people: written beside ``owner_id`` as owner or waiter.
        self.label: Label = _label_of(label)
        # The instance id, random: two instances sharing a stable owner_id are never taken for each other.
        # ``yields``: whether a waiter's request stands for us or is declined (at renewal, in the record).
        self._me = Me(self.owner_id, secrets.token_hex(8), self.label, yields=bool(yield_to_requests))
        self._clock = clock or Clock()
        self._prims = primitives or THREADING
        self._pid = os.getpid()
        real = self._clock.timebase is Clock().timebase and self._prims is THREADING
        # Real time and real threads: yes; a simulation: no (its time and threads are not the process's).
        self.release_at_exit: bool = real if release_at_exit is None else bool(release_at_exit)
        """Whether the lock is released (handed off) at interpreter exit, and when its last reference goes while held.

        True by default (False on an injected fake clock or injected primitives: a simulation's time
        is not the process's); settable (a bool). With False the lock stays held at exit until its
        lease runs out, and one dropped while held is only no longer renewed; with True an acquire still
        waiting at exit (in a daemon thread) is cancelled and gives its waiter slot back. Nothing runs on
        ``os._exit``, SIGKILL or a crash: the lease then runs out after ttl (plus the skew allowance).
        """
        self.release_on_signal: bool = real if release_on_signal is None else bool(release_on_signal)
        """Whether SIGTERM and SIGHUP release the lock where their action is the default one.

        True by default (False on an injected fake clock or injected primitives). When a hold begins in
        the main thread while a signal's action is the default (the process would just end), a handler
        is installed that releases every held lock of the process (handed off), puts the default action
        back and raises the signal again: the process ends with the signal's status, as it would have.
        It goes when no lock is held. A handler of anyone else's (:func:`~handofflock.install_signal_handlers`,
        ``handofflock run``, a framework's) is left alone. Settable (a bool); see :mod:`handofflock.os_signals`.
        """
        self._scheduler = scheduler  # None: the process-wide one, taken when the lock is first held
        self._duties = _Duties(self, storage, key)
        self._log_acquire = LockLog("handofflock.acquire", self)
        self._log_renew = LockLog("handofflock.renew", self)
        self._log_release = LockLog("handofflock.release", self)
        self._fresh_parts(IDLE, storage, key)
        _LOCKS.add(self)

    def _fresh_parts(self, state: State, storage: Storage, key: str) -> None:
        """The lock's state and the parts that keep it, new: at construction, and in a forked child
        (where a mutex may have been held by a parent thread that does not exist there)."""
        prims = self._prims
        self._state = state
        self._lease = Lease()  # replaced whole by each new hold; read without the mutex
        #: Serialises this lock's storage operations and the transitions that make them.
        self._mutex = prims.mutex()
        self._io = RecordStore(
            storage,
            key,
            url=self.url,
            clock=self._clock,
            timing=self.timing,
            interrupted=functools.partial(_interrupted, weakref.ref(self)),
            log=self._log_acquire,
        )
        self._cancel = prims.event()
        self._not_acquiring = prims.event()  # set while no acquire() runs (release() waits on it)
        self._not_acquiring.set()
        self._notifier = Notifier(prims, inline=_notifies_inline, name=f"handofflock-notify-{self.owner_id}")
        self._book = RequestBook(self, self._clock, self._notifier.event, yields=self._me.yields)
        # How deep this thread is in the lock's public operations (``depth`` of a thread-local).
        self._depth = prims.local()
        #: A release was asked for from inside the library (a signal handler); the outermost call carries it out.
        self._deferred = False
        self._after_deferred: list[Callable[[], Any]] = []
        self._declined_by: str | None = None  # see declined_by

    def _after_fork(self) -> None:
        """In a forked child: hold nothing, do nothing, refuse every operation. The token goes with
        the lease (the parent's: a fenced write in the child must not carry it)."""
        self._scheduler = None
        self._fresh_parts(FORKED, self._io.storage, self._io.key)

    # -- what a caller reads, without I/O and without the mutex -----------------------------------

    storage = Forward[Storage]("_io.storage")
    """The store holding the lock object (fenced objects beside the lock live there too)."""
    key = Forward[str]("_io.key")
    """The lock object's key inside :attr:`storage`."""
    clock = Forward[Clock]("_clock")
    """The clock the lock keeps time by (wall time for records, monotonic for intervals)."""
    token = Forward[int | None]("_lease.token")
    """The fencing token of the current (or last) hold; None before the first."""
    release_requested = Forward[bool]("_book.release_requested")
    """True while a release request stands (a waiter, a signal, a preemption notice, an operator)."""
    release_request = Forward[ReleaseRequest | None]("_book.release_request")
    """The most urgent request that stands (earliest deadline), or None."""
    release_requests = Forward[tuple[ReleaseRequest, ...]]("_book.release_requests")
    """Every request that stands, in the order noted; they go with the hold once it is released or handed off.
    A hold that was lost answered none: a signal's and a preemption notice's stand for the next hold."""
    declined_by = Forward[str | None]("_declined_by")
    """While this lock waits in the slot: the holder's owner id if it has declined our request (it does
    not yield: ``run --no-yield``), as its waiter check wrote into the record; else None."""

    @property
    def give_up_budget(self) -> float:
        """How long giving back the waiter slot (after a timeout, cancel or error) may take: rounds of a
        read and an urgent write (each allowed a retry; another round after a 412) begun within
        ``max(2, 2 * min_write_interval + 1)`` s (one begun late, after a pause or a 412, still reads:
        the lock may have been handed to us), each round's requests with 1 s at least
        (``core.timing.MIN_REQUEST_TIME``). acquire(timeout=T) returns within T plus this (plus the last
        round's second, should a round begin at the budget's very end): every request before it ends
        by T, cut off there if need be (a T under 1 s still allows its requests 1 s, so ``timeout=0``
        makes its one try)."""
        return max(2.0, 2 * self.timing.min_write_interval + 1.0) + MIN_REQUEST_TIME

    @property
    def instance(self) -> str:
        """This lock object's random id, written beside ``owner_id``: it tells apart lock objects sharing one."""
        return self._me.instance or ""

    @property
    def is_held(self) -> bool:
        """True from a successful acquire until release or loss. No I/O."""
        return self._state is HELD

    @property
    def healthy(self) -> bool:
        """True while the lock is held and renewed recently enough to be safe. No I/O.

        False once ``renew_deadline`` has passed since the last successful renewal, even if the background
        thread has not run yet (the process was stopped, or the host suspended): counted on the monotonic
        clock and on one that counts a suspend (:meth:`Lease.within`).

        The wall clock is a second opinion: it must not have passed the cached ``expiresAt`` less the
        margin, for a host whose boot time misses a suspend (not Linux) or a wall clock set forward:
        either way ``check()`` fails until the next renewal, written from the wall clock as it now is,
        moves ``expiresAt`` on. A wall clock set back never makes a lease look unhealthy (it only
        moves further from ``expiresAt``); the monotonic and boot clocks still end it on time.
        """
        lease = self._lease
        return self._state is HELD and lease.within(self._clock) and self._clock.time() < lease.wall_until

    ttl = Forward[float]("timing.ttl")
    """The lease, in seconds (``timing.ttl``)."""
    renew_interval = Forward[float]("timing.renew_interval")
    """Seconds between renewals (``timing.renew_interval``)."""
    renew_deadline = Forward[float]("timing.renew_deadline")
    """No successful renewal for this long, and the hold is no longer safe (``timing.renew_deadline``)."""
    waiter_ttl = Forward[float]("timing.waiter_ttl")
    """How long a waiter's slot lasts unrefreshed (``timing.waiter_ttl``)."""
    waiter_check_interval = Forward[float]("timing.waiter_check_interval")
    """Seconds between the owner's waiter checks (``timing.waiter_check_interval``)."""
    waiter_poll_interval = Forward[float]("timing.waiter_poll_interval")
    """Seconds between a waiter's polls (``timing.waiter_poll_interval``)."""
    max_clock_skew = Forward[float]("timing.max_clock_skew")
    """How far the clocks of the processes sharing the lock may disagree (``timing.max_clock_skew``)."""
    min_write_interval = Forward[float]("timing.min_write_interval")
    """Spacing of this process's writes to the object, the store's pacing (``timing.min_write_interval``)."""
    min_hold = Forward[float]("timing.min_hold")
    """How long a hold lasts before a waiter's request is acted on (``timing.min_hold``)."""

    def check(self) -> None:
        """Raise :class:`LockLost` unless the lock is held and healthy: call it before each unit of work. No I/O."""
        if not self.healthy:
            reason, deadline = self._lease.lost_reason, self.timing.renew_deadline
            raise _not_healthy(self.url, self._state, reason, deadline, self._pid)

    def steps(self, iterable: Iterable[T]) -> Steps[T]:
        """Iterate ``iterable`` until a release is requested: the yield-to-checkpoint idiom (:class:`Steps`).

        No I/O per step; raises :class:`LockLost` before a step if the lock is no longer safely held.
        """
        return Steps(self, iterable)

    def request_release(
        self,
        reason: RequestReason | str = RequestReason.OPERATOR,
        *,
        requester: str | None = None,
        deadline: float | None = None,
    ) -> ReleaseRequest:
        """Ask the holder of this instance to release, as a waiter would; return the request noted.

        Safe in a signal handler: it only assigns attributes; ``on_release_requested`` is sent from
        the scheduler thread. The most urgent request (earliest deadline) is kept. ``reason`` is a
        :class:`RequestReason` or its value (``"manual"``, the old name of ``"operator"``, is deprecated).
        The request stands, in :attr:`release_requests`, until the hold is released or handed off; one made
        while the lock is not held stands for the next hold, and so does a signal's or a preemption notice's
        once a hold is lost.
        """
        why = checked_request(reason, deadline)
        return self._book.request(why, requester or why.value, deadline)

    def cancel(self) -> None:
        """Stop a blocking ``acquire()`` running in another thread; it gives the waiter slot back.

        Each wait of the acquire (a poll, a retry's backoff, the store's write spacing) ends at the
        cancel; a request under way is not cut short. The slot is then given back within
        ``give_up_budget``.

        Only an acquire that is running is cancelled: a cancel while none runs (or while the lock is
        held) does nothing, so a stray one never spoils the next acquire. To stop an acquire just
        started in another thread, call it again until that thread ends (as ``run`` and the async lock do).
        """
        if self._state == WAITING:
            self._cancel.set()

    def status(self, timeout: float = 30.0) -> LockStatus:
        """Read the lock object now and describe it. One read; raises LockRecordCorrupt if bad.

        ``timeout`` bounds the read and its retries of transient errors (then the last one is raised;
        :class:`~handofflock.core.errors.StorageTimeout` when the time ran out), at least 1 s for the read.
        Never under the I/O mutex: a status() that rides out a read outage never holds up a renewal.
        """
        if not timeout >= 0:  # also refuses NaN
            raise ConfigurationError(f"timeout must be >= 0, got {timeout!r}")
        clock = self._clock

        def read() -> LockStatus:
            now = clock.monotonic()
            record, generation = self._io.read(requests_by(now, now + timeout), interruptible=True)
            return LockStatus.of(self.url, record, generation, clock.time(), self.timing)

        return self._guarded(read)

    def __enter__(self) -> HandoffLock:
        self.acquire()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self._state not in (HELD, LOST):
            return
        try:
            self.release()
        except LockLost:
            if exc_type is None:
                raise
            self._log_release.warning("lock %s had been lost; not masking the exception in flight", self.url)

    def __reduce_ex__(self, protocol: object) -> NoReturn:
        # What copy.copy, copy.deepcopy and pickle all ask. A copy would share this party's lease and
        # requests but have a life of its own: collected, it would release the lock the original holds.
        raise TypeError(
            f"a {type(self).__name__} is one party of the lock (its id, lease and renewals): it cannot be "
            "copied or pickled; share the instance, or make a new one for another party"
        )

    def __repr__(self) -> str:
        return f"<HandoffLock {self.url!r} owner_id={self.owner_id!r} state={self._state.value} token={self.token}>"

    # -- acquire ------------------------------------------------------------------------------------

    def acquire(
        self, blocking: bool = True, timeout: float | None = None, *, request_release: bool = True, priority: int = 0
    ) -> Acquired | Literal[False]:
        """Take the lock. Returns a true :class:`Acquired` when held, else False.

        The value is also a context manager that releases, as with filelock: ``with lock.acquire(timeout=5):``.

        * lock absent, free, or expired with no other live waiter: take it.
        * held by a live owner: become the single waiter; poll until the owner hands it over or its lease expires.
        * another live waiter already: wait outside the slot, polling, and take it when it frees (or from a
          younger waiter of equal rank: those waiting outside take the slot oldest first), then wait for the
          lock. ``wait_for_slot=False`` on the lock, without a ``timeout``, raises :class:`LockContended` at once.

        ``request_release=False`` waits patiently: the holder is never asked (no ``on_release_requested``;
        it finishes on its own, then hands the lock to us). ``priority`` ranks requests for the single
        slot: a higher one takes the slot from a lower one; at equal priority an asking request takes it
        from a patient one, never the reverse.

        ``blocking=False`` never waits and never registers as waiter: it returns False if the lock cannot
        be taken now (transient storage errors are retried for at most ``renew_deadline``); a ``timeout``
        with it is refused, as :meth:`threading.Lock.acquire` refuses it. ``timeout`` bounds the wait; on
        expiry the waiter slot is given back and :class:`LockTimeout` raised, within ``timeout + give_up_budget``
        (each request is cut off at the timeout: a store that does not answer in time is a LockTimeout too).
        ``timeout=-1`` is no timeout (filelock's and :meth:`threading.Lock.acquire`'s "forever").

        Every way out that does not return the lock gives the waiter slot back, and frees a lock it took or
        was handed: a timeout, :meth:`cancel`, a storage error, KeyboardInterrupt. When the lock is returned
        the lease is valid and counted from the write that made it (for a handoff, from the previous owner's
        write, renewed at once if little is left).
        """
        request = acquire_request(blocking, timeout, request_release, priority)
        timeout = None if timeout == -1 else timeout
        got = signals.observer.timed_acquire(
            self,
            self._clock,
            lambda: self._guarded(lambda: self._acquire(blocking, timeout, request), cancelled_by_release=True),
        )
        return Acquired(self) if got else False

    def _acquire(self, blocking: bool, timeout: float | None, request: WaiterRequest) -> bool:
        if self._state in (HELD, WAITING, RELEASING):
            raise _already_acquired(self._state, self.url, self._lease.thread, nested=getattr(self._depth, "n", 0) > 1)
        if self._state == LOST:  # a hold that was lost is over; a signal's request, unanswered, asks the next
            self._end_hold(lost=True)
        clock = self._clock
        # When the acquire gives up (monotonic), or None: never. A non-blocking acquire never waits for
        # the lock, nor forever for the store: it has ``renew_deadline`` for its reads and write.
        deadline = None if blocking else clock.monotonic() + self.timing.renew_deadline
        if timeout is not None:
            deadline = clock.monotonic() + timeout
        # The loop gives up at ``give_up_at``; its requests end by then too, cut off there if need be
        # (one shorter than a round trip still allows one: timeout=0 makes its one try).
        give_up_at, deadline = deadline, requests_by(clock.monotonic(), deadline)
        slot_wait = self.wait_for_slot is not False or timeout is not None or not request.asks  # else Contended raises
        # When this acquire began waiting, written with our slot: at equal rank the oldest waiter has it.
        since = clock.time()
        decide = functools.partial(
            protocol.decide_acquire, me=self._me, timing=self.timing, request=request, since=since
        )
        waiting = sent = False  # sent: a registration may have reached the store (its reply unseen)
        # The generation our last write that may have gone unanswered was conditioned on: cut off at its
        # timeout (no status came back), it may still be applied later, but only while the object stays
        # at that generation (None: no such write). Kept after a 412: the object has moved past it, or
        # (a write found stale as it was sent) an earlier attempt of it may still land.
        unanswered: int | None = None
        last: LockRecord | None = None
        observed: tuple[object, float] = (None, 0.0)  # the owner's lease we decide on, and when we first read it
        # A cancel() set as an earlier acquire ended (it read WAITING, then set) was meant for that one.
        self._cancel.clear()
        self._state = WAITING
        self._not_acquiring.clear()
        if blocking and self.release_on_signal:
            # A waiter killed by SIGTERM would keep the slot, and be handed the lock, until waiter_ttl:
            # the signal gives the slot back first (the wait sees the deferred release at its next poll).
            on_hold(self)
        try:
            if self._cancel.is_set():  # a cancel() that came as we started
                raise AcquireCancelled(f"acquire of {self.url!r} was cancelled")
            polled = clock.monotonic()
            record, generation = self._read_locked(deadline)
            while True:
                last = record or last
                if blocking and not waiting and protocol.registered(record, self._me):
                    waiting = True  # our registration landed though we could not confirm it
                    self._now_waiting(record)
                declined = record is not None and record.declined and protocol.registered(record, self._me)
                self._declined_by = record.owner_id if declined and record is not None else None
                mono, wall = clock.monotonic(), clock.time()
                observed = self._observe(record, wall, observed)
                decision = decide(
                    record, generation, now=wall, nonce=new_nonce(), waiting=waiting, observed_at=observed[1]
                )
                if isinstance(decision, Owned):
                    self._became_owner(
                        decision.record, decision.generation, mono, wall, handoff=True, settle_by=deadline
                    )
                    return True
                takes = isinstance(decision, Write) and decision.kind in (Kind.CREATE, Kind.TAKE, Kind.RETAKE)
                if not blocking and not takes:  # contended, or it would wait: never waits, never registers
                    return self._not_acquired(record)
                if isinstance(decision, Write):
                    # A registration or a take whose reply we may never see: a way out reads the record and
                    # gives back whatever of it landed (the slot, or the lock itself).
                    before = sent
                    sent = sent or takes or decision.kind is Kind.BECOME_WAITER
                    # An earlier write of ours left unanswered at this very generation (found stale as its
                    # retry was sent) may land as well as this one, whatever this one's attempts are told.
                    earlier = unanswered if unanswered == decision.if_generation_match else None
                    try:
                        with self._mutex:
                            unanswered = decision.if_generation_match
                            written, generation, mono, wall = self._io.write(decision, deadline, interruptible=True)
                    except PreconditionFailed:  # moved on (none of ours can land), or found stale as it was sent
                        record, generation = self._read_to_write(deadline, interruptible=True)
                        continue
                    except StorageError as exc:
                        if isinstance(exc, TransientStorageError) and not exc.ambiguous:
                            sent = before  # refused (a 429, a 503 before anything was applied): nothing landed
                        if not exc.may_land_late:  # every attempt was answered: none of this write can land later
                            unanswered = earlier
                        raise
                    unanswered = None
                    record = written.record
                    if takes:  # the attempt that landed is of the decision's kind
                        self._became_owner(record, generation, mono, wall, handoff=False, settle_by=deadline)
                        return True
                    if not waiting:
                        waiting = True  # before the signal: a receiver that raises must find the slot to give back
                        self._now_waiting(record)
                elif isinstance(decision, Contended) and not (slot_wait or waiting):
                    # A waiter displaced by a higher-ranked request waits for the slot again (design.md).
                    raise _contended(LockContended, self.url, decision.record)
                # The next read one poll interval after the last one began (a read's own duration does
                # not stretch the period), never past the deadline.
                pause = max(0.0, polled + self.timing.waiter_poll_interval - clock.monotonic())
                if give_up_at is not None:
                    left = give_up_at - clock.monotonic()
                    if left <= 0:
                        return self._give_up(last, waiting=waiting or sent, timed_out=True, unanswered=unanswered)
                    pause = min(pause, left)
                if self._interrupted(pause):
                    return self._give_up(last, waiting=waiting or sent, timed_out=False, unanswered=unanswered)
                polled = clock.monotonic()
                if give_up_at is not None and give_up_at - polled < MIN_ROOM:  # no time left to read in
                    return self._give_up(last, waiting=waiting or sent, timed_out=True, unanswered=unanswered)
                record, generation = self._read_locked(deadline)
        except BaseException as exc:
            # What stopped a retry, read before giving back (which clears a deferred release): a cancel()
            # or a release from a signal handler is said as such, never as the timeout it cut short.
            interrupted = self._cancel.is_set() or self._deferred
            ran_out = timeout is not None and not interrupted and _ran_out(exc, give_up_at, clock)  # before giving back
            if ran_out and self._state == WAITING:
                # The time ran out in the store: the end of the wait, as below (a handoff that beat it is kept).
                try:
                    return self._give_up(last, waiting=waiting or sent, timed_out=True, unanswered=unanswered)
                except LockTimeout as timed_out:
                    raise timed_out from exc
                except Exception as cleanup:  # the store refused the give-back too: still the timeout, below
                    self._log_acquire.warning(
                        "%s could not give back its waiter slot on %s: %r", self.owner_id, self.url, cleanup
                    )
            if self._state == WAITING:
                # Every way out gives the slot back, or the owner would hand the lock to nobody.
                try:
                    self._leave_slot(last, waiting=waiting or sent, keep=False, unanswered=unanswered)
                except BaseException as cleanup:  # the original error is what the caller must see
                    self._log_acquire.warning(
                        "%s could not give back its waiter slot on %s: %r", self.owner_id, self.url, cleanup
                    )
                if self._state == WAITING:
                    self._state = IDLE
                if isinstance(exc, TransientStorageError) and interrupted:
                    # The retry was interrupted by cancel(): that is what happened.
                    raise AcquireCancelled(f"acquire of {self.url!r} was cancelled") from exc
            if self._state is HELD and not buggify.on(buggify.CANCELLED_KEEPS_HANDED_LOCK):
                # The hold was made, and the caller will never get it (a Ctrl-C as the lock took it, in a
                # receiver of ``acquired``): handed on or freed before the error goes on, never left renewed.
                try:
                    self._release_held(self._clock.monotonic() + self.give_up_budget)
                except BaseException as cleanup:  # retried in the background; the original error goes on
                    self._log_acquire.warning(
                        "%s could not release the lock it took as its acquire was interrupted, on %s: %r",
                        self.owner_id,
                        self.url,
                        cleanup,
                    )
            if (
                self._state is LOST
                and isinstance(exc, LockLost)
                and exc is self._lease.lost_error
                and isinstance(exc.cause, StorageError)
                and exc.cause.may_land_late
            ):
                # The settling of a handed lease lost it with a renewal unanswered, conditioned on the lease's
                # generation: applied later, it would name us with a fresh lease nobody renews. As any way out,
                # the record is read and, while it still names us, given on, so that renewal can never land.
                try:
                    self._leave_slot(last, waiting=True, keep=False, unanswered=self._lease.generation)
                except BaseException as cleanup:  # the loss is what the caller must see
                    self._log_acquire.warning(
                        "%s could not give on the lease it lost as it acquired %s: %r", self.owner_id, self.url, cleanup
                    )
            if ran_out:  # the time ran out in the store
                why = f"timed out acquiring {self.url!r}: {exc}"
                raise _contended(LockTimeout, self.url, last, why) from exc
            raise
        finally:
            self._declined_by = None
            self._cancel.clear()
            self._not_acquiring.set()
            if self._state is not HELD:
                on_unhold()

    def _read_locked(self, deadline: float | None) -> tuple[LockRecord | None, int]:
        """An acquire's poll: one interruptible read under the I/O mutex."""
        with self._mutex:
            return self._io.read(deadline, interruptible=True)

    def _read_to_write(
        self, deadline: float | None, *, urgent: bool = False, interruptible: bool = False
    ) -> tuple[LockRecord | None, int]:
        """Read for a decision that will likely be written: our write slot first (mutex not held), then the read."""
        self._io.wait_for_gate(deadline, urgent=urgent, interruptible=interruptible)
        with self._mutex:
            return self._io.read(deadline, interruptible=interruptible)

    def _observe(self, record: LockRecord | None, now: float, observed: tuple[object, float]) -> tuple[object, float]:
        """``(the owner's lease, when this acquire first read it)``, after reading ``record`` at ``now``.

        client-go's ``observedTime``: a contender trusts an owner's ``expiresAt`` only as far as a lease
        can reach, ttl (plus the skew allowance) past its first reading of that lease (the owner, its
        token and its ``expiresAt``: a renewal starts a new observation, a waiter's writes do not). A
        lease claiming more is suspect, and said once: it would otherwise block the lock for years.
        """
        if record is None:
            return None, now
        lease = (record.owner_id, record.owner_instance, record.token, record.expires_at)
        if lease == observed[0]:
            return observed
        if protocol.suspect_lease(record, now, self.timing):  # never a lease without an owner
            self._log_acquire.warning(
                "lock %s: the lease of %s claims to run until %s, further ahead than its ttl (%s s) allows; "
                "not trusted: it ends %s unless its owner renews it",
                self.url,
                record.owner_id,
                when(record.expires_at, now),
                record.ttl or self.timing.ttl,
                when(protocol.lease_end(record, now, self.timing), now),
            )
        return lease, now

    def _interrupted(self, delay: float) -> bool:
        """Wait up to ``delay``; True if an interruptible retry must give up (cancel(), a deferred release)."""
        return self._clock.wait(self._cancel, delay) or self._deferred

    def _now_waiting(self, record: LockRecord) -> None:
        holder = who(record.owner_id, _label_text(record.owner_label))
        self._log_acquire.info("%s is now the waiter for %s (owner %s)", self.owner_id, self.url, holder)
        signals.send(
            signals.waiting,
            self,
            owner_id=record.owner_id,
            owner_label=record.owner_label,
            waiter_expires_at=record.waiter_expires_at,
        )

    def _not_acquired(self, record: LockRecord | None) -> bool:
        """A non-blocking acquire that did not get the lock; a slot of this instance's (leaked by an
        earlier acquire whose give-back failed) is left, never kept or refreshed."""
        try:
            if record is not None and record.waiter_instance == self._me.instance:
                self._leave_slot(record, waiting=True, keep=False)
        finally:
            self._state = IDLE
        return False

    def _give_up(
        self, last: LockRecord | None, *, waiting: bool, timed_out: bool, unanswered: int | None = None
    ) -> bool:
        """A timeout or a cancel: leave the waiter slot (maybe we were handed the lock meanwhile)."""
        try:
            if self._leave_slot(last, waiting=waiting, keep=timed_out, unanswered=unanswered):
                return True  # the handoff beat the timeout: keep it
        finally:
            if self._state == WAITING:  # given back, or tried within the budget: never tried twice
                self._state = IDLE
        if timed_out:
            if last is not None and last.owner is not None and last.owner_instance == self.instance:
                last = last.replace(owner=None)  # our last hold's record, given on by the way out: held by nobody
                message = _timeout_message(self.url, last, self._me, self._clock.time(), ours_given_on=True)
            else:
                message = _timeout_message(self.url, last, self._me, self._clock.time())
            raise _contended(LockTimeout, self.url, last, message)
        raise AcquireCancelled(f"acquire of {self.url!r} was cancelled")

    def _leave_slot(self, last: LockRecord | None, *, waiting: bool, keep: bool, unanswered: int | None = None) -> bool:
        """Clear our waiter slot within ``give_up_budget``.

        ``waiting``: we registered, or a registration may have reached the store (its reply unseen: a
        Ctrl-C, a lost reply): then the record is read, and the slot cleared if it names this instance.
        ``unanswered``: the generation a write of ours that got no answer was conditioned on. The store
        may still apply it after we leave (a request cut off at its timeout, applied late), while the
        object stays at that generation: if the read finds it there, the record is written again as it
        stands, so that write can never land (see :func:`~handofflock.core.protocol.decide_give_up_wait`).

        If the owner handed us the lock meanwhile we own it: with ``keep`` we keep it (returns True),
        else we release it at once, handing it on. Returns False when we do not hold the lock afterwards.
        """
        # ``waiting`` is False if our registration's reply was lost and the record moved
        # on before we could see our nonce; the record naming this instance still says the slot is ours
        # (a slot with our owner id and another instance is a twin's: never ours to clear, nothing to read).
        # A record that names this instance as owner with our last hold's token (a hold lost, or released,
        # whose renewal cut off at its timeout may still land there) is given on as well, waiting or not.
        last_hold = last is not None and last.owner_instance == self.instance and last.token == self._lease.token
        if not (waiting or last_hold or (last is not None and last.waiter_instance == self.instance)):
            return False
        if buggify.on(buggify.KEEP_SLOT_ON_TIMEOUT):
            return False
        deadline = self._clock.monotonic() + self.give_up_budget  # rounds begin by then
        # A round begins while the budget lasts (its requests get MIN_REQUEST_TIME at least), and one is
        # owed past it: the first, and one more after a 412 that came late (the record changed: perhaps
        # the lock was handed to us, which must not be left behind). A pause cannot skip the read.
        owed, late_412 = True, False
        while owed or self._clock.monotonic() < deadline:  # a conditional write, re-read on 412
            owed = False
            by = max(deadline, self._clock.monotonic() + MIN_REQUEST_TIME)  # this round's requests end by then
            record, generation = self._read_to_write(by, urgent=True)  # our write slot first, as urgent
            mono, wall = self._clock.monotonic(), self._clock.time()
            decision = protocol.decide_give_up_wait(
                record, generation, me=self._me, now=wall, timing=self.timing, nonce=new_nonce(), pending=unanswered
            )
            if isinstance(decision, Owned) and decision.record.token == self._lease.token:
                # Not handed to us: the record of the hold we last had (declared lost, or released), left naming
                # us by a write of that hold applied late (a renewal cut off at its timeout), or a handed lease
                # lost as this acquire settled it (its renewal unanswered: ``_acquire``'s way out). Its token is never
                # returned again: a writer left over from that hold still fences with it. Our time is up (a take
                # with a new token would be a new wait past it): the lock is given on, to a live waiter or freed.
                self._log_acquire.info("%s gives %s on: it bears our last hold's token", self.owner_id, self.url)
                decision = protocol.decide_release(
                    record,
                    generation,
                    me=self._me,
                    token=decision.record.token,
                    now=wall,
                    timing=self.timing,
                    nonce=new_nonce(),
                )
            if isinstance(decision, Owned):  # handed to us meanwhile: the lease counts from this read
                self._became_owner(
                    decision.record, decision.generation, mono, wall, handoff=True, settle=keep, settle_by=by
                )
                if keep:
                    return True
                self._deferred = False
                if not buggify.on(buggify.CANCELLED_KEEPS_HANDED_LOCK):
                    self._release_held(by)
                return False
            if not isinstance(decision, Write):  # the slot is no longer ours
                return False
            try:
                with self._mutex:
                    # Past the round's start, a 429's widened spacing no longer holds the give-back: it
                    # goes at the store's own spacing (a slot left behind blocks others for waiter_ttl).
                    self._io.write(decision, by, urgent=True, send_by=by - MIN_REQUEST_TIME)
                return False
            except PreconditionFailed:
                owed = not late_412 and self._clock.monotonic() >= deadline
                late_412 = late_412 or owed
                continue
            except TransientStorageError:
                # Refused (429s past its retries): the lock may have been handed to us while it was
                # retried, so read again while the budget lasts rather than leave on a stale read.
                if self._clock.monotonic() >= deadline:
                    raise
                continue
        raise TransientStorageError(
            f"could not give back the waiter slot of {self.url!r} within {self.give_up_budget:.1f} s; "
            f"it expires by itself within waiter_ttl ({self.timing.waiter_ttl} s)",
            url=self.url,
            key=self.key,
            ambiguous=False,
        )

    def _became_owner(
        self,
        record: LockRecord,
        generation: int,
        mono: float,
        wall: float,
        *,
        handoff: bool,
        settle: bool = True,
        settle_by: float | None,
    ) -> None:
        """We own ``record`` (stamped at ``mono``/``wall``; ``handoff``: handed to us by its owner).

        With ``settle`` a handed lease too short to use is renewed by ``settle_by`` (None: within
        ``renew_deadline``) before the scheduler or receivers know; without, it is released at once.
        """
        if handoff and record.owner is not None and buggify.on(buggify.HEIR_LEASE_FROM_ITS_READ):
            wall = record.owner.expires_at - (record.ttl or self.timing.ttl)  # as if the lease began at our read
        # A new hold: nothing of the last one (its loss included) carries over.
        lease = Lease(token=record.token, thread=threading.get_ident())
        lease.set(record, generation, mono, wall, self.timing, self._clock)
        lease.next_check = self._clock.monotonic() + self.timing.waiter_check_interval
        self._lease = lease
        self._book.new_hold()  # a release request recorded while we were acquiring (a SIGTERM, say) stands
        self._state = HELD
        how = ", handed off" if handoff else ""
        self._log_acquire.info("%s acquired %s (token %d%s)", self.owner_id, self.url, record.token, how)
        if record.waiter_live(self._clock.time()) and record.waiter_instance != self._me.instance:
            # A waiter already in the record we took (it registered while the lock was being handed to
            # us): our renewals write against this very generation and never meet it, so the first waiter
            # check runs now, in the background, after acquire() has returned (receivers never run inside it).
            lease.next_check = self._clock.monotonic()
        if record.min_hold != (self.timing.min_hold or None):
            lease.next_renew = self._clock.monotonic()  # a hold handed to us: our first renewal says our minHold
        if settle:
            self._settle_handed_lease(settle_by)
        self._schedule()
        _Reaper.ensure()  # started here, never in a collection
        if self.release_on_signal:
            on_hold(self)
        signals.send(signals.acquired, self, token=record.token, handoff=handoff)

    def _settle_handed_lease(self, deadline: float | None) -> None:
        """A handed-over lease with less than ``renew_interval`` left is renewed before acquire() returns.

        We may have seen the previous owner's write late (a slow poll, a pause); acquire() returns only with
        a lease no check can call lost before its first renewal. Conditional on the generation: safe however late.
        The write waits for the gate and is retried until ``deadline`` (None: ``renew_deadline``). A renewal
        confirmed late (a lost reply, settled by a slow read) counts from its send, so it may be as short as the
        lease it replaced: it is renewed again while the deadline lasts. A lease whose renewal failed is kept
        only while it is healthy by every clock ``healthy`` counts, the wall clock too: keeping it returns it.
        """
        lease, clock, t = self._lease, self._clock, self.timing
        if lease.valid_until - clock.monotonic() >= t.renew_interval:
            return
        with self._mutex:
            if self._state != HELD:
                return
            try:
                end = clock.monotonic() + t.renew_deadline
                by = end if deadline is None else max(min(deadline, end), lease.valid_until)
                for _ in range(3):  # a waiter that registers meanwhile moves the generation: read, note it, again
                    decision = self._decide_renew(lease)
                    if not isinstance(decision, Write):  # the record says the lease is not ours to renew
                        break
                    try:
                        written, generation, mono, wall = self._io.write(decision, by, urgent=True)
                    except PreconditionFailed:
                        if not self._saw(*self._io.read(by)):
                            raise lease.lost_error from None  # type: ignore[misc]
                        continue
                    lease.set(written.record, generation, mono, wall, t, clock)
                    if lease.left(clock) >= t.renew_interval:
                        return
                raise PreconditionFailed(self.key, lease.generation, url=self.url)
            except (StorageError, LockRecordCorrupt) as exc:
                if lease.left(clock) > 0:  # healthy still, by every clock
                    lease.next_renew = clock.monotonic()  # keep it; the scheduler retries at once
                    return
                self._mark_lost(f"handed a lease too short to use, and could not renew it: {exc}", exc)
                raise lease.lost_error from exc  # type: ignore[misc]

    # -- the background duties: renewal, waiter check, release retry, loss at the deadline -----------

    def _decide_renew(self, lease: Lease) -> protocol.Decision:
        """What renewing ``lease`` writes now (or that the record we know says it is lost)."""
        return protocol.decide_renew(
            lease.record,
            lease.generation,
            me=self._me,
            token=lease.token or 0,
            now=self._clock.time(),
            timing=self.timing,
            nonce=new_nonce(),
        )

    def _renew(self) -> None:
        """A background renewal: up to three writes, none waiting for the gate nor sleeping.

        A renewal the write spacing would delay is deferred to when the gate opens (``next_renew``; the
        lease is valid well past it), so the mutex is never held through a wait. After a 412 (a waiter
        registered, refreshed or left) it reads, notes what changed, and is sent again at once: a few
        waiter writes in a row must not run an owner at the shortest ttl past its renew deadline.

        A transient error is counted on the lease (retried in the background until ``renew_deadline``,
        when :meth:`_run_due` marks the loss); any other storage error, or the protocol's
        :class:`Lost`, is a loss now.
        """
        with self._mutex:
            lease, clock = self._lease, self._clock
            try:
                for _ in range(3):
                    if self._state != HELD:
                        return
                    now = clock.monotonic()
                    # A 429's widened spacing holds the renewal back only while it has room to.
                    by = self.timing.backoff_until(lease.valid_until)
                    wait = self._io.gate().ready_in(now, urgent=True, by=by)
                    if wait > 0:
                        lease.next_renew = now + wait
                        return
                    decision = self._decide_renew(lease)
                    if isinstance(decision, Lost):
                        self._mark_lost(decision.why, None)
                        return
                    assert isinstance(decision, Write)
                    try:
                        written, generation, mono, wall = self._io.write(
                            decision, lease.valid_until, retry=False, urgent=True, send_by=by
                        )
                    except PreconditionFailed:
                        if not self._saw(*self._io.read(lease.valid_until, retry=False)):
                            return  # lost
                        lease.next_renew = clock.monotonic()
                        continue
                    lease.set(written.record, generation, mono, wall, self.timing, clock)
                    signals.observer.renewed(self, clock.monotonic() - mono)
                    self._log_renew.debug(
                        "%s renewed %s until %.3f", self.owner_id, self.url, written.record.expires_at
                    )
                    return
            except TransientStorageError as exc:
                signals.observer.renewal_failed(self, exc)
                # The next try after a backoff, at most renew_interval and never past the end of validity.
                lease.renew_failures += 1
                delay = min(self.timing.renew_interval, RETRY.delay(lease.renew_failures))
                lease.next_renew = min(clock.monotonic() + delay, lease.valid_until)
                self._log_renew.warning(
                    "renewal of %s failed (%s); retrying in %.2f s, giving up at the renew deadline",
                    self.url,
                    exc,
                    delay,
                )
            except (StorageError, LockRecordCorrupt) as exc:
                signals.observer.renewal_failed(self, exc)
                self._mark_lost(f"renewal failed: {exc}", exc)

    def _check_waiter(self, known_generation: int | None = None) -> None:
        """Still ours? Someone waiting? One read, or none when a scheduler's listing says nothing changed.

        The scheduler passes ``known_generation`` from a listing it just made (0: not listed) when it
        checks many locks at once; the check then runs whether or not it was due (:meth:`.Lease.known`).

        The read is made without the I/O mutex, so one that stalls never holds up a renewal; what it
        found is applied only if the lease is as it was when the read began. A renewal (or release)
        since then wrote on the generation it knew, and would have met whatever the read saw.
        """
        with self._mutex:
            if self._state != HELD:
                return
            lease = self._lease
            lease.next_check = self._clock.monotonic() + self.timing.waiter_check_interval
            known, before = lease.known(known_generation), lease.generation
        error: BaseException | None = None
        try:
            record, generation = known or self._io.read(None, retry=False)
        except TransientStorageError as exc:
            self._log_renew.debug("waiter check of %s failed: %s", self.url, exc)
            return
        except (StorageError, LockRecordCorrupt) as exc:
            error, (record, generation) = exc, (None, 0)
        with self._mutex:
            if self._state != HELD or self._lease is not lease or lease.generation != before:
                return  # the hold moved on while we read: a renewal saw (or will see) the record itself
            if error is not None:
                self._mark_lost(f"the lock object became unreadable: {error}", error)
                return
            self._saw(record, generation)

    def _saw(self, record: LockRecord | None, generation: int) -> bool:
        """What an owner's read showed: False if the lock is lost (marked so); else the lease and book note it."""
        lease, mono, wall = self._lease, self._clock.monotonic(), self._clock.time()
        seen = protocol.observe_as_owner(
            record, me=self._me, token=self.token or 0, now=wall, min_hold=self.timing.min_hold
        )
        if isinstance(seen, Lost):
            self._mark_lost(seen.why, None)
            return False
        if generation != lease.generation:  # an equal one is the record we know
            lease.record, lease.generation = record, generation
        if seen is not None and seen.write_decline:
            lease.next_renew = mono  # the decline goes into the record now, by a renewal
        if seen is not None and seen.acts_at is not None:
            # Within our minimum hold: the request waits in the record; we look again as the hold is up.
            lease.next_check = min(lease.next_check, mono + (seen.acts_at - wall))
            seen = None
        self._book.note_waiter(seen, record)
        return True

    def _retry_release(self) -> None:
        """Retry a release whose write failed, until it lands or the lease is over anyway."""
        now, t = self._clock.monotonic(), self.timing
        if now >= self._lease.valid_until + (t.ttl - t.renew_deadline):
            with self._mutex:
                if self._state == RELEASING:
                    self._log_release.warning(
                        "gave up releasing %s: its lease has run out, so it is free for others anyway", self.url
                    )
                    self._end_hold()
                    self._stop_duties()
            return
        self._lease.next_release_try = now + min(1.0, t.renew_interval)
        try:
            self._release_held(now + min(t.renew_deadline, 5.0), background=True)
        except Exception as exc:  # already logged; a permanent error ends the hold
            self._log_release.warning("release of %s failed for good: %s", self.url, exc)

    def _mark_lost(self, why: str, error: BaseException | None, *, from_release: bool = False) -> None:
        """Record the loss once; queue ``lost`` (and ``on_renewal_error``) for sending outside locks."""
        if self._state == LOST:
            return
        self._state = LOST
        exc = LockLost(f"lock {self.url!r} lost: {why}", url=self.url, reason=why, cause=error)
        if error is not None:
            exc.__cause__ = error
        self._lease.valid_until = -math.inf  # nothing about the hold is valid any more
        self._lease.lost_reason, self._lease.lost_error = why, exc
        self._stop_duties()
        on_unhold()
        self._log_renew.error("%s lost %s: %s", self.owner_id, self.url, why)
        if not from_release:
            self._notifier.event(signals.on_renewal_error, error=exc)
        self._notifier.event(signals.lost, reason=why, error=exc)

    def _next_due(self) -> float:
        """Monotonic time of the next duty but the waiter check (inf if none): a renewal, the end of the
        lease's validity (it is lost then), a release retry, or signals to send (at once)."""
        if self._notifier.unsent:
            return -math.inf
        state, lease = self._state, self._lease
        if state is RELEASING:
            return lease.next_release_try
        if state is not HELD:
            return math.inf
        if not lease.within(self._clock):  # a suspend ran it out: monotonic time does not know
            return -math.inf
        return min(lease.next_renew, lease.valid_until)

    def _run_due(self) -> None:
        """Do whatever is due (one of: the loss at the renew deadline, a renewal, a waiter check, a release
        retry); then hand the signals to the notifier."""
        now, state, lease = self._clock.monotonic(), self._state, self._lease
        if state is HELD:
            if not lease.within(self._clock):  # monotonic time, or boot time (a host suspend counts)
                with self._mutex:  # a renewal may have landed while we waited for it (a handed lease settled)
                    if self._state == HELD and not self._lease.within(self._clock):
                        self._mark_lost(f"no successful renewal for {self.renew_deadline:.1f} s (renew_deadline)", None)
            elif now >= lease.next_renew:
                self._renew()  # never waits for the write gate: a deferred renewal leaves the check due next
            elif now >= lease.next_check:
                self._check_waiter(None)
        elif self._state is RELEASING and now >= lease.next_release_try:
            self._retry_release()
        self._notifier.notify(self)

    def _schedule(self) -> None:
        """Have the scheduler run the duties (the process-wide scheduler unless one was given)."""
        if self._scheduler is None:
            self._scheduler = default_scheduler()
        self._scheduler.add(self._duties)

    def _stop_duties(self) -> None:
        """Stop running the duties (they may still be running now)."""
        if self._scheduler is not None:
            self._scheduler.discard(self._duties)

    def _unschedule(self) -> None:
        """Stop the background duties as a process that dies holding the lock would: nothing is released,
        at exit or when collected (tests use it)."""
        self.release_at_exit = False
        self._stop_duties()

    # -- release ------------------------------------------------------------------------------------

    def release(self) -> str | None:
        """Give the lock up: hand it to a live waiter in one write, or mark it free.

        Returns the waiter's owner id when handed off, else None. Raises :class:`LockLost` (writing
        nothing) if the lock had been lost. On a lock this instance does not hold (never acquired, or
        already released: by a signal handler, say) it does nothing and returns None, as filelock does.
        During a blocking ``acquire()`` in another thread, it cancels that acquire and waits for it to
        end; if the acquire got the lock first, that hold is released.

        If the release write fails (the store is down), the error is raised and the lock is no longer
        renewed; the release is retried in the background until it lands or the lease runs out, and
        ``release()`` may be called again to retry it at once.
        """
        return self._guarded(self._release, deferrable=True)

    def _release(self) -> str | None:
        t = self.timing
        if self._state == WAITING:
            self._cancel.set()
            if not self._not_acquiring.wait(self.give_up_budget + t.renew_deadline + 30.0):
                self._log_release.warning("release() of %s: the acquire it cancelled has not ended yet", self.url)
                return None
            if self._state != HELD:  # the acquire gave up (and gave the slot back)
                return None
            # The acquire got the lock just before it saw the cancel: release that hold.
        if self._state == LOST:
            self._end_hold(lost=True)
            why = self._lease.lost_reason
            raise LockLost(
                f"lock {self.url!r} had been lost ({why}); nothing was written", url=self.url, reason=why or "lost"
            )
        if self._state not in (HELD, RELEASING):
            return None  # not held: nothing to give up
        return self._release_held(self._clock.monotonic() + max(t.renew_deadline, 5.0))

    def then_after_deferred_release(self, fn: Callable[[], Any]) -> bool:
        """Run ``fn`` once the release deferred by a signal handler has run; False if none is deferred.

        For a handler that must act after the release (a second signal that kills the process,
        :mod:`handofflock.os_signals`): called from the handler, in the thread it interrupted.
        """
        if not self._deferred:
            return False
        self._after_deferred.append(fn)
        return True

    def _release_held(self, deadline: float, *, background: bool = False) -> str | None:
        """The release write of a held (or releasing) lock; see :meth:`release`."""
        self._stop_duties()
        lost: LockLost | None = None
        with self._mutex:
            if self._state not in (HELD, RELEASING):  # lost while we waited for the scheduler's I/O
                return None if background else self._release()  # no I/O: raises LockLost
            # From here the lock is no longer ours to use: the write may land (and the heir start)
            # before its reply reaches us, so healthy/check() say no from the moment it is sent.
            self._state = RELEASING
            self._lease.next_release_try = math.inf  # this attempt runs now
            try:
                heir = self._write_release(deadline)
            except (TransientStorageError, PreconditionFailed) as exc:
                # Not idle: the record still names us (perhaps with a waiter waiting). Keep
                # trying in the background, no longer renewing; release() may retry at once.
                if self._state == RELEASING:
                    self._lease.next_release_try = self._clock.monotonic() + min(1.0, self.timing.renew_interval)
                    self._schedule()
                self._log_release.warning(
                    "release of %s failed (%s); retrying in the background until the lease runs out", self.url, exc
                )
                if background:
                    return None
                raise
            except LockLost as exc:  # marked lost by the write
                lost = exc
            except Exception:
                self._end_hold()
                raise
            except BaseException:
                # Interrupted (a Ctrl-C) as the write was made, sent or not: the record may still name us,
                # and no renewal holds it. Retried in the background as after a store error, never left
                # on record for ttl + skew under an instance that no longer counts on it.
                if self._state == RELEASING:
                    self._lease.next_release_try = self._clock.monotonic()
                    self._schedule()
                raise
            # Still under the I/O mutex: a scheduler duty queued behind this release must find the
            # lock no longer held, not renew or check it from the record just replaced.
            self._end_hold()
        if lost is not None:
            if background:
                return None
            self._notifier.flush(self)  # outside the mutex: a receiver of ``lost`` may call back in
            raise lost
        token = self.token
        self._log_release.info("%s released %s%s", self.owner_id, self.url, f", handed off to {heir}" if heir else "")
        if background:
            self._notifier.event(signals.released, handed_off_to=heir, token=token)
            self._notifier.notify(self)
        else:
            signals.send(signals.released, self, handed_off_to=heir, token=token)
        return heir

    def _write_release(self, deadline: float) -> str | None:
        """The release write (retried, re-read on 412): returns the heir; raises :class:`LockLost`, the hold
        marked lost, if the record says it is not ours.

        Call with the mutex held. A 412 is not the end of a release: a waiter registered, refreshed or
        left since our last read, and the protocol decides again from the record read back, knowing
        which write it ``attempted`` (if the record shows its effect, it landed). A record that has
        become unreadable was overwritten by someone: the hold is lost, and never rewritten by us.
        Transient storage errors (and a 412 the retry could not resolve) are raised.
        """
        attempted: Write | None = None
        lease = self._lease
        record, generation = lease.record, lease.generation
        while True:
            decision = protocol.decide_release(
                record,
                generation,
                me=self._me,
                token=lease.token or 0,
                now=self._clock.time(),
                timing=self.timing,
                nonce=new_nonce(),
                attempted=attempted,
                within_lease=lease.within(self._clock),
            )
            if isinstance(decision, Released):
                return decision.handed_off_to
            if isinstance(decision, Lost):
                self._mark_lost(decision.why, None, from_release=True)
                why = f"lock {self.url!r} was lost before release: {decision.why}; nothing was written"
                raise LockLost(why, url=self.url, reason=decision.why)
            assert isinstance(decision, Write)
            try:
                # A 429's widened spacing holds the release back only while that leaves it room to go out by
                # ``deadline``; past that it goes at the store's own spacing. Else it would give up with nothing
                # sent, and leave the lease (and a waiter) behind for up to ttl: released in an acquire's way
                # out, past that acquire's give-up budget.
                written, _, _, _ = self._io.write(decision, deadline, urgent=True, send_by=deadline - MIN_REQUEST_TIME)
            except PreconditionFailed:
                attempted = decision
                try:
                    record, generation = self._io.read(deadline)
                except LockRecordCorrupt as exc:  # overwritten by someone: lost, and never rewritten
                    self._mark_lost(f"the lock object became unreadable: {exc.reason}", exc, from_release=True)
                    why = f"lock {self.url!r} was lost before release: {exc}"
                    raise LockLost(why, url=self.url, reason="corrupt", cause=exc) from exc
                continue
            return written.record.owner_id if written.kind is Kind.HANDOFF else None

    def _end_hold(self, *, lost: bool = False) -> None:
        """A hold is over, however it ended: the lock is idle, the hold's requests go with it (but those a
        ``lost`` hold never answered: :meth:`RequestBook.end_hold`), and no release is retried."""
        self._state = IDLE
        self._book.end_hold(lost=lost)
        self._lease.next_release_try = math.inf
        on_unhold()  # the release-on-signal handler goes once no lock is held

    def _guarded(self, fn: Callable[[], T], *, deferrable: bool = False, cancelled_by_release: bool = False) -> T:
        """Run a public operation; a re-entrant ``deferrable`` one (a release) is deferred, not deadlocked.

        ``release()`` may be called from a signal handler that interrupted this very thread inside the
        library (inside ``acquire()``, holding the I/O mutex, even inside an Event's own lock): taking any
        lock there could deadlock. Such a call only sets a flag, and the outermost call carries the release
        out on its way out (a blocking acquire sees the flag after its current poll); callbacks registered
        meanwhile run after it. ``cancelled_by_release``: an acquire, whose hold that release ended before
        it could return it: it raises :class:`AcquireCancelled`, as an acquire the release stopped while
        waiting does, never returning a hold the lock no longer has.
        """
        if self._state == FORKED:
            raise InheritedAcrossFork(
                f"this HandoffLock for {self.url!r} was created in process {self._pid}, which this process was "
                "forked from; the lock and its renewals are that process's. Create a new HandoffLock here."
            )
        depth = getattr(self._depth, "n", 0)
        if depth and deferrable:
            # Only assignments: safe in a signal handler. Any thread's wait sees the flag; the thread the
            # handler interrupted (``owes``) carries the release out as its outermost call ends.
            self._depth.owes = True
            self._deferred = True
            return None  # type: ignore[return-value]
        self._depth.n = depth + 1
        released = False
        try:
            result = fn()
        finally:
            self._depth.n = depth
            if depth == 0 and getattr(self._depth, "owes", False):
                released = self._carry_out_deferred()
        if released and cancelled_by_release and result:
            raise AcquireCancelled(f"acquire of {self.url!r} was cancelled: a signal handler released the lock")
        return result

    def _carry_out_deferred(self) -> bool:
        """The release a signal handler deferred in this thread, then the callbacks it registered (the
        handler's "end the process"), whatever the operation it interrupted did meanwhile (a wait handed
        the lock as the release stopped it releases that lock itself). Another thread's operation on this
        lock never runs them: a ``status()`` from a progress thread ends before the release has landed.
        Another thread's acquire is cancelled and awaited, and a release write in flight in another thread
        lands first, so the callbacks never run while a slot or a hold of ours may still be in the record.
        ``owes`` is cleared last, once the callbacks ran, even where the release failed (its error goes on).
        True if this released the lock."""
        released = False
        try:
            if not self._not_acquiring.is_set():  # another thread's acquire (ours has ended): stop it, await it
                self._cancel.set()
                self._not_acquiring.wait(self.give_up_budget + self.timing.renew_deadline + 30.0)
            if self._state == RELEASING:  # another thread's release write in flight: it lands (or fails) first
                with self._mutex:
                    pass
            while self._deferred:  # the release a signal handler asked for (again, if one came meanwhile)
                self._deferred = False
                if self._state in (HELD, LOST, RELEASING):  # RELEASING: a release that failed, retried now
                    released = True
                    self._depth.n = 1  # a signal now defers again, to this loop
                    try:
                        self._release()
                    finally:
                        self._depth.n = 0
        finally:
            try:
                self._run_after_deferred()
            finally:
                self._depth.owes = False  # paid, even where the release failed (its error goes on)
        return released

    def _run_after_deferred(self) -> None:
        """Each callback registered for the deferred release, every one of them even if one raises (the
        "now" of a second Ctrl-C raises KeyboardInterrupt): the first exception goes on after the rest."""
        then, self._after_deferred = self._after_deferred, []
        first: BaseException | None = None
        for callback in then:
            try:
                callback()
            except BaseException as exc:  # raised again below, once every callback ran
                first = first or exc
        if first is not None:
            raise first

    def __del__(self) -> None:
        # Only a queue put, safe in any collection: a collection runs in whichever thread allocated at that
        # moment (the scheduler's, holding its mutex, say), where a release's I/O could deadlock or stall.
        # The reaper resurrects the lock for that one release (PEP 442 calls __del__ once).
        if self.__dict__.get("_state") is HELD and self._pid == os.getpid() and not sys.is_finalizing():
            _Reaper.orphans.put((self, self.release_at_exit))


class Acquired:
    """What a successful :meth:`HandoffLock.acquire` returns: true, and a context manager that releases.

    >>> with lock.acquire(timeout=5):      # as with filelock's AcquireReturnProxy
    ...     work()                         # released (or handed off) here
    >>> if lock.acquire(blocking=False):   # true; a failed try returns False
    ...     ...
    """

    __slots__ = ("lock",)

    def __init__(self, lock: HandoffLock) -> None:
        #: The lock that was acquired.
        self.lock = lock

    def __bool__(self) -> bool:
        return True

    def __enter__(self) -> HandoffLock:
        return self.lock

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.lock.__exit__(exc_type, exc, tb)

    def __repr__(self) -> str:
        return f"<Acquired {self.lock!r}>"


class Stepping(Generic[T]):
    """What :class:`Steps` and the async lock's ``AsyncSteps`` share: the tally of a loop over steps, and
    the question asked before each step (:meth:`stop_before_step`)."""

    __slots__ = ("count", "last", "request", "stopped")

    def __init__(self) -> None:
        self.last: T | None = None
        self.count = 0
        self.stopped = False
        self.request: ReleaseRequest | None = None

    def stop_before_step(self, lock: HandoffLock) -> bool:
        """``lock.check()`` (raises LockLost: never start a step without the lock); then True, noting the
        request, if a release is requested."""
        lock.check()
        if not lock.release_requested:
            return False
        self.stopped, self.request = True, lock.release_request
        return True

    def took(self, item: T) -> T:
        """``item`` is handed out as the next step."""
        self.last = item
        self.count += 1
        return item

    def __repr__(self) -> str:
        return f"<{type(self).__name__} last={self.last!r} count={self.count} stopped={self.stopped}>"


class Steps(Stepping[T]):
    """Iterate ``iterable`` while ``lock`` is held and nobody asked for it: the yield-to-checkpoint idiom.

    A training loop asks two questions before each step: may I still work, and does anybody want
    the lock? A :class:`Steps` asks both without I/O and without taking a lock (well under a
    microsecond per step); the background scheduler keeps the answers fresh. The loop ends after
    the step in progress, never in the middle of one: the next owner resumes after ``last``.

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

    __slots__ = ("_items", "lock")

    def __init__(self, lock: HandoffLock, iterable: Iterable[T]) -> None:
        super().__init__()
        self.lock = lock
        self._items = iter(iterable)

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        if self.stop_before_step(self.lock):
            raise StopIteration
        return self.took(next(self._items))  # StopIteration from the items means the work is done


class _Duties:
    """A lock as its scheduler sees it (:class:`~.scheduler.Scheduled`), through one weak reference.

    The scheduler must never keep a lock alive: a held lock whose last reference went is released by
    the reaper, and once collected it has nothing due. The store and key group waiter checks.
    """

    __slots__ = ("_lock", "check_interval", "key", "request_timeout", "store")

    def __init__(self, lock: HandoffLock, store: Storage, key: str) -> None:
        self._lock = weakref.ref(lock)
        self.store, self.key = store, key
        self.check_interval, self.request_timeout = lock.timing.waiter_check_interval, lock.timing.request_timeout

    def next_due_besides_check(self) -> float:
        lock = self._lock()
        return math.inf if lock is None else lock._next_due()

    def next_check_at(self) -> float:
        lock = self._lock()  # never while the lock is not held, when a check does nothing
        return lock._lease.next_check if lock is not None and lock._state is HELD else math.inf

    def deadline(self) -> float:
        lock = self._lock()
        return -math.inf if lock is None else lock._lease.valid_until

    def run_due(self) -> None:
        lock = self._lock()
        if lock is not None:
            lock._run_due()

    def check_against(self, generation: int) -> None:
        lock = self._lock()
        if lock is not None:
            lock._check_waiter(generation)
            lock._notifier.notify(lock)

    def __repr__(self) -> str:
        lock = self._lock()
        return f"<duties of {lock!r}>" if lock is not None else "<duties of a collected HandoffLock>"


def _interrupted(lock: weakref.ref[HandoffLock], delay: float) -> bool:
    """The record store's ``interrupted``: the lock's, through a weak reference (a part never keeps it alive)."""
    it = lock()
    return it is None or it._interrupted(delay)


def _notifies_inline(lock: HandoffLock) -> bool:
    """Whether ``lock``'s signals are sent in the thread that has them sent: a scheduler run by hand."""
    return bool(getattr(lock._scheduler, "notify_inline", False))


def _store_of(url: str | os.PathLike[str], storage: Storage | None, key: str | None) -> tuple[Storage, str, str]:
    """``(storage, key, url)``: the store and key given (both, or neither), or those the URL names (no I/O)."""
    if storage is not None:
        if key is None:
            raise ConfigurationError("pass key= together with storage=")
        return storage, key, f"{getattr(storage, 'url', storage)}/{key}"
    storage, key = open_url(url)
    return storage, key, os.fspath(url)


def _timing_of(storage: Storage, timing: Timing | None, given: dict[str, float]) -> Timing:
    """The lock's timing: ``timing`` as given, or built from the timing keywords ``given`` (None left out)."""
    if timing is not None:
        if not isinstance(timing, Timing):
            raise ConfigurationError(f"timing must be a handofflock.Timing, got {type(timing).__name__}")
        if given:
            raise ConfigurationError(f"pass timing= or the timing keywords, not both (got {', '.join(given)})")
    else:
        given.setdefault("min_write_interval", default_write_interval(storage))
        timing = Timing.build(**given)
    explicit = getattr(storage, "explicit_request_timeout", None)
    timing.check_request_timeout(explicit, getattr(storage, "url", "the store"))
    return timing


def _owner_id_of(owner_id: str | None) -> str:
    """``owner_id`` checked (it is written into the lock object), or a fresh ``host:pid:random``."""
    if owner_id is not None and (problem := id_problem(owner_id, "owner_id")) is not None:
        raise ConfigurationError(f"{problem}: it is written into the lock object")
    return owner_id or default_owner_id()


def _label_of(label: str | Label | None) -> Label:
    """``label`` as a :class:`Label` (which checks its text as it is made); by default what
    :func:`detect_label` finds."""
    if label is None or isinstance(label, str):
        return Label(detect_label() if label is None else label)
    if not isinstance(label, Label):
        raise ConfigurationError("label must be a string: it is written into the lock object")
    return label


# -- what the lock says when it refuses or fails: who holds it, until when, what to do -----------------


def _contended(
    cls: type[LockContended], url: str, record: LockRecord | None, message: str | None = None
) -> LockContended:
    """``cls`` (:class:`LockContended` or :class:`LockTimeout`) naming who holds ``record`` and who waits;
    saying ``message``, or by default that the lock is held and the waiter slot taken."""
    r = record or LockRecord()
    return cls(
        message,
        url=url,
        owner_id=r.owner_id,
        owner_expires_at=r.expires_at,
        waiter_id=r.waiting_owner_id,
        waiter_expires_at=r.waiter_expires_at,
        owner_label=_label_text(r.owner_label),
        waiter_label=_label_text(r.waiter_label),
    )


def _ran_out(exc: BaseException, deadline: float | None, clock: Clock) -> bool:
    """Whether ``exc``, ending an acquire, is its deadline reached: a request cut off at it or a write the
    spacing would hold past it, or a storage failure that came after it (no time was left to resolve it)."""
    if isinstance(exc, StorageTimeout):
        return True
    return isinstance(exc, TransientStorageError) and deadline is not None and clock.monotonic() >= deadline


def _label_text(label: Label | None) -> str | None:
    return None if label is None else label.text


def _timeout_message(url: str, record: LockRecord | None, me: Me, now: float, *, ours_given_on: bool = False) -> str:
    """What a timed-out acquire says: who holds it, and who has the slot (we, or someone else).

    Never "free at T" for a live lease: a running holder renews it, so its
    expiry says when the lock comes free only if the holder is gone (killed,
    its host down); the message says so, and when that would be.
    """
    owner, waiter = (None, None) if record is None else (record.owner, record.waiter)
    if ours_given_on:  # a write of our last hold (lost) applied late: not ours to keep, and not held by another
        held = "the record still named our last hold (a write of it applied late), not ours to keep: given on"
    elif owner is None and waiter is not None and waiter.live(now) and waiter.instance != me.instance:
        held = "it was free, but the waiter slot was taken"
    elif owner is None:
        held = "it was free, but no write of ours to take it landed in time"
    elif owner.live(now):
        held = (
            f"held by {who(owner.id, _label_text(owner.label))}, a live lease its holder renews while it runs "
            f"(if the holder is gone, the lease runs out {when(owner.expires_at, now)})"
        )
    else:
        ran_out = when(owner.expires_at, now)
        held = f"held by {who(owner.id, _label_text(owner.label))}, whose lease ran out {ran_out}"
    if waiter is None or not waiter.live(now):
        slot = "; nobody else waits"
    elif (waiter.id, waiter.instance) == (me.owner_id, me.instance):
        slot = "; we held the waiter slot, and gave it back"
    else:
        slot = f"; the waiter slot is {who(waiter.id, _label_text(waiter.label))}'s"
    return f"timed out acquiring {url!r}: {held}{slot}"


def _not_healthy(url: str, state: State, lost_reason: str | None, renew_deadline: float, pid: int) -> LockLost:
    """Why :meth:`HandoffLock.check` refuses a lock in ``state`` that is not held and healthy."""
    if state is State.HELD:
        return LockLost(
            f"lock {url!r} was not renewed within renew_deadline ({renew_deadline:.1f} s); "
            "treat it as lost (was the process paused, or the host suspended?)",
            url=url,
            reason="renew deadline passed",
        )
    if state is State.LOST:
        return LockLost(f"lock {url!r} was lost: {lost_reason}", url=url, reason=lost_reason or "lost")
    if state is State.FORKED:
        return LockLost(
            f"lock {url!r} belongs to process {pid}; this is a child forked from it",
            url=url,
            reason="inherited across fork",
        )
    return LockLost(f"lock {url!r} is not held by this instance", url=url, reason="not held")


def _already_acquired(state: State, url: str, holder: int | None, *, nested: bool) -> AlreadyAcquired:
    """The error of an ``acquire()`` on an instance that holds, acquires or releases already.

    One instance is one party (one owner id, one waiter slot): it is not
    reentrant, and threads do not queue on it (see :class:`AlreadyAcquired`).
    """
    per_thread = (
        "threads do not queue on one instance (it is one party: one owner id, one waiter slot); give each "
        "thread its own HandoffLock, and the second then waits as the waiter and asks the holder to hand over"
    )
    if state is State.HELD and (holder == threading.get_ident() or nested):
        return AlreadyAcquired(
            f"this HandoffLock instance already holds {url!r}, acquired in this very thread: it is not "
            "reentrant (the end of a nested block would hand the lock over in the middle of the outer one); "
            "use the hold you have"
        )
    if state is State.HELD:
        return AlreadyAcquired(f"this HandoffLock instance already holds {url!r} (in another thread); {per_thread}")
    if state is State.WAITING and nested:
        return AlreadyAcquired(
            f"acquire() of {url!r} called from inside this instance's own acquire() (a signal handler or a "
            "receiver): it is not reentrant"
        )
    if state is State.WAITING:
        return AlreadyAcquired(
            f"this HandoffLock instance is already acquiring {url!r} in another thread: {per_thread}"
        )
    return AlreadyAcquired(f"this HandoffLock instance is still releasing {url!r}; call acquire() once it has ended")


#: Every lock of this process (weakly): disarmed in a forked child, released at exit if still held.
_LOCKS: weakref.WeakSet[HandoffLock] = weakref.WeakSet()


#: Called as a hold begins (the lock) and as one ends: the release-on-signal handler of
#: :mod:`handofflock.os_signals` arms and settles itself through these. That module sets them as it
#: is imported (the package's ``__init__`` imports it), so the lock needs no import of a layer above it.
def on_hold(lock: HandoffLock) -> None:
    """A hold of ``lock`` began (replaced by :mod:`handofflock.os_signals`)."""


def on_unhold() -> None:
    """A hold ended (replaced by :mod:`handofflock.os_signals`)."""


def _finish(lock: HandoffLock, release: bool, why: str) -> None:
    """The end of a lock's life: released (handed off) if ``release``, else only no longer renewed."""
    try:
        if release and lock._state in (HELD, RELEASING):  # a release that failed (or was interrupted) too
            heir = lock.release()
            lock._log_release.info("released %s %s%s", lock.url, why, f", handed off to {heir}" if heir else "")
        else:
            lock._unschedule()  # no longer renewed: the lease runs out by itself
    except Exception as exc:  # the end of a lock's life must not raise into the program
        lock._log_release.warning(
            "could not release %s %s: %s; it frees itself when its lease runs out", lock.url, why, exc
        )


class _Reaper:
    """The daemon thread that releases locks whose last reference went while held (a daemon: exit never waits
    for it). Nothing of a lock's own keeps it alive, so that is at once; a cycle through user code (a receiver
    closing over its lock) waits for the cycle collector."""

    orphans: queue.SimpleQueue[tuple[HandoffLock, bool]] = queue.SimpleQueue()
    thread: threading.Thread | None = None
    start_mutex = threading.Lock()
    busy = threading.Lock()

    @classmethod
    def ensure(cls) -> None:
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


def _at_exit() -> None:
    """Cancel every acquire still waiting (in a daemon thread), then release every lock of this process
    still held. ``atexit`` runs after ``threading`` has joined the non-daemon threads and before the daemon
    ones stop, so the scheduler, notifiers and waiting acquires still run; hooks registered after this
    module was imported (a checkpoint saved at exit) run first."""
    pid = os.getpid()
    locks = [lock for lock in list(_LOCKS) if lock.release_at_exit and lock._pid == pid]
    waiting = [lock for lock in locks if lock._state is WAITING]
    for lock in waiting:
        # Its waiter slot given back now, or the owner would be asked to hand the lock to a process
        # that is gone. An acquire that won the lock meanwhile is released below, as any held lock.
        lock.cancel()
    for lock in waiting:
        if not lock._not_acquiring.wait(lock.timing.request_timeout + lock.give_up_budget):
            lock._log_acquire.warning("the acquire of %s cancelled at exit has not ended; exiting", lock.url)
    _Reaper.drain()
    for lock in locks:
        if lock._state in (HELD, RELEASING):
            _finish(lock, True, "at exit")


def _after_fork_in_child() -> None:
    """In a forked child every inherited lock holds nothing and does nothing: the parent's lease, renewals
    and release are the parent's, and the parent's reaper thread and its queue are not the child's."""
    _Reaper.orphans, _Reaper.thread = queue.SimpleQueue(), None
    _Reaper.start_mutex, _Reaper.busy = threading.Lock(), threading.Lock()
    for lock in list(_LOCKS):
        lock._after_fork()


atexit.register(_at_exit)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
