"""Section 5: one process holding 1 to 1,000 locks.

The full run's slow rows hold each request in :class:`handofflock.testing.FaultProxy` (its
``delay`` fault) between the store and the emulator, as the fault tests do. What stays here is
bench-specific: :class:`WriteTimes` notes each write's send time, to measure how late renewals are.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bench.support import ACQUIRE_THREADS, CLASS_A, CLASS_B, Backend, diff, ms, pct, run_in_thread  # noqa: E402
from handofflock import HandoffLock, Scheduler, signals  # noqa: E402
from handofflock.lock.scheduler import IO_WORKERS  # noqa: E402
from handofflock.testing import FaultProxy

# --------------------------------------------------------------------------- 5. scale


class WriteTimes:
    """A storage proxy noting when each write to each key was sent (monotonic), to see renewals from outside.

    A renewal is due ``renew_interval`` after the send of the write that made the lease, so a
    renewal's lateness is the gap between two writes of one key, less ``renew_interval``.
    """

    def __init__(self, inner: Any) -> None:
        self.inner, self.url = inner, inner.url
        self.sent: dict[str, list[float]] = {}
        self._lock = threading.Lock()

    def write(self, key: str, data: bytes, **kw: Any) -> int:
        with self._lock:
            self.sent.setdefault(key, []).append(time.monotonic())
        return self.inner.write(key, data, **kw)

    def __getattr__(self, name: str) -> Any:  # read, delete, list, close: as the store does them
        return getattr(self.inner, name)

    def lateness(self, interval: float, start: float, end: float) -> list[float]:
        """How late each renewal sent in [start, end] was against its due time."""
        with self._lock:
            sent = {key: list(times) for key, times in self.sent.items()}
        return [b - a - interval for times in sent.values() for a, b in zip(times, times[1:]) if start <= b <= end]


def bench_scale(backend: Backend, n: int, window: float, ttl: float, *, delay: float = 0.0, io_workers: int = IO_WORKERS) -> dict[str, Any]:
    """One process holds ``n`` locks under one prefix with default intervals; watch it for ``window`` s.

    ``delay`` holds every request that long before it is forwarded to the emulator (GCS only), in a
    :class:`FaultProxy`, standing in for real GCS's round trip (the emulator answers in about a
    millisecond): the scheduler's fixed I/O pool then has to cover the same renewals with slow
    requests. ``io_workers`` is the scheduler's pool size (its default unless given).
    """
    with contextlib.ExitStack() as stack:
        if delay:
            proxy = stack.enter_context(FaultProxy(os.environ["STORAGE_EMULATOR_HOST"]))
            proxy.inject("delay", delay=delay, times=10**9)  # every request, for as long as the row runs
            with proxy.env():  # the holder's store only: the notice probe's waiter talks to the emulator
                store, counter = backend.store()
        else:
            store, counter = backend.store()
        return _scale(backend, store, counter, n, window, ttl, delay, io_workers)


def _scale(backend: Backend, store: Any, counter: Any, n: int, window: float, ttl: float, delay: float,
           io_workers: int) -> dict[str, Any]:
    p = backend.prefix(f"scale-{n}")
    sched = Scheduler(name=f"bench-scale-{n}", io_workers=io_workers)
    timed = WriteTimes(store)
    locks = [backend.lock(timed, f"{p}l{i:04d}.json", ttl=ttl, scheduler=sched) for i in range(n)]
    t = time.monotonic()
    with ThreadPoolExecutor(ACQUIRE_THREADS) as pool:
        taken = list(pool.map(lambda lock: lock.acquire(blocking=False), locks))
    acquire_s = time.monotonic() - t
    if not all(taken):
        raise RuntimeError(f"could not take {taken.count(False)} of the {n} locks")
    try:
        # Let one renewal cycle pass first, so the window sees the steady state, not the start.
        time.sleep(locks[0].renew_interval)
        c0, cpu0, w0 = counter.snapshot(), time.process_time(), time.monotonic()
        peak_threads, peak_sched = threading.active_count(), sched.threads
        while time.monotonic() - w0 < window:
            time.sleep(min(0.25, max(0.0, window - (time.monotonic() - w0))))
            peak_threads = max(peak_threads, threading.active_count())
            peak_sched = max(peak_sched, sched.threads)
        c1, cpu1, w1 = counter.snapshot(), time.process_time(), time.monotonic()
        # renewals after the window (during the notice probe, the releases) do not count
        late = timed.lateness(locks[0].renew_interval, w0, w1)
        wall = w1 - w0
        spent_ = diff(c0, c1)
        healthy = sum(lock.healthy for lock in locks)
        lost = sum(not lock.is_held for lock in locks)
        notice = scale_notice(backend, locks[n // 2])
    finally:
        # In parallel: a release right after the lock's renewal waits out the 1 s write spacing.
        with ThreadPoolExecutor(ACQUIRE_THREADS) as pool:
            list(pool.map(lambda lock: lock.release() if lock.is_held else None, locks))
        sched.stop()
        store.close()
    check_interval = locks[0].waiter_check_interval
    checks = spent_["list"] + spent_["read"]
    return {
        "locks": n,
        "simulated_rtt_ms": delay * 1000,
        "io_workers": io_workers,
        "ttl_s": ttl,
        "renew_interval_s": locks[0].renew_interval,
        "check_interval_s": check_interval,
        "window_s": round(wall, 1),
        "acquire_all_s": round(acquire_s, 2),
        "process_threads": peak_threads,
        "scheduler_threads": peak_sched,
        "renewals": len(late),
        "renewals_due_about": round(n * wall / locks[0].renew_interval),
        "lateness_p50_ms": ms(statistics.median(late)) if late else None,
        "lateness_p99_ms": ms(pct(late, 99)) if late else None,
        "lateness_max_ms": ms(max(late)) if late else None,
        "requests_per_s": round(sum(spent_.values()) / wall, 2),
        "by_kind_per_s": {k: round(v / wall, 2) for k, v in sorted(spent_.items())},
        "check_requests_per_interval": round(checks / wall * check_interval, 2),
        "class_a_per_s": round(sum(spent_[k] for k in CLASS_A) / wall, 2),
        "class_b_per_s": round(sum(spent_[k] for k in CLASS_B) / wall, 2),
        "cpu_percent": round(100 * (cpu1 - cpu0) / wall, 1),
        "healthy_at_end": healthy,
        "lost": lost,
        "notice_ms": notice,
    }


def scale_notice(backend: Backend, owner: HandoffLock) -> float | None:
    """One waiter on one of the held locks: how long until its owner hears of it (grouped checks at work)."""
    store, _ = backend.store()
    # min_write_interval=0: the probe stands for another process, which would not share our pacing.
    waiter = backend.lock(store, owner.key, scheduler=Scheduler(autostart=False), waiter_poll_interval=0.5, min_write_interval=0.0)
    stamps: dict[str, float] = {}
    heard = threading.Event()

    def on_waiting(sender: Any, **kw: Any) -> None:
        stamps["waiting"] = time.monotonic()

    def on_request(sender: Any, **kw: Any) -> None:
        stamps["noticed"] = time.monotonic()
        heard.set()

    try:
        with signals.waiting.connected_to(on_waiting, sender=waiter), signals.on_release_requested.connected_to(on_request, sender=owner):
            thread, _ = run_in_thread(lambda: waiter.acquire(timeout=30))
            ok = heard.wait(owner.waiter_check_interval * 3 + 5)
            waiter.cancel()
            thread.join(30)
    finally:
        if waiter.is_held:
            waiter.release()
        store.close()
    return ms(stamps["noticed"] - stamps["waiting"]) if ok and "waiting" in stamps else None
