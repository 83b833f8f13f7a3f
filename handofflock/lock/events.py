"""The lock's blinker signals, in a private namespace.

Connect with ``sender=lock`` to hear about one lock, or without a sender to hear
about all of them. Receivers run on the thread that noticed the event (usually
the background scheduler); one that raises is logged and the others still run.

Receivers are kept **strongly** by default (``weak=False``), unlike a plain
blinker signal: a lambda or a closure (the usual way to bind a trainer's state)
stays connected after the line that connected it, instead of vanishing
silently at the next garbage collection. Disconnect it when done, or pass
``weak=True`` for blinker's behaviour. A receiver connected with
``sender=lock`` is kept by that lock and goes when the lock goes. Take the
lock from the ``sender`` argument rather than closing over it: a receiver
that closes over its lock makes a cycle that only the cycle collector frees
(the lock, dropped while held, is released then, not at once).

==========================  ====================================================
``on_release_requested``    someone wants the lock: ``request`` (a
                            :class:`~handofflock.ReleaseRequest`), and its fields
                            ``requester``, ``reason`` (a
                            :class:`~handofflock.RequestReason`: waiter, signal,
                            preemption, operator) and ``deadline`` (Unix time or
                            None). ``waiter_id`` is a deprecated alias of
                            ``requester``.
``on_release_withdrawn``    a waiter's request went away before the handoff (the
                            waiter left, or its slot expired): ``request`` (the
                            :class:`~handofflock.ReleaseRequest` sent with
                            ``on_release_requested``), ``requester``, ``reason``
                            (always waiter); ``release_requested`` is False
                            again unless another request stands
``on_renewal_error``        the lock can no longer be kept: ``error`` (an
                            exception; :class:`~handofflock.LockLost` when lost)
``waiting``                 we became the single waiter: ``owner_id`` (who holds it),
                            ``waiter_expires_at``
``acquired``                ``token``, ``handoff`` (True when handed to us)
``released``                ``handed_off_to`` (waiter id or None), ``token``
``lost``                    ``reason`` (text), ``error``
==========================  ====================================================

>>> from handofflock import signals
>>> @signals.on_release_requested.connect_via(lock)
... def checkpoint_soon(sender, request, **kw):
...     print(f"{request.requester} ({request.reason}) wants the lock by {request.deadline}")
"""

from __future__ import annotations

import inspect
import logging
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from blinker import ANY, NamedSignal, Signal

from .logfields import LockLog

if TYPE_CHECKING:
    from ..core.clock import Clock
    from ..core.record import LockRecord

F = TypeVar("F", bound=Callable[..., Any])


class StrongSignal(NamedSignal):
    """A blinker signal whose :meth:`connect` keeps receivers strongly unless told ``weak=True``.

    Blinker keeps receivers weakly by default, so ``connect(lambda ...)`` or a
    closure is disconnected as soon as nothing else refers to it, without a
    word; an ``on_renewal_error`` receiver lost that way leaves a job working
    after its lock is gone. ``connect_via`` already defaults to strong.

    A receiver connected for one sender (``sender=lock``) is kept by that sender, not by the
    signal: it goes when the lock goes. One that closes over its lock makes a cycle (the lock
    keeps the receiver, the receiver the lock), which the cycle collector frees; the lock is
    then released as any lock whose last reference went.
    """

    def connect(self, receiver: F, sender: Any = ANY, weak: bool = False) -> F:
        kept = None if weak or sender is ANY else _kept_by(sender)
        if kept is None:
            return super().connect(receiver, sender, weak)
        kept.append(receiver)
        # Weakly here, unless it is already connected strongly (for any sender): the sender keeps it.
        strong = receiver in self.receivers.values()
        return super().connect(receiver, sender, weak=not strong)

    def disconnect(self, receiver: Callable[..., Any], sender: Any = ANY) -> None:
        super().disconnect(receiver, sender)
        kept = None if sender is ANY else _kept_by(sender)
        if kept is not None and receiver in kept:
            kept.remove(receiver)


def _kept_by(sender: Any) -> list[Callable[..., Any]] | None:
    """The receivers ``sender`` keeps alive (a list in its ``__dict__``); None for a sender that cannot
    keep them (no ``__dict__``, or no weak reference to tell blinker when it goes)."""
    try:
        weakref.ref(sender)
        found: list[Callable[..., Any]] = vars(sender).setdefault(_KEPT, [])
    except TypeError:
        return None
    return found


