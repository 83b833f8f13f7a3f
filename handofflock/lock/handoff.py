"""HandoffLock: the public client. Its state and transitions; :mod:`handofflock.core.protocol` decides.

Threads: ``acquire()`` runs in the caller's thread (a waiter polls there).
Renewal and the waiter check run on the process-wide scheduler
(:mod:`.scheduler`). ``release()`` may be called from any thread, and from a
signal handler while the same thread is inside the library: such a re-entrant
call only records the request and the outer call carries it out on its way
out, so nothing deadlocks.

This module is the state machine: the acquire loop, giving up, becoming the
owner, renewing, the waiter check and the release, serialized by one I/O
mutex. Each part that does not decide a transition lives beside it, behind a
seam it names: record I/O (:mod:`.record_io`), the lease (:mod:`.lease`), the
request book (:mod:`.requests`), the notifier (:mod:`.notifier`), the
re-entry guard (:mod:`.reentry`), fork handling (:mod:`.forking`), the
scheduler's adapter (:mod:`.duties`), the primitives they are all made from
(:mod:`.primitives`) and the constructor's checks (:mod:`.options`); the
decisions are :mod:`handofflock.core.protocol`'s.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
from collections.abc import Callable, Iterable
from typing import Any, Literal, TypeVar

from ..core import protocol
from ..core.backoff import RETRY
from ..core.clock import Clock
from ..core.errors import (
    AcquireCancelled,
    ConfigurationError,
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
from ..core.protocol import Contended, Kind, Lost, Me, Owned, Policy, Released, WaiterSeen, Write
from ..core.record import Label, LockRecord, new_nonce
from ..core.timefmt import when as _when
from ..core.timefmt import who
from ..core.timing import Timing
from ..storage import Storage, open_url
from . import events as signals
from . import forking, lifetime, metrics
from .acquired import Acquired
from .duties import Duties
from .lease import Lease
from .lifetime import Lifetime, weakly
from .notifier import Notifier
from .observation import Observation
from .options import TimingViews, label_of, owner_id_of, timing_of
from .primitives import THREADING, Primitives
from .record_io import RecordIO
from .reentry import ReentryGuard, already_acquired
from .requests import RequestBook, checked_request
from .state import State
from .steps import Steps
from .types import LockStatus, ReleaseRequest, RequestReason

_log_acquire = logging.getLogger("handofflock.acquire")
_log_renew = logging.getLogger("handofflock.renew")
_log_release = logging.getLogger("handofflock.release")

T = TypeVar("T")
INF = float("inf")

IDLE, WAITING, HELD, RELEASING, LOST, FORKED = (
    State.IDLE,
    State.WAITING,
    State.HELD,
    State.RELEASING,
    State.LOST,
    State.FORKED,
)


class HandoffLock(TimingViews):
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
    Or pass them all as one ``timing=``, a :class:`~handofflock.Timing`.
    With ``wait_for_slot=True`` a blocking acquire that finds another live
    waiter keeps polling for the slot instead of raising :class:`LockContended`.
    ``owner_id`` defaults to a fresh ``host:pid:random``; pass a stable one to
    let a restarted process retake its own lock at once. ``label`` says who
    this is for people (``status`` shows it beside the owner or waiter id): a
    string, a :class:`~handofflock.core.record.Label`, or by default what
    :func:`~handofflock.core.identity.detect_label` finds (host, pid, pod,
    Slurm job, torchrun rank).

    ``release_at_exit`` (default True; False on an injected fake clock or
    primitives) releases a lock still held at interpreter exit, handing it to
    a waiter, and one whose last reference goes while held (see
    :mod:`~handofflock.lock.lifetime`; ``os._exit`` and SIGKILL release nothing).

    What the lock is built from can be passed in, for tests and simulations:
    ``clock`` (wall and monotonic time, waits), ``scheduler`` (what runs the
    renewals and waiter checks; by default one per process), ``storage`` and
    ``key`` (instead of a URL), and ``primitives``, a
    :class:`~handofflock.lock.primitives.Primitives` whose factories make
    every mutex, event, thread-local and thread the lock and its parts use
    (default: :mod:`threading`).

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
        primitives: Primitives | None = None,
        release_at_exit: bool | None = None,
    ) -> None:
        if storage is not None:
            if key is None:
                raise ConfigurationError("pass key= together with storage=")
            self.url = f"{getattr(storage, 'url', storage)}/{key}"
        else:
            storage, key = open_url(url)
            self.url = os.fspath(url)
        self.timing = timing_of(
            storage,
            timing,
            {
                "ttl": ttl,
                "renew_interval": renew_interval,
                "renew_deadline": renew_deadline,
                "waiter_ttl": waiter_ttl,
                "waiter_check_interval": waiter_check_interval,
                "waiter_poll_interval": waiter_poll_interval,
                "max_clock_skew": max_clock_skew,
                "min_write_interval": min_write_interval,
            },
        )
        self.wait_for_slot = bool(wait_for_slot)
        self.owner_id: str = owner_id_of(owner_id)
        #: Who this is, for people: written beside ``owner_id`` as owner or waiter.
        self.label: Label = label_of(label)
        # The instance id, random, written beside owner_id: two instances that share a stable
        # owner_id (a restart racing its predecessor) are never taken for each other.
        self._me = Me(self.owner_id, secrets.token_hex(8), self.label)
        self._clock = clock or Clock()
        t = self.timing
        self._policy = Policy(ttl=t.ttl, waiter_ttl=t.waiter_ttl, max_clock_skew=t.max_clock_skew)
        self._prims = primitives or THREADING
        self._pid = os.getpid()
        self._lifetime = Lifetime(self, release_at_exit, clock=self._clock, primitives=self._prims)
        self._duties = Duties(
            scheduler,
            store=storage,
            key=key,
            check_interval=t.waiter_check_interval,
            # Weakly: the scheduler must not keep a lock alive (see lifetime.py).
            next_due=weakly(self, HandoffLock._due, INF),
            next_due_besides_check=weakly(self, HandoffLock._due_besides_check, INF),
            next_check_at=weakly(self, _next_check_at, INF),
            run_due=weakly(self, HandoffLock._run_due, None),
            check_against=weakly(self, HandoffLock._check_against, None),
            describe=weakly(self, repr, "a collected HandoffLock"),
        )
        self._fresh_parts(IDLE)
        forking.register(self)

    def _fresh_parts(self, state: State) -> None:
        """The lock's state and the parts that keep it, new: at construction, and in a forked child
        (where a mutex may have been held by a parent thread that does not exist there)."""
        prims, duties = self._prims, self._duties
        self._state = state
        self._lease = Lease()  # "Plain attributes read without locks are written atomically" (see lease.py)
        self._io = RecordIO(
            duties.store,
            duties.key,
            url=self.url,
            clock=self._clock,
            policy=self._policy,
            min_write_interval=self.timing.min_write_interval,
            mutex=prims.mutex(),
            interrupted=self._interrupted,
            who=self.owner_id,
        )
        self._cancel = prims.event()
        self._not_acquiring = prims.event()  # set while no acquire() runs (release() waits on it)
        self._not_acquiring.set()
        inline = lambda: self._duties.notify_inline  # noqa: E731
        self._notifier = Notifier(self, prims, inline=inline, name=f"handofflock-notify-{self.owner_id}")
        self._book = RequestBook(self._clock, self._notifier.notice, who=self.owner_id)
        self._guard = ReentryGuard(prims, self._release_deferred)

    def _after_fork(self) -> None:
        """In a forked child (called by :mod:`.forking`): hold nothing, do nothing, refuse every operation.

        The token goes with the lease (the parent's: a fenced write in the child must not carry it).
        """
        self._duties.scheduler = None
        self._fresh_parts(FORKED)

    # ------------------------------------------------------------------ public state

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
        return self._state == HELD and self._clock.monotonic() < self._lease.valid_until

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
            why = self._lease.lost_reason
            raise LockLost(f"lock {self.url!r} was lost: {why}", url=self.url, reason=why or "lost")
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
        why = checked_request(reason, deadline)
        self._book.request(why, requester or why.value, deadline)

    # ------------------------------------------------------------------ acquire

    def acquire(self, blocking: bool = True, timeout: float | None = None) -> Acquired[HandoffLock] | Literal[False]:
        """Take the lock. Returns a true :class:`~.acquired.Acquired` when held, else False.

        The value is also a context manager that releases, as with filelock:
        ``with lock.acquire(timeout=5): ...``. It equals True, but is not
        ``True`` itself: test it for truth.

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

        Every way out that does not return the lock gives the waiter slot back: a
        timeout, :meth:`cancel`, a storage error, KeyboardInterrupt. A
        :meth:`cancel` that comes while no acquire runs cancels the next one.
        When it returns the lock the lease is valid and counted from the write
        that made it (for a handoff, from the previous owner's write, renewed
        at once if little of it is left).
        """
        if timeout is not None and not timeout >= 0:  # also refuses NaN
            raise ConfigurationError(f"timeout must be >= 0 or None, got {timeout!r}")
        got = metrics.timed_acquire(self, self._clock, lambda: self._guarded(lambda: self._acquire(blocking, timeout)))
        return Acquired(self) if got else False

    def _acquire(self, blocking: bool, timeout: float | None) -> bool:
        if self._state in (HELD, WAITING, RELEASING):
            raise already_acquired(self._state, self.url, self._lease.thread, nested=self._guard.nested())
        if self._state == LOST:  # a hold that was lost is over: its requests go with it, as after release()
            self._end_hold()
        deadline = None if timeout is None else self._clock.monotonic() + timeout
        if deadline is None and not blocking:  # never waits for the lock, nor forever for the store
            deadline = self._clock.monotonic() + self.timing.renew_deadline
        waiting = False
        last: LockRecord | None = None
        observed = Observation(self.url, self._policy)  # bounds a suspect lease (observation.py)
        self._state = WAITING
        self._not_acquiring.clear()
        try:
            if self._cancel.is_set():  # a cancel() that came before we started
                raise AcquireCancelled(f"acquire of {self.url!r} was cancelled")
            polled = self._clock.monotonic()
            record, generation = self._io.read_locked(deadline)
            while True:
                last = record or last
                if (
                    blocking
                    and not waiting
                    and record is not None
                    and record.owner_id != self.owner_id
                    and record.waiting_owner_id == self.owner_id
                    and record.waiter_instance == self._me.instance
                ):
                    # Our registration landed though we could not confirm it (its reply was lost and
                    # the record moved on before we read it back): we are the waiter all the same.
                    waiting = True
                    self._now_waiting(record)
                mono, wall = self._clock.monotonic(), self._clock.time()
                decision = protocol.decide_acquire(
                    record,
                    generation,
                    me=self._me,
                    now=wall,
                    policy=self._policy,
                    nonce=new_nonce(),
                    waiting=waiting,
                    observed_at=observed.at(record, wall),
                )
                if isinstance(decision, Owned):
                    self._became_owner(decision.record, decision.generation, handoff=True, mono=mono, wall=wall)
                    self._settle_handed_lease(deadline)
                    return True
                if isinstance(decision, Write):
                    if decision.kind is Kind.BECOME_WAITER and not blocking:
                        return self._not_acquired()
                    try:
                        with self._io.mutex:
                            written, generation, mono, wall = self._io.write_lease(
                                decision, deadline, interruptible=True
                            )
                    except PreconditionFailed:
                        record, generation = self._io.read_to_write(deadline, interruptible=True)
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
                pause = max(0.0, polled + self.timing.waiter_poll_interval - self._clock.monotonic())
                if deadline is not None:
                    left = deadline - self._clock.monotonic()
                    if left <= 0:
                        return self._give_up(waiting, last, timed_out=True)
                    pause = min(pause, left)
                if self._clock.wait(self._cancel, pause) or self._guard.deferred:
                    return self._give_up(waiting, last, timed_out=False)
                polled = self._clock.monotonic()
                record, generation = self._io.read_locked(deadline)
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
                if isinstance(exc, TransientStorageError) and (self._cancel.is_set() or self._guard.deferred):
                    # The retry was interrupted by cancel(): that is what happened.
                    raise AcquireCancelled(f"acquire of {self.url!r} was cancelled") from exc
            raise
        finally:
            self._cancel.clear()
            self._not_acquiring.set()

    def _interrupted(self, delay: float) -> bool:
        """Wait up to ``delay``; True if an interruptible retry must give up (cancel(), a deferred release)."""
        return self._clock.wait(self._cancel, delay) or self._guard.deferred

    def _now_waiting(self, record: LockRecord) -> None:
        holder = who(record.owner_id, None if record.owner_label is None else record.owner_label.text)
        _log_acquire.info("%s is now the waiter for %s (owner %s)", self.owner_id, self.url, holder)
        signals.send(
            signals.waiting,
            self,
            owner_id=record.owner_id,
            owner_label=record.owner_label,
            waiter_expires_at=record.waiter_expires_at,
        )

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
            record, generation = self._io.read_to_write(deadline, urgent=True)
            mono, wall = self._clock.monotonic(), self._clock.time()
            decision = protocol.decide_give_up_wait(
                record, generation, me=self._me, now=wall, policy=self._policy, nonce=new_nonce()
            )
            if isinstance(decision, Owned):
                self._became_owner(decision.record, decision.generation, handoff=True, mono=mono, wall=wall)
                if keep:
                    self._settle_handed_lease(deadline)
                    return True
                self._guard.deferred = False
                self._release_held(deadline)
                return False
            if not isinstance(decision, Write):
                return False
            try:
                with self._io.mutex:
                    self._io.write(decision, deadline, urgent=True)
                return False
            except PreconditionFailed:
                continue
        raise TransientStorageError(
            f"could not give back the waiter slot of {self.url!r} within {self.give_up_budget:.1f} s; "
            f"it expires by itself within waiter_ttl ({self.timing.waiter_ttl} s)",
            url=self.url,
            key=self.key,
            ambiguous=False,
        )

    def _contended(self, cls: type[LockContended], record: LockRecord | None, timed_out: bool = False) -> LockContended:
        r = record or LockRecord()
        message = None
        owner, waiter = (None if lb is None else lb.text for lb in (r.owner_label, r.waiter_label))
        if timed_out:
            message = (
                f"timed out acquiring {self.url!r}: held by {who(r.owner_id, owner)}, "
                f"lease ends {_when(r.expires_at, self._clock.time())}; waiter {who(r.waiting_owner_id, waiter)}"
            )
        return cls(
            message,
            url=self.url,
            owner_id=r.owner_id,
            owner_expires_at=r.expires_at,
            waiter_id=r.waiting_owner_id,
            waiter_expires_at=r.waiter_expires_at,
            owner_label=owner,
            waiter_label=waiter,
        )

    def _became_owner(self, record: LockRecord, generation: int, *, handoff: bool, mono: float, wall: float) -> None:
        """We own ``record``. ``mono``/``wall`` are the clocks when its lease was stamped (or read)."""
        # A new hold: nothing of the last one (its loss included) carries over.
        lease = Lease(token=record.token, thread=threading.get_ident())
        lease.set(record, generation, mono, wall, self.timing)
        lease.next_check = self._clock.monotonic() + self.timing.waiter_check_interval
        self._lease = lease
        self._book.new_hold()  # a release request recorded while we were acquiring (a SIGTERM, say) stands
        self._state = HELD
        _log_acquire.info(
            "%s acquired %s (token %d%s)", self.owner_id, self.url, record.token, ", handed off" if handoff else ""
        )
        if record.waiter_live(self._clock.time()) and record.waiter_instance != self._me.instance:
            # A waiter already in the record we took (it registered while the lock was being
            # handed to us): our renewals write against this very generation and never meet it,
            # so the first waiter check runs now, not an interval later. It runs in the
            # background, after acquire() has returned: receivers never run inside acquire().
            lease.next_check = self._clock.monotonic()
        self._duties.schedule()
        self._lifetime.held()
        signals.send(signals.acquired, self, token=record.token, handoff=handoff)

    def _settle_handed_lease(self, deadline: float | None) -> None:
        """A handed-over lease with less than ``renew_interval`` of validity left is renewed before we return.

        The previous owner wrote it; we may have seen it late (a slow poll, a
        pause). acquire() returns only with a lease no check can call lost
        before its first renewal. The renewal is a write conditional on the
        generation we read, so it is safe however late it is.
        """
        lease = self._lease
        if lease.valid_until - self._clock.monotonic() >= self.timing.renew_interval:
            return
        with self._io.mutex:
            if self._state != HELD:
                return
            decision = self._decide_renew()
            try:
                if not isinstance(decision, Write):
                    raise PreconditionFailed(self.key, lease.generation, url=self.url)
                end = self._clock.monotonic() + self.timing.renew_deadline
                written, generation, mono, wall = self._io.write_lease(
                    decision,
                    end if deadline is None else max(min(deadline, end), lease.valid_until),
                    urgent=True,
                )
            except (StorageError, LockRecordCorrupt) as exc:
                if self._clock.monotonic() < lease.valid_until:
                    lease.next_renew = self._clock.monotonic()  # keep it; the scheduler retries at once
                    return
                self._mark_lost(f"handed a lease too short to use, and could not renew it: {exc}", exc)
                raise lease.lost_error from exc  # type: ignore[misc]
            lease.set(written.record, generation, mono, wall, self.timing)

    def _decide_renew(self) -> protocol.Decision:
        lease = self._lease
        return protocol.decide_renew(
            lease.record,
            lease.generation,
            me=self._me,
            token=lease.token or 0,
            now=self._clock.time(),
            policy=self._policy,
            nonce=new_nonce(),
        )

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
        t = self.timing
        if self._state == WAITING:
            self._cancel.set()
            if not self._not_acquiring.wait(self.give_up_budget + t.renew_deadline + 30.0):
                _log_release.warning("release() of %s: the acquire it cancelled has not ended yet", self.url)
                return None
            if self._state != HELD:  # the acquire gave up (and gave the slot back)
                return None
            # The acquire got the lock just before it saw the cancel: release that hold.
        if self._state == LOST:
            self._state = IDLE
            self._end_hold()
            why = self._lease.lost_reason
            raise LockLost(
                f"lock {self.url!r} had been lost ({why}); nothing was written", url=self.url, reason=why or "lost"
            )
        if self._state not in (HELD, RELEASING):
            raise LockNotHeld(f"release() of {self.url!r}, which this instance does not hold")
        return self._release_held(self._clock.monotonic() + max(t.renew_deadline, 5.0))

    def _release_deferred(self) -> None:
        """The release a signal handler asked for from inside the library, carried out by the outer call."""
        if self._state in (HELD, LOST):
            self._guarded(self._release)

    def _release_held(self, deadline: float, *, background: bool = False) -> str | None:
        """The release write of a held (or releasing) lock; see :meth:`release`."""
        self._duties.unschedule()
        with self._io.mutex:
            if self._state not in (HELD, RELEASING):  # lost while we waited for the scheduler's I/O
                return None if background else self._release()  # no I/O: raises LockLost
            # From here the lock is no longer ours to use: the write may land (and the heir start)
            # before its reply reaches us, so healthy/check() say no from the moment it is sent.
            self._state = RELEASING
            self._lease.next_release_try = float("inf")  # this attempt runs now
            try:
                heir, lost = self._write_release(deadline)
            except (TransientStorageError, PreconditionFailed) as exc:
                # Not idle: the record still names us (perhaps with a waiter waiting). Keep
                # trying in the background, no longer renewing; release() may retry at once.
                if self._state == RELEASING:
                    self._lease.next_release_try = self._clock.monotonic() + min(1.0, self.timing.renew_interval)
                    self._duties.schedule()
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
            # Still under the I/O mutex: a scheduler duty queued behind this release must find the
            # lock no longer held, not renew or check it from the record just replaced.
            self._state = IDLE
        self._end_hold()
        if lost is not None:
            if background:
                return None
            self._notifier.flush()  # outside the mutex: a receiver of ``lost`` may call back in
            raise lost
        token = self.token
        _log_release.info("%s released %s%s", self.owner_id, self.url, f", handed off to {heir}" if heir else "")
        if background:
            self._notifier.event(signals.released, handed_off_to=heir, token=token)
            self._notifier.notify()
        else:
            signals.send(signals.released, self, handed_off_to=heir, token=token)
        return heir

    def _end_hold(self) -> None:
        """A hold is over, however it ended: its requests go with it, and no release is retried."""
        self._book.end_hold()
        self._lease.next_release_try = float("inf")

    def _write_release(self, deadline: float) -> tuple[str | None, LockLost | None]:
        """The release's write (retried, re-read on 412): (heir, None), or (None, why it was lost)."""
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
                policy=self._policy,
                nonce=new_nonce(),
                attempted=attempted,
                within_lease=self._clock.monotonic() < lease.valid_until,
            )
            if isinstance(decision, Released):
                return decision.handed_off_to, None
            if isinstance(decision, Lost):
                self._mark_lost(decision.why, None, from_release=True)
                why = f"lock {self.url!r} was lost before release: {decision.why}; nothing was written"
                return None, LockLost(why, url=self.url, reason=decision.why)
            assert isinstance(decision, Write)
            try:
                written, _, _, _ = self._io.write_lease(decision, deadline, urgent=True)
            except PreconditionFailed:
                attempted = decision
                try:
                    record, generation = self._io.read(deadline)
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

    def status(self, timeout: float = 30.0) -> LockStatus:
        """Read the lock object now and describe it. One read; raises LockRecordCorrupt if bad.

        ``timeout`` bounds the read's retries of transient errors (then the last one is raised).
        """
        if not timeout >= 0:  # also refuses NaN
            raise ConfigurationError(f"timeout must be >= 0, got {timeout!r}")

        def read() -> LockStatus:
            # A read only, of nothing this instance keeps: never under the I/O mutex, so a status()
            # that rides out a read outage never holds up a renewal or a waiter check.
            record, generation = self._io.read(self._clock.monotonic() + timeout, interruptible=True)
            return LockStatus.of(self.url, record, generation, self._clock.time(), self._policy)

        return self._guarded(read)

    # ------------------------------------------------------------------ background duties (scheduler thread)

    def _due(self) -> float:
        """Monotonic time of this lock's next background duty (inf if none)."""
        if self._state == HELD:
            return min(self._due_besides_check(), self._lease.next_check)
        return self._due_besides_check()

    def _due_besides_check(self) -> float:
        """Like :meth:`_due` without the waiter check, which a scheduler may batch across locks."""
        if self._notifier.unsent:
            return float("-inf")
        if self._state == RELEASING:
            return self._lease.next_release_try
        if self._state != HELD:
            return float("inf")
        return min(self._lease.next_renew, self._lease.valid_until)

    def _run_due(self) -> None:
        """Do whatever is due: renew, check for a waiter, retry a failed release; hand signals to the notifier."""
        now, lease = self._clock.monotonic(), self._lease
        if self._state == HELD:
            if now >= lease.valid_until:
                with self._io.mutex:
                    if self._state == HELD:
                        self._mark_lost(f"no successful renewal for {self.renew_deadline:.1f} s (renew_deadline)", None)
            elif now >= lease.next_renew:
                self._renew()  # never waits for the write gate: a deferred renewal leaves the check due next
            elif now >= lease.next_check:
                self._check_waiter()
        elif self._state == RELEASING and now >= lease.next_release_try:
            self._retry_release()
        self._notifier.notify()

    def _check_against(self, generation: int) -> None:
        """A waiter check against a scheduler's listing (see :meth:`_check_waiter`), then the signals."""
        self._check_waiter(known_generation=generation)
        self._notifier.notify()

    def _renew(self) -> None:
        """Renew; never waits for the write gate (it defers instead) and never sleeps between retries.

        The lease stays valid until ``valid_until``, well past the next
        attempt: a renewal the store's write spacing would delay is deferred to
        when the gate opens, so the lock's I/O mutex is never held through a
        wait and a release or a waiter check never queues behind one.

        Renewals are urgent writes for the gate (they keep the lock), so a
        renewal whose write failed its precondition (a waiter registered,
        refreshed or left) is sent again at once from the record just read,
        not a full spacing later: a few waiter writes in a row must not run
        an owner at the shortest ttl past its renew deadline.
        """
        with self._io.mutex:
            lease = self._lease
            for _ in range(3):
                if self._state != HELD:
                    return
                now = self._clock.monotonic()
                wait = self._io.gate().ready_in(now, urgent=True)
                if wait > 0:
                    lease.next_renew = now + wait
                    return
                try:
                    decision = self._decide_renew()
                    if isinstance(decision, Lost):
                        self._mark_lost(decision.why, None)
                        return
                    assert isinstance(decision, Write)
                    try:
                        written, generation, mono, wall = self._io.write_lease(
                            decision, lease.valid_until, retry=False, urgent=True
                        )
                    except PreconditionFailed:
                        # A waiter registered, refreshed or left (or we lost it): read, note, renew again.
                        record, generation = self._io.read(lease.valid_until, retry=False)
                        seen = self._observe(record)
                        if isinstance(seen, Lost):
                            self._mark_lost(seen.why, None)
                            return
                        lease.seen(record, generation)
                        self._note_waiter(record, seen)
                        lease.next_renew = self._clock.monotonic()
                        continue
                    lease.set(written.record, generation, mono, wall, self.timing)
                    metrics.renewed(self, self._clock.monotonic() - mono)
                    _log_renew.debug("%s renewed %s until %.3f", self.owner_id, self.url, written.record.expires_at)
                    return
                except TransientStorageError as exc:
                    metrics.renewal_failed(self, exc)
                    lease.renew_failures += 1
                    delay = min(self.timing.renew_interval, RETRY.delay(lease.renew_failures))
                    lease.next_renew = min(self._clock.monotonic() + delay, lease.valid_until)
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
        now, t = self._clock.monotonic(), self.timing
        if now >= self._lease.valid_until + (t.ttl - t.renew_deadline):
            with self._io.mutex:
                if self._state == RELEASING:
                    _log_release.warning(
                        "gave up releasing %s: its lease has run out, so it is free for others anyway", self.url
                    )
                    self._state = IDLE
                    self._end_hold()
                    self._duties.unschedule()
            return
        self._lease.next_release_try = now + min(1.0, t.renew_interval)
        try:
            self._release_held(now + min(t.renew_deadline, 5.0), background=True)
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
        with self._io.mutex:
            if self._state != HELD:
                return
            lease = self._lease
            lease.next_check = self._clock.monotonic() + self.timing.waiter_check_interval
            record: LockRecord | None
            try:
                if (
                    known_generation is not None
                    and 0 < known_generation <= lease.generation
                    and lease.record is not None
                ):
                    # Listed as we know it, or older: we wrote (renewed) or read it since the
                    # listing was made, and that is at least as fresh as the listing's view.
                    record, generation = lease.record, lease.generation
                else:
                    record, generation = self._io.read(None, retry=False)
            except TransientStorageError as exc:
                _log_renew.debug("waiter check of %s failed: %s", self.url, exc)
                return
            except (StorageError, LockRecordCorrupt) as exc:
                self._mark_lost(f"the lock object became unreadable: {exc}", exc)
                return
            seen = self._observe(record)
            if isinstance(seen, Lost):
                self._mark_lost(seen.why, None)
                return
            if generation != lease.generation:
                lease.seen(record, generation)
            self._note_waiter(record, seen)

    def _observe(self, record: LockRecord | None) -> Lost | WaiterSeen | None:
        return protocol.observe_as_owner(record, me=self._me, token=self.token or 0, now=self._clock.time())

    def _note_waiter(self, record: LockRecord | None, seen: WaiterSeen | None) -> None:
        """Announce a new waiter; withdraw the request of one that has gone (left, expired or replaced)."""
        if record is None:
            return
        self._book.note_waiter(
            seen,
            record.waiter_instance,
            url=self.url,
            noticed=lambda: metrics.waiter_noticed(self, record, self._clock.time()),
        )

    def _mark_lost(self, why: str, error: BaseException | None, *, from_release: bool = False) -> None:
        """Record the loss once; queue ``lost`` (and ``on_renewal_error``) for sending outside locks."""
        if self._state == LOST:
            return
        self._state = LOST
        lease = self._lease
        lease.valid_until = float("-inf")
        lease.lost_reason = why
        self._duties.unschedule()
        exc = LockLost(f"lock {self.url!r} lost: {why}", url=self.url, reason=why, cause=error)
        if error is not None:
            exc.__cause__ = error
        lease.lost_error = exc
        _log_renew.error("%s lost %s: %s", self.owner_id, self.url, why)
        if not from_release:
            self._notifier.event(signals.on_renewal_error, error=exc)
        self._notifier.event(signals.lost, reason=why, error=exc)

    # ------------------------------------------------------------------ re-entrancy

    def _guarded(self, fn: Callable[[], T], *, deferrable: bool = False) -> T:
        """Run a public operation; a re-entrant release (signal handler) is deferred, not deadlocked."""
        if self._state == FORKED:
            raise InheritedAcrossFork(
                f"this HandoffLock for {self.url!r} was created in process {self._pid}, which this process was "
                "forked from; the lock and its renewals are that process's. Create a new HandoffLock here."
            )
        return self._guard.run(fn, deferrable=deferrable)

    def _then_after_deferred_release(self, fn: Callable[[], Any]) -> bool:
        """See :meth:`.reentry.ReentryGuard.then_after_deferred_release` (for :mod:`handofflock.os_signals`)."""
        return self._guard.then_after_deferred_release(fn)

    def _unschedule(self) -> None:
        """Stop the background duties (tests use it to make a process that dies holding the lock)."""
        self._lifetime.releases = False  # a dead process releases nothing, at exit or when collected
        self._duties.unschedule()

    @property
    def release_at_exit(self) -> bool:
        """Whether the lock is released (handed off) at interpreter exit, and when collected while held.

        True by default (False on an injected fake clock); settable. See :mod:`.lifetime`.
        """
        return self._lifetime.releases

    @release_at_exit.setter
    def release_at_exit(self, value: bool) -> None:
        self._lifetime.releases = bool(value)

    def __del__(self) -> None:
        lifetime.collected(self)  # only queues a held lock for the reaper thread: safe in any collection

    def __repr__(self) -> str:
        return f"<HandoffLock {self.url!r} owner_id={self.owner_id!r} state={self._state.value} token={self.token}>"


def _next_check_at(lock: HandoffLock) -> float:
    return lock._lease.next_check
