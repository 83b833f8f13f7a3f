"""Metrics through the OpenTelemetry API: the optional extra ``handofflock[otel]``.

Without ``opentelemetry-api`` installed nothing here is hooked to the lock. With
it installed, the instruments come from the global meter provider: a no-op until
the application configures one (``opentelemetry.metrics.set_meter_provider``),
which is the OpenTelemetry convention for libraries. :func:`use_meter_provider` binds them to a given
provider instead (tests, or an application that keeps its provider local).

| instrument | kind | unit | what |
|---|---|---|---|
| ``handofflock.locks.held`` | gauge | 1 | locks this process holds now, per lock |
| ``handofflock.acquire.duration`` | histogram | s | how long ``acquire()`` took, by ``outcome`` |
| ``handofflock.acquisitions`` | counter | 1 | locks taken, ``handoff`` True when handed over |
| ``handofflock.renewals`` | counter | 1 | successful renewals |
| ``handofflock.renewal.duration`` | histogram | s | a successful renewal's write, send to reply |
| ``handofflock.renewal.errors`` | counter | 1 | failed renewal attempts, by ``error.type`` |
| ``handofflock.handoffs`` | counter | 1 | locks handed to a waiter by their release |
| ``handofflock.notice.latency`` | histogram | s | waiter's registration to the owner seeing it |
| ``handofflock.losses`` | counter | 1 | locks lost while held |
| ``handofflock.renewal.lateness`` | histogram | 1 | how late a renewal started, as a share of its margin |

Every point carries ``lock.url``, but the renewal lateness: a process's scheduler serves all its locks, so
its points carry ``handofflock.scheduler`` (the scheduler's name; ``handofflock`` for the process-wide one).
``outcome`` is ``acquired``, ``not_acquired``
(a non-blocking try), ``timeout``, ``contended``, ``cancelled`` or ``error``.

The notice latency is measured on the owner's clock, from the start of the
waiter's slot (its ``waiterExpiresAt`` minus its ``waiterTtl``) to the check
that saw it: the waiter's registration, or its latest refresh if the owner
first saw the slot after a refresh. Clock skew between the two hosts is in it;
a negative value (the waiter's clock ahead) counts as 0.

The hooks are the locks' :class:`~handofflock.lock.events.Observer` and receivers of their
``acquired``, ``released`` and ``lost`` signals, connected as this module is imported (importing
:mod:`handofflock` imports it). They run on the lock's own paths (acquire, the renewal, the
waiter check). A meter provider is a plug-in point that may fail (a full exporter
queue, a bad configuration): an instrument that raises is logged on
``handofflock.lock.metrics`` (with its traceback the first time per hook, at
DEBUG after that) and never reaches the lock. ``timed_acquire`` returns or
raises exactly what the acquire did.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from ._version import __version__
from .core.errors import AcquireCancelled, LockContended, LockTimeout
from .lock import events
from .lock.logfields import Described, LockLog

if TYPE_CHECKING:
    from .core.clock import Clock
    from .core.record import LockRecord


class Measured(Described, Protocol):
    """What the hooks read of a lock (a :class:`~handofflock.lock.handoff.HandoffLock`)."""

    @property
    def is_held(self) -> bool: ...

    @property
    def waiter_ttl(self) -> float: ...


T = TypeVar("T")

_log = logging.getLogger("handofflock.lock.metrics")  # the name docs/observability.md lists

try:
    from opentelemetry import metrics as _otel
except ImportError:  # the extra is not installed: every hook is a no-op
    _otel = None  # type: ignore[assignment]

#: The instrumentation scope's name, as a meter provider's views and exporters see it.
METER_NAME = "handofflock"

# Durations are seconds; the default buckets (0..10000) suit none of these.
_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
# Shares of a renewal's margin: 0.5 is where the scheduler warns, 1 where the lease ran out first.
_SHARES = (0.05, 0.1, 0.25, 0.5, 0.75, 1.0)


class _Instruments:
    """The instruments, made from one meter."""

    def __init__(self, meter: Any) -> None:
        def histogram(name: str, description: str, unit: str = "s", buckets: tuple[float, ...] = _SECONDS) -> Any:
            try:
                return meter.create_histogram(
                    name, unit=unit, description=description, explicit_bucket_boundaries_advisory=buckets
                )
            except TypeError:  # opentelemetry-api before 1.23 has no advisory buckets
                return meter.create_histogram(name, unit=unit, description=description)

        self.acquire_duration = histogram("handofflock.acquire.duration", "How long acquire() took, by outcome")
        self.acquisitions = meter.create_counter("handofflock.acquisitions", unit="1", description="Locks taken")
        self.renewals = meter.create_counter("handofflock.renewals", unit="1", description="Successful renewals")
        self.renewal_duration = histogram("handofflock.renewal.duration", "A successful renewal's write")
        self.renewal_errors = meter.create_counter(
            "handofflock.renewal.errors", unit="1", description="Failed renewal attempts"
        )
        self.handoffs = meter.create_counter("handofflock.handoffs", unit="1", description="Locks handed to a waiter")
        self.notice_latency = histogram(
            "handofflock.notice.latency", "From a waiter's registration to the owner seeing it"
        )
        self.losses = meter.create_counter("handofflock.losses", unit="1", description="Locks lost while held")
        self.renewal_lateness = histogram(
            "handofflock.renewal.lateness", "How late a renewal started, as a share of its margin", "1", _SHARES
        )
        self.held = meter.create_observable_gauge(
            "handofflock.locks.held", callbacks=[_observe_held], unit="1", description="Locks this process holds"
        )


_instruments: _Instruments | None = None
#: Locks that were held at some point, for the ``locks.held`` gauge (weak: a dropped lock is no series).
_locks: weakref.WeakSet[Measured] = weakref.WeakSet()
#: The hooks whose instruments raised since the instruments were made (each logged in full once).
_failed: set[str] = set()


def enabled() -> bool:
    """Whether the OpenTelemetry API is installed (metrics may flow once a provider is configured)."""
    return _instruments is not None


def use_meter_provider(provider: Any = None) -> None:
    """Make the instruments from ``provider``; ``None`` goes back to the global meter provider.

    Needs the ``otel`` extra. Locks already created report to the new instruments too.
    """
    global _instruments
    if _otel is None:
        from .core.errors import ConfigurationError

        raise ConfigurationError("metrics need the OpenTelemetry API: pip install 'handofflock[otel]'")
    meter = (_otel.get_meter if provider is None else provider.get_meter)(METER_NAME, __version__)
    _instruments = _Instruments(meter)
    _failed.clear()  # new instruments: their first failure is worth a traceback again


def _record(hook: str, lock: Measured, measure: Callable[[_Instruments, dict[str, Any]], object]) -> None:
    """Apply ``measure`` to the instruments, with the lock's attributes; an instrument that raises is logged,
    never raised into the lock.

    With its traceback the first time per hook, at DEBUG after that: a broken
    exporter fails on every renewal, and the log must not drown in it.
    """
    instruments = _instruments
    if instruments is None:
        return
    try:
        measure(instruments, {"lock.url": lock.url})
    except Exception:
        # The lock's fields on the record, as on every record of a lock.
        _hook_failed(
            LockLog(_log.name, lock), hook, "the lock goes on (later failures of this hook are logged at DEBUG)"
        )


def _hook_failed(log: Any, hook: str, goes_on: str) -> None:
    """Log the exception being handled: with its traceback the first time per hook, at DEBUG after that."""
    if hook in _failed:
        log.debug("metrics hook %s raised again; ignored", hook, exc_info=True)
        return
    _failed.add(hook)
    log.error("metrics hook %s raised; ignored, %s", hook, goes_on, exc_info=True)


def _observe_held(options: Any) -> Iterable[Any]:
    held: dict[str, int] = {}
    for lock in list(_locks):
        held[lock.url] = held.get(lock.url, 0) + (1 if lock.is_held else 0)
    return [_otel.Observation(count, {"lock.url": url}) for url, count in held.items()]


class _Metrics(events.Observer):
    """The hooks the lock calls on its own paths: each records on the instruments, and never raises."""

    def timed_acquire(self, lock: Measured, clock: Clock, acquire: Callable[[], bool]) -> bool:
        """Run ``acquire`` and record how long it took (on ``clock``) and how it ended.

        Returns or raises exactly what ``acquire`` did: a lock taken is never
        reported as an error because its measurement failed (``with lock:`` would
        then never release it).
        """
        if _instruments is None:
            return acquire()
        started = clock.monotonic()
        outcome = "error"
        try:
            got = acquire()
            outcome = "acquired" if got else "not_acquired"
            return got
        except LockTimeout:
            outcome = "timeout"
            raise
        except LockContended:
            outcome = "contended"
            raise
        except (AcquireCancelled, KeyboardInterrupt):
            outcome = "cancelled"
            raise
        finally:  # a measurement that raised here would replace the acquire's own result: _record logs it
            _record(
                "timed_acquire",
                lock,
                lambda m, attrs: m.acquire_duration.record(
                    max(0.0, clock.monotonic() - started), {**attrs, "outcome": outcome}
                ),
            )

    def renewed(self, lock: Measured, latency: float) -> None:
        """A renewal landed, ``latency`` seconds after its write was sent."""

        def measure(m: _Instruments, attrs: dict[str, Any]) -> None:
            m.renewals.add(1, attrs)
            m.renewal_duration.record(max(0.0, latency), attrs)

        _record("renewed", lock, measure)

    def renewal_failed(self, lock: Measured, error: BaseException) -> None:
        """A renewal attempt failed (transient: retried; otherwise the lock is lost).

        Never raises: raised into the renewal, it would keep the renewal due, a busy loop against a failing store.
        """
        _record(
            "renewal_failed",
            lock,
            lambda m, attrs: m.renewal_errors.add(1, {**attrs, "error.type": type(error).__name__}),
        )

    def waiter_noticed(self, lock: Measured, record: LockRecord, now: float) -> None:
        """The owner saw a new waiter in ``record`` at wall time ``now``: how long after the slot began.

        Never raises: raised into the request book, it would hide the waiter from the owner for good.
        """
        waiter = record.waiter
        if waiter is not None:
            registered = waiter.expires_at - (waiter.ttl or lock.waiter_ttl)
            _record("waiter_noticed", lock, lambda m, attrs: m.notice_latency.record(max(0.0, now - registered), attrs))

    def renewal_started(self, scheduler: str, lateness: float, share: float) -> None:
        """A scheduler started a renewal ``share`` of its margin late. Never raises: it runs on a scheduler worker."""
        instruments = _instruments
        if instruments is None:
            return
        try:
            instruments.renewal_lateness.record(share, {"handofflock.scheduler": scheduler})
        except Exception:  # as _record does, for a point of no lock's
            _hook_failed(_log, "renewal_started", "the scheduler goes on (later failures are logged at DEBUG)")


# ---------------------------------------------------------------------- from the lock's signals


def _on_acquired(sender: Any, *, handoff: bool = False, **_: Any) -> None:
    _locks.add(sender)
    _record("acquired", sender, lambda m, attrs: m.acquisitions.add(1, {**attrs, "handoff": bool(handoff)}))


def _on_released(sender: Any, *, handed_off_to: str | None = None, **_: Any) -> None:
    if handed_off_to is not None:
        _record("released", sender, lambda m, attrs: m.handoffs.add(1, attrs))


def _on_lost(sender: Any, **_: Any) -> None:
    _record("lost", sender, lambda m, attrs: m.losses.add(1, attrs))


if _otel is not None:
    use_meter_provider(None)
    events.acquired.connect(_on_acquired, weak=False)
    events.released.connect(_on_released, weak=False)
    events.lost.connect(_on_lost, weak=False)
    events.observer = _Metrics()