#: The attribute of a sender holding the receivers connected for it alone.
_KEPT = "_handofflock_receivers"


on_release_requested: Signal = StrongSignal(
    "on_release_requested", doc="A waiter, signal or preemption asks for the lock."
)
on_release_withdrawn: Signal = StrongSignal(
    "on_release_withdrawn", doc="A waiter's release request went away: the waiter left or its slot expired."
)
on_renewal_error: Signal = StrongSignal("on_renewal_error", doc="Renewal failed for good; the lock is unhealthy.")
waiting: Signal = StrongSignal("waiting", doc="We registered as the single waiter.")
acquired: Signal = StrongSignal("acquired", doc="The lock was acquired (or handed to us).")
released: Signal = StrongSignal("released", doc="The lock was released (handed off or freed).")
lost: Signal = StrongSignal("lost", doc="The lock is no longer safely held.")

_log = logging.getLogger("handofflock.lock.events")

#: Who awaits a coroutine-function receiver (``async def``) for a given sender: ``runner(receiver,
#: sender, kwargs)``, which returns once it has been awaited. :mod:`handofflock.aio` registers one
#: per lock it wraps, awaiting on that lock's event loop. Calling such a receiver here would only
#: make a coroutine nobody awaits, so for other senders it is skipped, with a warning.
async_runners: weakref.WeakKeyDictionary[Any, Callable[[Callable[..., Any], Any, dict[str, Any]], None]] = (
    weakref.WeakKeyDictionary()
)


class Observer:
    """Watches a lock's own paths inline: acquire, the renewal, the waiter check. The default does nothing.

    Unlike a receiver it runs on the path that keeps the lock, so it must be quick and never raise;
    :mod:`handofflock.metrics` installs one when the OpenTelemetry API is installed.
    """

    def timed_acquire(self, lock: Any, clock: Clock, acquire: Callable[[], bool]) -> bool:
        """Run ``acquire`` and return or raise exactly what it did."""
        return acquire()

    def renewed(self, lock: Any, latency: float) -> None:
        """A renewal landed, ``latency`` seconds after its write was sent."""

    def renewal_failed(self, lock: Any, error: BaseException) -> None:
        """A renewal attempt failed (transient: retried; otherwise the lock is lost)."""

    def waiter_noticed(self, lock: Any, record: LockRecord, now: float) -> None:
        """The owner saw a new waiter in ``record`` at wall time ``now``."""

    def renewal_started(self, scheduler: str, lateness: float, share: float) -> None:
        """The scheduler named ``scheduler`` started a renewal ``lateness`` seconds after it fell due:
        ``share`` of its margin (0 on time, 1 when its lease ran out first)."""


#: The observer of every lock of the process.
observer = Observer()


def _log_for(sender: Any) -> Any:
    """The events logger, speaking for ``sender`` when it is a lock (its records carry the lock's fields)."""
    return LockLog(_log.name, sender) if all(hasattr(sender, a) for a in ("url", "owner_id", "token")) else _log


def send(signal: Signal, sender: Any, **kwargs: Any) -> None:
    """Send ``signal``; a receiver that raises is logged (with the lock's fields) and the rest still run."""
    if signal.receivers:
        send_to(list(signal.receivers_for(sender)), signal, sender, kwargs)


def send_to(receivers: list[Callable[..., Any]], signal: Signal, sender: Any, kwargs: dict[str, Any]) -> None:
    """Call ``receivers`` with ``signal``'s ``kwargs`` as :func:`send` calls the signal's receivers: an ``async
    def`` one is awaited by the runner of ``sender`` in :data:`async_runners`; one that raises is logged."""
    for receiver in receivers:
        try:
            if inspect.iscoroutinefunction(receiver):
                runner = async_runners.get(sender)
                if runner is None:
                    _log_for(sender).warning(
                        "async receiver %r of handofflock signal %r skipped: only an AsyncHandoffLock "
                        "awaits async receivers",
                        receiver,
                        getattr(signal, "name", signal),
                    )
                    continue
                runner(receiver, sender, kwargs)
            else:
                receiver(sender, **kwargs)
        except Exception:
            _log_for(sender).exception(
                "receiver %r of handofflock signal %r raised; carrying on", receiver, getattr(signal, "name", signal)
            )
