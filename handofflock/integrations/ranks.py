"""One lock holder, one yield decision for every rank of a multi-process job.

A job of N ranks (``torchrun`` workers, say) takes the lock once: one rank,
the *holder*, owns the :class:`~handofflock.HandoffLock`; the others never
touch it. Every K steps all ranks run one tiny collective, ``agree``, in
which each rank votes two flags, *yield* and *lost*, and learns whether any
rank voted each. So every rank stops after the same step, checkpoints the same
state, and nobody waits in a collective that another rank has left:

* the holder votes *yield* when ``lock.release_requested`` by a waiter or an
  operator; any rank may vote it with :meth:`RankLock.request_stop`;
* any rank votes *exit*, with its cause, when it got SIGTERM, SIGINT or SIGUSR1
  (:class:`RankSignals`, which ``rank_lock`` installs on
  every rank), a preemption notice, ``request_stop("exit")``, or when its
  launcher is gone (``launcher``: its parent changed); the holder also
  when its lock's release request came from a signal or a preemption notice.
  Exit wins over yield, and every rank learns the same :class:`StopDecision`
  (``"exit"`` or ``"yield"``, and the exit's cause), so the loop can tell
  "checkpoint and exit" from "checkpoint, hand off and wait";
* the holder votes *lost* when ``lock.check()`` raises
  :class:`~handofflock.LockLost`; then every rank raises ``LockLost`` at that
  same step.

The collective is the caller's: ``agree(flags) -> flags``, the elementwise
any-rank-true of a short sequence of bools. :mod:`handofflock.integrations.torch`
supplies one all-reduce (MAX over a 2-element tensor); a launcher whose only
collective agrees on one bool can use :func:`any_of_two`. If the collective
itself fails (a rank died), the adapter raises
:class:`~handofflock.AgreementFailed`.

>>> ranks = RankLock(lock if rank == 0 else None, agree, every=10)
>>> while True:
...     ranks.acquire()                           # all ranks; raises RankExit if they agree to exit meanwhile
...     steps = ranks.steps(range(load_checkpoint(), total))
...     for step in steps:
...         train(step)
...     save_checkpoint(steps.last)               # every rank stopped after this step
...     ranks.release()                           # all ranks meet, then the holder hands the lock off
...     if steps.decision is None:
...         break                                 # finished
...     if steps.decision.exit:
...         sys.exit(steps.decision.exit_status)  # a signal or a notice: be requeued, resume from the checkpoint
...     # "yield": wait for the lock again, in this process
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Literal, TypeVar

from ..core.errors import (
    ConfigurationError,
    HandoffLockError,
    LockLost,
    LockNotHeld,
    StoppedWithoutCheckpointWarning,
)
from ..core.timing import seconds
from ..exit_codes import report_exit_status
from ..fencing import StaleToken
from ..lock.handoff import Steps
from ..os_signals import CaughtSignals, Handler, SignalLike, Stands

if TYPE_CHECKING:
    from ..lock.handoff import HandoffLock
    from ..lock.types import ReleaseRequest
    from .checkpoints import Checkpoint, LatestCheckpoint

T = TypeVar("T")

#: The collective: each rank passes the same number of flags, every rank gets their elementwise OR.
Agree = Callable[[Sequence[bool]], Sequence[bool]]

_log = logging.getLogger("handofflock.ranks")

#: What a rank can vote "exit" for, in the order of the vote; the first one any rank voted names the exit.
EXIT_CAUSES = ("SIGTERM", "SIGINT", "SIGUSR1", "preemption", "requested", "launcher")
#: The status of an exit that no signal caused (a preemption notice, ``request_stop("exit")``):
#: EX_TEMPFAIL, "try again later", as ``handofflock``'s own exit codes use it.
EXIT_TEMPFAIL = 75

# A vote: [first, yield, *EXIT_CAUSES, last]; first/last are (ok, failed) in acquire, unused/lost in steps.
_FIRST, _YIELD, _LAST = 0, 1, 2 + len(EXIT_CAUSES)


@dataclass(frozen=True)
class StopDecision:
    """What all ranks agreed when they stopped: the same ``action`` and ``cause`` on every rank.

    ``action`` is ``"exit"`` (a signal or a preemption notice reached some rank:
    checkpoint, release, and end the process; the job is requeued and resumes from
    the checkpoint) or ``"yield"`` (another job asked for the lock: checkpoint,
    hand off, and wait for it again, here or after a requeue). ``cause`` is, for
    an exit, one of :data:`EXIT_CAUSES` (the first that any rank voted); for a
    yield, ``"waiter"``, ``"operator"`` or ``"requested"`` where this rank knows it
    (the holder), else ``"yield"``. ``request`` is the lock's
    :class:`~handofflock.ReleaseRequest` on the holder rank, None elsewhere.
    """

    action: Literal["exit", "yield"]
    cause: str
    request: ReleaseRequest | None = None

    @property
    def exit(self) -> bool:
        """True when the ranks must end their processes (not wait for the lock again)."""
        return self.action == "exit"

    @property
    def exit_status(self) -> int:
        """The documented status to exit with: 128+N for signal N (as a shell reports it), else 75 (EX_TEMPFAIL)."""
        if self.cause.startswith("SIG"):
            return 128 + int(signal.Signals[self.cause])
        return EXIT_TEMPFAIL


class RankExit(SystemExit):
    """The ranks agreed to exit while they waited for the lock: raised by :meth:`RankLock.acquire` on every rank.

    A :class:`SystemExit` whose code is the decision's :attr:`~StopDecision.exit_status`,
    so an uncaught one ends the process with the documented status and no traceback
    (as Lightning's ``SIGTERMException`` does). The waiter slot was given back.
    """

    def __init__(self, decision: StopDecision) -> None:
        super().__init__(decision.exit_status)
        self.decision = decision


def local_agree(flags: Sequence[bool]) -> Sequence[bool]:
    """The collective of a job of one rank: the flags as they are."""
    return tuple(bool(f) for f in flags)


def any_of_two(agree_one: Callable[[bool], bool]) -> Agree:
    """An :data:`Agree` from a collective that agrees on one bool (any-rank-true): one call per flag.

    Every rank makes the same calls in the same order, so this never leaves a
    rank waiting; it costs one collective per flag (a vote has
    ``3 + len(EXIT_CAUSES)`` flags) instead of one in all.
    """

    def agree(flags: Sequence[bool]) -> Sequence[bool]:
        return tuple(bool(agree_one(bool(f))) for f in flags)

    return agree


class RankLock:
    """The lock of a multi-rank job: held by one rank, decided on by all.

    Construct it on every rank, passing the :class:`~handofflock.HandoffLock`
    on the holder rank and ``None`` on every other rank, and the same
    ``agree`` collective and ``every`` everywhere. ``every`` is how many steps
    pass between agreements (1: before each step); ``poll`` is how often, in
    seconds, the ranks meet while the holder waits for the lock.

    ``request_release`` and ``priority`` are what the holder's acquire asks
    with (see ``HandoffLock.acquire``). ``launcher`` is the pid of the process
    that started this rank (torchrun's agent): once this process's parent is
    another, the launcher died without passing on a signal, and the rank votes
    an exit with the cause ``"launcher"`` at the next agreement, so no orphaned
    rank trains on holding the lock.

    ``latest`` is the job's :class:`~handofflock.integrations.checkpoints.LatestCheckpoint`
    (every rank's, the holder's opened with its lock), or None: the holder
    claims it once it has the lock, before any rank returns from
    :meth:`acquire`, so every rank then reads the same newest checkpoint and
    no replaced holder can move it.

    Every method that takes part in the collective must be called by all ranks
    in the same order: :meth:`acquire`, :meth:`should_stop` (or iterating
    :meth:`steps`) and :meth:`release`.
    """

    def __init__(
        self,
        lock: HandoffLock | None,
        agree: Agree,
        *,
        every: int = 1,
        poll: float = 1.0,
        rank: int | None = None,
        request_release: bool = True,
        priority: int = 0,
        launcher: int | None = None,
        latest: LatestCheckpoint | None = None,
    ) -> None:
        if not isinstance(every, int) or isinstance(every, bool) or every < 1:
            raise ConfigurationError(f"every must be a positive int (steps between agreements), not {every!r}")
        self.lock = lock
        self.agree = agree
        self.every = every
        self.poll = seconds("poll", poll)
        self.rank = rank
        #: What :meth:`acquire` asks with by default: whether to ask the holder to yield, and the priority.
        self.request_release_on_acquire = bool(request_release)
        self.priority = priority
        #: The launcher's pid (None: not watched); the rank votes an exit once its parent is another.
        self.launcher = launcher
        #: The job's latest-checkpoint pointer, claimed by the holder in :meth:`acquire`; None: none.
        self.latest = latest
        #: How many agreements this rank took part in (acquire rounds, step checks and the release).
        self.agreements = 0
        #: Steps counted by :meth:`should_stop` since the last agreement.
        self._since = 0
        #: A stop asked on this rank: a yield is consumed when the ranks agree on it; an exit stands
        #: for the life of this object (a process told to end must not take the lock again).
        self._yield_asked = False
        self._exit_cause: str | None = None
        self._held = False
        #: After a stop: what all ranks agreed (the same on every rank); None until then.
        self.decision: StopDecision | None = None
        #: After a yield: the release request that caused it (holder rank only; None elsewhere).
        self.request: ReleaseRequest | None = None
        #: The signal handlers ``rank_lock`` installed for this rank, if any.
        self.signals: RankSignals | None = None

    @property
    def is_holder(self) -> bool:
        """True on the rank that holds the lock object."""
        return self.lock is not None

    @property
    def held(self) -> bool:
        """True on every rank between a successful :meth:`acquire` and :meth:`release` (or a loss)."""
        return self._held

    def _meet(
        self, *, first: bool = False, want_yield: bool = False, exit_cause: str | None = None, last: bool = False
    ) -> Sequence[bool]:
        """One agreement: this rank's vote ``[first, yield, *exit causes, last]``, every rank's OR back."""
        flags = [first, want_yield, *(cause == exit_cause for cause in EXIT_CAUSES), last]
        self.agreements += 1
        agreed = self.agree(flags)
        if len(agreed) != len(flags):
            raise ConfigurationError(f"agree() returned {len(agreed)} flags for {len(flags)}")
        return agreed

    def _holder_votes(self) -> tuple[bool, str | None]:
        """(yield, exit cause) as this rank sees them: its own requests, and on the holder its lock's request."""
        if self._exit_cause is None and self.launcher is not None and os.getppid() != self.launcher:
            _log.warning("rank %s: its launcher (pid %s) is gone; the ranks stop", self.rank, self.launcher)
            self.request_stop("exit", cause="launcher")
        want_yield, cause = self._yield_asked, self._exit_cause
        lock = self.lock
        if lock is not None and lock.release_requested and cause is None:
            # Every request that stands, not only the most urgent: a signal or a notice behind a waiter's earlier
            # deadline still means the process is going away (exit, with its status), not a yield.
            for request in lock.release_requests:
                if request.reason == "preemption":
                    cause = "preemption"
                elif request.reason == "signal":
                    cause = request.requester if request.requester in EXIT_CAUSES else "SIGTERM"
                if cause is not None:
                    break
            want_yield = want_yield or cause is None
        return want_yield, cause

    def _decided(self, agreed: Sequence[bool]) -> StopDecision | None:
        """What the ranks agreed, if anything; its exit status goes to ``handofflock exec`` (if it started us)."""
        causes = [c for c, voted in zip(EXIT_CAUSES, agreed[_YIELD + 1 : _LAST], strict=True) if voted]
        request = self.lock.release_request if self.lock is not None else None
        decision = None
        if causes:
            decision = StopDecision("exit", causes[0], request)
        elif agreed[_YIELD]:
            cause = str(request.reason) if request is not None else ("requested" if self._yield_asked else "yield")
            decision = StopDecision("yield", cause, request)
        if decision is not None:
            report_exit_status(decision.exit_status)
        return decision

    # ------------------------------------------------------------------ acquire

    def acquire(
        self, timeout: float | None = None, *, request_release: bool | None = None, priority: int | None = None
    ) -> None:
        """Take the lock for the job: the holder acquires; all ranks return together once it holds.

        ``timeout``, ``request_release`` and ``priority`` go to the holder's
        ``HandoffLock.acquire`` (the last two default to this object's).
        The holder claims :attr:`latest` before the ranks return (a failed
        claim lets the lock go and fails the acquire on every rank).
        While the holder waits (as the single waiter, perhaps for hours), all
        ranks meet every ``poll`` seconds, so no collective waits longer than
        that. If the holder's acquire fails, it re-raises the error and every
        other rank raises :class:`~handofflock.LockNotHeld`.
        """
        outcome: dict[str, BaseException | bool] = {}
        done = threading.Event()
        if self.lock is not None:
            lock = self.lock
            asking = self.request_release_on_acquire if request_release is None else request_release
            rank_of_request = self.priority if priority is None else priority

            def take() -> None:
                try:
                    ok = bool(lock.acquire(timeout=timeout, request_release=asking, priority=rank_of_request))
                    if ok and self.latest is not None:
                        self._claim_latest(lock, self.latest)
                    outcome["ok"] = ok
                except BaseException as exc:  # reported to every rank below, re-raised on this one
                    outcome["error"] = exc
                finally:
                    done.set()

            threading.Thread(target=take, name="handofflock-rank-acquire", daemon=True).start()
        while True:
            finished = self.lock is not None and done.wait(self.poll)
            ok = finished and outcome.get("ok") is True
            failed = finished and not ok
            _, cause = self._holder_votes()  # a yield asked while waiting stands for the hold
            agreed = self._meet(first=ok, exit_cause=cause, last=failed)
            decision = self._decided(agreed)
            if decision is not None and decision.exit:
                self._exit_while_waiting(decision, done, outcome)
            if agreed[_LAST]:
                if self.lock is not None:
                    if "error" in outcome:
                        raise outcome["error"]  # type: ignore[misc]
                    raise LockNotHeld(f"could not take {self.lock.url!r}")
                raise LockNotHeld(f"the holder rank could not take the lock; rank {self.rank} stops too")
            if agreed[_FIRST]:
                break
        # A stop asked while waiting stands (the first agreement of the hold stops at once).
        self._held, self._since, self.request, self.decision = True, 0, None, None
        report_exit_status(None)  # held again: the job goes on, and a stop decided before is over
        if self.lock is not None:
            _log.info("rank %s holds %s for the job (token %s)", self.rank, self.lock.url, self.lock.token)

    def _claim_latest(self, lock: HandoffLock, latest: LatestCheckpoint) -> None:
        """Fence the job's pointer with this hold's token; if that fails, the lock goes back before the error."""
        try:
            latest.claim()
        except BaseException:
            try:
                lock.release()
            except HandoffLockError as exc:
                _log.warning("rank %s could not release %s after a failed claim: %s", self.rank, lock.url, exc)
            raise

    def _exit_while_waiting(
        self, decision: StopDecision, done: threading.Event, outcome: dict[str, BaseException | bool]
    ) -> None:
        """All ranks agreed to exit before the lock was theirs: the holder stops waiting (giving the slot back)."""
        self.decision = decision
        lock = self.lock
        if lock is not None:
            while not done.is_set():
                # The acquire gives the waiter slot back and returns. Repeated until it does: a cancel()
                # that comes before the thread's acquire has begun is dropped.
                lock.cancel()
                done.wait(0.05)
            if outcome.get("ok") is True and lock.is_held:  # the lock came just now: pass it on
                try:
                    lock.release()
                except HandoffLockError as exc:
                    _log.warning("rank %s could not release %s on exit: %s", self.rank, lock.url, exc)
        _log.info("rank %s stops waiting for the lock: %s (%s)", self.rank, decision.action, decision.cause)
        raise RankExit(decision)

    def join(self) -> None:
        """Become held on every rank, without acquiring, when the holder rank already holds its lock.

        For ranks that start after the holder took the lock: Lightning's launcher
        (``python train.py`` with ``devices=N``) starts ranks 1..N-1 from inside
        the holder's ``fit``, after the holder took the lock alone. One agreement:
        every rank returns held if the holder holds its lock, else every rank
        raises :class:`~handofflock.LockNotHeld`.
        """
        holds = self.lock is not None and self.lock.is_held
        agreed = self._meet(first=holds, last=self.lock is not None and not holds)
        if agreed[_LAST] or not agreed[_FIRST]:
            self._held = False
            raise LockNotHeld(f"the holder rank does not hold the lock; rank {self.rank} cannot join the hold")
        self._held, self._since = True, 0

    # ------------------------------------------------------------------ steps

    def request_stop(self, action: Literal["exit", "yield"] = "yield", cause: str = "requested") -> None:
        """Ask, from any rank, that all ranks stop at the next agreement. Safe in a signal handler.

        ``action="yield"``: checkpoint and hand the lock off (consumed once agreed).
        ``action="exit"``: checkpoint, release and end (it stands: a later
        :meth:`acquire` raises :class:`RankExit` instead of taking the lock);
        ``cause`` is one of :data:`EXIT_CAUSES` (``"preemption"`` for a notice).
        A request made while :meth:`acquire` waits is kept.
        """
        if action == "exit":
            if self._exit_cause is None:  # the first cause names the exit
                self._exit_cause = cause if cause in EXIT_CAUSES else "requested"
        else:
            self._yield_asked = True

    def start_over(self) -> None:
        """Begin a new run in this process after one that ended (a notebook's next cell, an HPO driver's next trial).

        An exit for SIGINT was carried out by the run it stopped and is
        forgotten: an interrupt ends the run, not the process. Any other exit
        stands (the process is being ended: :meth:`acquire` raises
        :class:`RankExit`). The signal handlers start afresh: the next signal
        is a first one again.
        """
        if self._held:
            raise ConfigurationError("start_over() while the job holds the lock: release() first")
        if self._exit_cause == "SIGINT":
            self._exit_cause = None
        self.decision, self.request = None, None
        old = self.signals
        if old is not None and old.received:
            old.uninstall()
            self.signals = RankSignals(self, old.wanted, chain=old.chain)

    def request_release(
        self, reason: str = "operator", *, requester: str | None = None, deadline: float | None = None
    ) -> None:
        """Ask, from any rank, as :meth:`HandoffLock.request_release` does: all ranks stop at the next agreement.

        What a :class:`~handofflock.PreemptionWatcher` calls on the node it runs
        on, holder or not. A preemption notice is an exit (the node is going
        away: checkpoint, release, end, and be requeued elsewhere); any other
        reason is a yield. The holder rank hands the request (reason, deadline)
        to its lock as well, so ``request`` carries it after the stop.
        Safe in a signal handler.
        """
        if self.lock is not None:
            self.lock.request_release(reason, requester=requester, deadline=deadline)
        if str(getattr(reason, "value", reason)) == "preemption":
            self.request_stop("exit", cause="preemption")
        else:
            self.request_stop()

    def should_stop(self) -> bool:
        """Count one step; every ``every`` steps, agree with all ranks. True when all must stop now.

        Call it on every rank before each step (the first call agrees at once).
        When it returns True, :attr:`decision` says why (the same on every rank).
        Raises :class:`~handofflock.LockLost` on every rank, at the same call,
        if the holder's ``lock.check()`` failed: the work must stop unprotected
        by the lock. The holder raises its own ``LockLost``; the others a new
        one saying the holder lost the lock.
        """
        if not self._held:
            raise LockNotHeld("should_stop() before acquire(), or after release: every rank calls acquire() first")
        due = self._since % self.every == 0
        self._since += 1
        if not due:
            return False
        lost_error: LockLost | None = None
        if self.lock is not None:
            try:
                self.lock.check()
            except LockLost as exc:
                lost_error = exc
        want_yield, cause = self._holder_votes()
        agreed = self._meet(want_yield=want_yield, exit_cause=cause, last=lost_error is not None)
        if agreed[_LAST]:
            self._held = False  # the holder raises its own LockLost, every other rank one saying so
            raise lost_error or LockLost(
                f"the holder rank lost the lock; rank {self.rank} stops at the same step as every other rank",
                reason="the holder rank lost the lock",
            )
        decision = self._decided(agreed)
        if decision is None:
            return False
        self.decision, self.request = decision, decision.request
        if not decision.exit:
            self._yield_asked = False
        return True

    def point(
        self,
        path: str | os.PathLike[str],
        step: int | None = None,
        *,
        seal: Callable[[int], str | os.PathLike[str] | None] | None = None,
    ) -> Checkpoint | None:
        """Point the job's :attr:`latest` at a whole checkpoint: every rank calls it once its part is written.

        All ranks meet (so the checkpoint is whole, whichever ranks wrote it),
        the holder moves the pointer with its token, and all ranks meet again
        to learn how that went, so they carry on or stop together. ``seal``,
        given the token, runs on the holder first and returns the checkpoint's
        final path (say, after renaming it to a name with the token), or None
        when there is nothing to point at. Returns what the pointer names on
        the holder, None elsewhere (and without :attr:`latest`, on every rank,
        with no meeting).

        A refused write (:class:`~handofflock.StaleToken`: a newer holder moved
        the pointer, so this one was replaced) or a lock that knows it is lost
        raises :class:`~handofflock.LockLost` on every rank, at the same call,
        and the job no longer holds the lock; any other failure is re-raised on
        the holder, and the other ranks raise a ``HandoffLockError`` saying so.
        """
        if self.latest is None:
            return None
        if not self._held:
            raise LockNotHeld("point() before acquire(), or after release: every rank calls acquire() first")
        self._meet()  # every rank has written its part of the checkpoint
        found: Checkpoint | None = None
        error: BaseException | None = None
        lock = self.lock
        if lock is not None:
            try:
                lock.check()  # a lock that knows it is lost seals nothing
                token = lock.token
                if token is None:
                    raise LockNotHeld(f"rank {self.rank} does not hold {lock.url!r}")
                where = seal(token) if seal is not None else path
                if where is not None:
                    found = self.latest.point(where, step)
            except Exception as exc:  # reported to every rank below, raised on every rank
                error = exc
        replaced = isinstance(error, (StaleToken, LockLost))
        agreed = self._meet(first=replaced, last=error is not None)
        if agreed[_FIRST]:
            self._held = False
            if isinstance(error, LockLost):
                raise error
            lost = LockLost(
                f"rank {self.rank}: the job's latest-checkpoint pointer refused the holder's write (a newer holder "
                "moved it: this job was replaced); every rank stops at this checkpoint",
                url=lock.url if lock is not None else None,
                reason="replaced",
                cause=error,
            )
            raise lost from error
        if agreed[_LAST]:
            raise error or HandoffLockError(
                f"the holder rank could not move the job's latest-checkpoint pointer; rank {self.rank} stops too"
            )
        return found

    def steps(self, iterable: Iterable[T]) -> RankSteps[T]:
        """Iterate ``iterable`` on every rank until the ranks agree to yield; see :class:`RankSteps`."""
        return RankSteps(self, iterable)

    # ------------------------------------------------------------------ release

    def release(self) -> str | None:
        """Hand the lock off once every rank got here (after its checkpoint): one agreement, then the holder releases.

        Returns the heir's owner id on the holder (None if nobody waited), None elsewhere.
        """
        if not self._held:
            raise LockNotHeld("release() without acquire(): every rank calls acquire() first")
        self._meet()  # nobody leaves its checkpoint before everybody finished theirs
        self._held = False
        if self.lock is not None:
            return self.lock.release()
        return None

    def abandon(self) -> bool:
        """Leave without meeting the other ranks (this rank failed): the holder lets the lock go if it still has it.

        True if this call released the lock."""
        self._held = False
        lock = self.lock
        if lock is not None and lock.is_held:
            try:
                lock.release()
            except HandoffLockError as exc:  # lost meanwhile: nothing to hand off
                _log.warning("rank %s could not release %s while failing: %s", self.rank, lock.url, exc)
            else:
                return True
        return False

    def __enter__(self) -> RankLock:
        self.acquire()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is not None:  # the others may be gone (or failing too): meeting them could hang
            self.abandon()
        elif self._held:
            self.release()

    def __repr__(self) -> str:
        role = "holder" if self.is_holder else "follower"
        return f"<RankLock rank={self.rank} {role} every={self.every} held={self._held}>"


class RankSteps(Steps[T]):
    """Iterate ``iterable`` on every rank while the job holds the lock and nobody asked for it.

    A :class:`~handofflock.Steps` for a job of many ranks: before each item it
    calls :meth:`RankLock.should_stop` (which agrees with the other ranks every
    ``every`` items) instead of asking the lock, and stops, without taking the
    item, when the ranks agreed to stop. Every rank hands out the same items, so
    after the loop ``last`` is the same step on every rank.

    After the loop: ``last``, ``count`` and ``stopped`` as on a ``Steps``,
    ``decision`` (the :class:`StopDecision`, the same on every rank:
    ``decision.exit`` tells "exit" from "yield and wait") and ``request`` (the
    :class:`~handofflock.ReleaseRequest`, on the holder rank only). ``lock`` is
    the holder rank's lock, None on the other ranks.
    """

    __slots__ = ("decision", "ranks")

    def __init__(self, ranks: RankLock, iterable: Iterable[T]) -> None:
        super().__init__(ranks.lock, iterable)  # type: ignore[arg-type]  # None off the holder; never asked here
        self.ranks = ranks
        self.decision: StopDecision | None = None

    def __next__(self) -> T:
        if self.ranks.should_stop():  # raises LockLost on every rank at once
            self.stopped = True
            self.decision, self.request = self.ranks.decision, self.ranks.request
            raise StopIteration
        item = next(self._items)
        self.last = item
        self.count += 1
        return item

    def __repr__(self) -> str:
        why = f" {self.decision.action}:{self.decision.cause}" if self.decision else ""
        return f"<RankSteps last={self.last!r} count={self.count} stopped={self.stopped}{why}>"


#: What ``rank_lock`` handles by default.
DEFAULT_RANK_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
#: Seconds within which a second SIGINT counts as the same request (a later one means "now").
REPEAT_WINDOW = 1.0


class RankSignals(CaughtSignals):
    """Signal handlers that turn signals into an agreed exit of all ranks; :meth:`uninstall` puts things back.

    ``rank_lock`` installs these on every rank (torchrun sends each worker the
    signal it got; Slurm's ``scancel`` and a Kubernetes eviction reach every
    process). A signal only records ``ranks.request_stop("exit", cause=NAME)``: at
    the next agreement every rank stops after the same step with the decision
    ``exit`` and that cause, checkpoints, releases (the holder hands the lock off)
    and exits with ``decision.exit_status`` (128 + the signal's number). torchrun
    sends SIGKILL 30 s after SIGTERM: ``every`` steps plus the checkpoint must fit.

    * A SIGTERM or SIGUSR1 after the first signal, however late, is the same
      request again: launchers send copies (``scancel``, systemd and a
      Kubernetes eviction signal every process while torchrun forwards its own
      copy to each rank), and a rank blocked in a collective runs its handler
      only when the collective returns, so a copy sent milliseconds later may be
      handled seconds later. Slurm's ``--signal=USR1@N`` is followed by SIGTERM
      at the time limit: the stop agreed on goes on. A launcher escalates with
      SIGKILL, not a second SIGTERM.
    * A SIGINT handled at least :data:`REPEAT_WINDOW` seconds after the first
      signal (Ctrl-C pressed again at a terminal) means "now": the holder
      releases the lock at once (no meeting: the other ranks may be gone), the
      handlers found at install come back, SIGINT does what it would have done
      without us (:class:`KeyboardInterrupt` by default), and a
      :class:`~handofflock.core.errors.StoppedWithoutCheckpointWarning` says so.
      Under torchrun a terminal's Ctrl-C reaches torchrun alone (its workers run
      in sessions of their own), which sends SIGINT, and SIGTERM on a second
      Ctrl-C: a SIGTERM after a first SIGINT means "now" too, and ends the
      process by SIGTERM's default action.
    * ``chain`` names the signals whose earlier Python handler also runs at the
      first signal: by default SIGUSR1, so Lightning's Slurm auto-requeue (or
      your own handler) still runs; SIGINT's earlier handler runs only on "now",
      and SIGTERM's not at all while ours is installed, since the stop is ours to
      carry out (Lightning's SIGTERM handler, say, runs a collective inside the
      handler and raises ``SIGTERMException``: on one rank alone, the ranks'
      collectives fall out of step and the job hangs).
    * A signal ignored (SIG_IGN) at install time stays ignored; a forked child
      (a DataLoader worker) gets the signal's own behaviour, not ours.
    """

    repeat_window = REPEAT_WINDOW
    uncatchable = "{} cannot be caught"
    off_main_thread = "RankSignals.install() must be called from the main thread"

    def __init__(
        self,
        ranks: RankLock,
        signals: Iterable[SignalLike] = DEFAULT_RANK_SIGNALS,
        *,
        chain: Iterable[SignalLike] = (signal.SIGUSR1,),
    ) -> None:
        super().__init__(signals, chain=chain)
        self.ranks = ranks

    def _ask(self, sig: signal.Signals) -> Stands:
        ranks = self.ranks
        ranks.request_stop("exit", cause=sig.name)
        # An exit stands for the life of the ranks, except one for SIGINT that start_over() forgets: after
        # that, the next run's first signal asks again.
        return lambda: ranks._exit_cause is not None

    def _escalates(self, sig: signal.Signals, first: signal.Signals) -> bool:
        # torchrun starts its workers in sessions of their own: a terminal's Ctrl-C reaches torchrun alone,
        # which sends its workers SIGINT, and on a second Ctrl-C SIGTERM (its shutdown).
        return sig is signal.SIGINT or (sig is signal.SIGTERM and first is signal.SIGINT)

    def _then(self, sig: signal.Signals, previous: Handler) -> Handler:
        # SIGTERM's earlier handler never runs from ours (Lightning's runs a collective): it ends the process.
        return previous if sig is signal.SIGINT else signal.SIG_DFL

    def _now(self, sig: signal.Signals, act: Callable[[], None]) -> None:
        """No meeting (the other ranks may be gone): the holder lets the lock go, then the signal acts."""
        released = self.ranks.abandon()
        first = self._first[1].name if self._first is not None else "another"
        message = (
            f"rank {self.ranks.rank}: a second signal ({sig.name}, after {first}): stopping now, "
            "without a checkpoint and without the other ranks" + (", the lock released" if released else "")
        )
        _log.warning("%s", message)
        try:  # the library's logger says nothing unless the application set logging up; a warning shows anyway
            warnings.warn(StoppedWithoutCheckpointWarning(f"handofflock: {message}"), stacklevel=2)
        except Exception:  # a warnings filter that raises: said in the log just above, and the signal must act
            _log.debug("StoppedWithoutCheckpointWarning raised by a warnings filter; carrying on", exc_info=True)
        if released and self.ranks.lock is not None and self.ranks.lock.then_after_deferred_release(act):
            return  # the release waits for the lock's call in progress to return: the signal acts after it
        act()
