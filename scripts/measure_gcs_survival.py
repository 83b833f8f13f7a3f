#!/usr/bin/env python3
"""What an owner survives at each ttl on GCS: 429s, a 429 then a 503, a stalled read.

    .venv/bin/python scripts/measure_gcs_survival.py [--seeds 20] [--ttls 5,6,8,10,15,30,60] [--phases 8]

One owner, alone, holds a lock on the memory store with GCS's write spacing
(``min_write_interval=1``, what ``gs://`` gets by default) and the default
timing for its ttl (renew_interval max(ttl/8, 1 s), renew_deadline ttl/2).

* ``one 429`` / ``two 429s`` / ``429, 503``, on simulated time
  (tests/support/simclock.py: requests take no time, the scheduler runs every
  0.05 s of simulated time, in one thread). After three renewals the next
  renewal writes are answered so (the 429 as GCS sends it, without
  Retry-After; the 503 as GCS's is mapped: the write may have landed, so it is
  read back). The cell says in how many seeds (the retry jitter) the owner
  still held a healthy lock 30 s on.
* ``stalled read``, on the real clock, with the lock's real threads (its own
  scheduler and I/O workers; every trial of every ttl runs at once, each lock
  with a scheduler of its own): after three renewals the owner's next read,
  its waiter check, stalls for ``ttl`` seconds, longer than the whole lease
  (the memory store does not cut it; GCS's would be cut at the lock's
  ``request_timeout``, so this is the harder case). Armed at ``--phases``
  points spread over one ``waiter_check_interval``. The cell says in how many
  of them the owner was never lost and still held a healthy lock
  ``renew_deadline`` after the stall ended, and the longest gap between two
  renewals that landed during the stall.

Prints the measured figures and the conditions, and whether this tree's
``HandoffLock._renew`` passes ``Timing.backoff_until`` to the write gate.
Run it on an older tree (``git archive <commit> handofflock``, then
``PYTHONPATH=<that dir>``) to measure that tree: it imports ``handofflock``
from ``PYTHONPATH`` first.
"""

from __future__ import annotations

import argparse
import inspect
import itertools
import os
import platform
import random
import sys
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "support"))
for _first in reversed([p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]):
    sys.path.insert(0, _first)  # a tree named on PYTHONPATH is the one measured

import logging  # noqa: E402

from simclock import SimClock  # noqa: E402

import handofflock  # noqa: E402
from handofflock import HandoffLock, Scheduler, TransientStorageError, signals  # noqa: E402
from handofflock.storage import MemoryStorage  # noqa: E402
from handofflock.storage.records import RecordStore  # noqa: E402

KEY = "locks/job.json"
SPACING = 1.0
STEP = 0.05


def _fault(kind: str) -> TransientStorageError:
    if kind == "429":
        return TransientStorageError("429: rate limit for object mutations", status=429, ambiguous=False)
    return TransientStorageError("503: backend error", status=503, ambiguous=True)


def owner(ttl: float) -> tuple[HandoffLock, SimClock, MemoryStorage]:
    clock = SimClock(step=STEP)
    sched = Scheduler(clock, autostart=False)
    clock.on_tick.append(sched.run_pending)
    store = MemoryStorage(f"survival-{uuid.uuid4().hex[:8]}")
    lock = HandoffLock(
        "memory://unused", storage=store, key=KEY, owner_id="A", clock=clock, scheduler=sched,
        ttl=ttl, min_write_interval=SPACING,
    )
    assert lock.acquire()
    clock.run_for(3 * lock.renew_interval + 0.01)
    return lock, clock, store


def survives_faults(ttl: float, answers: list[str], seed: int) -> bool:
    random.seed(seed)
    lock, clock, store = owner(ttl)
    for kind in answers:
        store.faults.fail_next("write", key=KEY, exc=lambda kind=kind: _fault(kind))
    clock.run_for(30.0)
    return lock.healthy


class SleepyStore(MemoryStorage):
    """The first read at or after ``stall_from`` (monotonic) really takes ``stall`` seconds more;
    the time of every write that lands is kept."""

    def __init__(self) -> None:
        super().__init__(f"survival-{uuid.uuid4().hex[:8]}")
        self.stall_from = float("inf")
        self.stall = 0.0
        self.stalled_at: float | None = None
        self.stalled = threading.Event()
        self.landed: list[float] = []

    def read(self, key: str, *, max_bytes: int | None = None, timeout: float | None = None) -> tuple[bytes, int] | None:
        now = time.monotonic()
        if now >= self.stall_from:
            self.stall_from = float("inf")
            self.stalled_at = now
            self.stalled.set()
            time.sleep(self.stall)
        return super().read(key, max_bytes=max_bytes, timeout=timeout)

    def write(self, key: str, data: bytes, *, if_generation_match: int, timeout: float | None = None) -> int:
        generation = super().write(key, data, if_generation_match=if_generation_match, timeout=timeout)
        self.landed.append(time.monotonic())
        return generation


