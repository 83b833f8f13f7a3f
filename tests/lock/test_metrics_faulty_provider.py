"""A meter provider whose instruments raise costs log lines, never the lock.

The OpenTelemetry API is a plug-in point: a misbehaving or misconfigured
provider (a full exporter queue, a bad view) may raise from ``add`` or
``record``. The hooks in ``handofflock.lock.metrics`` run on the lock's own
paths (acquire, the renewal, the waiter check), so each catches what its
instruments raise and logs it on ``handofflock.lock.metrics``: with its
traceback the first time per hook, at DEBUG after that.

Regression tests from an adversarial review: before the fix a raising
histogram hid a waiter from the holder for good, a raising error counter
turned renewal retries into a busy loop, and a raising acquire histogram
turned a successful acquire into an exception (``with lock:`` then never
released the lock).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid

import pytest
from lockutil import eventually, make_lock

from handofflock import HandoffLock
from handofflock.core.errors import AcquireCancelled, LockTimeout, TransientStorageError
from handofflock.lock import metrics
from handofflock.storage import MemoryStorage

pytestmark = pytest.mark.timeout(60)

METRICS_LOG = "handofflock.lock.metrics"


class _Instrument:
    """An instrument that raises from ``add``/``record`` when its name is in ``raising`` (``"*"``: all)."""

    def __init__(self, name: str, raising: set[str]) -> None:
        self.name = name
        self.raising = raising

    def _maybe_raise(self) -> None:
        if self.name in self.raising or "*" in self.raising:
            raise RuntimeError(f"exporter queue full ({self.name})")

    def add(self, *a, **k):
        self._maybe_raise()

    def record(self, *a, **k):
        self._maybe_raise()


class _Meter:
    def __init__(self, raising: set[str]) -> None:
        self.raising = raising

    def create_histogram(self, name, **kw):
        return _Instrument(name, self.raising)

    def create_counter(self, name, **kw):
        return _Instrument(name, self.raising)

    def create_observable_gauge(self, name, **kw):
        return _Instrument(name, self.raising)


class _RaisingProvider:
    """A meter provider whose named instruments raise."""

    def __init__(self, *raising: str) -> None:
        self.raising = set(raising)

    def get_meter(self, *a, **k):
        return _Meter(self.raising)


@pytest.fixture
def raising():
    """``raising("name", ...)``: bind the instruments to a provider whose named instruments raise."""

    def bind(*names: str) -> None:
        metrics.use_meter_provider(_RaisingProvider(*names))

    yield bind
    metrics.use_meter_provider(None)


@pytest.fixture
def name():
    name = f"hooks-{uuid.uuid4().hex[:8]}"
    yield name
    MemoryStorage.forget(name)


def metrics_errors(caplog) -> list[str]:
    """The hooks named by the ERROR records of the metrics logger, in order."""
    return [r.args[0] for r in caplog.records if r.name == METRICS_LOG and r.levelno == logging.ERROR]


def _acquire_in_thread(lock: HandoffLock, timeout: float) -> threading.Thread:
    def run() -> None:
        try:
            lock.acquire(timeout=timeout)
        except (AcquireCancelled, LockTimeout):
            pass  # the test cancels it, or gives up

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_a_raising_notice_histogram_never_hides_the_waiter_from_the_holder(raising, name, caplog):
    caplog.set_level(logging.DEBUG, logger=METRICS_LOG)
    raising("handofflock.notice.latency")
    url = f"memory://{name}/locks/l.json"
    owner, waiter = make_lock(url), make_lock(url)
    t = None
    try:
        assert owner.acquire()
        t = _acquire_in_thread(waiter, timeout=15)
        eventually(
            # private: "waiting" (an acquire runs) has no public flag
            lambda: waiter._state == "waiting" and owner.status().waiter_id == waiter.owner_id,
            what="the waiter registered",
        )
        # waiter checks run every 0.1 s: 3 s is 30 of them
        eventually(lambda: owner.release_requested, timeout=3.0, what="the owner hears of the waiter")
        assert owner.release_request.requester == waiter.owner_id
        assert metrics_errors(caplog) == ["waiter_noticed"]
        error = next(r for r in caplog.records if r.name == METRICS_LOG and r.levelno == logging.ERROR)
        assert error.exc_info and "exporter queue full" in str(error.exc_info[1])
        assert error.lock_url == url  # the lock's fields, as every handofflock logger has
    finally:
        waiter.cancel()
        if t is not None:
            t.join(20)
        if owner.is_held:
            owner.release()
        owner._unschedule()  # private: stop its renewals without releasing
        waiter._unschedule()  # private: stop its renewals without releasing


class _FailingWrites:
    """The memory store, except that writes fail transiently (a 503) while ``failing`` is set."""

    def __init__(self, inner):
        self.inner, self.url = inner, inner.url
        self.failing = False
        self.failed_writes = 0

    def __getattr__(self, attr):
        return getattr(self.inner, attr)

    def write(self, key, data, **kw):
        if self.failing:
            self.failed_writes += 1
            raise TransientStorageError("503 (injected)", key=key, ambiguous=False)
        return self.inner.write(key, data, **kw)


def test_a_raising_error_counter_leaves_renewal_retries_spaced_by_their_backoff(raising, name, caplog):
    """Raised into the renewal, the hook kept the renewal due: the scheduler retried at once, thousands of
    times a second, against a store that was already failing."""
    caplog.set_level(logging.DEBUG, logger=METRICS_LOG)
    raising("handofflock.renewal.errors")
    store = _FailingWrites(MemoryStorage.named(name))
    lock = HandoffLock(
        "unused", storage=store, key="l.json", ttl=6.0, renew_interval=0.5, renew_deadline=3.0
    )
    try:
        assert lock.acquire()
        store.failing = True
        time.sleep(2.0)  # within the renew deadline: retries spaced by the backoff (at most renew_interval)
        attempts = store.failed_writes
        assert 1 <= attempts <= 40, f"{attempts} renewal writes in 2 s against a failing store (backoff sends ~10)"
        assert lock.is_held
        assert metrics_errors(caplog) == ["renewal_failed"]  # once, however often it raised
        if attempts > 1:
            again = [r for r in caplog.records if r.name == METRICS_LOG and r.levelno == logging.DEBUG]
            assert again and all(r.args[0] == "renewal_failed" for r in again)
        spun = [r for r in caplog.records if r.name == "handofflock.lock.scheduler"]
        assert not spun, f"the hook raised into the scheduler: {[r.getMessage() for r in spun][:3]}"
    finally:
        store.failing = False
        lock._unschedule()  # private: stop its renewals without releasing


def test_a_raising_acquire_histogram_never_turns_a_taken_lock_into_an_error(raising, name, caplog):
    """``with lock:`` whose acquire succeeded must run its body and release: the lock is never left held
    (and renewed in the background) by code that was told it does not have it."""
    raising("handofflock.acquire.duration")
    url = f"memory://{name}/locks/l.json"
    lock = make_lock(url)
    ran = False
    try:
        with lock:
            ran = True
            assert lock.is_held
        assert ran
        assert not lock.is_held
        assert metrics_errors(caplog) == ["timed_acquire"]
    finally:
        if lock.is_held:
            lock.release()
        lock._unschedule()  # private: stop its renewals without releasing


def test_timed_acquire_returns_or_raises_exactly_what_the_acquire_did_when_the_histogram_raises(raising, name):
    raising("handofflock.acquire.duration")
    url = f"memory://{name}/locks/l.json"
    owner, other = make_lock(url), make_lock(url)
    try:
        assert owner.acquire()  # an Acquired: true
        assert other.acquire(blocking=False) is False
        with pytest.raises(LockTimeout):
            other.acquire(timeout=0.3)
    finally:
        for lock in (owner, other):
            if lock.is_held:
                lock.release()
            lock._unschedule()  # private: stop its renewals without releasing


def test_a_provider_whose_every_instrument_raises_still_hands_the_lock_over(raising, name, caplog):
    """Acquire, notice, handoff, release and renewals all go through hooks; each hook is logged once."""
    caplog.set_level(logging.DEBUG, logger=METRICS_LOG)
    raising("*")
    url = f"memory://{name}/locks/l.json"
    owner, waiter = make_lock(url), make_lock(url)
    got: list[bool] = []
    t = threading.Thread(target=lambda: got.append(waiter.acquire(timeout=15)), daemon=True)
    try:
        assert owner.acquire()
        t.start()
        eventually(lambda: owner.release_requested, timeout=10.0, what="the owner hears of the waiter")
        time.sleep(0.5)  # a few renewals (every 0.2 s), each through the raising hook
        assert owner.release() == waiter.owner_id
        t.join(15)
        assert [bool(g) for g in got] == [True] and waiter.is_held
        waiter.release()
        errors = metrics_errors(caplog)
        assert len(errors) == len(set(errors)), f"a hook logged its error twice: {errors}"
        assert {"timed_acquire", "acquired", "waiter_noticed", "released", "renewed"} <= set(errors), errors
        events_errors = [
            r for r in caplog.records if r.name == "handofflock.lock.events" and r.levelno >= logging.ERROR
        ]
        assert not events_errors, "a metrics receiver raised into the signals"
    finally:
        waiter.cancel()
        t.join(20)
        for lock in (owner, waiter):
            if lock.is_held:
                lock.release()
            lock._unschedule()  # private: stop its renewals without releasing
