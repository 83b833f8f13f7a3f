"""HandoffLock: the public client. It performs I/O and keeps state; ``protocol.py`` decides.

Threads: ``acquire()`` runs in the caller's thread (a waiter polls there).
Renewal and the waiter check run on the process-wide scheduler
(``scheduler.py``). ``release()`` may be called from any thread, and from a
signal handler while the same thread is inside the library: such a re-entrant
call only records the request and the outer call carries it out on its way
out, so nothing deadlocks.
"""

from __future__ import annotations

import enum
import logging
import math
import os
import secrets
import socket
import threading
import warnings
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from ..core import protocol
from ..core.backoff import RETRY
from ..core.clock import Clock
from ..core.errors import (
    AcquireCancelled,
    ConfigurationError,
    HandoffLockError,
    InheritedAcrossFork,
    LockContended,
    LockLost,
    LockNotHeld,
    LockRecordCorrupt,
    LockTimeout,
    PreconditionFailed,
    StorageError,
    TransientStorageError,
)
from ..core.identity import detect_label
from ..core.protocol import Contended, Kind, Lost, Owned, Policy, Released, WaiterSeen, Write
from ..core.record import Label, LockRecord, id_problem, label_problem, new_nonce
from ..core.timefmt import when as _when
from ..core.timing import Timing
from ..storage import MAX_RECORD_BYTES, Storage, open_url
from ..storage.cas import read_retrying, write_resolving
from ..storage.pacing import WriteGate, default_write_interval, gate_for
from . import events as signals
from . import metrics

if TYPE_CHECKING:
    from .steps import Steps

_log_acquire = logging.getLogger("handofflock.acquire")
_log_renew = logging.getLogger("handofflock.renew")
_log_release = logging.getLogger("handofflock.release")

T = TypeVar("T")

IDLE, WAITING, HELD, LOST = "idle", "waiting", "held", "lost"
#: A release whose write failed transiently: retried in the background (and by ``release()``)
#: until it lands or the lease runs out. Not renewed, not "held" for the user.
RELEASING = "releasing"
#: An instance inherited across fork(): in the child it holds nothing and does nothing.
FORKED = "forked"

#: Every live instance, so that a forked child can disarm those it inherited.
_INSTANCES: weakref.WeakSet[HandoffLock] = weakref.WeakSet()


