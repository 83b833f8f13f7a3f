#!/usr/bin/env python3
"""How much does asking "should I yield?" cost inside a training loop?

Measures, with timeit, on a held lock (memory backend, no background I/O in
the way): reading ``lock.release_requested``, calling ``lock.check()``, and the
per-item overhead of ``for step in lock.steps(...)`` over a bare ``for`` loop.

    .venv/bin/python scripts/measure_yield_check.py
"""

from __future__ import annotations

import timeit

from handofflock import HandoffLock
from handofflock.scheduler import Scheduler


def best_ns(stmt: str, env: dict, number: int) -> float:
    """Best of five runs, in nanoseconds per execution."""
    return min(timeit.repeat(stmt, globals=env, number=number, repeat=5)) / number * 1e9


def main() -> int:
    scheduler = Scheduler(autostart=False)  # nothing runs behind our back while we measure
    lock = HandoffLock("memory://measure/lock.json", ttl=3600.0, scheduler=scheduler)
    lock.acquire()
    try:
        env = {"lock": lock, "range": range}
        n = 1_000_000
        flag = best_ns("lock.release_requested", env, n)
        empty = best_ns("pass", env, n)
        check = best_ns("lock.check()", env, n)
        bare = best_ns("for _ in range(100_000): pass", env, 20) / 100_000
        steps = best_ns("for _ in lock.steps(range(100_000)): pass", env, 20) / 100_000
        print(f"lock.release_requested   {flag:7.1f} ns/call  ({flag - empty:.1f} ns over an empty statement)")
        print(f"lock.check()             {check:7.1f} ns/call")
        print(f"lock.steps() per item    {steps - bare:7.1f} ns over a bare for loop ({bare:.1f} ns/item)")
    finally:
        lock.release()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
