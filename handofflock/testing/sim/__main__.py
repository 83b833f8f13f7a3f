"""``python -m handofflock.testing.sim``: run the simulation over many seeds, replay one, or model-check the protocol.

    python -m handofflock.testing.sim --seeds 2000        # N seeds, K violations; a coverage line; exit 1 if K > 0
    python -m handofflock.testing.sim --seed 1234 --trace # replay one seed with its trace
    python -m handofflock.testing.sim --list-bugs         # the bugs that can be planted
    python -m handofflock.testing.sim --plant-bug NAME    # must find it within the default seeds (exit 1 if not)
    python -m handofflock.testing.sim --model-check       # every interleaving of the pure protocol, 2 and 3 parties

A failing seed reproduces exactly from its number.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

from ...core.buggify import BUGS, PROTOCOL_BUGS

DEFAULT_SEEDS = 2000


def _simulate(a: argparse.Namespace) -> int:
    from .run import coverage_line, run_seed, run_seeds

    if a.seed is not None:
        out = run_seed(a.seed, bug=a.plant_bug, strict_suspend=a.strict_suspend, trace=400 if a.trace else 40)
        print(f"seed {a.seed}: {out.steps} steps, config {out.config}")
        if a.trace or out.violation:
            print("\n".join(out.trace))
        print(f"violation: {out.violation}" if out.violation else "no violation")
        print(coverage_line(out.coverage))
        return 1 if out.violation else 0
    started, totals = time.monotonic(), {}  # type: ignore[var-annotated]
    seeds = range(a.first, a.first + a.seeds)
    found = run_seeds(seeds, bug=a.plant_bug, stop_at_first=bool(a.plant_bug), strict_suspend=a.strict_suspend,
                      totals=totals)  # fmt: skip
    took = time.monotonic() - started
    for out in found[:5]:
        print(f"seed {out.seed}: {out.violation}")
        print("  " + "\n  ".join(out.trace[-12:]))
    ran = a.seeds if not (a.plant_bug and found) else found[0].seed - a.first + 1
    bug = f" with bug {a.plant_bug!r} planted" if a.plant_bug else ""
    print(f"{ran} seeds, {len(found)} violations{bug} ({took:.1f} s)")
    print(coverage_line(totals))
    return 1 if found else 0  # with a planted bug, exit 1 is the checker doing its job


def _model_check(a: argparse.Namespace) -> int:
    from .model import check_all

    return check_all(bug=a.plant_bug, long=a.long)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m handofflock.testing.sim",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--seeds", type=int, default=DEFAULT_SEEDS, help=f"how many seeds (default {DEFAULT_SEEDS})")
    p.add_argument("--first", type=int, default=0, help="first seed (default 0)")
    p.add_argument("--seed", type=int, help="replay this one seed")
    p.add_argument("--trace", action="store_true", help="with --seed: print the whole trace")
    p.add_argument("--list-bugs", action="store_true", help="name the bugs that can be planted")
    p.add_argument("--plant-bug", metavar="NAME", help="plant this bug; the run must find it")
    p.add_argument("--strict-suspend", action="store_true", help="a check() that passes after a suspend is a violation")
    p.add_argument("--model-check", action="store_true", help="check every interleaving of the pure protocol")
    p.add_argument("--long", action="store_true", help="with --model-check: go deeper (minutes)")
    p.add_argument("--log", action="store_true", help="show the library's log as it runs")
    a = p.parse_args(argv)
    if not a.log:  # a seed's faults make the library log plenty; the verdict is what matters here
        logging.getLogger("handofflock").setLevel(logging.CRITICAL)
    names = PROTOCOL_BUGS if a.model_check else tuple(BUGS)
    if a.list_bugs:
        for name in names:
            print(f"{name}: {BUGS[name]}")
        return 0
    if a.plant_bug and a.plant_bug not in names:
        p.error(f"unknown bug {a.plant_bug!r}; see --list-bugs" + (" --model-check" if a.model_check else ""))
    return _model_check(a) if a.model_check else _simulate(a)


if __name__ == "__main__":
    sys.exit(main())
