"""Running seeds: one world per seed, its verdict, its trace and what it explored (coverage)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass, field

from .bugs import planted
from .hub import Violation
from .world import Config, World

#: The keys every run reports, in this order; the issue's done-criterion wants each above zero.
COVERAGE_KEYS = (
    "handoffs", "twins", "waiter_pauses", "throttled", "suspends", "grouped_checks", "slow_reads", "async",
    "holder_pauses", "twin_overlaps", "stale_writes_refused", "suspend_awaiting_fix",
)  # fmt: skip


@dataclass
class Outcome:
    seed: int
    violation: str | None
    trace: list[str]
    steps: int
    config: Config | None = None
    coverage: dict[str, int] = field(default_factory=dict)


def run_seed(seed: int, *, bug: str | None = None, strict_suspend: bool = False, trace: int = 60) -> Outcome:
    """Run one seed (with a planted bug if named); return what it found."""
    with planted(bug) if bug else contextlib.nullcontext():
        world = World(seed)
        world.checker.strict_suspend = strict_suspend
        violation = None
        try:
            world.run()
        except Violation as exc:
            violation = str(exc)
        finally:  # what the run did, before close() unwinds what is left of it
            outcome = Outcome(
                seed, violation, list(world.hub.trace[-trace:]), world.hub.steps, world.config, world.coverage
            )
            world.close()
        return outcome


def run_seeds(
    seeds: Iterable[int], *, bug: str | None = None, stop_at_first: bool = False, strict_suspend: bool = False,
    totals: dict[str, int] | None = None,
) -> list[Outcome]:  # fmt: skip
    """Run many seeds; return those that broke an invariant. ``totals`` gathers their coverage."""
    found = []
    for seed in seeds:
        outcome = run_seed(seed, bug=bug, strict_suspend=strict_suspend)
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
