"""SIGTERM, SIGINT and SIGUSR1 on every rank of a job, as an agreed exit: :class:`RankSignals`.

``rank_lock`` installs these on every rank (torchrun sends each worker the
signal it got; Slurm's ``scancel`` and a Kubernetes eviction reach every
process). A signal only records ``ranks.request_stop("exit", cause=NAME)``: at
the next agreement every rank stops after the same step with the decision
``exit`` and that cause, checkpoints, releases (the holder hands the lock off)
and exits with ``decision.exit_status`` (128 + the signal's number). torchrun
sends SIGKILL 30 s after SIGTERM: ``every`` steps plus the checkpoint must fit.

* A repeat within :data:`REPEAT_WINDOW` seconds of the first is the same
  request arriving twice (``scancel`` signals every process of the step and
  torchrun forwards its own copy; a terminal's Ctrl-C reaches torchrun and its
  workers), not a second one.
* A later second signal means "now": the holder releases the lock at once
  (no meeting: the other ranks may be gone), the handlers found at install
  come back, and the signal does what it would have done without us.
* ``chain`` names the signals whose earlier Python handler also runs at the
  first signal: by default SIGUSR1, so Lightning's Slurm auto-requeue (or
  your own handler) still runs; SIGTERM's and SIGINT's earlier handlers run
  only on the second signal, since the stop is ours to carry out (Lightning's
  SIGTERM handler, say, would raise ``SIGTERMException`` on some ranks before
  the checkpoint).
* A signal ignored (SIG_IGN) at install time stays ignored; a forked child
  (a DataLoader worker) gets the signal's own behaviour, not ours.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Iterable
from types import FrameType

from ..core.errors import ConfigurationError
from ..os_signals import Handler, SignalLike, act_as_before, is_python_handler, parse_signal, take_over
from .ranks import RankLock

_log = logging.getLogger("handofflock.ranks")

#: What ``rank_lock`` handles by default.
DEFAULT_RANK_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
#: Seconds within which a repeated signal counts as the same request.
REPEAT_WINDOW = 1.0


class RankSignals:
    """Signal handlers that turn signals into an agreed exit of all ranks; :meth:`uninstall` puts things back.

    ``received``: names of the signals received so far, in order.
    """

    def __init__(
        self,
        ranks: RankLock,
        signals: Iterable[SignalLike] = DEFAULT_RANK_SIGNALS,
        *,
        chain: Iterable[SignalLike] = (signal.SIGUSR1,),
    ) -> None:
        self.ranks = ranks
        self.wanted = tuple(dict.fromkeys(parse_signal(s) for s in signals))
        self.chain = frozenset(parse_signal(s) for s in chain)
        for sig in self.wanted:
            if sig in (signal.SIGKILL, signal.SIGSTOP):
                raise ConfigurationError(f"{sig.name} cannot be caught")
        self.received: list[str] = []
        self.signals: tuple[signal.Signals, ...] = ()
        self._previous: dict[signal.Signals, Handler] = {}
        self._first_at: float | None = None
        self._pid = os.getpid()

    def install(self) -> RankSignals:
        """Install on this process's main thread (Python runs handlers only there).

        Idempotent; called again, it takes back any signal whose handler was replaced
        since (a framework installed its own), chaining to or restoring that one.
        """
        if threading.current_thread() is not threading.main_thread():
            raise ConfigurationError("RankSignals.install() must be called from the main thread")
        self.signals = take_over(self.wanted, self._handle, self._previous)
        return self

    def uninstall(self) -> None:
        """Put back the handlers found at install (a handler replaced after ours is left to its owner)."""
        for sig in self.signals:
            if signal.getsignal(sig) == self._handle:
                previous = self._previous.get(sig)
                signal.signal(sig, signal.SIG_DFL if previous is None else previous)
        self.signals, self._previous = (), {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        sig = signal.Signals(signum)
        previous = self._previous.get(sig)
        if os.getpid() != self._pid:  # a forked child inherited the handler, not the job
            act_as_before(sig, frame, previous)
            return
        now = time.monotonic()
        self.received.append(sig.name)
        if self._first_at is None or now - self._first_at < REPEAT_WINDOW:
            if self._first_at is None:
                self._first_at = now
                # Attributes only: no I/O, no collective, whatever the main thread was doing.
                self.ranks.request_stop("exit", cause=sig.name)
                if sig in self.chain and is_python_handler(previous):
                    previous(signum, frame)
            return
        # A second signal: now. No meeting; the holder lets the lock go, then the signal acts.
        self.uninstall()
        self.ranks.abandon()
        _log.warning("rank %s: second signal (%s): released without a checkpoint", self.ranks.rank, sig.name)
        act_as_before(sig, frame, previous)

    def __repr__(self) -> str:
        return f"<RankSignals {','.join(s.name for s in self.signals)} received={self.received}>"