def default_owner_id() -> str:
    """``host:pid:random``: unique per lock instance, readable in ``status``."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


class RequestReason(str, enum.Enum):
    """Why the lock is wanted. A ``str``: ``RequestReason.WAITER == "waiter"``."""

    #: Another party registered as the waiter; ``requester`` is its owner id.
    WAITER = "waiter"
    #: An OS signal (SIGTERM, SIGUSR1, ...) through :func:`~handofflock.install_signal_handlers`.
    SIGNAL = "signal"
    #: A preemption notice from :class:`~handofflock.PreemptionWatcher`.
    PREEMPTION = "preemption"
    #: Code or a person called :meth:`HandoffLock.request_release` (formerly ``"manual"``).
    OPERATOR = "operator"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class ReleaseRequest:
    """Someone wants the lock: who, why, and by when.

    ``reason`` is a :class:`RequestReason`; ``requester`` is the waiter's owner
    id, or the signal/notice/operator that asked; ``deadline`` is the Unix time
    by which the lock should be released, or None; ``requested_at`` is the Unix
    time the request was noted here.
    """

    reason: RequestReason
    requester: str
    deadline: float | None
    requested_at: float


@dataclass(frozen=True)
class _Withdrawn:
    """A queued ``on_release_withdrawn`` (it travels with the notices, so it is sent after its request)."""

    request: ReleaseRequest


@dataclass(frozen=True)
class LockStatus:
    """A fresh snapshot of the lock object, as read by :meth:`HandoffLock.status`."""

    url: str
    exists: bool
    generation: int
    owner_id: str | None = None
    expires_at: float | None = None
    waiter_id: str | None = None
    waiter_expires_at: float | None = None
    token: int = 0
    ttl: float | None = None
    read_at: float = 0.0
    owner_live: bool = False
    waiter_live: bool = False
    record: LockRecord | None = None
    owner_label: Label | None = None
    waiter_label: Label | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "exists": self.exists,
            "generation": self.generation,
            "ownerId": self.owner_id,
            "expiresAt": self.expires_at,
            "waitingOwnerId": self.waiter_id,
            "waiterExpiresAt": self.waiter_expires_at,
            "token": self.token,
            "ttl": self.ttl,
            "readAt": self.read_at,
            "ownerLive": self.owner_live,
            "waiterLive": self.waiter_live,
            "ownerLabel": None if self.owner_label is None else self.owner_label.text,
            "waiterLabel": None if self.waiter_label is None else self.waiter_label.text,
            "ownerGrace": None if self.owner_label is None else self.owner_label.grace,
        }


class HandoffLock:
    """A single-waiter cooperative handoff lock kept as one JSON object.

    >>> lock = HandoffLock("gs://bucket/locks/train.json", ttl=60.0)
    >>> with lock:                      # waits as the single waiter if held
    ...     for step in steps:
    ...         train(step)
    ...         if lock.release_requested:   # a waiter, SIGTERM or preemption asked
    ...             save_checkpoint(fence=lock.token)
    ...             break                    # leaving the block hands the lock over

    Parameters (seconds): ``ttl`` is the lease; the owner renews every
    ``renew_interval`` (default ttl/8) and gives the lock up as unhealthy if no
    renewal succeeded for ``renew_deadline`` (default ttl/2). The owner reads
    the record every ``waiter_check_interval`` to notice a waiter; a waiter
    reads it every ``waiter_poll_interval`` and holds its slot for
    ``waiter_ttl`` (default ttl), refreshing it at half-life. A lease counts
    as expired for others only ``max_clock_skew`` after its ``expiresAt``.
    ``min_write_interval`` spaces writes to the object from this process
    (default 1.0 on GCS, whose per-object write rate is about 1/s; 0 elsewhere).
    With ``wait_for_slot=True`` a blocking acquire that finds another live
    waiter keeps polling for the slot instead of raising :class:`LockContended`.
    ``owner_id`` defaults to a fresh ``host:pid:random``; pass a stable one to
    let a restarted process retake its own lock at once. ``label`` says who
    this is for people (``status`` shows it beside the owner or waiter id): a
    string, a :class:`~handofflock.core.record.Label`, or by default what
    :func:`~handofflock.core.identity.detect_label` finds (host, pid, pod,
    Slurm job, torchrun rank).

    No I/O happens in the constructor.
    """

    def __init__(
        self,
        url: str | os.PathLike[str],
        *,
        ttl: float = 60.0,
        renew_interval: float | None = None,
        renew_deadline: float | None = None,
        waiter_ttl: float | None = None,
        waiter_check_interval: float = 2.0,
        waiter_poll_interval: float = 1.0,
        max_clock_skew: float = 2.0,
        min_write_interval: float | None = None,
        wait_for_slot: bool = False,
        owner_id: str | None = None,
        label: str | Label | None = None,
        clock: Clock | None = None,
        scheduler: Any = None,
        storage: Storage | None = None,
        key: str | None = None,
        timing: Timing | None = None,
    ) -> None:
        if storage is not None:
            if key is None:
                raise ConfigurationError("pass key= together with storage=")
            self._storage, self._key = storage, key
            self.url = f"{getattr(storage, 'url', storage)}/{key}"
        else:
            self._storage, self._key = open_url(url)
            self.url = os.fspath(url)
        #: What the scheduler runs (its whole view of this lock).
        self._duties = _Duties(self)
        if timing is not None:
            given = {
                name: value
                for name, value, default in (
                    ("ttl", ttl, 60.0),
                    ("renew_interval", renew_interval, None),
                    ("renew_deadline", renew_deadline, None),
                    ("waiter_ttl", waiter_ttl, None),
                    ("waiter_check_interval", waiter_check_interval, 2.0),
                    ("waiter_poll_interval", waiter_poll_interval, 1.0),
                    ("max_clock_skew", max_clock_skew, 2.0),
                    ("min_write_interval", min_write_interval, None),
                )
                if value != default
            }
            if not isinstance(timing, Timing):
                raise ConfigurationError(f"timing must be a handofflock.Timing, got {type(timing).__name__}")
            if given:
                raise ConfigurationError(f"pass timing= or the timing keywords, not both (got {', '.join(given)})")
            self.timing = timing
        else:
            if min_write_interval is None:
                min_write_interval = default_write_interval(self._storage)
            self.timing = Timing.build(
                ttl=ttl,
                renew_interval=renew_interval,
                renew_deadline=renew_deadline,
                waiter_ttl=waiter_ttl,
                waiter_check_interval=waiter_check_interval,
                waiter_poll_interval=waiter_poll_interval,
                max_clock_skew=max_clock_skew,
                min_write_interval=min_write_interval,
            )
        t = self.timing
        self.ttl, self.renew_interval, self.renew_deadline, self.waiter_ttl = (
            t.ttl,
            t.renew_interval,
            t.renew_deadline,
            t.waiter_ttl,
        )
        self.waiter_check_interval, self.waiter_poll_interval = t.waiter_check_interval, t.waiter_poll_interval
        self.max_clock_skew, self.min_write_interval = t.max_clock_skew, t.min_write_interval
        #: How long giving back the waiter slot (after a timeout, cancel or error) may take: a read
        #: and an urgent write, each allowed a retry. acquire() returns within its timeout plus this.
        self.give_up_budget = max(2.0, 2 * t.min_write_interval + 1.0)
        self.wait_for_slot = bool(wait_for_slot)
        if owner_id is not None and (problem := id_problem(owner_id, "owner_id")) is not None:
            raise ConfigurationError(f"{problem}: it is written into the lock object")
        self.owner_id: str = owner_id or default_owner_id()
        if label is None:
            label = Label(detect_label())
        elif isinstance(label, str):
            label = Label(label)
        problem = label_problem(label.text, "label") if isinstance(label, Label) else "label must be a string"
        if problem is not None:
            raise ConfigurationError(f"{problem}: it is written into the lock object")
        #: Who this is, for people: written beside ``owner_id`` as owner or waiter.
        self.label: Label = label
        self._clock = clock or Clock()
        self._scheduler = scheduler
        self._policy = Policy(ttl=self.ttl, waiter_ttl=self.waiter_ttl, max_clock_skew=self.max_clock_skew)
        #: Random id of this instance, written beside owner_id: two instances that share a stable
        #: owner_id (a restart racing its predecessor) are never taken for each other.
        self._instance = secrets.token_hex(8)

        # State. Plain attributes read without locks are written atomically.
        self._state = IDLE
        self._record: LockRecord | None = None
        self._generation = 0
        self.token: int | None = None
        self._valid_until = float("-inf")  # monotonic
        self._next_renew = float("inf")
        self._next_check = float("inf")
        self._renew_failures = 0
        self._lost_reason: str | None = None
        self._lost_error: BaseException | None = None
        self.release_requested: bool = False
        self.release_request: ReleaseRequest | None = None
        self._notified_waiters: set[str] = set()  # waiters already announced while we hold the lock
        self._requests: list[ReleaseRequest] = []  # the requests that stand (release_request: the most urgent)
        self._waiter_request: tuple[tuple[str, str | None], ReleaseRequest] | None = None  # (waiter id, instance)
        self._pending_notices: list[ReleaseRequest | _Withdrawn] = []
        self._pending_events: list[tuple[Any, dict[str, Any]]] = []

        self._new_primitives()
        self._next_release_try = float("inf")
        self._deferred_release = False
        self._after_deferred_release: list[Callable[[], Any]] = []
        self._gate: WriteGate | None = None
        self._pid = os.getpid()
        _INSTANCES.add(self)

    def _new_primitives(self) -> None:
        """The lock's mutexes, events and thread state, new: at construction, and in a forked child
        (where one may have been held by a parent thread that does not exist there)."""
        self._io = threading.Lock()  # serialises this lock's storage operations
        self._cancel = threading.Event()
        self._not_acquiring = threading.Event()  # set while no acquire() runs (release() waits on it)
        self._not_acquiring.set()
        self._notify_mutex = threading.Lock()
        self._notifier_running = False
        self._tls = threading.local()

    # ------------------------------------------------------------------ public state

    @property
    def storage(self) -> Storage:
        """The store holding the lock object (fenced objects beside the lock live there too)."""
        return self._storage

    @property
    def key(self) -> str:
        """The lock object's key inside :attr:`storage`."""
        return self._key

    @property
    def is_held(self) -> bool:
        """True from a successful acquire until release or loss. No I/O."""
        return self._state == HELD

    @property
    def healthy(self) -> bool:
        """True while the lock is held and renewed recently enough to be safe. No I/O.

        Turns False as soon as ``renew_deadline`` has passed since the last
        successful renewal, even if the background thread has not run yet (say
        the whole process was stopped): the monotonic clock kept counting.
        """
        return self._state == HELD and self._clock.monotonic() < self._valid_until

    def check(self) -> None:
        """Raise :class:`LockLost` unless the lock is held and healthy. No I/O.

        Call it before each unit of protected work.
        """
        if self.healthy:
            return
        if self._state == HELD:
            raise LockLost(
                f"lock {self.url!r} was not renewed within renew_deadline ({self.renew_deadline:.1f} s); "
                "treat it as lost (was the process paused?)",
                url=self.url,
                reason="renew deadline passed",
            )
        if self._state == LOST:
            raise LockLost(
                f"lock {self.url!r} was lost: {self._lost_reason}", url=self.url, reason=self._lost_reason or "lost"
            )
        if self._state == FORKED:
            raise LockLost(
                f"lock {self.url!r} belongs to process {self._pid}; this is a child forked from it",
                url=self.url,
                reason="inherited across fork",
            )
        raise LockLost(f"lock {self.url!r} is not held by this instance", url=self.url, reason="not held")

    def steps(self, iterable: Iterable[T]) -> Steps[T]:
        """Iterate ``iterable`` until a release is requested: the yield-to-checkpoint idiom.

        >>> steps = lock.steps(range(start, total))
        >>> for step in steps:
        ...     train(step)
        >>> save_checkpoint(steps.last, fence=lock.token)   # then leave: hands off

        No I/O per step; raises :class:`LockLost` before a step if the lock is
        no longer safely held. See :class:`handofflock.lock.steps.Steps`.
        """
        from .steps import Steps

        return Steps(self, iterable)

    def request_release(
        self,
        reason: RequestReason | str = RequestReason.OPERATOR,
        *,
        requester: str | None = None,
        deadline: float | None = None,
    ) -> None:
        """Ask the holder of this instance to release, as a waiter would.

        Safe in a signal handler: it only assigns attributes; the
        ``on_release_requested`` signal is sent from the scheduler thread.
        The most urgent request (earliest deadline) is kept. ``reason`` is a
        :class:`RequestReason` or its value; ``"manual"`` (the old name of
        ``"operator"``) still works, with a :class:`DeprecationWarning`.
        """
        if reason == "manual":
            warnings.warn(
                'request_release("manual") is deprecated: use RequestReason.OPERATOR ("operator")',
                DeprecationWarning,
                stacklevel=2,
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
        self._request(why, requester or why.value, deadline)

    def _request(self, reason: RequestReason, requester: str, deadline: float | None) -> ReleaseRequest:
        request = ReleaseRequest(reason, requester, deadline, self._clock.time())
        self._requests.append(request)  # first: a withdrawal running meanwhile must see it
        current = self.release_request
        if current is None or (deadline is not None and (current.deadline is None or deadline < current.deadline)):
            self.release_request = request
        self.release_requested = True
        self._pending_notices.append(request)
        return request

    def _withdraw(self, request: ReleaseRequest) -> None:
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
            self.release_request = _most_urgent(standing)
            self.release_requested = bool(standing)
            if len(self._requests) == len(standing):
                break
        self._pending_notices.append(_Withdrawn(request))

    # ------------------------------------------------------------------ acquire

    def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        """Take the lock. Returns True when held.

        * lock absent, free, or expired with no other live waiter: take it.
        * held by a live owner: become the single waiter and poll until the
          owner hands the lock over or its lease expires.
        * another live waiter already: raise :class:`LockContended` (or, with
          ``wait_for_slot``, keep polling for the slot).

        ``blocking=False`` never waits and never registers as waiter: it returns
        False if the lock cannot be taken now (transient storage errors are
        retried for at most ``timeout``, default ``renew_deadline``).
        ``timeout`` bounds the wait; on expiry the waiter slot is given back
        and :class:`LockTimeout` raised, within ``timeout + give_up_budget``.

        Every way out that does not return True gives the waiter slot back: a
        timeout, :meth:`cancel`, a storage error, KeyboardInterrupt. A
        :meth:`cancel` that comes while no acquire runs cancels the next one.
        When True is returned the lease is valid and counted from the write
        that made it (for a handoff, from the previous owner's write, renewed
        at once if little of it is left).
        """
        if timeout is not None and not timeout >= 0:  # also refuses NaN
            raise ConfigurationError(f"timeout must be >= 0 or None, got {timeout!r}")
        return metrics.timed_acquire(self, self._clock, lambda: self._guarded(lambda: self._acquire(blocking, timeout)))

    def _acquire(self, blocking: bool, timeout: float | None) -> bool:
        if self._state in (HELD, WAITING, RELEASING):
            doing = {HELD: "holds", WAITING: "is acquiring", RELEASING: "is still releasing"}[self._state]
            raise HandoffLockError(f"this HandoffLock instance already {doing} {self.url!r}")
        deadline = None if timeout is None else self._clock.monotonic() + timeout
        if deadline is None and not blocking:  # never waits for the lock, nor forever for the store
            deadline = self._clock.monotonic() + self.renew_deadline
        waiting = False
        last: LockRecord | None = None
        self._state = WAITING
        self._not_acquiring.clear()
        try:
            if self._cancel.is_set():  # a cancel() that came before we started
                raise AcquireCancelled(f"acquire of {self.url!r} was cancelled")
            polled = self._clock.monotonic()
            record, generation = self._read_locked(deadline)
            while True:
                last = record or last
                if (
                    blocking
                    and not waiting
                    and record is not None
                    and record.owner_id != self.owner_id
                    and record.waiting_owner_id == self.owner_id
                    and record.waiter_instance == self._instance
                ):
                    # Our registration landed though we could not confirm it (its reply was lost and
                    # the record moved on before we read it back): we are the waiter all the same.
                    waiting = True
                    self._now_waiting(record)
                mono, wall = self._clock.monotonic(), self._clock.time()
                decision = protocol.decide_acquire(
                    record,
                    generation,
                    me=self.owner_id,
                    now=wall,
                    policy=self._policy,
                    nonce=new_nonce(),
                    waiting=waiting,
                    instance=self._instance,
                    label=self.label,
                )
                if isinstance(decision, Owned):
                    self._became_owner(decision.record, decision.generation, handoff=True, mono=mono, wall=wall)
                    self._settle_handed_lease(deadline)
                    return True
                if isinstance(decision, Write):
                    if decision.kind is Kind.BECOME_WAITER and not blocking:
                        return self._not_acquired()
                    try:
                        with self._io:
                            written, generation, mono, wall = self._write_lease(decision, deadline, interruptible=True)
                    except PreconditionFailed:
                        record, generation = self._read_to_write(deadline, interruptible=True)
                        continue
                    record = written.record
                    if written.kind in (Kind.CREATE, Kind.TAKE, Kind.RETAKE):
                        self._became_owner(record, generation, handoff=False, mono=mono, wall=wall)
                        return True
                    if not waiting:
                        waiting = True  # before the signal: a receiver that raises must find the slot to give back
                        self._now_waiting(record)
                elif isinstance(decision, Contended):
                    if not blocking:
                        return self._not_acquired()
                    if not self.wait_for_slot:
                        raise self._contended(LockContended, decision.record)
                else:  # Wait
                    if not blocking:
                        return self._not_acquired()
                # Read again one poll interval after the last read began (sooner at the deadline):
                # polls keep a fixed rate, so a read's own duration does not stretch the period.
                pause = max(0.0, polled + self.waiter_poll_interval - self._clock.monotonic())
                if deadline is not None:
                    left = deadline - self._clock.monotonic()
                    if left <= 0:
                        return self._give_up(waiting, last, timed_out=True)
                    pause = min(pause, left)
                if self._clock.wait(self._cancel, pause) or self._deferred_release:
                    return self._give_up(waiting, last, timed_out=False)
                polled = self._clock.monotonic()
                record, generation = self._read_locked(deadline)
        except BaseException as exc:
            if self._state == WAITING:
                # Every way out gives the slot back, or the owner would hand the lock to nobody.
                try:
                    self._leave_slot(waiting, last, keep=False)
                except BaseException as cleanup:  # the original error is what the caller must see
                    _log_acquire.warning(
                        "%s could not give back its waiter slot on %s: %r", self.owner_id, self.url, cleanup
                    )
                if self._state == WAITING:
                    self._state = IDLE
                if isinstance(exc, TransientStorageError) and (self._cancel.is_set() or self._deferred_release):
                    # The retry was interrupted by cancel(): that is what happened.
                    raise AcquireCancelled(f"acquire of {self.url!r} was cancelled") from exc
            raise
        finally:
            self._cancel.clear()
            self._not_acquiring.set()

    def _now_waiting(self, record: LockRecord) -> None:
        _log_acquire.info("%s is now the waiter for %s (owner %s)", self.owner_id, self.url, record.owner_id)
        signals.send(signals.waiting, self, owner_id=record.owner_id, waiter_expires_at=record.waiter_expires_at)

    def cancel(self) -> None:
        """Stop a blocking ``acquire()`` running in another thread; it gives the waiter slot back.

        If no acquire is running, the next one to start is cancelled instead
        (a cancel racing the start of an acquire is never dropped). No effect
        while the lock is held.
        """
        if self._state in (IDLE, WAITING):
            self._cancel.set()

    def _not_acquired(self) -> bool:
        self._state = IDLE
        return False

    def _give_up(self, waiting: bool, last: LockRecord | None, *, timed_out: bool) -> bool:
        """A timeout or a cancel: leave the waiter slot (maybe we were handed the lock meanwhile)."""
        try:
            if self._leave_slot(waiting, last, keep=timed_out):
                return True  # the handoff beat the timeout: keep it
        finally:
            if self._state == WAITING:  # given back, or tried within the budget: never tried twice
                self._state = IDLE
        if timed_out:
            raise self._contended(LockTimeout, last, timed_out=True)
        raise AcquireCancelled(f"acquire of {self.url!r} was cancelled")

    def _leave_slot(self, waiting: bool, last: LockRecord | None, *, keep: bool) -> bool:
        """Clear our waiter slot with a conditional write, within ``give_up_budget``.

        If the owner handed us the lock meanwhile we own it: with ``keep`` we
        keep it (returns True), else we release it at once, handing it on.
        Returns False when we do not hold the lock afterwards.
        """
        # ``waiting`` is False if our registration's reply was lost and the record moved
        # on before we could see our nonce; the record naming us still says the slot is ours.
        if not (waiting or (last is not None and last.waiting_owner_id == self.owner_id)):
            return False
        deadline = self._clock.monotonic() + self.give_up_budget
        while self._clock.monotonic() < deadline:
            record, generation = self._read_to_write(deadline, urgent=True)
            mono, wall = self._clock.monotonic(), self._clock.time()
            decision = protocol.decide_give_up_wait(
                record,
                generation,
                me=self.owner_id,
                now=wall,
                policy=self._policy,
                nonce=new_nonce(),
                instance=self._instance,
            )
            if isinstance(decision, Owned):
                self._became_owner(decision.record, decision.generation, handoff=True, mono=mono, wall=wall)
                if keep:
                    self._settle_handed_lease(deadline)
                    return True
                self._deferred_release = False
                self._release_held(deadline)
                return False
            if not isinstance(decision, Write):
                return False
            try:
                with self._io:
                    self._write(decision, deadline, urgent=True)
                return False
            except PreconditionFailed:
                continue
        raise TransientStorageError(
            f"could not give back the waiter slot of {self.url!r} within {self.give_up_budget:.1f} s; "
            f"it expires by itself within waiter_ttl ({self.waiter_ttl} s)",
            url=self.url,
            key=self._key,
            ambiguous=False,
        )

    def _contended(self, cls: type[LockContended], record: LockRecord | None, timed_out: bool = False) -> LockContended:
        r = record or LockRecord()
        message = None
        if timed_out:
            message = (
                f"timed out acquiring {self.url!r}: held by {r.owner_id!r}, "
                f"lease ends {_when(r.expires_at, self._clock.time())}; waiter {r.waiting_owner_id!r}"
            )
        return cls(
            message,
            url=self.url,
            owner_id=r.owner_id,
            owner_expires_at=r.expires_at,
            waiter_id=r.waiting_owner_id,
            waiter_expires_at=r.waiter_expires_at,
        )

    def _lease_until(self, record: LockRecord, mono: float, wall: float) -> float:
        """Monotonic time until which ``record``'s lease is safe for us, ``mono``/``wall`` read together.

        The lease runs to ``expiresAt``; we stop calling it safe the usual
        margin (``ttl - renew_deadline``, in proportion for a lease of another
        length) before that. For a lease we wrote, stamped at its send, this is
        exactly ``send + renew_deadline``: counted from the write that made it.
        Others take the lock only ``max_clock_skew`` after ``expiresAt`` by
        their clocks, which is where the skew allowance is.
        """
        assert record.expires_at is not None
        length = record.ttl or self.ttl
        return mono + (record.expires_at - wall) - length * (1 - self.renew_deadline / self.ttl)

    def _set_lease(self, record: LockRecord, generation: int, mono: float, wall: float) -> None:
        self._record, self._generation = record, generation
        self._valid_until = self._lease_until(record, mono, wall)
        # Renew when what is left of the validity falls to renew_deadline - renew_interval.
        self._next_renew = self._valid_until - (self.renew_deadline - self.renew_interval)
        self._renew_failures = 0

    def _became_owner(self, record: LockRecord, generation: int, *, handoff: bool, mono: float, wall: float) -> None:
        """We own ``record``. ``mono``/``wall`` are the clocks when its lease was stamped (or read)."""
        self.token = record.token
        self._set_lease(record, generation, mono, wall)
        self._next_check = self._clock.monotonic() + self.waiter_check_interval
        self._lost_reason = self._lost_error = None
        # A release request recorded while we were acquiring (a SIGTERM, say) stands.
        self._notified_waiters.clear()
        self._state = HELD
        _log_acquire.info(
            "%s acquired %s (token %d%s)", self.owner_id, self.url, record.token, ", handed off" if handoff else ""
        )
        if record.waiter_live(self._clock.time()) and record.waiter_instance != self._instance:
            # A waiter already in the record we took (it registered while the lock was being
            # handed to us): our renewals write against this very generation and never meet it,
            # so the first waiter check runs now, not an interval later. It runs in the
            # background, after acquire() has returned: receivers never run inside acquire().
            self._next_check = self._clock.monotonic()
        self._schedule()
        signals.send(signals.acquired, self, token=record.token, handoff=handoff)

    def _settle_handed_lease(self, deadline: float | None) -> None:
        """A handed-over lease with less than ``renew_interval`` of validity left is renewed before we return.

        The previous owner wrote it; we may have seen it late (a slow poll, a
        pause). acquire() returns only with a lease no check can call lost
        before its first renewal. The renewal is a write conditional on the
        generation we read, so it is safe however late it is.
        """
        if self._valid_until - self._clock.monotonic() >= self.renew_interval:
            return
        with self._io:
            if self._state != HELD:
                return
            decision = protocol.decide_renew(
                self._record,
                self._generation,
                me=self.owner_id,
                token=self.token or 0,
                now=self._clock.time(),
                policy=self._policy,
                nonce=new_nonce(),
                instance=self._instance,
            )
            try:
                if not isinstance(decision, Write):
                    raise PreconditionFailed(self._key, self._generation, url=self.url)
                end = self._clock.monotonic() + self.renew_deadline
                written, generation, mono, wall = self._write_lease(
                    decision,
                    end if deadline is None else max(min(deadline, end), self._valid_until),
                    urgent=True,
                )
            except (StorageError, LockRecordCorrupt) as exc:
                if self._clock.monotonic() < self._valid_until:
                    self._next_renew = self._clock.monotonic()  # keep it; the scheduler retries at once
                    return
                self._mark_lost(f"handed a lease too short to use, and could not renew it: {exc}", exc)
                raise self._lost_error from exc  # type: ignore[misc]
            self._set_lease(written.record, generation, mono, wall)

    # ------------------------------------------------------------------ release

    def release(self) -> str | None:
        """Give the lock up: hand it to a live waiter in one write, or mark it free.

        Returns the waiter's owner id when handed off, else None. Raises
        :class:`LockLost` (writing nothing) if the lock had been lost, and
        :class:`LockNotHeld` if this instance never held it. During a blocking
        ``acquire()`` in another thread, it cancels that acquire and waits for
        it to end; if the acquire got the lock first, that hold is released.

        If the release write fails (the store is down), the error is raised
        and the lock is no longer renewed; the release is retried in the
        background until it lands or the lease runs out, and ``release()`` may
        be called again to retry it at once.
        """
        return self._guarded(self._release, deferrable=True)

    def _release(self) -> str | None:
        if self._state == WAITING:
            self._cancel.set()
            if not self._not_acquiring.wait(self.give_up_budget + self.renew_deadline + 30.0):
                _log_release.warning("release() of %s: the acquire it cancelled has not ended yet", self.url)
                return None
            if self._state != HELD:  # the acquire gave up (and gave the slot back)
                return None
            # The acquire got the lock just before it saw the cancel: release that hold.
        if self._state == LOST:
            self._state = IDLE
            self._end_hold()
            raise LockLost(
                f"lock {self.url!r} had been lost ({self._lost_reason}); nothing was written",
                url=self.url,
                reason=self._lost_reason or "lost",
            )
        if self._state not in (HELD, RELEASING):
            raise LockNotHeld(f"release() of {self.url!r}, which this instance does not hold")
        return self._release_held(self._clock.monotonic() + max(self.renew_deadline, 5.0))

    def _release_held(self, deadline: float, *, background: bool = False) -> str | None:
        """The release write of a held (or releasing) lock; see :meth:`release`."""
        self._unschedule()
        with self._io:
            if self._state not in (HELD, RELEASING):  # lost while we waited for the scheduler's I/O
                return None if background else self._release()  # no I/O: raises LockLost
            # From here the lock is no longer ours to use: the write may land (and the heir start)
            # before its reply reaches us, so healthy/check() say no from the moment it is sent.
            self._state = RELEASING
            self._next_release_try = float("inf")  # this attempt runs now
            try:
                heir, lost = self._write_release(deadline)
            except (TransientStorageError, PreconditionFailed) as exc:
                # Not idle: the record still names us (perhaps with a waiter waiting). Keep
                # trying in the background, no longer renewing; release() may retry at once.
                if self._state == RELEASING:
                    self._next_release_try = self._clock.monotonic() + min(1.0, self.renew_interval)
                    self._schedule()
                _log_release.warning(
                    "release of %s failed (%s); retrying in the background until the lease runs out", self.url, exc
                )
                if background:
                    return None
                raise
            except BaseException:
                self._state = IDLE
                self._end_hold()
                raise
            # Still under _io: a scheduler duty queued behind this release must find the
            # lock no longer held, not renew or check it from the record just replaced.
            self._state = IDLE
        self._end_hold()
        if lost is not None:
            if background:
                return None
            self._flush_events()  # outside _io: a receiver of ``lost`` may call back in
            raise lost
        token = self.token
        _log_release.info("%s released %s%s", self.owner_id, self.url, f", handed off to {heir}" if heir else "")
        if background:
            self._pending_events.append((signals.released, {"handed_off_to": heir, "token": token}))
            self._notify()
        else:
            signals.send(signals.released, self, handed_off_to=heir, token=token)
        return heir

    def _end_hold(self) -> None:
        """A hold is over, however it ended: a release request belonged to it and goes with it."""
        self.release_request = None
        self.release_requested = False
        self._requests = []
        self._waiter_request = None
        self._next_release_try = float("inf")

    def _write_release(self, deadline: float) -> tuple[str | None, LockLost | None]:
        """The release's write (retried, re-read on 412): (heir, None), or (None, why it was lost)."""
        attempted: Write | None = None
        record, generation = self._record, self._generation
        while True:
            decision = protocol.decide_release(
                record,
                generation,
                me=self.owner_id,
                token=self.token or 0,
                now=self._clock.time(),
                policy=self._policy,
                nonce=new_nonce(),
                attempted=attempted,
                within_lease=self._clock.monotonic() < self._valid_until,
                instance=self._instance,
            )
            if isinstance(decision, Released):
                return decision.handed_off_to, None
            if isinstance(decision, Lost):
                self._mark_lost(decision.why, None, from_release=True)
                why = f"lock {self.url!r} was lost before release: {decision.why}; nothing was written"
                return None, LockLost(why, url=self.url, reason=decision.why)
            assert isinstance(decision, Write)
            try:
                written, _, _, _ = self._write_lease(decision, deadline, urgent=True)
            except PreconditionFailed:
                attempted = decision
                try:
                    record, generation = self._read(deadline)
                except LockRecordCorrupt as exc:  # overwritten by someone: lost, and never rewritten
                    self._mark_lost(f"the lock object became unreadable: {exc.reason}", exc, from_release=True)
                    lost = LockLost(
                        f"lock {self.url!r} was lost before release: {exc}", url=self.url, reason="corrupt", cause=exc
                    )
                    lost.__cause__ = exc
                    return None, lost
                continue
            return (written.record.owner_id if written.kind is Kind.HANDOFF else None), None

    # ------------------------------------------------------------------ context manager

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
            _log_release.warning("lock %s had been lost; not masking the exception in flight", self.url)

    # ------------------------------------------------------------------ status

    def status(self) -> LockStatus:
        """Read the lock object now and describe it. One read; raises LockRecordCorrupt if bad."""

        def read() -> LockStatus:
            with self._io:
                record, generation = self._read(self._clock.monotonic() + 30.0, interruptible=True)
            now = self._clock.time()
            if record is None:
                return LockStatus(self.url, False, 0, read_at=now)
            return LockStatus(
                self.url,
                True,
                generation,
                record.owner_id,
                record.expires_at,
                record.waiting_owner_id,
                record.waiter_expires_at,
                record.token,
                record.ttl,
                now,
                record.owner_live(now),
                record.waiter_live(now),
                record,
                record.owner_label,
                record.waiter_label,
            )

        return self._guarded(read)

    # ------------------------------------------------------------------ background duties (scheduler thread)

    def _due(self) -> float:
        """Monotonic time of this lock's next background duty (inf if none)."""
        if self._state == HELD:
            return min(self._due_besides_check(), self._next_check)
        return self._due_besides_check()

    def _due_besides_check(self) -> float:
        """Like :meth:`_due` without the waiter check, which a scheduler may batch across locks."""
        if (self._pending_notices or self._pending_events) and not self._notifier_running:
            return float("-inf")
        if self._state == RELEASING:
            return self._next_release_try
        if self._state != HELD:
            return float("inf")
        return min(self._next_renew, self._valid_until)

    def _run_due(self) -> None:
        """Do whatever is due: renew, check for a waiter, retry a failed release; hand signals to the notifier."""
        now = self._clock.monotonic()
        if self._state == HELD:
            if now >= self._valid_until:
                with self._io:
                    if self._state == HELD:
                        self._mark_lost(f"no successful renewal for {self.renew_deadline:.1f} s (renew_deadline)", None)
            elif now >= self._next_renew:
                self._renew()  # never waits for the write gate: a deferred renewal leaves the check due next
            elif now >= self._next_check:
                self._check_waiter()
        elif self._state == RELEASING and now >= self._next_release_try:
            self._retry_release()
        self._notify()

    def _renew(self) -> None:
        """Renew; never waits for the write gate (it defers instead) and never sleeps between retries.

        The lease stays valid until ``_valid_until``, well past the next
        attempt: a renewal the store's write spacing would delay is deferred to
        when the gate opens, so the lock's I/O mutex is never held through a
        wait and a release or a waiter check never queues behind one.

        Renewals are urgent writes for the gate (they keep the lock), so a
        renewal whose write failed its precondition (a waiter registered,
        refreshed or left) is sent again at once from the record just read,
        not a full spacing later: a few waiter writes in a row must not run
        an owner at the shortest ttl past its renew deadline.
        """
        with self._io:
            for _ in range(3):
                if self._state != HELD:
                    return
                now = self._clock.monotonic()
                wait = self._write_gate().ready_in(now, urgent=True)
                if wait > 0:
                    self._next_renew = now + wait
                    return
                try:
                    decision = protocol.decide_renew(
                        self._record,
                        self._generation,
                        me=self.owner_id,
                        token=self.token or 0,
                        now=self._clock.time(),
                        policy=self._policy,
                        nonce=new_nonce(),
                        instance=self._instance,
                    )
                    if isinstance(decision, Lost):
                        self._mark_lost(decision.why, None)
                        return
                    assert isinstance(decision, Write)
                    try:
                        written, generation, mono, wall = self._write_lease(
                            decision, self._valid_until, retry=False, urgent=True
                        )
                    except PreconditionFailed:
                        # A waiter registered, refreshed or left (or we lost it): read, note, renew again.
                        record, generation = self._read(self._valid_until, retry=False)
                        seen = protocol.observe_as_owner(
                            record,
                            me=self.owner_id,
                            token=self.token or 0,
                            now=self._clock.time(),
                            instance=self._instance,
                        )
                        if isinstance(seen, Lost):
                            self._mark_lost(seen.why, None)
                            return
                        self._record, self._generation = record, generation
                        self._note_waiter(record)
                        self._next_renew = self._clock.monotonic()
                        continue
                    self._set_lease(written.record, generation, mono, wall)
                    metrics.renewed(self, self._clock.monotonic() - mono)
                    _log_renew.debug("%s renewed %s until %.3f", self.owner_id, self.url, written.record.expires_at)
                    return
                except TransientStorageError as exc:
                    metrics.renewal_failed(self, exc)
                    self._renew_failures += 1
                    delay = min(self.renew_interval, RETRY.delay(self._renew_failures))
                    self._next_renew = min(self._clock.monotonic() + delay, self._valid_until)
                    _log_renew.warning(
                        "renewal of %s failed (%s); retrying in %.2f s, giving up at the renew deadline",
                        self.url,
                        exc,
                        delay,
                    )
                    return
                except (StorageError, LockRecordCorrupt) as exc:
                    metrics.renewal_failed(self, exc)
                    self._mark_lost(f"renewal failed: {exc}", exc)
                    return

    def _retry_release(self) -> None:
        """Retry a release whose write failed, until it lands or the lease is over anyway."""
        now = self._clock.monotonic()
        if now >= self._valid_until + (self.ttl - self.renew_deadline):
            with self._io:
                if self._state == RELEASING:
                    _log_release.warning(
                        "gave up releasing %s: its lease has run out, so it is free for others anyway", self.url
                    )
                    self._state = IDLE
                    self._end_hold()
                    self._unschedule()
            return
        self._next_release_try = now + min(1.0, self.renew_interval)
        try:
            self._release_held(now + min(self.renew_deadline, 5.0), background=True)
        except Exception as exc:  # already logged; a permanent error ends the hold
            _log_release.warning("release of %s failed for good: %s", self.url, exc)

    def _check_waiter(self, known_generation: int | None = None) -> None:
        """Still ours? Someone waiting? One read, or none when ``known_generation`` says nothing changed.

        The scheduler passes ``known_generation`` from a listing it just made
        (0: not listed) when it checks many locks at once; the check then runs
        whether or not it was due. Generations only grow, so a listed generation equal to the one we know
        means the object holds exactly our cached record: deciding on that is
        deciding on what a read would return. A listed generation below ours
        means the listing is older than our own last write or read of the
        object (a renewal while the group was being listed), which already
        showed it: no read either. A higher one (someone else wrote), or 0
        (not listed), is settled by a read, never by the listing alone.
        """
        with self._io:
            if self._state != HELD:
                return
            self._next_check = self._clock.monotonic() + self.waiter_check_interval
            record: LockRecord | None
            try:
                if (
                    known_generation is not None
                    and 0 < known_generation <= self._generation
                    and self._record is not None
                ):
                    # Listed as we know it, or older: we wrote (renewed) or read it since the
                    # listing was made, and that is at least as fresh as the listing's view.
                    record, generation = self._record, self._generation
                else:
                    record, generation = self._read(None, retry=False)
            except TransientStorageError as exc:
                _log_renew.debug("waiter check of %s failed: %s", self.url, exc)
                return
            except (StorageError, LockRecordCorrupt) as exc:
                self._mark_lost(f"the lock object became unreadable: {exc}", exc)
                return
            seen = protocol.observe_as_owner(
                record, me=self.owner_id, token=self.token or 0, now=self._clock.time(), instance=self._instance
            )
            if isinstance(seen, Lost):
                self._mark_lost(seen.why, None)
                return
            if generation != self._generation:
                self._record, self._generation = record, generation
            self._note_waiter(record)

    def _note_waiter(self, record: LockRecord | None) -> None:
        """Announce a new waiter; withdraw the request of one that has gone (left, expired or replaced)."""
        if record is None:
            return
        seen = protocol.observe_as_owner(
            record, me=self.owner_id, token=self.token or 0, now=self._clock.time(), instance=self._instance
        )
        if isinstance(seen, Lost):
            return
        waiter = (seen.waiter_id, record.waiter_instance) if isinstance(seen, WaiterSeen) else None
        standing = self._waiter_request
        if standing is not None and standing[0] != waiter:
            # Only a waiter's own request goes with it; a signal's or a preemption notice's stands.
            self._waiter_request = None
            self._notified_waiters.discard(standing[0][0])  # should it come back, it is announced again
            gone = "left" if waiter is None else f"was replaced by {waiter[0]}"
            _log_renew.info("%s: waiter %s %s; its release request is withdrawn", self.owner_id, standing[0][0], gone)
            self._withdraw(standing[1])
        if isinstance(seen, WaiterSeen) and seen.waiter_id not in self._notified_waiters:
            self._notified_waiters.add(seen.waiter_id)
            metrics.waiter_noticed(self, record, self._clock.time())
            _log_renew.info("%s: %s is waiting for %s", self.owner_id, seen.waiter_id, self.url)
            request = self._request(RequestReason.WAITER, seen.waiter_id, seen.deadline)
            self._waiter_request = ((seen.waiter_id, record.waiter_instance), request)

    def _mark_lost(self, why: str, error: BaseException | None, *, from_release: bool = False) -> None:
        """Record the loss once; queue ``lost`` (and ``on_renewal_error``) for sending outside locks."""
        if self._state == LOST:
            return
        self._state = LOST
        self._valid_until = float("-inf")
        self._lost_reason = why
        self._unschedule()
        exc = LockLost(f"lock {self.url!r} lost: {why}", url=self.url, reason=why, cause=error)
        if error is not None:
            exc.__cause__ = error
        self._lost_error = exc
        _log_renew.error("%s lost %s: %s", self.owner_id, self.url, why)
        if not from_release:
            self._pending_events.append((signals.on_renewal_error, {"error": exc}))
        self._pending_events.append((signals.lost, {"reason": why, "error": exc}))

    def _notify(self) -> None:
        """Have queued signals sent by this lock's notifier thread, never by the thread that renews.

        Receivers may block (a checkpoint in an ``on_release_requested``
        receiver is the point of it): they delay only later signals of this
        lock, never a renewal or a waiter check of any lock. The notifier is a
        daemon thread that lives while there is something to send, so
        interpreter exit never waits for a receiver.
        """
        if not (self._pending_notices or self._pending_events):
            return
        if getattr(self._scheduler, "notify_inline", False):
            self._flush_events()  # a scheduler run by hand (tests, simulations): deterministic, in its caller
            return
        with self._notify_mutex:
            if self._notifier_running:
                return
            self._notifier_running = True
        try:
            threading.Thread(
                target=self._notifier_main, name=f"handofflock-notify-{self.owner_id}", daemon=True
            ).start()
        except BaseException:
            self._notifier_running = False
            raise

    def _notifier_main(self) -> None:
        while True:
            try:
                self._flush_events()
            except Exception:  # signals.send already isolates receivers; this is a last resort
                _log_renew.exception("sending the signals of %s failed", self.url)
            with self._notify_mutex:
                if not (self._pending_notices or self._pending_events):
                    self._notifier_running = False
                    return

    def _flush_events(self) -> None:
        """Send queued signals in this thread. Called with no lock held, so receivers may call back in."""
        # Two threads may flush at once (a release and the notifier): pop, never test then pop.
        while (req := _pop_first(self._pending_notices)) is not None:
            if isinstance(req, _Withdrawn):
                signals.send(
                    signals.on_release_withdrawn,
                    self,
                    request=req.request,
                    requester=req.request.requester,
                    reason=req.request.reason,
                )
                continue
            signals.send(
                signals.on_release_requested,
                self,
                request=req,
                requester=req.requester,
                reason=req.reason,
                deadline=req.deadline,
                waiter_id=req.requester,  # deprecated: the requester, whatever the reason (see CHANGELOG)
            )
        while (event := _pop_first(self._pending_events)) is not None:
            signal, kwargs = event
            signals.send(signal, self, **kwargs)

    def _schedule(self) -> None:
        if self._scheduler is None:
            from .scheduler import default_scheduler

            self._scheduler = default_scheduler()
        self._scheduler.add(self._duties)

    def _unschedule(self) -> None:
        if self._scheduler is not None:
            self._scheduler.discard(self._duties)

    # ------------------------------------------------------------------ storage I/O

    def _read(
        self, deadline: float | None, *, retry: bool = True, interruptible: bool = False
    ) -> tuple[LockRecord | None, int]:
        """One read (retried on transient errors until ``deadline``), decoded strictly."""
        found = read_retrying(
            self._storage,
            self._key,
            clock=self._clock,
            deadline=deadline,
            max_bytes=MAX_RECORD_BYTES,
            retry=retry,
            sleep=lambda delay: self._sleep_before_retry(delay, interruptible),
        )
        if found is None:
            return None, 0
        data, generation = found
        return LockRecord.decode(data, key=self._key, generation=generation, url=self.url), generation

    def _read_locked(self, deadline: float | None) -> tuple[LockRecord | None, int]:
        """An acquire's poll: one interruptible read under the I/O mutex."""
        with self._io:
            return self._read(deadline, interruptible=True)

    def _write_gate(self) -> WriteGate:
        if self._gate is None:
            self._gate = gate_for(self._storage, self._key, self.min_write_interval, self._clock)
        return self._gate

    def _read_to_write(
        self, deadline: float | None, *, urgent: bool = False, interruptible: bool = False
    ) -> tuple[LockRecord | None, int]:
        """Read for a decision that will likely be written: wait for our write slot first (mutex not held).

        Reading and then waiting out the per-object write spacing would send the
        write on a generation that has had a second to go stale; against a busy
        object that can lose every time.
        """
        wait = self._write_gate().ready_in(self._clock.monotonic(), urgent=urgent)
        if deadline is not None:
            wait = min(wait, max(0.0, deadline - self._clock.monotonic()))
        if wait > 0:
            if interruptible:
                self._sleep_before_retry(wait, True)
            else:
                self._clock.sleep(wait)
        with self._io:
            return self._read(deadline, interruptible=interruptible)

    def _write_lease(
        self,
        write: Write,
        deadline: float | None,
        *,
        retry: bool = True,
        urgent: bool = False,
        interruptible: bool = False,
    ) -> tuple[Write, int, float, float]:
        """Make ``write``, its lease or slot stamped at the send of each attempt. Call with ``_io`` held.

        Returns ``(the attempt that landed, new generation, monotonic and wall
        time of its send)``: a lease is counted from the send of the write that
        made it, never from when the operation began (a wait for the write
        gate, or retries after a 503 or a 429, come before the stamp).
        """
        attempts: dict[str, tuple[Write, float, float]] = {}
        sent: list[str] = []

        def stamp() -> bytes:
            mono, wall = self._clock.monotonic(), self._clock.time()
            attempt = protocol.restamp(write, now=wall, nonce=new_nonce(), policy=self._policy)
            assert attempt.record.nonce is not None
            attempts[attempt.record.nonce] = (attempt, mono, wall)
            sent.append(attempt.record.nonce)
            return attempt.record.encode()

        def is_ours(data: bytes) -> bool:
            return LockRecord.decode(data, key=self._key, url=self.url).nonce in attempts

        generation, read_back = write_resolving(
            self._storage,
            self._key,
            stamp,
            if_generation_match=write.if_generation_match,
            is_ours=is_ours,
            clock=self._clock,
            deadline=deadline,
            max_bytes=MAX_RECORD_BYTES,
            gate=self._write_gate(),
            urgent=urgent,
            retry=retry,
            sleep=lambda delay: self._sleep_before_retry(delay, interruptible),
        )
        landed = attempts[sent[-1]]
        if read_back is not None:
            landed = attempts.get(LockRecord.decode(read_back, key=self._key, url=self.url).nonce or "", landed)
            _log_acquire.info("%s: a write whose reply was lost had landed (%s)", self.owner_id, write.kind.value)
        attempt, mono, wall = landed
        return attempt, generation, mono, wall

    def _write(
        self,
        write: Write,
        deadline: float | None,
        *,
        retry: bool = True,
        urgent: bool = False,
        interruptible: bool = False,
    ) -> int:
        """Make one conditional write (stamped at its send); return the new generation.

        Raises PreconditionFailed when the record moved on (the caller reads and decides again).
        """
        return self._write_lease(write, deadline, retry=retry, urgent=urgent, interruptible=interruptible)[1]

    def _sleep_before_retry(self, delay: float, interruptible: bool) -> bool:
        """Sleep ``delay`` before a retry (the caller has checked its deadline); False to give up.

        ``interruptible`` retries (an acquire's polling, ``status()``) give up
        on ``cancel()`` or a deferred release. The others (a release, giving
        the waiter slot back) carry on to their deadline whatever arrives: they
        are what a cancel or a signal wants done.
        """
        if not interruptible:
            self._clock.sleep(delay)
            return True
        return not self._clock.wait(self._cancel, delay) and not self._deferred_release

    # ------------------------------------------------------------------ re-entrancy

    def _guarded(self, fn: Callable[[], T], *, deferrable: bool = False) -> T:
        """Run a public operation; a re-entrant release (signal handler) is deferred, not deadlocked."""
        if self._state == FORKED:
            raise InheritedAcrossFork(
                f"this HandoffLock for {self.url!r} was created in process {self._pid}, which this process was "
                "forked from; the lock and its renewals are that process's. Create a new HandoffLock here."
            )
        depth = getattr(self._tls, "depth", 0)
        if depth and deferrable:
            # Only a plain assignment: this may run in a signal handler that interrupted
            # this very thread inside the library, even inside an Event's own lock, so
            # taking any lock here could deadlock. The outer call acts on the flag (a
            # blocking acquire sees it after its current poll).
            self._deferred_release = True
            return None  # type: ignore[return-value]
        self._tls.depth = depth + 1
        try:
            return fn()
        finally:
            self._tls.depth = depth
            if depth == 0 and self._deferred_release:
                self._deferred_release = False
                try:
                    if self._state in (HELD, LOST):
                        self._guarded(self._release)
                finally:
                    then, self._after_deferred_release = self._after_deferred_release, []
                    for fn in then:
                        fn()

    def _then_after_deferred_release(self, fn: Callable[[], Any]) -> bool:
        """Run ``fn`` once the release deferred by a signal handler has run; False if none is deferred.

        For a handler that must act after the release (a second signal that
        kills the process): called from the handler, in the thread it interrupted.
        """
        if not self._deferred_release:
            return False
        self._after_deferred_release.append(fn)
        return True

    def __repr__(self) -> str:
        return f"<HandoffLock {self.url!r} owner_id={self.owner_id!r} state={self._state} token={self.token}>"


def _most_urgent(requests: list[ReleaseRequest]) -> ReleaseRequest | None:
    """The request with the earliest deadline (one without a deadline last; the first of equals)."""
    best: ReleaseRequest | None = None
    for request in requests:
        if best is None or (
            request.deadline is not None and (best.deadline is None or request.deadline < best.deadline)
        ):
            best = request
    return best


def _pop_first(items: list[T]) -> T | None:
    """Remove and return the first item, or None if there is none (atomic: one list.pop)."""
    try:
        return items.pop(0)
    except IndexError:
        return None


def _positive(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value == float("inf"):
        raise ConfigurationError(f"{name} must be a positive finite number of seconds, got {value!r}")
    return float(value)


def _disarm_inherited() -> None:
    """In a forked child: every inherited instance holds nothing and can do nothing.

    The parent's lease, renewals and release are the parent's business; a child
    that released or renewed them (an inherited ``release_at_exit`` hook, say)
    would take the lock from under the parent, or hand it on while the parent
    still works.
    """
    for lock in list(_INSTANCES):
        lock._state = FORKED
        lock._new_primitives()
        lock._pending_notices = []
        lock._pending_events = []
        lock._scheduler = None
        lock.token = None  # the parent's: a fenced write in the child must not carry it
        lock.release_requested = False
        lock.release_request = None
        lock._requests = []
        lock._waiter_request = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_disarm_inherited)


class _Duties:
    """A lock as its scheduler sees it (:class:`~handofflock.lock.scheduler.Scheduled`): its duties, nothing else."""

    __slots__ = ("_lock",)

    def __init__(self, lock: HandoffLock) -> None:
        self._lock = lock

    def __repr__(self) -> str:
        return f"<duties of {self._lock!r}>"

    @property
    def check_interval(self) -> float:
        return self._lock.waiter_check_interval

    @property
    def store(self) -> Storage:
        return self._lock._storage

    @property
    def key(self) -> str:
        return self._lock._key

    def next_due(self) -> float:
        return self._lock._due()

    def next_due_besides_check(self) -> float:
        return self._lock._due_besides_check()

    def next_check_at(self) -> float:
        return self._lock._next_check

    def run_due(self) -> None:
        self._lock._run_due()

    def check_against(self, generation: int) -> None:
        self._lock._check_waiter(known_generation=generation)
        self._lock._notify()
