"""The ``async`` section of scripts/bench: event-loop lag while async locks renew and hand off.

    .venv/bin/python scripts/bench --only async

One process, one event loop (asyncio or trio, through anyio). ``locks``
AsyncHandoffLocks are taken and held under one prefix with the store's default
pacing, so the library's scheduler renews them in the background, while
``handoffs`` pairs of async locks each make one handoff (the waiter registers,
the owner is woken in ``wait_release_requested()``, releases, and the waiter's
``acquire()`` returns), started at even intervals across the window. A probe
task sleeps 5 ms at a time and records how late each wake-up is: the event
loop's lag. A baseline is measured first with no locks at all, on the same
loop, so the row shows what the locks add to what the machine already does.

Nothing here runs on the loop but the probe, the handoff tasks' awaits and the
wake-ups the lock sends to it; every storage request runs in worker threads or
on the scheduler's threads.
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from typing import Any

import anyio

from handofflock import AsyncHandoffLock, Scheduler

#: The probe's sleep (seconds): lag = how much later than this each wake-up comes.
PROBE_INTERVAL = 0.005
#: Concurrent acquires while taking the held locks (setup, not measured).
SETUP_CONCURRENCY = 8


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


def _ms(x: float | None) -> float | None:
    return None if x is None else round(x * 1000, 2)


async def _probe(samples: list[float], stop: anyio.Event) -> None:
    while not stop.is_set():
        t = time.perf_counter()
        await anyio.sleep(PROBE_INTERVAL)
        samples.append(max(0.0, time.perf_counter() - t - PROBE_INTERVAL))


async def _baseline(seconds: float) -> list[float]:
    samples: list[float] = []
    stop = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(_probe, samples, stop)
        await anyio.sleep(seconds)
        stop.set()
    return samples


async def _run(backend: Any, store: Any, counter: Any, sched: Scheduler, *, locks: int, handoffs: int,
               window: float, ttl: float) -> dict[str, Any]:
    prefix = backend.prefix(f"async-{locks}")

    def make(key: str, in_store: Any = store) -> AsyncHandoffLock:
        # min_hold 0: a holder is asked at once, so the notice and handoff rows measure the mechanics, not the hold.
        return AsyncHandoffLock(f"{in_store.url}/{key}", storage=in_store, key=key, ttl=ttl, scheduler=sched, min_hold=0.0)

    baseline = await _baseline(min(5.0, window / 2))
    held = [make(f"{prefix}held/l{i:04d}.json") for i in range(locks)]
    limiter = anyio.Semaphore(SETUP_CONCURRENCY)

    async def take(lock: AsyncHandoffLock) -> None:
        async with limiter:
            if not await lock.acquire(blocking=False):
                raise RuntimeError(f"could not take {lock.url}")

    t = time.monotonic()
    async with anyio.create_task_group() as tg:
        for lock in held:
            tg.start_soon(take, lock)
    acquire_s = time.monotonic() - t

    stores: list[Any] = []
    lags: list[float] = []
    handoff_s: list[float] = []
    notice_s: list[float] = []
    done: list[bool] = []
    stop = anyio.Event()

    async def one_handoff(i: int) -> None:
        await anyio.sleep(i * max(0.0, window - 6.0) / max(1, handoffs))
        # Each pair has a store (a GCS client) of its own, as two programs would; the held locks share one.
        pair_store, _ = backend.store()
        stores.append(pair_store)
        owner = make(f"{prefix}handoff/h{i:02d}.json", pair_store)
        waiter = make(f"{prefix}handoff/h{i:02d}.json", pair_store)
        got: list[float] = []

        async def wait_for_it() -> None:
            await waiter.acquire(timeout=60)
            got.append(time.monotonic())
            await waiter.release()

        async with owner:
            async with anyio.create_task_group() as tg:
                asked = time.monotonic()
                tg.start_soon(wait_for_it)
                with anyio.fail_after(60):
                    await owner.wait_release_requested()
                notice_s.append(time.monotonic() - asked)
                heir = await owner.release()
                released = time.monotonic()
            handoff_s.append(got[0] - released)
            done.append(heir == waiter.owner_id)

    c0, cpu0, w0 = counter.snapshot(), time.process_time(), time.monotonic()
    async with anyio.create_task_group() as tg:
        tg.start_soon(_probe, lags, stop)
        async with anyio.create_task_group() as pairs:
            for i in range(handoffs):
                pairs.start_soon(one_handoff, i)
            with anyio.move_on_after(max(0.0, window - (time.monotonic() - w0))):
                await anyio.sleep_forever()
        stop.set()
    c1, cpu1, wall = counter.snapshot(), time.process_time(), time.monotonic() - w0
    healthy = sum(lock.healthy for lock in held)

    async def give_back(lock: AsyncHandoffLock) -> None:
        async with limiter:
            await lock.release()

    async with anyio.create_task_group() as tg:
        for lock in held:
            tg.start_soon(give_back, lock)
    for pair_store in stores:
        pair_store.close()
    spent = {k: c1[k] - c0.get(k, 0) for k in c1}
    renew_interval = held[0].renew_interval if held else None
    return {
        "locks": locks,
        "handoffs": handoffs,
        "handoffs_done": sum(done),
        "ttl_s": ttl,
        "renew_interval_s": renew_interval,
        "min_write_interval_s": held[0].sync.min_write_interval if held else None,
        "window_s": round(wall, 1),
        "acquire_all_s": round(acquire_s, 2),
        "probe_interval_ms": PROBE_INTERVAL * 1000,
        "samples": len(lags),
        "lag_p50_ms": _ms(statistics.median(lags)) if lags else None,
        "lag_p99_ms": _ms(_pct(lags, 99)),
        "lag_max_ms": _ms(max(lags)) if lags else None,
        "baseline_p50_ms": _ms(statistics.median(baseline)) if baseline else None,
        "baseline_p99_ms": _ms(_pct(baseline, 99)),
        # Requests of the held locks' store (the handoff pairs have stores of their own).
        "writes_per_s": round(spent.get("write", 0) / wall, 1),
        "requests_per_s": round(sum(spent.values()) / wall, 1),
        "handoff_p50_ms": _ms(statistics.median(handoff_s)) if handoff_s else None,
        "notice_p50_ms": _ms(statistics.median(notice_s)) if notice_s else None,
        "cpu_percent": round(100 * (cpu1 - cpu0) / wall, 1),
        "threads_peak": threading.active_count(),
        "healthy_at_end": healthy,
    }


def bench_async(backend: Any, *, loop: str = "asyncio", locks: int = 200, handoffs: int = 10,
                window: float = 20.0, ttl: float = 60.0, switch_interval: float | None = None) -> dict[str, Any]:
    """One row: ``locks`` held async locks and ``handoffs`` handoffs on ``backend``, under ``loop``.

    ``switch_interval`` sets ``sys.setswitchinterval()`` for the row (and puts it back after): how
    long the loop's thread may wait for the GIL while background threads run Python code.
    """
    store, counter = backend.store()
    sched = Scheduler(name=f"bench-async-{backend.name}")
    previous = sys.getswitchinterval()
    if switch_interval is not None:
        sys.setswitchinterval(switch_interval)
    try:
        row = anyio.run(
            lambda: _run(backend, store, counter, sched, locks=locks, handoffs=handoffs, window=window, ttl=ttl),
            backend=loop,
        )
    finally:
        sys.setswitchinterval(previous)
        sched.stop()
        store.close()
    return {"backend": backend.name, "loop": loop, "switch_interval_ms": round(sys.getswitchinterval() * 1000
            if switch_interval is None else switch_interval * 1000, 2), **row}