def stall_trial(ttl: float, phase: float, results: list[tuple[bool, float]]) -> None:
    """One owner on the real clock whose waiter check's read stalls ``ttl`` s; appends (kept, longest gap)."""
    store = SleepyStore()
    sched = Scheduler(name=f"survival-{ttl:g}-{phase:.2f}")
    lock = HandoffLock(
        "memory://unused", storage=store, key=KEY, owner_id=f"A-{uuid.uuid4().hex[:6]}", scheduler=sched,
        ttl=ttl, min_write_interval=SPACING,
    )
    lost: list[object] = []

    def on_lost(sender: object, **kw: object) -> None:
        lost.append(kw)

    signals.lost.connect(on_lost, sender=lock, weak=False)
    try:
        assert lock.acquire(timeout=30)
        time.sleep(3 * lock.renew_interval)
        store.stall, store.stall_from = ttl, time.monotonic() + phase
        if not store.stalled.wait(phase + lock.waiter_check_interval + 10.0):
            raise RuntimeError(f"ttl {ttl:g}: the owner's waiter check never read")
        time.sleep(ttl + lock.renew_deadline)
        assert store.stalled_at is not None
        during = [t for t in store.landed if store.stalled_at <= t <= store.stalled_at + ttl]
        edges = [store.stalled_at, *during, store.stalled_at + ttl]
        gap = max(b - a for a, b in itertools.pairwise(edges))
        results.append((lock.healthy and not lost, gap))
    finally:
        signals.lost.disconnect(on_lost, sender=lock)
        if lock.is_held:
            lock.release()
        sched.stop()


def stalled_reads(ttls: list[float], phases: int) -> dict[float, list[tuple[bool, float]]]:
    """Every trial of every ttl at once, each in a thread of its own (most of the time is waiting)."""
    found: dict[float, list[tuple[bool, float]]] = {ttl: [] for ttl in ttls}
    threads = []
    for ttl in ttls:
        check = HandoffLock("memory://probe/x", ttl=ttl, min_write_interval=SPACING).waiter_check_interval
        for i in range(phases):
            thread = threading.Thread(target=stall_trial, args=(ttl, check * i / phases, found[ttl]), daemon=True)
            thread.start()
            threads.append(thread)
    for thread in threads:
        thread.join()
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--ttls", default="5,6,8,10,15,30,60")
    parser.add_argument("--phases", type=int, default=8)
    args = parser.parse_args()
    logging.disable(logging.CRITICAL)  # the lost owners log errors; the table is the output
    ttls = [float(t) for t in args.ttls.split(",")]
    renew_passes_by = "send_by" in inspect.signature(RecordStore.write).parameters
    print(f"# handofflock from {Path(handofflock.__file__).parent}")
    print(f"# python {platform.python_version()} on {platform.system()} {platform.machine()}, {os.cpu_count()} CPUs")
    print(f"# memory store at GCS's spacing (min_write_interval={SPACING:g}), default timing")
    print(f"# HandoffLock._renew passes Timing.backoff_until to the write gate: {renew_passes_by}")
    print(
        f"# 429/503 cells: simulated time (step {STEP} s), seeds in which the owner kept a healthy lock, "
        f"of {args.seeds}"
    )
    print(
        f"# stalled read: real clock, the waiter check's read stalls ttl s, {args.phases} phases at once; "
        "phases kept, and the longest gap between renewals during the stall"
    )
    started = time.monotonic()
    stalls = stalled_reads(ttls, args.phases)
    print(f"# stalled-read trials took {time.monotonic() - started:.0f} s of real time")
    scenarios = {"one 429": ["429"], "two 429s": ["429", "429"], "429, 503": ["429", "503"]}
    header = ["ttl", "renew_interval", "renew_deadline", *scenarios, "stalled read (ttl s)"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for ttl in ttls:
        probe = HandoffLock("memory://probe/x", ttl=ttl, min_write_interval=SPACING)
        cells = [f"{ttl:g}", f"{probe.renew_interval:g}", f"{probe.renew_deadline:g}"]
        for answers in scenarios.values():
            kept = sum(survives_faults(ttl, answers, seed) for seed in range(args.seeds))
            cells.append(f"{kept}/{args.seeds}")
        trials = stalls[ttl]
        kept = sum(ok for ok, _ in trials)
        cells.append(f"{kept}/{len(trials)}, renewals at most {max(gap for _, gap in trials):.2f} s apart")
        print("| " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
