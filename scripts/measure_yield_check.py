#!/usr/bin/env python3
"""How much does asking "should I yield?" cost inside a training loop?

Measures, with timeit, on a held lock (memory backend, no background I/O in
the way): reading ``lock.release_requested``, calling ``lock.check()``, and the
per-item overhead of ``for step in lock.steps(...)`` over a bare ``for`` loop.

    .venv/bin/python scripts/measure_yield_check.py [--quick]
"""

from __future__ import annotations

import os
import platform
import sys
import timeit

from handofflock import HandoffLock
from handofflock.lock.scheduler import Scheduler


def best_ns(stmt: str, env: dict, number: int) -> float:
    """Best of five runs, in nanoseconds per execution."""
    return min(timeit.repeat(stmt, globals=env, number=number, repeat=5)) / number * 1e9


def main(argv: list[str]) -> int:
    # --quick: a thousandth of the work, for the test suite, which checks that it runs, not what it measures
    scale = 1000 if "--quick" in argv else 1
    scheduler = Scheduler(autostart=False)  # nothing runs behind our back while we measure
    lock = HandoffLock("memory://measure/lock.json", ttl=3600.0, scheduler=scheduler)
    lock.acquire()
    try:
        env = {"lock": lock, "range": range}
        n, loops = 1_000_000 // scale, 20 // (2 if scale > 1 else 1)
        items = 100_000 // scale
        flag = best_ns("lock.release_requested", env, n)
        empty = best_ns("pass", env, n)
        check = best_ns("lock.check()", env, n)
        bare = best_ns(f"for _ in range({items}): pass", env, loops) / items
        steps = best_ns(f"for _ in lock.steps(range({items})): pass", env, loops) / items
        print(f"lock.release_requested   {flag:7.1f} ns/call  ({flag - empty:.1f} ns over an empty statement)")
        print(f"lock.check()             {check:7.1f} ns/call")
        print(f"lock.steps() per item    {steps - bare:7.1f} ns over a bare for loop ({bare:.1f} ns/item)")
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
        print(f"measured on: Python {platform.python_version()}, {os.cpu_count()} CPUs ({platform.processor() or platform.machine()}), "
              f"load average {load}; best of 5 runs of {n} calls ({'--quick' if scale > 1 else 'full'})")
    finally:
        lock.release()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
