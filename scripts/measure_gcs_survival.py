#!/usr/bin/env python3
"""What an owner survives at each ttl on GCS: 429s, a 429 then a 503, a stalled read (issue 25).

    .venv/bin/python scripts/measure_gcs_survival.py [--seeds 20] [--ttls 5,6,8,10,15,30,60]

One owner, alone, holds a lock on the memory store with GCS's write spacing
(``min_write_interval=1``, what ``gs://`` gets by default) and the default
timing for its ttl (renew_interval max(ttl/8, 1 s), renew_deadline ttl/2),
on simulated time (tests/simclock.py: requests take no time, the scheduler
runs every 0.05 s of simulated time). After three renewals:

* ``one 429`` / ``two 429s`` / ``429, 503``: the next renewal writes are
  answered so (the 429 as GCS sends it, without Retry-After; the 503 as GCS's
  is mapped: the write may have landed, so it is read back). The cell says in
  how many seeds (the retry jitter) the owner still held a healthy lock 30 s on.
* ``stalled read``: the longest stall of one of the owner's own reads (its
  waiter check) it survived in every phase tried (stall armed at 40 points
  over 16 s), searched in steps of 0.25 s up to 30 s.

Prints the measured figures and the conditions, and whether this tree's
``HandoffLock._renew`` passes ``Timing.backoff_until`` to the write gate.
"""

from __future__ import annotations

import argparse
import inspect
import os
import platform
import random
import sys
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import logging  # noqa: E402

from simclock import SimClock  # noqa: E402

from handofflock import HandoffLock, Scheduler, TransientStorageError  # noqa: E402
from handofflock.storage import MemoryStorage  # noqa: E402

KEY = "locks/job.json"
SPACING = 1.0
STEP = 0.05


def _fault(kind: str) -> TransientStorageError:
    if kind == "429":
        return TransientStorageError("429: rate limit for object mutations", status=429, ambiguous=False)
    return TransientStorageError("503: backend error", status=503, ambiguous=True)


class StallingStore(MemoryStorage):
    """Reads armed at ``stall_from`` take ``stall`` seconds of simulated time (once)."""

    def __init__(self, clock: SimClock) -> None:
        super().__init__(f"survival-{uuid.uuid4().hex[:8]}")
        self.clock = clock
        self.stall_from = float("inf")
        self.stall = 0.0

    def read(self, key: str, *, max_bytes: int | None = None) -> tuple[bytes, int] | None:
        if self.clock.monotonic() >= self.stall_from:
            self.stall_from = float("inf")
            self.clock.advance(self.stall)
        return super().read(key, max_bytes=max_bytes)


def owner(ttl: float) -> tuple[HandoffLock, SimClock, StallingStore]:
    clock = SimClock(step=STEP)
    sched = Scheduler(clock, autostart=False)
    clock.on_tick.append(sched.run_pending)
    store = StallingStore(clock)
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


def survives_stall(ttl: float, stall: float, armed_at: float) -> bool:
    random.seed(0)
    lock, clock, store = owner(ttl)
    store.stall_from, store.stall = clock.monotonic() + armed_at, stall
    clock.run_for(armed_at + stall + 10.0)
    return lock.healthy


def longest_stall(ttl: float) -> float:
    phases = [16.0 * i / 40 for i in range(40)]
    best = 0.0
    stall = 0.25
    while stall <= 30.0 and all(survives_stall(ttl, stall, p) for p in phases):
        best, stall = stall, stall + 0.25
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--ttls", default="5,6,8,10,15,30,60")
    args = parser.parse_args()
    logging.disable(logging.CRITICAL)  # the lost owners log errors; the table is the output
    ttls = [float(t) for t in args.ttls.split(",")]
    renew_passes_by = "send_by" in inspect.signature(HandoffLock._write_lease).parameters
    print(f"# python {platform.python_version()} on {platform.system()} {platform.machine()}, {os.cpu_count()} CPUs")
    print(
        f"# memory store at GCS's spacing (min_write_interval={SPACING:g}), "
        f"simulated time (step {STEP} s), default timing"
    )
    print(f"# HandoffLock._renew passes Timing.backoff_until to the write gate: {renew_passes_by}")
    print(
        f"# cells: seeds in which the owner kept a healthy lock, of {args.seeds}; "
        "stall: longest survived in every phase"
    )
    scenarios = {"one 429": ["429"], "two 429s": ["429", "429"], "429, 503": ["429", "503"]}
    header = ["ttl", "renew_interval", "renew_deadline", *scenarios, "stalled read"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for ttl in ttls:
        probe = HandoffLock("memory://probe/x", ttl=ttl, min_write_interval=SPACING)
        cells = [f"{ttl:g}", f"{probe.renew_interval:g}", f"{probe.renew_deadline:g}"]
        for answers in scenarios.values():
            kept = sum(survives_faults(ttl, answers, seed) for seed in range(args.seeds))
            cells.append(f"{kept}/{args.seeds}")
        cells.append(f"{longest_stall(ttl):g} s")
        print("| " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
