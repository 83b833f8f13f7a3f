"""``python -m handofflock.testing.sim``: run the simulation over many seeds, replay one, or model-check the protocol.

    python -m handofflock.testing.sim --seeds 2000        # N seeds, K violations; a coverage line; exit 1 if K > 0
    python -m handofflock.testing.sim --seed 1234 --trace # replay one seed with its trace
    python -m handofflock.testing.sim --list-bugs         # the bugs that can be planted
    python -m handofflock.testing.sim --plant-bug NAME    # must find it within the default seeds (exit 1 if not)
    python -m handofflock.testing.sim --model-check       # every interleaving of the pure protocol, 2 and 3 parties

A failing seed reproduces exactly from its number: one world per seed, its verdict, its trace and what it
explored (coverage).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import time
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ...core.errors import StoreUnreachableWarning
from .bugs import BUGS, PROTOCOL_BUGS, planted
from .model import check_all

if TYPE_CHECKING:
    from .world import Config

DEFAULT_SEEDS = 2000
#: The keys every run reports, in this order; the issue's done-criterion wants each above zero.
COVERAGE_KEYS = (
    "handoffs", "twins", "waiter_pauses", "throttled", "suspends", "grouped_checks", "slow_reads", "async",
    "holder_pauses", "stale_writes_refused", "late_commits",
)  # fmt: skip


@dataclass
class Outcome:
    seed: int
    violation: str | None
    trace: list[str]
    steps: int
    config: Config | None = None
    coverage: dict[str, int] = field(default_factory=dict)


def run_seed(
    seed: int, *, bug: str | None = None, trace: int = 60, late_commits: bool = True, ttl_spread: bool = True
) -> Outcome:
    """Run one seed (with a planted bug if named); return what it found. ``late_commits=False``: the seed's
    world as it was before the store had late commits; ``ttl_spread=False``: before parties had ttls of
    their own (what a regression test of an older seed replays)."""
    from .checker import swallowed
    from .hub import Violation  # greenlet: imported only to run a world (not for --list-bugs, --model-check)
    from .world import World

    with planted(bug) if bug else contextlib.nullcontext(), swallowed() as caught:
        world = World(seed, late_commits=late_commits, ttl_spread=ttl_spread)
        violation = None
        try:
            world.run()
            if caught:  # judged once the world's own invariants have held
                raise Violation(f"the library caught and logged {caught[0]} ({len(caught)} in all)")
        except Violation as exc:
            violation = str(exc)
        finally:  # what the run did, before close() unwinds what is left of it
            outcome = Outcome(
                seed,
                violation,
                list(world.hub.trace[-trace:]),
                world.hub.steps,
                world.config,
                dict(world.checker.counts),
            )
            world.close()
        return outcome


def run_seeds(
    seeds: Iterable[int], *, bug: str | None = None, stop_at_first: bool = False, totals: dict[str, int] | None = None,
) -> list[Outcome]:  # fmt: skip
    """Run many seeds; return those that broke an invariant. ``totals`` gathers their coverage."""
    found = []
    for seed in seeds:
        outcome = run_seed(seed, bug=bug)
        if totals is not None:
            for k, v in outcome.coverage.items():
                totals[k] = totals.get(k, 0) + v
        if outcome.violation:
            found.append(outcome)
            if stop_at_first:
                break
    return found


def coverage_line(totals: dict[str, int]) -> str:
    """``coverage: handoffs=N twins=N ...``: one line, so a run that explores nothing cannot pass quietly."""
    t = dict(totals)
    t["grouped_checks"] = t.pop("listings", 0)
    keys = list(COVERAGE_KEYS) + sorted(k for k in t if k not in COVERAGE_KEYS)
    return "coverage: " + " ".join(f"{k}={t.get(k, 0)}" for k in keys)


def _simulate(a: argparse.Namespace) -> int:
    if a.seed is not None:
        out = run_seed(a.seed, bug=a.plant_bug, trace=400 if a.trace else 40)
        print(f"seed {a.seed}: {out.steps} steps, config {out.config}")
        if a.trace or out.violation:
            print("\n".join(out.trace))
        print(f"violation: {out.violation}" if out.violation else "no violation")
        print(coverage_line(out.coverage))
        return 1 if out.violation else 0
    started, totals = time.monotonic(), {}  # type: ignore[var-annotated]
    seeds = range(a.first, a.first + a.seeds)
    found = run_seeds(seeds, bug=a.plant_bug, stop_at_first=bool(a.plant_bug), totals=totals)
    took = time.monotonic() - started
    for out in found[:5]:
        print(f"seed {out.seed}: {out.violation}")
        print("  " + "\n  ".join(out.trace[-12:]))
    ran = a.seeds if not (a.plant_bug and found) else found[0].seed - a.first + 1
    bug = f" with bug {a.plant_bug!r} planted" if a.plant_bug else ""
    print(f"{ran} seeds, {len(found)} violations{bug} ({took:.1f} s)")
    print(coverage_line(totals))
    return 1 if found else 0  # with a planted bug, exit 1 is the checker doing its job


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
    p.add_argument("--model-check", action="store_true", help="check every interleaving of the pure protocol")
    p.add_argument("--long", action="store_true", help="with --model-check: go deeper (minutes)")
    p.add_argument("--log", action="store_true", help="show the library's log as it runs")
    a = p.parse_args(argv)
    if not a.log:  # a seed's faults make the library log (and warn) plenty; the verdict is what matters here
        logging.getLogger("handofflock").setLevel(logging.CRITICAL)
        warnings.simplefilter("ignore", StoreUnreachableWarning)
    names = PROTOCOL_BUGS if a.model_check else tuple(BUGS)
    if a.list_bugs:
        for name in names:
            print(f"{name}: {BUGS[name]}")
        return 0
    if a.plant_bug and a.plant_bug not in names:
        p.error(f"unknown bug {a.plant_bug!r}; see --list-bugs" + (" --model-check" if a.model_check else ""))
    return check_all(bug=a.plant_bug, long=a.long) if a.model_check else _simulate(a)


if __name__ == "__main__":
    sys.exit(main())
