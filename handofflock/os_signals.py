"""SIGTERM and friends: a held lock released on a signal that would end the process, or a release request.

Without any set-up, a lock that becomes held (or waits in a blocking acquire) in the main
thread while SIGTERM's or SIGHUP's action is the default one (SIG_DFL: the process would just
end) installs a handler for it (:func:`arm`): the signal releases every lock of this process that is
held (handed to a live waiter, as ``release()`` does), has every waiting acquire give its waiter
slot back (else the lock would be handed to a process that is gone), puts the default action back
and raises the signal again, so the process still ends with the signal's status.
The handler goes again when no lock is held (:func:`settle`). A handler of anyone
else's is never replaced, and one installed over ours later (a framework's, or
:func:`install_signal_handlers`) decides alone: ours does nothing when it chains to
us, and acts again once put back. ``HandoffLock(release_on_signal=False)`` opts out.

With :func:`install_signal_handlers`:

The first signal only records a request (``reason="signal"``, the signal's
name as requester, ``deadline = now + grace``): the training loop sees
``lock.release_requested`` at its next step, checkpoints and hands the lock
over. A second signal while that request stands means "now": the handler
hands the lock over itself and then lets the signal do what it would have done
without us (the previous handler runs, the default action kills the process,
or SIGINT raises :class:`KeyboardInterrupt`). The request goes with the hold it
asked to end (one made between holds, or while ``acquire()`` waits, stands for
the next hold): once that hold is over, the next signal is a first one again,
a request to the next hold.

Grace periods people live with, and what to pass as ``grace`` (leave a few
seconds for the checkpoint's last write and the release itself):

==========================  ==================================================
torchrun / torch.elastic     SIGTERM to workers, SIGKILL ~30 s later
Kubernetes                   SIGTERM, SIGKILL after terminationGracePeriodSeconds
                             (default 30 s)
Slurm                        ``--signal=B:USR1@120``: USR1 120 s before the time
                             limit (``B:`` sends it to the batch shell only);
                             ``scancel`` sends SIGTERM, SIGKILL after KillWait
                             (default 30 s)
GCE spot / preemptible VM    ~30 s between the notice and the stop; ACPI G2
                             soft-off reaches processes as SIGTERM on shutdown
                             (see :mod:`handofflock.preemption` to hear it first)
==========================  ==================================================
"""

from __future__ import annotations

import atexit
import functools
import logging
import math
import os
import signal
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from types import FrameType
from typing import TYPE_CHECKING, Any, Protocol, TypeGuard, TypeVar

from .core.errors import ConfigurationError, HandoffLockError
from .lock import handoff as _handoff

if TYPE_CHECKING:
    from .lock.handoff import HandoffLock

_log = logging.getLogger("handofflock.os_signals")

#: The signals handled when none are named.
DEFAULT_SIGNALS = (signal.SIGTERM, signal.SIGINT)
#: Seconds promised to the requester after a signal: under the common 30 s before SIGKILL.
DEFAULT_GRACE = 25.0
#: Seconds after a "now" within which a signal is a copy of it (a launcher's, a burst of Ctrl-C): it waits for the
#: lock to be let go, then acts. A signal later than that acts at once, whatever the release is waiting for.
NOW_COPIES = 1.0

SignalLike = int | str | signal.Signals
SignalT = TypeVar("SignalT", bound=int)
CaughtT = TypeVar("CaughtT", bound="CaughtSignals")
#: A signal handler as ``signal.getsignal`` returns it.
Handler = Callable[[int, FrameType | None], Any] | int | None
#: Whether the stop a first signal asked for still stands (called in a signal handler: no I/O, no lock).
Stands = Callable[[], bool]


def parse_signal(value: SignalLike) -> signal.Signals:
    """``15``, ``"TERM"``, ``"SIGTERM"`` or ``signal.SIGTERM`` -> ``signal.SIGTERM``."""
    if isinstance(value, signal.Signals):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return signal.Signals(value)
        except ValueError:
            raise ConfigurationError(f"{value} is not a signal number on this platform") from None
    if isinstance(value, str):
        text = value.strip().upper()
        if text.isdigit():
            return parse_signal(int(text))
        name = text if text.startswith("SIG") else f"SIG{text}"
        try:
            return signal.Signals[name]
        except KeyError:
            raise ConfigurationError(f"unknown signal {value!r}; use a name like TERM, INT or USR1") from None
    raise ConfigurationError(f"a signal is a name or a number, got {type(value).__name__}")


