"""OpenTelemetry metrics, read back with the SDK's in-memory reader after real lock sequences."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import textwrap
import threading
import urllib.request
import uuid
from pathlib import Path

import pytest
from lockutil import FAST, eventually, make_lock, raw_read, raw_write
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from handofflock import FakeClock, HandoffLock, Scheduler
from handofflock.core.errors import AcquireCancelled, LockTimeout, TransientStorageError
from handofflock import metrics
from handofflock.storage import MemoryStorage
from childpipes import next_line


@pytest.fixture
def reader():
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    metrics.use_meter_provider(provider)
    yield reader
    metrics.use_meter_provider(None)
    provider.shutdown()


def read(reader) -> dict[str, list]:
    """Metric name -> its data points, as of now."""
    found: dict[str, list] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                found.setdefault(metric.name, []).extend(metric.data.data_points)
    return found


def total(points, **attrs) -> float:
    """Sum of counter values (or histogram counts) over the points whose attributes include ``attrs``."""
    value = 0.0
    for p in points:
        if all(p.attributes.get(k) == v for k, v in attrs.items()):
            value += p.count if hasattr(p, "bucket_counts") else p.value
    return value


def test_a_handoff_between_two_locks_is_counted_timed_and_noticed(reader, sim):
    owner, waiter = sim.lock("owner", **FAST), sim.lock("waiter", **FAST)
    url = owner.url
    assert sim.call(owner.acquire)
    got = sim.start(lambda: waiter.acquire(timeout=30))
    sim.run_until(lambda: owner.release_requested, limit=10.0, what="the owner noticing the waiter")
    sim.run_until(lambda: total(read(reader).get("handofflock.renewals", []), **{"lock.url": url}) >= 2,
                  limit=10.0, step=0.05, what="two renewals counted")
    held = read(reader)["handofflock.locks.held"]
    assert total(held, **{"lock.url": url}) == 1
    assert sim.call(owner.release) == waiter.owner_id
    sim.run_until(lambda: got.done, limit=30.0, what="the waiter's acquire to return")
    assert got.error is None and bool(got.result) is True

    seen = read(reader)
    assert total(seen["handofflock.handoffs"], **{"lock.url": url}) == 1
    assert total(seen["handofflock.acquisitions"], handoff=False) == 1
    assert total(seen["handofflock.acquisitions"], handoff=True) == 1
    waits = [p for p in seen["handofflock.acquire.duration"] if p.attributes["outcome"] == "acquired"]
    assert sum(p.count for p in waits) == 2
    # The waiter waited at least until the owner had renewed twice (0.2 s apart).
    assert max(p.max for p in waits) >= 0.2
    (notice,) = seen["handofflock.notice.latency"]
    assert notice.count == 1 and 0.0 <= notice.max < 10.0
    (renew,) = seen["handofflock.renewal.duration"]
    assert renew.count >= 2 and 0.0 <= renew.min <= renew.max < 5.0
    assert total(seen["handofflock.locks.held"], **{"lock.url": url}) == 1, "the waiter holds it now"
    assert "handofflock.losses" not in seen
    sim.call(waiter.release)
    assert total(read(reader)["handofflock.locks.held"], **{"lock.url": url}) == 0


@pytest.fixture
def fake():
    name = f"metrics-{uuid.uuid4().hex[:8]}"
    clock = FakeClock()
    sched = Scheduler(clock, autostart=False)
    yield f"memory://{name}/train.json", clock, sched, MemoryStorage.named(name)
    MemoryStorage.forget(name)


def test_notice_latency_renewal_errors_and_a_loss_on_a_fake_clock(reader, fake):
    url, clock, sched, store = fake
    lock = HandoffLock(url, ttl=60.0, waiter_check_interval=2.0, clock=clock, scheduler=sched, min_hold=0)
    assert lock.acquire()
    # A waiter registers (its slot: 30 s from now); the owner's check runs 2 s later.
    record, gen = raw_read(url)
    raw_write(url, record.replace(waiting_owner_id="w", waiter_expires_at=clock.time() + 30.0, waiter_ttl=30.0, nonce="w1"), gen)
    clock.advance(2.0)
    sched.run_pending()
    assert lock.release_requested
    (notice,) = read(reader)["handofflock.notice.latency"]
    assert notice.count == 1 and notice.sum == pytest.approx(2.0)

    store.faults.fail_next("write", count=10_000)
    for _ in range(200):  # 100 s of fake time; the renew deadline is 30 s
        clock.advance(0.5)
        sched.run_pending()
        if not lock.is_held and read(reader).get("handofflock.losses"):
            break
    store.faults.clear()
    seen = read(reader)
    errors = seen["handofflock.renewal.errors"]
    assert total(errors, **{"lock.url": url}) >= 3
    assert all(p.attributes["error.type"] == "TransientStorageError" for p in errors)
    assert total(seen["handofflock.losses"], **{"lock.url": url}) == 1
    assert total(seen["handofflock.locks.held"], **{"lock.url": url}) == 0
    assert "handofflock.renewals" not in seen, "no renewal succeeded"


def test_a_timed_out_acquire_is_recorded_with_its_outcome(reader, world):
    owner, waiter = world.lock("owner", **FAST), world.lock("waiter", **FAST)
    assert owner.acquire()
    with pytest.raises(TimeoutError):
        waiter.acquire(timeout=0.3)
    assert not world.lock("third", **FAST).acquire(blocking=False)
    points = read(reader)["handofflock.acquire.duration"]
    (timeout,) = [p for p in points if p.attributes["outcome"] == "timeout"]
    assert timeout.count == 1 and timeout.min >= 0.3
    assert total(points, outcome="not_acquired") == 1
    owner.release()


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60)


def test_metrics_flow_to_a_global_provider_the_application_sets_after_importing_handofflock():
    done = run_python(
        """
        from handofflock import HandoffLock
        from opentelemetry import metrics
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader

        lock = HandoffLock("memory://global/train.json")
        assert lock.acquire(); lock.release()          # before any provider: a no-op
        reader = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
        assert lock.acquire(); lock.release()
        names = {m.name: sum(p.value for p in m.data.data_points)
                 for r in reader.get_metrics_data().resource_metrics
                 for s in r.scope_metrics for m in s.metrics if m.name == "handofflock.acquisitions"}
        print(names)
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "{'handofflock.acquisitions': 1}", "only the acquire after set_meter_provider counts"


