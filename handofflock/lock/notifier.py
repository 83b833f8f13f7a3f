"""The notifier: a lock's signals, queued by the thread that noticed the event and sent by another.

The renewal path never runs user code. A transition (a waiter seen, a loss,
a release retried in the background) queues what happened here, and
:meth:`Notifier.notify` has it sent by this lock's notifier thread, started
only while there is something to send (a daemon: interpreter exit never
waits for a receiver). A receiver that blocks (a checkpoint in an
``on_release_requested`` receiver is the point of it) delays only the later
signals of the same lock, never a renewal or a waiter check of any lock.

Its mutex and its thread come from the lock's
:class:`~handofflock.lock.primitives.Primitives`, so a simulation runs the
notifier as one of its own tasks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..core.threads import take_signals_again
from . import events as signals
from .logfields import Described, LockLog
from .primitives import Primitives


class Notifier:
    """Queues a lock's signals and sends them, in the order queued, off the thread that queued them.

    It keeps no reference to its lock (a lock whose last reference goes is released at once, not
    when the cycle collector runs): the lock names itself as the signals' sender each time it has
    them sent (:meth:`notify`, :meth:`flush`), and the notifier thread holds it only while sending.
    ``inline(sender)`` says whether to send in the caller's thread instead: a scheduler run by hand
    (tests, simulations) wants runs to be deterministic.
    """

    def __init__(self, primitives: Primitives, *, inline: Callable[[Any], bool], name: str) -> None:
        self._queue: list[tuple[Any, dict[str, Any]]] = []
        self._mutex = primitives.mutex()
        self._start_thread = primitives.start_thread
        self._running = False
        self._inline, self._name = inline, name

    def event(self, signal: Any, **kwargs: Any) -> None:
        """Queue ``signal`` with ``kwargs`` (only an append: a signal handler may queue)."""
        self._queue.append((signal, kwargs))

    @property
    def unsent(self) -> bool:
        """Something is queued and no notifier thread is on its way to send it."""
        return bool(self._queue) and not self._running

    def notify(self, sender: Described) -> None:
        """Have the queued signals sent by ``sender``'s notifier thread, never by the thread that renews."""
        if not self._queue:
            return
        if self._inline(sender):
            self.flush(sender)  # a scheduler run by hand (tests, simulations): deterministic, in its caller
            return
        with self._mutex:
            if self._running:
                return
            self._running = True
        try:
            self._start_thread(lambda: self._main(sender), self._name)
        except BaseException:
            self._running = False
            raise

    def _main(self, sender: Described) -> None:
        take_signals_again()  # receivers are user code: what they start must be stoppable (core/threads.py)
        while True:
            try:
                self.flush(sender)
            except Exception:  # signals.send already isolates receivers; this is a last resort
                LockLog("handofflock.renew", sender).exception("sending the signals of %s failed", sender.url)
            with self._mutex:
                if not self._queue:
                    self._running = False
                    return

    def flush(self, sender: Described) -> None:
        """Send queued signals of ``sender`` in this thread. Called with no lock held: receivers may call back in."""
        while True:
            try:  # two threads may flush at once (a release and the notifier): pop, never test then pop
                signal, kwargs = self._queue.pop(0)
            except IndexError:
                return
            signals.send(signal, sender, **kwargs)
