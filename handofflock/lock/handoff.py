"""HandoffLock: the state machine (acquire loop, give-up, becoming owner, renew, waiter check, release).

Its transitions run under one I/O mutex; :mod:`handofflock.core.protocol` decides what each writes.
``acquire()`` runs in the caller's thread, renewal and the waiter check on the scheduler
(:mod:`.scheduler`, through :mod:`.duties`), ``release()`` in any thread, even a signal handler's
(:mod:`.reentry` defers it to the outer call). Every other part (record I/O, lease, renewal and
release writes, request book, notifier, errors, the no-I/O views, the surface that makes no
transition) is a module beside this one, one job each: docs/design.md's table of layers names them.
"""

from __future__ import annotations

import functools
import logging
import os
import secrets
import threading
from collections.abc import Callable
from typing import Any, Literal, TypeVar

from ..core import buggify, protocol
from ..core.clock import Clock
from ..core.errors import (
    AcquireCancelled,
    LockContended,
    LockNotHeld,
    LockRecordCorrupt,
    LockTimeout,
    PreconditionFailed,
    StorageError,
    TransientStorageError,
)
from ..core.protocol import Contended, Kind, Lost, Me, Owned, Write
from ..core.record import Label, LockRecord, WaiterRequest, new_nonce
from ..core.timefmt import who
from ..core.timing import Timing
from ..storage import Storage
from . import events as signals
from . import forking, messages, metrics, polling, renewal
from .acquired import Acquired
from .duties import Duties
from .lease import Lease
from .lifetime import Lifetime, weakly
from .notifier import Notifier
from .observation import Observation
from .options import TimingViews, label_of, owner_id_of, store_of, timing_of
from .primitives import THREADING, Primitives
from .record_io import RecordIO
from .reentry import ReentryGuard
from .release import give_back_slot, write_release
from .requests import RequestBook, acquire_request
from .state import State
from .surface import LockSurface
from .views import LockViews

_log_acquire = logging.getLogger("handofflock.acquire")
_log_renew = logging.getLogger("handofflock.renew")
_log_release = logging.getLogger("handofflock.release")

T = TypeVar("T")

IDLE, WAITING, HELD = State.IDLE, State.WAITING, State.HELD
Settle = float | Literal[False] | None  # settle the lease by then (None: renew_deadline), or not (released at once)
RELEASING, LOST, FORKED = State.RELEASING, State.LOST, State.FORKED