def test_without_opentelemetry_installed_the_hooks_are_no_ops():
    done = run_python(
        """
        import sys
        sys.modules["opentelemetry"] = None   # as if the otel extra were not installed
        from handofflock import HandoffLock
        from handofflock import metrics
        lock = HandoffLock("memory://bare/train.json")
        assert lock.acquire(); lock.release()
        print(metrics.enabled())
        try:
            metrics.use_meter_provider(None)
        except Exception as exc:
            print(type(exc).__name__, exc)
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "False",
        "ConfigurationError metrics need the OpenTelemetry API: pip install 'handofflock[otel]'",
    ]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def scrape(port: int) -> dict[str, float]:
    """``name{labels}`` -> value of every handofflock sample on the endpoint."""
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    samples = {}
    for line in text.splitlines():
        if line.startswith("handofflock_"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


def value(samples: dict[str, float], name: str) -> float:
    return sum(v for k, v in samples.items() if k == name or k.startswith(name + "{"))


@pytest.mark.timeout(90)
def test_the_prometheus_example_serves_the_lock_metrics_on_localhost():
    port = free_port()
    example = Path(__file__).resolve().parents[2] / "examples" / "prometheus_metrics.py"
    proc = subprocess.Popen([sys.executable, str(example), "--port", str(port), "--duration", "60"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = next_line(proc)
        assert first.startswith(f"serving http://127.0.0.1:{port}/metrics"), (first, proc.stderr.read() if proc.poll() is not None else "")
        samples = eventually(lambda: (s := scrape(port)) and value(s, "handofflock_handoffs_total") >= 2 and s,
                             timeout=45, what="two handoffs on /metrics")
        assert value(samples, "handofflock_acquisitions_total") >= 2
        assert "handofflock_locks_held" in {k.partition("{")[0] for k in samples}
        assert value(samples, "handofflock_locks_held") <= 1, "never both workers at once"
        assert value(samples, "handofflock_acquire_duration_seconds_count") >= 2
        assert value(samples, "handofflock_notice_latency_seconds_count") >= 2
        assert any('outcome="acquired"' in k for k in samples)
        assert value(samples, "handofflock_losses_total") == 0
    finally:
        proc.terminate()
        proc.wait(30)


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


def test_a_raising_notice_histogram_never_hides_the_waiter_from_the_holder(raising, sim, caplog):
    caplog.set_level(logging.DEBUG, logger=METRICS_LOG)
    raising("handofflock.notice.latency")
    owner, waiter = sim.lock("owner", **FAST), sim.lock("waiter", **FAST)
    assert sim.call(owner.acquire)
    sim.start(lambda: waiter.acquire(timeout=15))
    sim.run_until(
        # private: "waiting" (an acquire runs) has no public flag
        lambda: waiter._state == "waiting" and sim.call(owner.status).waiter_id == waiter.owner_id,
        what="the waiter registered",
    )
    # waiter checks run every 0.1 s: 3 s is 30 of them
    sim.run_until(lambda: owner.release_requested, limit=3.0, what="the owner hears of the waiter")
    assert owner.release_request.requester == waiter.owner_id
    assert metrics_errors(caplog) == ["waiter_noticed"]
    error = next(r for r in caplog.records if r.name == METRICS_LOG and r.levelno == logging.ERROR)
    assert error.exc_info and "exporter queue full" in str(error.exc_info[1])
    assert error.lock_url == owner.url  # the lock's fields, as every handofflock logger has


def test_a_raising_error_counter_leaves_renewal_retries_spaced_by_their_backoff(raising, sim, caplog):
    """Raised into the renewal, the hook kept the renewal due: the scheduler retried at once, thousands of
    times a second, against a store that was already failing."""
    caplog.set_level(logging.DEBUG, logger=METRICS_LOG)
    raising("handofflock.renewal.errors")
    lock = sim.lock("A", ttl=6.0, renew_interval=0.5, renew_deadline=3.0)
    assert sim.call(lock.acquire)
    failed_writes = 0

    def fail(op, key):  # writes fail transiently (a 503) from now on
        nonlocal failed_writes
        failed_writes += 1
        raise TransientStorageError("503 (injected)", key=key, ambiguous=False)

    sim.store.faults.before("write", fail)
    sim.run_for(2.0)  # within the renew deadline: retries spaced by the backoff (at most renew_interval)
    attempts = failed_writes
    assert 1 <= attempts <= 40, f"{attempts} renewal writes in 2 s against a failing store (backoff sends ~10)"
    assert lock.is_held
    assert metrics_errors(caplog) == ["renewal_failed"]  # once, however often it raised
    if attempts > 1:
        again = [r for r in caplog.records if r.name == METRICS_LOG and r.levelno == logging.DEBUG]
        assert again and all(r.args[0] == "renewal_failed" for r in again)
    spun = [r for r in caplog.records if r.name == "handofflock.lock.scheduler"]
    assert not spun, f"the hook raised into the scheduler: {[r.getMessage() for r in spun][:3]}"
    sim.store.faults.clear()


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


def test_a_provider_whose_every_instrument_raises_still_hands_the_lock_over(raising, sim, caplog):
    """Acquire, notice, handoff, release and renewals all go through hooks; each hook is logged once."""
    caplog.set_level(logging.DEBUG, logger=METRICS_LOG)
    raising("*")
    owner, waiter = sim.lock("owner", **FAST), sim.lock("waiter", **FAST)
    assert sim.call(owner.acquire)
    t = sim.start(lambda: waiter.acquire(timeout=15))
    sim.run_until(lambda: owner.release_requested, limit=10.0, what="the owner hears of the waiter")
    sim.run_for(0.5)  # a few renewals (every 0.2 s), each through the raising hook
    assert sim.call(owner.release) == waiter.owner_id
    sim.run_until(lambda: t.done, limit=15)
    assert [bool(t.result)] == [True] and waiter.is_held
    sim.call(waiter.release)
    errors = metrics_errors(caplog)
    assert len(errors) == len(set(errors)), f"a hook logged its error twice: {errors}"
    assert {"timed_acquire", "acquired", "waiter_noticed", "released", "renewed"} <= set(errors), errors
    events_errors = [
        r for r in caplog.records if r.name == "handofflock.lock.events" and r.levelno >= logging.ERROR
    ]
    assert not events_errors, "a metrics receiver raised into the signals"
