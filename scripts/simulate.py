#!/usr/bin/env python3
"""Run the deterministic simulation of the lock over many seeds (see tests/support/simulation.py).

    python scripts/simulate.py --seeds 2000          # N seeds, K violations; exit 1 if K > 0
    python scripts/simulate.py --seed 1234           # replay one seed, with its trace
    python scripts/simulate.py --list-bugs           # the bugs that can be planted
    python scripts/simulate.py --plant-bug NAME      # must find it within the default seeds (exit 1)

A failing seed reproduces exactly from its number.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))

import simulation  # noqa: E402

DEFAULT_SEEDS = 2000


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=DEFAULT_SEEDS, help=f"how many seeds (default {DEFAULT_SEEDS})")
    p.add_argument("--first", type=int, default=0, help="first seed (default 0)")
    p.add_argument("--seed", type=int, help="replay this one seed and print its trace")
    p.add_argument("--list-bugs", action="store_true", help="name the bugs that can be planted")
    p.add_argument("--plant-bug", metavar="NAME", help="plant this bug; the run must find it")
    p.add_argument("--log", action="store_true", help="show the library's log (lost locks, retries) as it runs")
    a = p.parse_args(argv)
    if not a.log:  # a seed's faults make the library log plenty; the verdict is what matters here
        logging.getLogger("handofflock").setLevel(logging.CRITICAL)
    if a.list_bugs:
        for name, make in simulation.BUGS.items():
            print(f"{name}: {(make.__doc__ or '').strip()}")
        return 0
    if a.plant_bug and a.plant_bug not in simulation.BUGS:
        p.error(f"unknown bug {a.plant_bug!r}; see --list-bugs")
    if a.seed is not None:
        out = simulation.run_seed(a.seed, bug=a.plant_bug)
        print(f"seed {a.seed}: {out.steps} steps, config {out.config}")
        print("\n".join(out.trace))
        print(f"violation: {out.violation}" if out.violation else "no violation")
        return 1 if out.violation else 0
    started = time.monotonic()
    seeds = range(a.first, a.first + a.seeds)
    found = simulation.run_seeds(seeds, bug=a.plant_bug, stop_at_first=bool(a.plant_bug))
    took = time.monotonic() - started
    for out in found[:5]:
        print(f"seed {out.seed}: {out.violation}")
        print("  " + "\n  ".join(out.trace[-12:]))
    ran = a.seeds if not (a.plant_bug and found) else found[0].seed - a.first + 1
    bug = f" with bug {a.plant_bug!r} planted" if a.plant_bug else ""
    print(f"{ran} seeds, {len(found)} violations{bug} ({took:.1f} s)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