class CaughtSignals:
    """Handlers for ``wanted``: the first signal asks for a stop, a later one may mean "now".

    Subclasses say what each means (:meth:`_ask`, :meth:`_now`). At the first
    signal, the handler found at install runs too if it is a Python function
    and the signal is one of ``chain`` (default: all). A later signal means
    "now" if :meth:`_escalates` says it may (by default, any) and it is handled
    at least ``repeat_window`` seconds after the first; any other is the same
    request again. A signal is a later one only while the stop the first asked
    for stands (:meth:`_ask` returns how to tell): once that stop is over, the
    next signal is a first one again, whether our handlers stayed or were
    installed again meanwhile. While "now" lets the lock go (a release deferred to the
    lock's call in progress too), our handlers stay: a signal within
    :data:`NOW_COPIES` seconds of it is a copy, and acts once the lock is let go,
    with every other that came (those that end the process first, Python
    handlers next, ``KeyboardInterrupt`` last); a later one (Ctrl-C pressed yet
    again: the release is stuck) acts at once with the copies, even if that cuts
    the release short. A signal found ignored (SIG_IGN) at install stays ignored; in
    a forked child, which inherited the handler but not the lock, a signal
    does what it would have done had we never been installed (a worker told
    to stop must stop). ``signals``: the signals handled; ``received``: names
    of the signals received so far, in order.
    """

    repeat_window = 0.0
    #: What a subclass's API says of a signal that cannot be caught, and of an install off the main thread.
    uncatchable = "{} cannot be caught; no process gets a chance to release on it"
    off_main_thread = "signal handlers must be installed from the main thread (Python runs signal handlers only there)"

    def __init__(self, signals: Iterable[SignalLike], *, chain: Iterable[SignalLike] | None = None) -> None:
        self.wanted = tuple(dict.fromkeys(parse_signal(s) for s in signals))
        for sig in self.wanted:
            if sig in (signal.SIGKILL, signal.SIGSTOP):
                raise ConfigurationError(self.uncatchable.format(sig.name))
        self.chain = frozenset(self.wanted if chain is None else (parse_signal(s) for s in chain))
        # The first signal: when it was handled, which it was, and whether the stop it asked for still stands
        # (None while it is being asked). Replaced whole: a handler that nests reads one consistent value.
        self._first: tuple[float, signal.Signals, Stands | None] | None = None
        self._now_at: float | None = None  # when a "now" under way began
        self._meanwhile: dict[signal.Signals, Handler] = {}  # signals that came during it, to act after it
        self.received: list[str] = []
        self.signals: tuple[signal.Signals, ...] = ()
        self._previous: dict[signal.Signals, Handler] = {}
        self._pid = os.getpid()

    def install(self: CaughtT) -> CaughtT:
        """Install on this process's main thread (Python runs handlers only there).

        Called again, it takes back any signal whose handler was replaced since
        (a framework installed its own), chaining to or restoring that one. That
        alone does not start afresh: a first signal's request that still stands
        makes the next signal a repeat of it.
        """
        if threading.current_thread() is not threading.main_thread():
            raise ConfigurationError(self.off_main_thread)
        self.signals = take_over(self.wanted, self._handle, self._previous)
        return self

    def uninstall(self) -> None:
        """Put back the handlers found at install. Idempotent; a handler replaced after ours is left to its owner."""
        for sig in self.signals:
            previous = self._previous.get(sig)
            if signal.getsignal(sig) != self._handle:
                _log.warning("%s's handler was replaced after ours was installed; leaving it", sig.name)
            else:  # a handler installed from C reads back as None and cannot be restored: default it
                signal.signal(sig, signal.SIG_DFL if previous is None else previous)
        self.signals, self._previous = (), {}
        self._now_at, self._meanwhile = None, {}  # a "now" under way ends with our handlers
        settle()  # our release-on-signal handler, put back, goes too if no lock is held any more

    def __enter__(self: CaughtT) -> CaughtT:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.uninstall()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        sig = signal.Signals(signum)
        previous = self._previous.get(sig)
        if os.getpid() != self._pid:
            act_as_before(sig, frame, previous)
            return
        now, first = time.monotonic(), self._first
        if first is not None and self._now_at is None and first[2] is not None and not first[2]():
            first = None  # the stop the first signal asked for is over (its hold has ended): this one asks again
        if first is None:
            # Marked before anything else: a repeat that lands while this handler runs (handlers can
            # nest between bytecodes) is then a repeat of this one, not a second first signal.
            self._first = (now, sig, None)
        self.received.append(sig.name)
        if first is None:
            # Attributes only: no I/O, no lock, whatever the main thread was doing.
            self._first = (now, sig, self._ask(sig))
            if sig in self.chain and is_python_handler(previous):
                previous(signum, frame)
        elif self._now_at is not None:  # a "now" is letting the lock go
            then = self._then(sig, previous)
            if now - self._now_at < NOW_COPIES:
                self._meanwhile.setdefault(sig, then)  # a copy: it acts once the lock is let go
                return
            self._act_with_copies(sig, then, frame)  # pressed again, later: now, even if that cuts the release short
        elif self._escalates(sig, first[1]) and now - first[0] >= self.repeat_window:
            self._now_at, then = now, self._then(sig, previous)
            try:  # ours stay in place while the lock is let go, deferred or not: a copy must not act first
                self._now(sig, lambda: self._act_with_copies(sig, then, frame))
            except BaseException:
                if self.signals:
                    self.uninstall()
                raise

    def _act_with_copies(self, sig: signal.Signals, then: Handler, frame: FrameType | None) -> None:
        """Put back the handlers found at install; then ``sig`` (doing ``then``) and each copy that came during the
        "now" act: those that end the process first, then those that may raise, ``KeyboardInterrupt`` last (the
        one most often caught); one that raises does not keep the rest from acting."""
        remembered = self._meanwhile  # a copy landing until uninstall() has put the handlers back lands here
        self.uninstall()
        copies = [(s, h) for s, h in remembered.items() if s is not sig]
        _act_all(sorted([*copies, (sig, then)], key=lambda sh: _order(sh[1])), frame)

    def _escalates(self, sig: signal.Signals, first: signal.Signals) -> bool:
        """Whether ``sig``, after the first signal ``first``, may mean "now"; if not, however late, it repeats the
        request."""
        return True

    def _then(self, sig: signal.Signals, previous: Handler) -> Handler:
        """What ``sig`` does once "now" has let the lock go: what it did before us (``previous``)."""
        return previous

    def _ask(self, sig: signal.Signals) -> Stands:
        """The first signal: ask for a stop; return what says whether that stop still stands (no I/O, no lock:
        it is called in the handler). While it does, a later signal is a repeat; once it does not, a first."""
        raise NotImplementedError

    def _now(self, sig: signal.Signals, act: Callable[[], None]) -> None:
        """A second signal: give the lock up now, then ``act()``: what the signal would have done without us."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {','.join(s.name for s in self.signals)} received={self.received}>"


class SignalHandlers(CaughtSignals):
    """What :func:`install_signal_handlers` installed; :meth:`uninstall` puts things back.

    ``skipped``: the signals left alone because they were ignored (SIG_IGN)
    when installing. Also a context manager that uninstalls on exit.
    """

    off_main_thread = (
        "install_signal_handlers() must be called from the main thread (Python runs signal handlers only there)"
    )

    def __init__(
        self, lock: HandoffLock, signals: Iterable[SignalLike], *, grace: float, release_at_exit: bool
    ) -> None:
        super().__init__(signals)
        self.lock = lock
        self.grace = grace
        self.release_at_exit = release_at_exit
        #: The signals left alone at the last install (ignored then); kept after uninstall.
        self.skipped: tuple[signal.Signals, ...] = ()

    def install(self) -> SignalHandlers:
        super().install()
        self.skipped = tuple(sig for sig in self.wanted if sig not in self.signals)
        if self.release_at_exit:
            atexit.unregister(self._release_at_exit)
            atexit.register(self._release_at_exit)
        return self

    def uninstall(self) -> None:
        """Restore the handlers found when installing (and drop the atexit hook). Idempotent."""
        atexit.unregister(self._release_at_exit)
        super().uninstall()

    def _ask(self, sig: signal.Signals) -> Stands:
        lock = self.lock
        request = lock.request_release("signal", requester=sig.name, deadline=time.time() + self.grace)
        # The request goes with the hold it asked to end (one made between holds stands for the next hold):
        # once that hold is over, released or handed off, the next signal asks the next hold again.
        return lambda: any(standing is request for standing in lock.release_requests)

    def __repr__(self) -> str:
        names = ",".join(s.name for s in self.signals)
        return f"<SignalHandlers {names} grace={self.grace} received={self.received}>"

    def _now(self, sig: signal.Signals, act: Callable[[], None]) -> None:
        if self.lock.is_held:
            try:
                heir = self.lock.release()
            except HandoffLockError as exc:
                _log.warning("second %s: could not release %s: %s", sig.name, self.lock.url, exc)
            else:
                # The signal interrupted the library itself (a status() or release() in this
                # thread): the release runs when that call returns, and the signal acts after it.
                if self.lock.then_after_deferred_release(act):
                    _log.warning(
                        "second %s: releasing %s as soon as the call in progress returns", sig.name, self.lock.url
                    )
                    return
                _log.warning(
                    "second %s: released %s%s", sig.name, self.lock.url, f", handed off to {heir}" if heir else ""
                )
        act()

    def _release_at_exit(self) -> None:
        if os.getpid() != self._pid or not self.lock.is_held:
            return  # a forked child's exit releases nothing: the lock is the parent's
        try:
            heir = self.lock.release()
            _log.info("released %s at exit%s", self.lock.url, f", handed off to {heir}" if heir else "")
        except HandoffLockError as exc:
            _log.warning("could not release %s at exit: %s", self.lock.url, exc)


class _Wraps(Protocol):
    """A lock that drives a :class:`HandoffLock` (an :class:`~handofflock.aio.AsyncHandoffLock`)."""

    @property
    def sync(self) -> HandoffLock: ...


def install_signal_handlers(
    lock: HandoffLock | _Wraps,
    signals: Iterable[SignalLike] = DEFAULT_SIGNALS,
    *,
    grace: float = DEFAULT_GRACE,
    release_at_exit: bool = False,
) -> SignalHandlers:
    """Turn ``signals`` into release requests on ``lock``; return a handle to undo it.

    >>> handlers = install_signal_handlers(lock, grace=25.0, release_at_exit=True)
    >>> for step in lock.steps(range(start, total)):   # stops after SIGTERM
    ...     train(step)

    * First signal: ``lock.request_release("signal", requester="SIGTERM",
      deadline=now + grace)``, then the handler that was installed before
      (if it is a Python function) runs too. Nothing else: no I/O, no lock.
      A request that arrives while ``acquire()`` waits stands once the lock
      is acquired (``steps()`` then yields nothing).
    * Second signal (any of them) while the first one's request stands:
      release the lock now, handing it to the waiter, restore the previous
      handlers, then re-raise: the previous Python handler runs, SIGINT raises
      :class:`KeyboardInterrupt`, and any other signal gets its default action
      (the process ends with it).
    * The first signal's request goes with the hold it asked to end (one that
      arrives between holds stands for the next hold, as one during ``acquire()``
      does). Once that hold is over (released or handed off), the next signal
      is a first one again: a later hold is asked, not ended, whether these
      handlers stayed installed or were installed again. A lost hold answered
      no request: its signals' requests stand for the next hold, and a repeat
      is still the "now".
    * A signal ignored (SIG_IGN) at install time stays ignored.
    * ``release_at_exit=True`` also releases at interpreter exit if the lock (a lock made
      with ``release_at_exit=False`` too; other locks release at exit by themselves)
      is still held (normal exit, ``sys.exit``, an uncaught exception; not a
      kill by a signal's default action, which is why the second signal
      releases first).

    An :class:`~handofflock.aio.AsyncHandoffLock` is taken as the lock it drives (its ``sync``): the "now"
    releases it from the handler, in the event loop's thread, before the signal acts.

    Must be called from the main thread: Python runs signal handlers there.
    """
    if threading.current_thread() is not threading.main_thread():  # said first, whatever else is wrong
        raise ConfigurationError(SignalHandlers.off_main_thread)
    # An AsyncHandoffLock: its release() is a coroutine, which a handler cannot await.
    sync = lock if isinstance(lock, _handoff.HandoffLock) else lock.sync
    if isinstance(grace, bool) or not isinstance(grace, (int, float)) or not grace >= 0 or not math.isfinite(grace):
        raise ConfigurationError(f"grace must be a finite number of seconds >= 0, got {grace!r}")
    handlers = SignalHandlers(sync, signals, grace=float(grace), release_at_exit=bool(release_at_exit))
    if not handlers.wanted:
        raise ConfigurationError("install_signal_handlers() needs at least one signal")
    return handlers.install()


#: The signals a held lock is released on where their action is the default one (``release_on_signal``).
RELEASE_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
#: The locks held (or once held) with ``release_on_signal``: those our handler releases. Replaced whole
#: under ``_arming`` (a tuple), read without it: a signal handler must take no lock.
_armed: tuple[weakref.ref[HandoffLock], ...] = ()
_arming = threading.Lock()


def _held() -> list[HandoffLock]:
    """The locks of :data:`_armed` that are held now, still being released (a release in progress, in the
    thread the signal interrupted or retried in the background, must land before the process ends), or
    waiting in a blocking acquire (its waiter slot given back, or the lock would be handed to a dead process)."""
    from .lock.types import State

    busy = (State.HELD, State.RELEASING, State.WAITING)
    return [lock for ref in _armed if (lock := ref()) is not None and lock._state in busy]


def _forget_in_child() -> None:
    """A forked child's locks are not the parent's (they hold nothing there), and a parent thread may
    have held ``_arming`` at the fork."""
    global _armed, _arming
    _armed, _arming = (), threading.Lock()


def arm(lock: HandoffLock) -> None:
    """``lock`` became held, or waits in a blocking acquire: release it (give its slot back) on
    :data:`RELEASE_SIGNALS` whose action is the default one.

    The handler is installed only from the main thread (Python installs and runs handlers only
    there); a hold begun in another thread is released by it once a hold in the main thread
    installed it. A handler of anyone else's, or SIG_IGN, is left as it is.
    """
    global _armed
    with _arming:
        if not any(ref() is lock for ref in _armed):
            _armed = (*(ref for ref in _armed if ref() is not None), weakref.ref(lock))
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in RELEASE_SIGNALS:
        if signal.getsignal(sig) is signal.SIG_DFL:
            signal.signal(sig, _release_and_reraise)


def settle() -> None:
    """Put the default action back on the signals we handle, once no lock of ours is held (main thread only;
    elsewhere our handler stays until the next call here, acting as the default action would)."""
    if threading.current_thread() is not threading.main_thread() or _held():
        return
    for sig in RELEASE_SIGNALS:
        if signal.getsignal(sig) is _release_and_reraise:
            signal.signal(sig, signal.SIG_DFL)


def _release_and_reraise(signum: int, frame: FrameType | None) -> None:
    """Release every held lock of ours, then let the signal take its default action (the process ends with it).

    Called by a handler installed over ours (chained to as "the previous handler"), it does
    nothing: that handler decides what the signal means (a release request, a framework's stop).
    A release that lands in the middle of the lock's own operation in this thread is deferred to
    that operation's end, and the signal raised again only after it.
    """
    sig = signal.Signals(signum)
    if signal.getsignal(sig) is _release_and_reraise:
        _release_then_default(sig, frame)


def _release_then_default(sig: signal.Signals, frame: FrameType | None) -> None:
    """What our handler does for ``sig``: release every held lock of ours, then the default action."""
    signal.signal(sig, signal.SIG_DFL)  # the action we replaced: a repeat of the signal now ends the process
    deferred: list[HandoffLock] = []

    def after(lock: HandoffLock) -> None:
        deferred.remove(lock)
        if not deferred:
            act_as_before(sig, frame, signal.SIG_DFL)

    for lock in [lock for lock in _held() if lock.release_on_signal]:
        try:
            heir = lock.release()
        except Exception as exc:  # whatever happens, the signal acts: the process was to end
            _log.warning("%s: could not release %s: %s", sig.name, lock.url, exc)
            continue
        if lock.then_after_deferred_release(functools.partial(after, lock)):
            deferred.append(lock)
            _log.info("%s: releasing %s as soon as the call in progress returns", sig.name, lock.url)
        else:
            _log.info("%s: released %s%s", sig.name, lock.url, f", handed off to {heir}" if heir else "")
    if not deferred:
        act_as_before(sig, frame, signal.SIG_DFL)


def _order(handler: Handler) -> int:
    """When a remembered signal acts: one that ends the process (SIG_DFL, ours that releases first) before a
    Python handler, which may return or raise, and SIGINT's ``KeyboardInterrupt``, the one most often caught, last."""
    if handler is signal.default_int_handler:
        return 2
    return 1 if is_python_handler(handler) and handler is not _release_and_reraise else 0


def _act_all(actions: list[tuple[signal.Signals, Handler]], frame: FrameType | None) -> None:
    """Each signal does what it did before us, in order; one that raises does not keep the rest from acting."""
    if actions:
        try:
            act_as_before(actions[0][0], frame, actions[0][1])
        finally:
            _act_all(actions[1:], frame)


def take_over(signals: Iterable[SignalT], handler: Handler, previous: dict[SignalT, Handler]) -> tuple[SignalT, ...]:
    """Install ``handler`` for each of ``signals``, keeping the handler it replaces in ``previous``.

    A signal found ignored (SIG_IGN) is left so: whoever started us asked for that
    (nohup, ``cmd &`` in a script). Returns the signals now handled by ``handler``.
    """
    installed = []
    for sig in signals:
        found = signal.getsignal(sig)
        if found is signal.SIG_IGN:
            continue
        if found != handler:
            previous[sig] = found
            signal.signal(sig, handler)
        installed.append(sig)
    return tuple(installed)


def restore(previous: dict[SignalT, Handler]) -> None:
    """Put back the handlers :func:`take_over` kept in ``previous`` (one installed from C reads back as
    None and cannot be restored: the default action instead)."""
    for sig, handler in previous.items():
        signal.signal(sig, signal.SIG_DFL if handler is None else handler)


def is_python_handler(handler: Handler) -> TypeGuard[Callable[[int, FrameType | None], Any]]:
    """A function to call: not SIG_DFL/SIG_IGN, not None (C-level), not SIGINT's default."""
    return callable(handler) and handler is not signal.default_int_handler


def act_as_before(sig: signal.Signals, frame: FrameType | None, previous: Handler) -> None:
    """Do what ``sig`` would have done had no handler of ours been installed (``previous`` was there before)."""
    if previous is signal.default_int_handler:
        raise KeyboardInterrupt
    if previous is _release_and_reraise:  # ours, found at install: it releases, then the default action
        _release_then_default(sig, frame)
        return
    if is_python_handler(previous):
        previous(sig, frame)
        return
    if previous is signal.SIG_IGN:
        return
    # SIG_DFL (or a C-level handler we could not keep): the default action, for real.
    signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)
    if os.getpid() == 1:
        # The kernel ignores a signal whose action is SIG_DFL for PID 1 (a container's
        # entrypoint): the kill above did nothing. End the process as the signal would have.
        os._exit(128 + int(sig))


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)

# The lock arms and settles the release-on-signal handler through these hooks (the lock's layer is
# below this module's, so it does not import it).
_handoff.on_hold, _handoff.on_unhold = arm, settle
