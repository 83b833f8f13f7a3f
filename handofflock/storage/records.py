"""The record store: the lock object read, decoded strictly, and written conditionally, paced and resolved.

Everything the lock says to its store goes through :class:`RecordStore`, above the
backends' small contract (:mod:`.base`); :mod:`handofflock.fencing` and
:mod:`handofflock.repair` use the two functions under it. Three parts, one job:

* **Pacing.** GCS sustains about one write per second to a single object; faster
  writes earn 429s. Every lock of this process that writes the same object (on
  the same clock) shares one :class:`WriteGate`, which keeps writes to one per
  ``min_interval`` on average, lets a release through at once, and widens the
  spacing after a 429 (shrinking it back after successes). A 429 asks for
  backoff, but the lease comes first: an urgent write (a renewal) passes ``by``,
  the latest time it can be held back and still keep its promise; past that it
  waits only the store's own spacing. A 429 applies nothing, so one more write at
  GCS's documented rate costs at most another 429, while waiting out a doubled
  spacing past the renew deadline costs the lock.
* **Writes whose reply was lost** (:func:`write_resolving`). A write whose reply
  is lost (a timeout or reset after the request went out) may or may not have
  been applied, and a retry would fail its precondition against its own result.
  So every write carries a nonce the caller recognises in the stored bytes, and
  after an ambiguous failure the object is read back: it carries our nonce (the
  write landed); its generation is still the one we matched (it did not: retry);
  someone else wrote and the bytes show ours is not among the writes since
  (:class:`PreconditionFailed`: read again, decide again); or the bytes cannot
  tell (a fenced object keeps only its last writes' nonces): an ambiguous
  :class:`TransientStorageError`, never PreconditionFailed, whose caller would
  take it for "nothing written".
* **The lock's record** (:class:`RecordStore`): reads decoded strictly, each
  write stamped at the send of each attempt (a lease counts from the write that
  made it), every request bounded by the lock's ``request_timeout`` and by what
  is left of its operation's deadline (:class:`Bound`): an ``acquire(timeout=5)``
  never waits 11 s for one request. A deadline reached (a request cut off at
  it, a write the spacing would hold past it) is a
  :class:`~handofflock.core.errors.StorageTimeout`, which the lock reports as
  the timeout it is.
* **Outages said once.** The retry loops retry a store's transient errors
  silently until their deadline, which for a blocking ``acquire()`` is none: a
  store that is down (a wrong ``STORAGE_EMULATOR_HOST``, no network) would leave
  a waiting process silent for as long as it waits. So the first retried failure
  of a store logs a WARNING on ``handofflock.storage`` with its cause, and the
  first success after it logs at INFO: once per process, however many of its
  locks wait on that store (:func:`failed`, :func:`answered`, :func:`down`).
  Without logging set up that says nothing, so each lock also warns once
  (:class:`Watch`) when its store has not answered for longer than a request may take.

It never decides what to write (:mod:`handofflock.core.protocol` does) nor what a
result means for the lock (:mod:`handofflock.lock.handoff` does).
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
import weakref
from collections.abc import Callable
from typing import Any

from ..core import protocol
from ..core.clock import Clock
from ..core.errors import (
    PreconditionFailed,
    StorageError,
    StorageTimeout,
    StoreUnreachableWarning,
    TransientStorageError,
)
from ..core.protocol import Write
from ..core.record import LockRecord, new_nonce
from ..core.timing import MIN_REQUEST_TIME, MIN_ROOM, RETRY, Backoff, Timing
from .base import MAX_RECORD_BYTES, Storage

# Gates live as long as their store: keyed by the store object itself (weakly),
# not by id(), which a new store can reuse after the old one is collected and so
# inherit its spacing and its booked slots.
_GATES: weakref.WeakKeyDictionary[object, dict[tuple[str, object], WriteGate]] = weakref.WeakKeyDictionary()
_UNWEAKABLE: dict[int, tuple[object, dict[tuple[str, object], WriteGate]]] = {}
_GATES_LOCK = threading.Lock()

#: Longest spacing a run of 429s can push writes to one object to.
MAX_PENALTY_INTERVAL = 8.0
#: Writes the bucket of a gate holds: an urgent write may follow an ordinary one at once.
BURST = 2
#: A wait this short is no wait: a write may go (float dust in the bucket arithmetic).
_TOLERANCE = 1e-9


# --------------------------------------------------------------------------- outages, said once

_storage_log = logging.getLogger("handofflock.storage")
_down: weakref.WeakKeyDictionary[Storage, str] = weakref.WeakKeyDictionary()  # each store down, and why
_down_lock = threading.Lock()


def failed(storage: Storage, exc: TransientStorageError) -> None:
    """A transient failure of ``storage`` that is about to be retried: say so if it starts an outage."""
    why = _cause(exc)
    try:
        with _down_lock:
            first = storage not in _down
            _down[storage] = why
    except TypeError:  # a store that cannot be referred to weakly: every failure is news
        first = True
    if first:
        _storage_log.warning("cannot reach the store %s: %s (retrying)", storage.url, why)


def answered(storage: Storage) -> None:
    """``storage`` answered: if it was down, say that it is back."""
    try:
        with _down_lock:
            was_down = _down.pop(storage, None) is not None
    except TypeError:
        return
    if was_down:
        _storage_log.info("the store %s answers again", storage.url)


def down() -> dict[str, str]:
    """The stores of this process that cannot be reached now: ``{store url: why}``."""
    with _down_lock:
        return {store.url: why for store, why in _down.items()}


def _answered(storage: Storage, watch: Watch | None) -> None:
    answered(storage)
    if watch is not None:
        watch.answered()


class Watch:
    """Whether one lock's store answers: a warning, once per lock, when it has not for a while.

    The log above is for applications that set logging up; the library's logger has a
    ``NullHandler`` (libraries leave handlers to the application), so without that set-up it
    says nothing, and a process that waits on a store it cannot reach would be silent. So the
    first run of failures that lasts longer than ``bound`` (the longest one request may take),
    counted from the send of its first request, is also said by :func:`warnings.warn`
    (:class:`~handofflock.core.errors.StoreUnreachableWarning`): on stderr by default, filtered
    with ``-W`` like any warning, routed into logging by :func:`logging.captureWarnings`.
    """

    def __init__(self, url: str, bound: float, clock: Clock) -> None:
        self._url, self._bound, self._clock = url, bound, clock
        self._since: float | None = None  # the send of the first request of the current run of failures
        self._warned = False
        self._lock = threading.Lock()

    def failed(self, exc: TransientStorageError, since: float) -> None:
        """A request sent at ``since`` (monotonic) failed with ``exc`` (a 429 is an answer: not counted)."""
        if exc.status == 429:
            return
        with self._lock:
            self._since = since if self._since is None else self._since
            if self._warned or self._clock.monotonic() - self._since < self._bound:
                return
            self._warned = True
        # The same words for the same lock and cause: Python's default filter shows them once.
        warnings.warn(
            f"handofflock: the store of lock {self._url} has not answered for over {self._bound:g} s "
            f"({_cause(exc)}); still trying",
            StoreUnreachableWarning,
            stacklevel=2,
        )

    def answered(self) -> None:
        with self._lock:
            self._since = None


class Bound:
    """The time one request may take: what is left before the operation's ``deadline`` (monotonic,
    on ``clock``; None: none), at most ``cap`` (the lock's bound; None: the store's own).

    Once less than :data:`~handofflock.core.timing.MIN_ROOM` is left nothing more is sent: a
    :class:`~handofflock.core.errors.StorageTimeout` is raised here instead, unless ``first`` (an
    operation's first request: a read, or a write decided on one, must still be able to go out
    once, as the last poll of a wait that saw the lock handed over must be acted on), which then
    gets :data:`~handofflock.core.timing.MIN_REQUEST_TIME` at most. A request that was
    given all that was left, and timed out, used the operation's time up (:meth:`used_up`):
    nothing more is tried, whatever the clock says (a fake clock does not move while a real
    request stalls).
    """

    def __init__(
        self,
        clock: Clock,
        deadline: float | None,
        cap: float | None,
        storage: Storage,
        key: str,
        op: str,
        first: bool = False,
    ) -> None:
        self.sent = clock.monotonic()
        self.seconds, self._by_deadline = cap, False
        if deadline is not None:
            left = deadline - self.sent
            if left < MIN_ROOM and first:
                self.seconds = MIN_REQUEST_TIME if cap is None else min(cap, MIN_REQUEST_TIME)
            elif left < MIN_ROOM:
                raise StorageTimeout(
                    f"{op} {key!r} in {storage.url}: the time ran out; nothing was sent",
                    url=storage.url,
                    key=key,
                    ambiguous=False,
                )
            elif cap is None or left < cap:
                # With no cap of ours the store's own may be the shorter: a cut then is not the deadline's.
                self.seconds, self._by_deadline = left, cap is not None

    @classmethod
    def or_last(cls, last: TransientStorageError | None, *args: Any) -> Bound:
        """A retry's bound (``args`` as for the constructor); with no time left, ``last`` (the failure
        before it, if any: a retry whose sleep overran the deadline) is what is raised."""
        try:
            return cls(*args)
        except StorageTimeout as exc:
            timed_out = exc
        raise last or timed_out

    def used_up(self, exc: TransientStorageError) -> bool:
        """Whether ``exc`` (this request's failure) is the operation's deadline reached."""
        return self._by_deadline and isinstance(exc, StorageTimeout)

    def failed(self, exc: TransientStorageError, watch: Watch | None) -> None:
        if watch is not None:
            watch.failed(exc, self.sent)


def _cause(exc: BaseException) -> str:
    """What went wrong, in a few words where the exception chain says it ("connection refused")."""
    seen: BaseException | None = exc
    for _ in range(10):  # the chain of a requests or botocore error is a few links long
        if seen is None:
            break
        if isinstance(seen, ConnectionRefusedError):
            return "connection refused"
        seen = seen.__cause__ or seen.__context__
    text = str(exc)
    if "connection refused" in text.lower():
        return f"connection refused ({text})"
    return text


# --------------------------------------------------------------------------- pacing


class WriteGate:
    """Spacing of writes to one object from this process: a token bucket on one clock.

    The bucket holds at most :data:`BURST` writes and refills one write per
    ``interval`` (``min_interval``, widened after a 429). An ordinary write
    (a renewal, a waiter's registration) needs the bucket full and leaves one
    write in it; an ``urgent`` one (a release or handoff, giving a waiter slot
    back) needs just one. So writes average at most one per ``interval``, and
    a release never waits behind the renewal that went out a moment before it.

    Nothing is booked ahead: :meth:`ready_in` says how long until a write of
    its class could go, and :meth:`take` spends a write only at the moment it
    is sent. A writer that gives up costs the others nothing.

    A gate belongs to one clock: times passed to it are that clock's
    ``monotonic()`` readings (see :func:`gate_for`).
    """

    def __init__(self, min_interval: float) -> None:
        self.min_interval = min_interval
        self.forget()

    def forget(self) -> None:
        """As new: no write sent, no 429 seen (a forked child's gates: the parent's writes are not its own)."""
        self.interval = self.min_interval
        self._tokens = float(BURST)
        self._stamp = float("-inf")  # when _tokens was last brought up to date
        self._sent = float("-inf")  # when the last write was let through
        self._lock = threading.Lock()

    def _refill(self, now: float) -> float:
        """Bring the bucket up to ``now``; return its capacity (what an ordinary write needs)."""
        # While a 429's penalty lasts there is no burst: every write waits its full spacing.
        cap = float(BURST) if self.interval <= self.min_interval else 1.0
        if self.interval <= 0:
            self._tokens = cap
        elif now > self._stamp:
            self._tokens += (now - self._stamp) / self.interval if self._stamp != float("-inf") else cap
        self._tokens = min(cap, self._tokens)
        self._stamp = max(self._stamp, now)
        return cap

    def _wait(self, now: float, urgent: bool, by: float | None) -> float:
        """Seconds until a write of this class may go (call with ``_lock`` held)."""
        cap = self._refill(now)
        need = 1.0 if urgent else cap
        wait = 0.0 if self.interval <= 0 else max(0.0, (need - self._tokens) * self.interval)
        if urgent and wait > 0 and self.interval > self.min_interval and by is not None and now + wait > by:
            # A 429's widening would hold this write past the last moment it can wait: it goes
            # at the store's own spacing instead (the lease comes first; see the module docstring).
            wait = min(wait, max(0.0, self._sent + self.min_interval - now))
        return wait

    def ready_in(self, now: float, *, urgent: bool = False, by: float | None = None) -> float:
        """Seconds until a write of this class could be sent; nothing is booked.

        ``by`` (urgent writes only): the latest time this write may be held
        back by the spacing a 429 widened. If the widened spacing would pass
        it, the write waits only ``min_interval`` after the previous write sent
        to the object. Without ``by`` the widened spacing holds urgent writes too.

        A read whose result decides a write should come after this wait, not
        before, or the write may go out on a stale generation.
        """
        with self._lock:
            wait = self._wait(now, urgent, by)
        # Below the tolerance take() allows, a write may go now. Float dust (1e-13 s) left as a wait
        # would put the next try at ``now + wait == now``: a renewal deferred to the instant it was
        # deferred at, again and again, wherever time does not move between tries (the simulation).
        return 0.0 if wait <= _TOLERANCE else wait

    def take(self, now: float, *, urgent: bool = False, by: float | None = None) -> bool:
        """Spend one write now if its class may go (``by`` as for :meth:`ready_in`); False (nothing spent) if not."""
        with self._lock:
            if self._wait(now, urgent, by) > _TOLERANCE:
                return False
            self._tokens = max(0.0, self._tokens - 1.0)
            self._sent = max(self._sent, now)
            return True

    def refund(self, now: float) -> None:
        """A write was refused on its precondition (412): it changed nothing, so it costs nothing.

        GCS's rate limit is on updates of the object; a refused write is none. An
        owner whose renewal lost the race with a waiter's write retries at once.
        """
        with self._lock:
            cap = self._refill(now)
            self._tokens = min(cap, self._tokens + 1.0)

    def throttled(self, retry_after: float | None = None) -> None:
        """The store answered 429: empty the bucket and refill it more slowly."""
        with self._lock:
            widened = max(self.interval * 2, self.min_interval, 1.0)
            if retry_after:
                widened = max(widened, retry_after)
            self.interval = min(widened, MAX_PENALTY_INTERVAL)
            self._tokens = 0.0

    def succeeded(self) -> None:
        """A write went through: let the spacing relax back toward the minimum."""
        with self._lock:
            if self.interval > self.min_interval:
                relaxed = self.interval * 0.75
                # Close enough to the minimum is the minimum (0.75**n never reaches 0).
                self.interval = self.min_interval if relaxed < self.min_interval + 0.05 else relaxed


def default_write_interval(storage: object) -> float:
    """The write spacing a store asks for (``min_write_interval``: 1 s on GCS), else 0."""
    return float(getattr(storage, "min_write_interval", 0.0))


def gate_for(storage: object, key: str, min_interval: float, clock: object = None) -> WriteGate:
    """The process-wide gate for ``key`` in ``storage`` on ``clock`` (the strictest minimum wins).

    Writers on different clocks get different gates: a gate compares times of
    one clock only (a fake clock's monotonic time has nothing to do with the real one).
    """
    with _GATES_LOCK:
        try:
            gates = _GATES.setdefault(storage, {})
        except TypeError:  # not weak-referenceable or unhashable: keep it alive with its gates
            gates = _UNWEAKABLE.setdefault(id(storage), (storage, {}))[1]
        slot = (key, getattr(clock, "timebase", clock))
        gate = gates.get(slot)
        if gate is None:
            gate = gates[slot] = WriteGate(min_interval)
        elif min_interval > gate.min_interval:
            gate.min_interval = min_interval
            gate.interval = max(gate.interval, min_interval)
        return gate


def _reset_after_fork() -> None:
    """In a forked child: every gate as new. The spacing is this process's own (its writes, its 429s):
    the parent's last writes are not the child's, nor is a mutex a parent thread may have held at the fork."""
    global _GATES_LOCK
    _GATES_LOCK = threading.Lock()
    for gates in [*_GATES.values(), *(held for _, held in _UNWEAKABLE.values())]:
        for gate in gates.values():
            gate.forget()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


class Retries:
    """The retries of one operation: :data:`~handofflock.core.timing.RETRY` delays bounded by a deadline.

    The deadline is monotonic, or None for none. The policy is
    :meth:`Backoff.delay_within <handofflock.core.timing.Backoff.delay_within>`:
    the last try goes just before the deadline, never past it.
    """

    def __init__(self, clock: Clock, deadline: float | None, policy: Backoff = RETRY) -> None:
        self._clock = clock
        self._deadline = deadline
        self._policy = policy
        self._attempt = 0

    def next_delay(self) -> float | None:
        """Seconds to wait before the next try, or None when there is none."""
        delay = self._policy.delay_within(self._attempt, now=self._clock.monotonic(), deadline=self._deadline)
        self._attempt += 1
        return delay


def read_retrying(
    storage: Storage,
    key: str,
    *,
    clock: Clock,
    deadline: float | None,
    max_bytes: int,
    retry: bool = True,
    sleep: Callable[[float], bool] | None = None,
    timeout: float | None = None,
    watch: Watch | None = None,
) -> tuple[bytes, int] | None:
    """One read, its transient errors retried with backoff until ``deadline`` (monotonic).

    ``retry``, ``sleep``, ``timeout`` and ``watch`` as for :func:`write_resolving`. Every read that
    decides a write goes through here (the lock's, the fence's, a force-release's).
    """
    retries = Retries(clock, deadline)
    last: TransientStorageError | None = None
    while True:
        bound = Bound.or_last(last, clock, deadline, timeout, storage, key, "read", last is None)
        try:
            found = storage.read(key, max_bytes=max_bytes, timeout=bound.seconds)
        except TransientStorageError as exc:
            last = exc
            bound.failed(exc, watch)
            delay = retries.next_delay()
            if not retry or delay is None or bound.used_up(exc):
                raise
            failed(storage, exc)  # said once per outage: a long wait is never silent
            if sleep is None:
                clock.sleep(delay)
            elif not sleep(delay):
                raise
        else:
            _answered(storage, watch)
            return found


def write_resolving(
    storage: Storage,
    key: str,
    data: bytes | Callable[[], bytes],
    *,
    if_generation_match: int,
    is_ours: Callable[[bytes], bool | None],
    clock: Clock,
    deadline: float | None,
    max_bytes: int,
    gate: WriteGate | None = None,
    urgent: bool = False,
    send_by: float | None = None,
    retry: bool = True,
    sleep: Callable[[float], bool] | None = None,
    timeout: float | None = None,
    watch: Watch | None = None,
) -> tuple[int, bytes | None]:
    """Write ``data`` if the object is at ``if_generation_match``; return ``(generation, read_back)``.

    ``data`` may be a function called just before each attempt is sent (after
    any wait for the write gate), so what it stamps (a lease's ``expiresAt``)
    dates from the send; ``is_ours`` must then recognise every attempt's bytes.
    ``gate`` spaces the writes; ``urgent`` as for :meth:`WriteGate.take`, and
    ``send_by`` is its ``by``: the latest time (monotonic) a 429's widened
    spacing may hold this urgent write back (a renewal passes
    :meth:`Timing.backoff_until <handofflock.core.timing.Timing.backoff_until>`).

    ``is_ours(bytes)`` says whether stored bytes show our write: True, False
    (they prove it is not among the writes they reflect), or None (they cannot
    tell). After a write that may have landed, bytes at a later generation for
    which it says None end the write with an ambiguous
    :class:`TransientStorageError`: the outcome is lost, and no retry can find it.

    ``read_back`` is None when the store answered the write, else the bytes read
    back that proved it landed (they may be a later write that kept our nonce in
    view: compare them with ``data`` before trusting ``generation`` as ours).
    Transient errors are retried with backoff until ``deadline`` (monotonic);
    the last one is raised after it. With ``retry=False`` the first transient
    error is raised (after one read-back if the write may have landed).
    ``sleep(seconds)`` waits between retries and out the write spacing, and
    returns False to stop early (a cancelled acquire: the last failure is
    raised, or with none a :class:`TransientStorageError` that says nothing
    was sent); the default just sleeps. Raises
    :class:`PreconditionFailed` when the object moved on, and any permanent
    :class:`StorageError` at once.

    Each request ends by ``deadline`` as well, within ``timeout`` (None: the
    store's own ``request_timeout``) and what is left (:class:`Bound`): past
    the deadline nothing is sent, and the operation ends with a
    :class:`~handofflock.core.errors.StorageTimeout` (as it does when the write
    spacing would hold the write past it). ``watch`` hears of each failure and
    success of the store (:class:`Watch`).
    """
    retries = Retries(clock, deadline)
    maybe_landed = False
    cut_off = False  # an attempt got no answer at all: it may be applied later
    last_failure: TransientStorageError | None = None

    def rest(seconds: float) -> bool:
        """Sleep ``seconds``; False when ``sleep`` stopped early."""
        if sleep is None:
            clock.sleep(seconds)
            return True
        return sleep(seconds)

    def pause() -> bool:
        """Sleep before the next try; False when there is no next try."""
        delay = retries.next_delay()
        if not retry or delay is None:
            return False
        return rest(delay)

    def read_back(*, patient: bool) -> tuple[int, bytes] | None:
        """Whether a write that may have landed did (:func:`_landed`). A failed read is no answer:
        ``patient``, read again after a pause; else None (the retry's precondition will tell)."""
        while True:
            try:
                bound = Bound(clock, deadline, timeout, storage, key, "read")
                return _landed(storage, key, if_generation_match, is_ours, max_bytes, bound.seconds)
            except TransientStorageError:
                if not patient:
                    return None
                if not pause():
                    raise
            except _OutcomeLost:
                raise _outcome_lost(storage, key, if_generation_match) from (None if patient else last_failure)

    try:
        while True:
            while True:
                # The attempt's bound before the gate's write: one left no time to be sent in raises before
                # the gate spends a write on it. A write spent and never sent would hold the next one (the
                # caller's next round: a waiter giving its slot back) a spacing more, for nothing.
                bound = Bound.or_last(
                    last_failure, clock, deadline, timeout, storage, key, "write", last_failure is None
                )
                if gate is None or gate.take(clock.monotonic(), urgent=urgent, by=send_by):
                    break
                wait = gate.ready_in(clock.monotonic(), urgent=urgent, by=send_by)
                if deadline is not None and clock.monotonic() + wait >= deadline:
                    # The spacing (widened by 429s) would carry the write past the deadline:
                    # give up now rather than sleep there. Nothing was booked, so giving up
                    # costs the other writers of the object nothing. The store refused nothing:
                    # the operation ran out of time (a store's refusal before it is raised instead).
                    raise last_failure or StorageTimeout(
                        f"the write spacing for {key!r} in {storage.url} ({wait:.1f} s) "
                        "would pass the operation's deadline; nothing was sent",
                        url=storage.url,
                        key=key,
                        ambiguous=False,
                    )
                if not rest(max(wait, 0.001)):
                    # Stopped while the spacing (up to MAX_PENALTY_INTERVAL once 429s widened it) held the
                    # write: a cancelled acquire ends now, not once the write may go. Nothing was sent
                    # since the last failure, which says what the store did (none: the stop is the cause).
                    raise last_failure or TransientStorageError(
                        f"the write to {key!r} in {storage.url} was stopped while the write spacing "
                        f"({wait:.1f} s) held it back; nothing was sent",
                        url=storage.url,
                        key=key,
                        ambiguous=False,
                    )
            try:
                body = data() if callable(data) else data
            except PreconditionFailed:  # ``data`` found its write stale at the send: nothing was sent
                if gate is not None:
                    gate.refund(clock.monotonic())
                raise
            try:
                generation = storage.write(key, body, if_generation_match=if_generation_match, timeout=bound.seconds)
            except PreconditionFailed:
                if gate is not None:
                    gate.refund(clock.monotonic())
                # our own earlier attempt may be what moved the generation: only a read can tell
                landed = read_back(patient=True) if maybe_landed else None
                if landed is not None:
                    return landed
                raise
            except TransientStorageError as exc:
                last_failure = exc
                bound.failed(exc, watch)
                if exc.status == 429 and gate is not None:
                    gate.throttled(exc.retry_after)
                if exc.ambiguous:
                    maybe_landed = True
                    cut_off = cut_off or exc.status is None
                    landed = read_back(patient=False)
                    if landed is not None:
                        return landed
                if bound.used_up(exc) or not pause():
                    raise
                failed(storage, exc)  # after the pause: a write's last failure is the caller's to report
            else:
                if gate is not None:
                    gate.succeeded()
                _answered(storage, watch)
                return generation, None
    except TransientStorageError as exc:
        if maybe_landed and not exc.ambiguous:
            # The last failure (a read-back's 503, a retry's 429) says nothing of an earlier attempt
            # whose reply was lost: it may have landed, so the outcome is unknown, whatever this one says.
            exc.ambiguous = True
        exc.may_land_late = cut_off
        raise
    except StorageError as exc:  # refused for good (a 403): an earlier attempt cut off may still land
        exc.may_land_late = cut_off
        raise


def _landed(
    storage: Storage,
    key: str,
    expected: int,
    is_ours: Callable[[bytes], bool | None],
    max_bytes: int,
    timeout: float | None,
) -> tuple[int, bytes] | None:
    """After a write that may have landed: ``(generation, bytes)`` if it did, None if it did not yet.

    Raises :class:`PreconditionFailed` if someone else wrote and ours is proven
    absent, and :class:`_OutcomeLost` if someone else wrote and the bytes cannot
    tell. Not a :class:`TransientStorageError`: the callers retry those.
    """
    found = storage.read(key, max_bytes=max_bytes, timeout=timeout)
    if found is None:
        if expected != 0:
            raise PreconditionFailed(key, expected, url=storage.url)
        return None
    data, generation = found
    try:
        ours = is_ours(data)
    except Exception:  # unreadable bytes are not ours; the caller's own read will report them
        ours = False
    if ours:
        return generation, data
    if generation == expected:
        return None
    if ours is None:
        raise _OutcomeLost()
    raise PreconditionFailed(key, expected, url=storage.url)


class _OutcomeLost(Exception):
    """Raised by :func:`_landed`: the object moved on, and its bytes no longer show whether our write landed."""


def _outcome_lost(storage: Storage, key: str, expected: int) -> TransientStorageError:
    return TransientStorageError(
        f"write to {key!r} in {storage.url}: no reply came, and others have written since "
        f"generation {expected} so often that the object no longer shows whether this write is among theirs: "
        "it may have landed (read the object to see where things stand)",
        url=storage.url,
        key=key,
        ambiguous=True,
    )


class RecordStore:
    """Reads and conditional writes of one lock object, each request bounded by the lock's ``request_timeout``
    and by what is left of its operation's deadline (:class:`Bound`).

    ``interrupted(delay)`` waits up to ``delay`` seconds and says whether an
    interruptible retry must give up (a ``cancel()``, a deferred release).
    Needs no mutex of its own: the lock serialises its writes.
    """

    def __init__(
        self,
        storage: Storage,
        key: str,
        *,
        url: str,
        clock: Clock,
        timing: Timing,
        interrupted: Callable[[float], bool],
        log: logging.Logger | logging.LoggerAdapter[logging.Logger],
    ) -> None:
        self.storage, self.key, self.url = storage, key, url
        self._clock, self._timing, self._interrupted, self._log = clock, timing, interrupted, log
        self._gate: WriteGate | None = None
        self._watch = Watch(url, timing.request_timeout, clock)

    def gate(self) -> WriteGate:
        """The store's write gate for this object (shared with every lock of this process on it)."""
        if self._gate is None:
            self._gate = gate_for(self.storage, self.key, self._timing.min_write_interval, self._clock)
        return self._gate

    def read(
        self, deadline: float | None, *, retry: bool = True, interruptible: bool = False
    ) -> tuple[LockRecord | None, int]:
        """One read (retried on transient errors until ``deadline``), decoded strictly."""
        found = read_retrying(
            self.storage,
            self.key,
            clock=self._clock,
            deadline=deadline,
            max_bytes=MAX_RECORD_BYTES,
            retry=retry,
            sleep=lambda delay: self._sleep(delay, interruptible),
            timeout=self._timing.request_timeout,
            watch=self._watch,
        )
        if found is None:
            return None, 0
        data, generation = found
        return LockRecord.decode(data, key=self.key, generation=generation, url=self.url), generation

    def wait_for_gate(self, deadline: float | None, *, urgent: bool = False, interruptible: bool = False) -> None:
        """Before a read whose decision will likely be written: wait for our write slot first.

        Reading and then waiting out the per-object write spacing would send the
        write on a generation that has had a second to go stale; against a busy
        object that can lose every time. The wait leaves the read its
        ``MIN_REQUEST_TIME`` before ``deadline``: a wait that used the time up
        would leave the read nothing, and its caller (giving a slot or a handed
        lock back) not even the record to decide on.
        """
        wait = self.gate().ready_in(self._clock.monotonic(), urgent=urgent)
        if deadline is not None:
            wait = min(wait, max(0.0, deadline - MIN_REQUEST_TIME - self._clock.monotonic()))
        if wait > 0:
            self._sleep(wait, interruptible)

    def write(
        self,
        write: Write,
        deadline: float | None,
        *,
        retry: bool = True,
        urgent: bool = False,
        send_by: float | None = None,
        interruptible: bool = False,
    ) -> tuple[Write, int, float, float]:
        """Make ``write``, decided again against the clock at the send of each attempt.

        Returns ``(the attempt that landed, new generation, monotonic and wall
        time of its send)``: a lease is counted from the send of the write that
        made it, never from when the operation began (a wait for the write
        gate, behind the lock's I/O mutex, or retries after a 503 or a 429, come
        before the stamp). A write whose decision no longer holds at the send
        (:func:`~handofflock.core.protocol.restamp`: a handoff to a slot that
        has ended meanwhile) is not sent: PreconditionFailed, as when the record
        moved on, and the caller reads and decides again.
        ``send_by`` (monotonic): past it, a 429's widened spacing no longer holds
        an urgent write back (see :meth:`~handofflock.core.timing.Timing.backoff_until`).
        Raises PreconditionFailed when the record moved on (the caller reads and decides again).
        """
        attempts: dict[str, tuple[Write, float, float]] = {}
        sent: list[str] = []

        def stamp() -> bytes:
            mono, wall = self._clock.monotonic(), self._clock.time()
            attempt = protocol.restamp(write, now=wall, nonce=new_nonce(), timing=self._timing)
            if attempt is None:  # sent now, the decision would no longer hold: read and decide again
                raise PreconditionFailed(self.key, write.if_generation_match, url=self.url)
            assert attempt.record.nonce is not None
            attempts[attempt.record.nonce] = (attempt, mono, wall)
            sent.append(attempt.record.nonce)
            return attempt.record.encode()

        def is_ours(data: bytes) -> bool:
            return LockRecord.decode(data, key=self.key, url=self.url).nonce in attempts

        generation, read_back = write_resolving(
            self.storage,
            self.key,
            stamp,
            if_generation_match=write.if_generation_match,
            is_ours=is_ours,
            clock=self._clock,
            deadline=deadline,
            max_bytes=MAX_RECORD_BYTES,
            gate=self.gate(),
            urgent=urgent,
            send_by=send_by,
            retry=retry,
            sleep=lambda delay: self._sleep(delay, interruptible),
            timeout=self._timing.request_timeout,
            watch=self._watch,
        )
        landed = attempts[sent[-1]]
        if read_back is not None:
            landed = attempts.get(LockRecord.decode(read_back, key=self.key, url=self.url).nonce or "", landed)
            self._log.info("a write whose reply was lost had landed (%s)", write.kind.value)
        attempt, mono, wall = landed
        return attempt, generation, mono, wall

    def _sleep(self, delay: float, interruptible: bool) -> bool:
        """Sleep ``delay`` before a retry or out the write spacing; False to give up.

        ``interruptible`` retries (an acquire's polling, ``status()``) give up
        on ``cancel()`` or a deferred release. The others (a release, giving
        the waiter slot back) carry on to their deadline whatever arrives: they
        are what a cancel or a signal wants done.
        """
        if not interruptible:
            self._clock.sleep(delay)
            return True
        return not self._interrupted(delay)
