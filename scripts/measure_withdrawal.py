#!/usr/bin/env python3
"""Measure how soon a holder learns that its waiter went away.

    .venv/bin/python scripts/measure_withdrawal.py [--rounds 10] [--check 2.0] [--url file:///tmp/x.json]

Each round: a holder takes the lock; a waiter registers; once the holder has
been asked (``on_release_requested``), the waiter cancels its acquire, which
gives its slot back with one conditional write. Printed: the time from the
waiter's ``acquire()`` returning (its give-up has landed) to the holder's
``on_release_withdrawn``, per round, and its median and maximum. Expect up to
one ``waiter_check_interval`` (``--check``) plus a read: the holder learns of it
at its next check. Every number is measured in this run, in one process, with
threads, on the monotonic clock; the conditions (store, interval, load) are
printed with them.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from handofflock import AcquireCancelled, HandoffLock, signals


def one_round(url: str, check: float) -> float:
    timing = {"ttl": 30.0, "waiter_check_interval": check, "waiter_poll_interval": min(0.5, check), "min_write_interval": 0.0}
    holder = HandoffLock(url, owner_id="holder", **timing)
    waiter = HandoffLock(url, owner_id="waiter", **timing)
    asked, withdrawn = threading.Event(), threading.Event()
    at: dict[str, float] = {}

    def on_asked(sender, **kw):
        asked.set()

    def on_withdrawn(sender, **kw):
        at["withdrawn"] = time.monotonic()
        withdrawn.set()

    signals.on_release_requested.connect(on_asked, sender=holder)
    signals.on_release_withdrawn.connect(on_withdrawn, sender=holder)
    holder.acquire()
    try:
        def wait() -> None:
            try:
                waiter.acquire(timeout=60)
            except AcquireCancelled:
                at["gone"] = time.monotonic()

        t = threading.Thread(target=wait, daemon=True)
        t.start()
        if not asked.wait(10 * check + 10):
            raise SystemExit("the holder was never asked")
        waiter.cancel()
        t.join(30)
        if not withdrawn.wait(10 * check + 10):
            raise SystemExit("the holder never heard that the waiter left")
        return at["withdrawn"] - at["gone"]
    finally:
        holder.release()
        signals.on_release_requested.disconnect(on_asked, sender=holder)
        signals.on_release_withdrawn.disconnect(on_withdrawn, sender=holder)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--check", type=float, default=2.0, help="the holder's waiter_check_interval (default 2, the default)")
    parser.add_argument("--url", default=None, help="lock URL (default: a file in a temporary directory)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = args.url or (Path(tmp) / "lock.json").as_uri()
        print(f"store {url.split(':', 1)[0]}, waiter_check_interval {args.check:g} s, {args.rounds} rounds; "
              f"{platform.python_implementation()} {platform.python_version()}, {os.cpu_count()} CPUs, "
              f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
        latencies = []
        for i in range(args.rounds):
            latencies.append(one_round(url, args.check))
            print(f"  round {i + 1}: withdrawn {latencies[-1] * 1000:.0f} ms after the waiter left")
        print(f"median {statistics.median(latencies) * 1000:.0f} ms, max {max(latencies) * 1000:.0f} ms "
              f"(bound: one check interval, {args.check * 1000:.0f} ms, plus a read)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