class HandoffLock(LockSurface, LockViews, TimingViews):
    """A single-waiter cooperative handoff lock kept as one JSON object.

    >>> lock = HandoffLock("gs://bucket/locks/train.json", ttl=60.0)
    >>> with lock:                      # waits as the single waiter if held
    ...     for step in steps:
    ...         train(step)
    ...         if lock.release_requested:   # a waiter, SIGTERM or preemption asked
    ...             save_checkpoint(fence=lock.token)
    ...             break                    # leaving the block hands the lock over

    The keywords (the timing in seconds, or one ``timing=``; ``wait_for_slot`` and ``yield_to_requests``;
    ``owner_id`` and ``label``; and what the lock is built from, for tests and simulations: ``clock``,
    ``scheduler``, ``storage`` and ``key``, ``primitives``; ``release_at_exit``, see :mod:`.lifetime`) are
    described once, for this lock and the async one, at :class:`~handofflock.lock.options.LockOptions`.
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
        yield_to_requests: bool = True,
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
        storage, key, self.url = store_of(url, storage, key)
        lease = {"ttl": ttl, "renew_interval": renew_interval, "renew_deadline": renew_deadline}
        polls = {"waiter_check_interval": waiter_check_interval, "waiter_poll_interval": waiter_poll_interval}
        more = {"waiter_ttl": waiter_ttl, "max_clock_skew": max_clock_skew, "min_write_interval": min_write_interval}
        self.timing = timing_of(storage, timing, lease | polls | more)
        self.wait_for_slot = bool(wait_for_slot)
        self.owner_id: str = owner_id_of(owner_id)
        #: Who this is, for people: written beside ``owner_id`` as owner or waiter.
        self.label: Label = label_of(label)
        # The instance id, random (see Me): two instances sharing a stable owner_id are never taken for each other.
        # ``yields``: whether a waiter's request stands for us or is declined (at renewal, in the record).
        self._me = Me(self.owner_id, secrets.token_hex(8), self.label, yields=bool(yield_to_requests))
        self._clock = clock or Clock()
        self._policy = self.timing
        self._prims = primitives or THREADING
        self._pid = os.getpid()
        self._lifetime = Lifetime(self, release_at_exit, clock=self._clock, primitives=self._prims)
        self._duties = Duties(
            scheduler,
            store=storage,
            key=key,
            check_interval=self.timing.waiter_check_interval,
            request_timeout=self.timing.request_timeout,
            clock=self._clock,
            # Weakly: the scheduler must not keep a lock alive (see lifetime.py); once it is gone, nothing is due.
            hold=weakly(self, lambda lock: (lock._state, lock._lease), (IDLE, Lease())),
            notifier=weakly(self, lambda lock: lock._notifier, None),
            renew=weakly(self, HandoffLock._renew, None),
            check_waiter=weakly(self, HandoffLock._check_waiter, None),
            retry_release=weakly(self, HandoffLock._retry_release, None),
            deadline_passed=weakly(self, HandoffLock._deadline_passed, None),
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
            request_timeout=self.timing.request_timeout,
        )
        self._cancel = prims.event()
        self._not_acquiring = prims.event()  # set while no acquire() runs (release() waits on it)
        self._not_acquiring.set()
        inline = lambda: self._duties.notify_inline  # noqa: E731
        self._notifier = Notifier(self, prims, inline=inline, name=f"handofflock-notify-{self.owner_id}")
        self._book = RequestBook(self._clock, self._notifier.notice, who=self.owner_id, yields=self._me.yields)
        self._guard = ReentryGuard(prims, self._release_deferred)

    def _after_fork(self) -> None:
        """In a forked child (called by :mod:`.forking`): hold nothing, do nothing, refuse every operation.
        The token goes with the lease (the parent's: a fenced write in the child must not carry it)."""
        self._duties.scheduler = None
        self._fresh_parts(FORKED)

    def acquire(
        self, blocking: bool = True, timeout: float | None = None, *, request_release: bool = True, priority: int = 0
    ) -> Acquired[HandoffLock] | Literal[False]:
        """Take the lock. Returns a true :class:`~.acquired.Acquired` when held, else False.

        The value is also a context manager that releases, as with filelock: ``with lock.acquire(timeout=5):``.
        It equals True, but is not ``True`` itself: test it for truth.

        * lock absent, free, or expired with no other live waiter: take it.
        * held by a live owner: become the single waiter; poll until the owner hands it over or its lease expires.
        * another live waiter already: with a ``timeout`` (or ``wait_for_slot``, or a patient wait) poll for
          the slot until the timeout; without, raise :class:`LockContended` at once.

        ``request_release=False`` waits patiently: the holder is never asked (no ``on_release_requested``;
        it finishes on its own, then hands the lock to us). ``priority`` ranks requests for the single
        slot: a higher one takes the slot from a lower one; at equal priority an asking request takes it
        from a patient one, never the reverse.

        ``blocking=False`` never waits and never registers as waiter: it returns False if the lock cannot
        be taken now (transient storage errors are retried for at most ``renew_deadline``); a ``timeout``
        with it is refused, as :meth:`threading.Lock.acquire` refuses it. ``timeout`` bounds the wait; on
        expiry the waiter slot is given back and :class:`LockTimeout` raised, within ``timeout + give_up_budget``.

        Every way out that does not return the lock gives the waiter slot back: a timeout, :meth:`cancel`,
        a storage error, KeyboardInterrupt. When the lock is returned the lease is valid and counted from the
        write that made it (for a handoff, from the previous owner's write, renewed at once if little is left).
        """
        request = acquire_request(blocking, timeout, request_release, priority)
        got = metrics.timed_acquire(
            self, self._clock, lambda: self._guarded(lambda: self._acquire(blocking, timeout, request))
        )
        return Acquired(self) if got else False

    def _acquire(self, blocking: bool, timeout: float | None, request: WaiterRequest) -> bool:
        if self._state in (HELD, WAITING, RELEASING):
            raise messages.already_acquired(self._state, self.url, self._lease.thread, nested=self._guard.nested())
        if self._state == LOST:  # a hold that was lost is over: its requests go with it, as after release()
            self._end_hold()
        deadline = polling.deadline_of(self._clock, self.timing, blocking=blocking, timeout=timeout)
        slot_wait = self.wait_for_slot or timeout is not None or not request.asks  # else Contended raises
        decide = functools.partial(protocol.decide_acquire, me=self._me, timing=self._policy, request=request)
        waiting = sent = False  # sent: a registration may have reached the store (its reply unseen)
        last: LockRecord | None = None
        observed = Observation(self.url, self._policy)  # bounds a suspect lease (observation.py)
        # A cancel() set as an earlier acquire ended (it read WAITING, then set) was meant for that one.
        self._cancel.clear()
        self._state = WAITING
        self._not_acquiring.clear()
        try:
            if self._cancel.is_set():  # a cancel() that came as we started
                raise AcquireCancelled(f"acquire of {self.url!r} was cancelled")
            polled = self._clock.monotonic()
            record, generation = self._io.read_locked(deadline)
            while True:
                last = record or last
                if blocking and not waiting and protocol.registered(record, self._me):
                    waiting = True  # our registration landed though we could not confirm it
                    self._now_waiting(record)
                mono, wall = self._clock.monotonic(), self._clock.time()
                decision = decide(
                    record,
                    generation,
                    now=wall,
                    nonce=new_nonce(),
                    waiting=waiting,
                    observed_at=observed.at(record, wall),
                )
                if isinstance(decision, Owned):
                    self._became_owner(decision.record, decision.generation, True, mono, wall, settle_by=deadline)
                    return True
                if isinstance(decision, Write):
                    if decision.kind in (Kind.BECOME_WAITER, Kind.REFRESH_WAITER) and not blocking:
                        return self._not_acquired(record)
                    sent = sent or decision.kind is Kind.BECOME_WAITER
                    try:
                        written, generation, mono, wall = self._io.write_locked(decision, deadline)
                    except PreconditionFailed:
                        record, generation = self._io.read_to_write(deadline, interruptible=True)
                        continue
                    record = written.record
                    if written.kind in (Kind.CREATE, Kind.TAKE, Kind.RETAKE):
                        self._became_owner(record, generation, False, mono, wall, settle_by=deadline)
                        return True
                    if not waiting:
                        waiting = True  # before the signal: a receiver that raises must find the slot to give back
                        self._now_waiting(record)
                elif not blocking:  # contended, or it would wait: never waits, never registers
                    return self._not_acquired(record)
                elif isinstance(decision, Contended) and (decision.superseded or not (slot_wait or waiting)):
                    # A waiter displaced by a higher-ranked request waits for the slot again (design.md).
                    raise messages.contended(LockContended, self.url, decision.record, self._clock.time())
                pause = polling.pause(self._clock, polled, self.timing.waiter_poll_interval, deadline)  # fixed rate
                if pause is None:
                    return self._give_up(waiting or sent, last, timed_out=True)
                if self._interrupted(pause):
                    return self._give_up(waiting or sent, last, timed_out=False)
                polled = self._clock.monotonic()
                record, generation = self._io.read_locked(deadline)
        except BaseException as exc:
            if self._state == WAITING:
                # Every way out gives the slot back, or the owner would hand the lock to nobody.
                try:
                    self._leave_slot(waiting or sent, last, keep=False)
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

    def _not_acquired(self, record: LockRecord | None) -> bool:
        """A non-blocking acquire that did not get the lock; a slot of this instance's (leaked by an
        earlier acquire whose give-back failed) is left, never kept or refreshed."""
        try:
            if record is not None and record.waiter_instance == self._me.instance:
                self._leave_slot(True, record, keep=False)
        finally:
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
            raise messages.contended(LockTimeout, self.url, last, self._clock.time(), timed_out=self._me)
        raise AcquireCancelled(f"acquire of {self.url!r} was cancelled")

    def _leave_slot(self, waiting: bool, last: LockRecord | None, *, keep: bool) -> bool:
        """Clear our waiter slot (:func:`.release.give_back_slot`) within ``give_up_budget``.

        ``waiting``: we registered, or a registration may have reached the store (its reply unseen: a
        Ctrl-C, a lost reply): then the record is read, and the slot cleared if it names this instance.

        If the owner handed us the lock meanwhile we own it: with ``keep`` we keep it (returns True),
        else we release it at once, handing it on. Returns False when we do not hold the lock afterwards.
        """
        # ``waiting`` is False if our registration's reply was lost and the record moved
        # on before we could see our nonce; the record naming us still says the slot is ours.
        if not (waiting or (last is not None and last.waiting_owner_id == self.owner_id)):
            return False
        if buggify.on(buggify.KEEP_SLOT_ON_TIMEOUT):
            return False
        deadline = self._clock.monotonic() + self.give_up_budget
        handed = give_back_slot(self._io, me=self._me, clock=self._clock, policy=self._policy, deadline=deadline)
        if handed is None:
            raise messages.slot_not_given_back(self.url, self.key, self.give_up_budget, self.timing.waiter_ttl)
        if not handed:
            return False
        owned, mono, wall = handed
        self._became_owner(owned.record, owned.generation, True, mono, wall, settle_by=deadline if keep else False)
        if keep:
            return True
        self._guard.deferred = False
        if not buggify.on(buggify.CANCELLED_KEEPS_HANDED_LOCK):
            self._release_held(deadline)
        return False

    def _became_owner(
        self, record: LockRecord, generation: int, handoff: bool, mono: float, wall: float, *, settle_by: Settle
    ) -> None:
        """We own ``record`` (stamped at ``mono``/``wall``); its lease settled before scheduler or receivers know."""
        if handoff and record.expires_at is not None and buggify.on(buggify.HEIR_LEASE_FROM_ITS_READ):
            wall = record.expires_at - (record.ttl or self.timing.ttl)  # as if the lease began at our read
        # A new hold: nothing of the last one (its loss included) carries over.
        lease = Lease(token=record.token, thread=threading.get_ident())
        lease.set(record, generation, mono, wall, self.timing, self._clock)
        lease.next_check = self._clock.monotonic() + self.timing.waiter_check_interval
        self._lease = lease
        self._book.new_hold()  # a release request recorded while we were acquiring (a SIGTERM, say) stands
        self._state = HELD
        how = ", handed off" if handoff else ""
        _log_acquire.info("%s acquired %s (token %d%s)", self.owner_id, self.url, record.token, how)
        if record.waiter_live(self._clock.time()) and record.waiter_instance != self._me.instance:
            # A waiter already in the record we took (it registered while the lock was being handed to
            # us): our renewals write against this very generation and never meet it, so the first waiter
            # check runs now, in the background, after acquire() has returned (receivers never run inside it).
            lease.next_check = self._clock.monotonic()
        if settle_by is not False:
            self._settle_handed_lease(settle_by)
        self._duties.schedule()
        self._lifetime.held()
        signals.send(signals.acquired, self, token=record.token, handoff=handoff)

    def _settle_handed_lease(self, deadline: float | None) -> None:
        """A handed-over lease with less than ``renew_interval`` left is renewed before acquire() returns.

        We may have seen the previous owner's write late (a slow poll, a pause); acquire() returns only with
        a lease no check can call lost before its first renewal. Conditional on the generation: safe however late.
        """
        lease = self._lease
        if lease.valid_until - self._clock.monotonic() >= self.timing.renew_interval:
            return
        with self._io.mutex:
            if self._state != HELD:
                return
            try:
                renewal.renew_handed(self._io, lease, deadline=deadline, **self._renewing())
            except (StorageError, LockRecordCorrupt) as exc:
                if lease.within(self._clock):
                    lease.next_renew = self._clock.monotonic()  # keep it; the scheduler retries at once
                    return
                self._mark_lost(f"handed a lease too short to use, and could not renew it: {exc}", exc)
                raise lease.lost_error from exc  # type: ignore[misc]

    def _renewing(self) -> renewal.Renewer:
        """What :mod:`.renewal` needs of this lock, besides its I/O and its lease."""
        return renewal.Renewer(me=self._me, clock=self._clock, policy=self._policy, timing=self.timing)

    def release(self) -> str | None:
        """Give the lock up: hand it to a live waiter in one write, or mark it free.

        Returns the waiter's owner id when handed off, else None. Raises :class:`LockLost` (writing
        nothing) if the lock had been lost, and :class:`LockNotHeld` if this instance never held it.
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
                _log_release.warning("release() of %s: the acquire it cancelled has not ended yet", self.url)
                return None
            if self._state != HELD:  # the acquire gave up (and gave the slot back)
                return None
            # The acquire got the lock just before it saw the cancel: release that hold.
        if self._state == LOST:
            self._state = IDLE
            self._end_hold()
            raise messages.had_been_lost(self.url, self._lease.lost_reason)
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
                heir, loss = write_release(
                    self._io, self._lease, me=self._me, clock=self._clock, policy=self._policy, deadline=deadline
                )
                if loss is not None:
                    self._mark_lost(loss.why, loss.cause, from_release=True)
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
        if loss is not None:
            if background:
                return None
            self._notifier.flush()  # outside the mutex: a receiver of ``lost`` may call back in
            raise loss.error
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

    def _deadline_passed(self) -> None:
        """No renewal succeeded within ``renew_deadline``: the hold is lost (run by :mod:`.duties` when due)."""
        with self._io.mutex:  # a renewal may have landed while we waited for it (a handed lease settled)
            if self._state == HELD and not self._lease.within(self._clock):
                self._mark_lost(f"no successful renewal for {self.renew_deadline:.1f} s (renew_deadline)", None)

    def _renew(self) -> None:
        """Renew (see :mod:`.renewal`: never waits for the write gate, never sleeps between retries)."""
        with self._io.mutex:
            held = lambda: self._state == HELD  # noqa: E731
            loss = renewal.renew_or_fail(self, self._io, self._lease, held=held, saw=self._saw, **self._renewing())
            if loss is not None:
                self._mark_lost(*loss)

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
        """Still ours? Someone waiting? One read, or none when a scheduler's listing says nothing changed.

        The scheduler passes ``known_generation`` from a listing it just made (0: not listed) when it
        checks many locks at once; the check then runs whether or not it was due (:meth:`.Lease.known`).

        The read is made without the I/O mutex, so one that stalls never holds up a renewal (issue 25);
        what it found is applied only if the lease is as it was when the read began. A renewal (or
        release) since then wrote on the generation it knew, and would have met whatever the read saw.
        """
        with self._io.mutex:
            if self._state != HELD:
                return
            lease = self._lease
            lease.next_check = self._clock.monotonic() + self.timing.waiter_check_interval
            known, before = lease.known(known_generation), lease.generation
        error: BaseException | None = None
        try:
            record, generation = known or self._io.read(None, retry=False)
        except TransientStorageError as exc:
            _log_renew.debug("waiter check of %s failed: %s", self.url, exc)
            return
        except (StorageError, LockRecordCorrupt) as exc:
            error, (record, generation) = exc, (None, 0)
        with self._io.mutex:
            if self._state != HELD or self._lease is not lease or lease.generation != before:
                return  # the hold moved on while we read: a renewal saw (or will see) the record itself
            if error is not None:
                self._mark_lost(f"the lock object became unreadable: {error}", error)
                return
            self._saw(record, generation)

    def _saw(self, record: LockRecord | None, generation: int) -> bool:
        """What an owner's read showed: False if the lock is lost (marked so); else the lease and book note it."""
        seen = protocol.observe_as_owner(record, me=self._me, token=self.token or 0, now=self._clock.time())
        if isinstance(seen, Lost):
            self._mark_lost(seen.why, None)
            return False
        if generation != self._lease.generation:  # an equal one is the record we know
            self._lease.seen(record, generation)
        self._book.note_waiter(seen, record, url=self.url, noticed=functools.partial(metrics.waiter_noticed, self))
        return True

    def _mark_lost(self, why: str, error: BaseException | None, *, from_release: bool = False) -> None:
        """Record the loss once; queue ``lost`` (and ``on_renewal_error``) for sending outside locks."""
        if self._state == LOST:
            return
        self._state = LOST
        self._lease.lose(why, exc := messages.lost(self.url, why, error))
        self._duties.unschedule()
        _log_renew.error("%s lost %s: %s", self.owner_id, self.url, why)
        if not from_release:
            self._notifier.event(signals.on_renewal_error, error=exc)
        self._notifier.event(signals.lost, reason=why, error=exc)

    def _guarded(self, fn: Callable[[], T], *, deferrable: bool = False) -> T:
        """Run a public operation; a re-entrant release (signal handler) is deferred, not deadlocked."""
        if self._state == FORKED:
            raise messages.inherited(self.url, self._pid)
        return self._guard.run(fn, deferrable=deferrable)

    def __repr__(self) -> str:
        return f"<HandoffLock {self.url!r} owner_id={self.owner_id!r} state={self._state.value} token={self.token}>"
