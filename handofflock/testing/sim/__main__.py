"""``python -m handofflock.testing.sim``: run the simulation over many seeds, replay one, or model-check the protocol.

    python -m handofflock.testing.sim --seeds 2000        # N seeds, K violations; a coverage line; exit 1 if K > 0
    python -m handofflock.testing.sim --long --jobs 2     # 100,000 seeds on 2 processes, with seeds per second
    python -m handofflock.testing.sim --long --ledger L   # the same, resumable: skips what L says ran on this tree
    python -m handofflock.testing.sim --seed 1234 --trace # replay one seed with its trace
    python -m handofflock.testing.sim --list-bugs         # the bugs that can be planted
    python -m handofflock.testing.sim --plant-bug NAME    # must find it within the default seeds (exit 1 if not)
    python -m handofflock.testing.sim --model-check       # every interleaving of the pure protocol, 2 and 3 parties

A failing seed reproduces exactly from its number: one world per seed, its verdict, its trace and what it
explored (coverage). Violations are grouped by signature (the rule broken, numbers and names left out, and
the kind of world), so a run of many seeds names each distinct failure once, with the seeds that show it.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import itertools
import logging
import platform
import re
import sys
import time
import warnings
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from ...core.errors import RenewalsBehindWarning, StoreUnreachableWarning
from .bugs import BUGS, PROTOCOL_BUGS, planted
from .model import check_all

if TYPE_CHECKING:
    from .world import Config

DEFAULT_SEEDS = 2000
LONG_SEEDS = 100_000
#: How often a long run says how far it got.
PROGRESS_EVERY = 1000
#: The keys every run reports, in this order; the issue's done-criterion wants each above zero.
COVERAGE_KEYS = (
    "handoffs", "twins", "waiter_pauses", "throttled", "suspends", "grouped_checks", "slow_reads", "async",
    "holder_pauses", "stale_writes_refused", "late_commits", "slow_writes", "cut_after_applied", "old_records",
    "drifting_clocks", "clock_steps", "boottime_suspends",
)  # fmt: skip


@dataclass
class Outcome:
    seed: int
    violation: str | None
    trace: list[str]
    steps: int
    config: Config | None = None
    coverage: dict[str, int] = field(default_factory=dict)

    @property
    def signature(self) -> str:
        """The violation's rule (its words, numbers and party names left out) and the kind of world."""
        rule = re.sub(r"\bp\d+\b", "pN", self.violation or "")
        rule = re.sub(r"-?\d+(\.\d+)?(e-?\d+)?", "N", rule)
        c = self.config
        kind = "?" if c is None else "gentle" if c.gentle else "gcs" if c.spacing else "fast"
        return f"[{kind}] {rule}"


def run_seed(
    seed: int,
    *,
    bug: str | None = None,
    trace: int = 60,
    late_commits: bool = True,
    ttl_spread: bool = True,
    swarm: bool = True,
    aims: bool = True,
    by_protocol: bool = True,
) -> Outcome:
    """Run one seed (with a planted bug if named); return what it found. ``late_commits=False``: the seed's
    world as it was before the store had late commits; ``ttl_spread=False``: before parties had ttls of
    their own; ``swarm=False``: before the swarm's choices (what a regression test of an older seed replays);
    ``aims=False``: before tries that may not wait for the slot and 429s aimed at a gentle world's holder;
    ``by_protocol=False``: writes not judged against the protocol (a plant's own symptom, without it)."""
    from .checker import swallowed
    from .hub import Violation  # greenlet: imported only to run a world (not for --list-bugs, --model-check)
    from .world import World

    with planted(bug) if bug else contextlib.nullcontext(), swallowed() as caught:
        world = World(
            seed, late_commits=late_commits, ttl_spread=ttl_spread, swarm=swarm, aims=aims, by_protocol=by_protocol
        )
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


def _quiet() -> None:
    """A seed's faults make the library log (and warn) plenty; the verdict is what matters here."""
    logging.getLogger("handofflock").setLevel(logging.CRITICAL)
    warnings.simplefilter("ignore", StoreUnreachableWarning)
    warnings.simplefilter("ignore", RenewalsBehindWarning)  # a slow simulated store, on purpose


def _outcomes(seeds: Iterable[int], bug: str | None, jobs: int) -> Iterator[Outcome]:
    """Each seed's outcome, in order: run here, or on ``jobs`` processes (quiet, as the run here is)."""
    if jobs <= 1:
        yield from (run_seed(seed, bug=bug) for seed in seeds)
        return
    pool = ProcessPoolExecutor(jobs, initializer=_quiet)
    try:
        yield from pool.map(_run_quietly, seeds, itertools.repeat(bug), chunksize=20)
    finally:  # a run that stops at its first violation leaves the rest
        pool.shutdown(cancel_futures=True)


def _run_quietly(seed: int, bug: str | None) -> Outcome:
    return run_seed(seed, bug=bug)


def tree_digest(root: Path | None = None) -> str:
    """A digest of the library's source (every ``.py`` under ``handofflock/``, by path and bytes): a seed's verdict
    holds for the tree it ran on, and a ledger counts only the seeds that ran on this one."""
    root = root or Path(__file__).resolve().parents[2]
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


@dataclass
class Ledger:
    """What a long run did, one JSON line per block of seeds, so that a run stopped (a session's end, a machine's
    time limit) goes on where it stopped, and runs on several machines add up: a block counts only for the tree
    it ran on (:func:`tree_digest`). A line: ``{"tree", "first", "end", "violations": [[seed, text], ...],
    "seconds", "python", "host"}`` for seeds ``first`` to ``end - 1``, each run to its end."""

    path: Path
    tree: str

    def lines(self) -> list[dict[str, Any]]:
        """This tree's lines (others' are kept in the file, and not counted); a line cut short is left out."""
        if not self.path.exists():
            return []
        out = []
        for raw in self.path.read_bytes().splitlines():
            with contextlib.suppress(orjson.JSONDecodeError):
                line = orjson.loads(raw)
                if isinstance(line, dict) and line.get("tree") == self.tree:
                    out.append(line)
        return out

    def done(self) -> set[int]:
        return {s for line in self.lines() for s in range(int(line["first"]), int(line["end"]))}

    def violations(self, seeds: range) -> list[tuple[int, str]]:
        return sorted((int(s), str(v)) for line in self.lines() for s, v in line["violations"] if int(s) in seeds)

    def add(self, first: int, end: int, violations: list[Outcome], seconds: float) -> None:
        line = {
            "tree": self.tree,
            "first": first,
            "end": end,
            "violations": [[o.seed, o.violation] for o in violations],
            "seconds": round(seconds, 1),
            "python": platform.python_version(),
            "host": platform.node(),
        }
        with self.path.open("a+b") as f:  # one write per line: a run killed mid-way leaves whole lines
            size = f.seek(0, 2)
            if size:
                f.seek(size - 1)
                if f.read(1) != b"\n":
                    f.write(b"\n")  # a line cut short (its run killed as it wrote) ends here, and stays unread
            f.write(orjson.dumps(line) + b"\n")


def run_seeds(
    seeds: Iterable[int],
    *,
    bug: str | None = None,
    stop_at_first: bool = False,
    totals: dict[str, int] | None = None,
    jobs: int = 1,
    progress: bool = False,
    ledger: Ledger | None = None,
) -> list[Outcome]:
    """Run many seeds; return those that broke an invariant. ``totals`` gathers their coverage; ``progress``
    prints a line every :data:`PROGRESS_EVERY` seeds, with seeds per second; ``ledger`` gets a line for each
    run of at most that many consecutive seeds, once each has run."""
    found: list[Outcome] = []
    started = block_started = time.monotonic()
    block: list[Outcome] = []  # the seeds since the ledger's last line, consecutive

    def write_block() -> None:
        nonlocal block_started
        if ledger is not None and block:
            now = time.monotonic()
            ledger.add(block[0].seed, block[-1].seed + 1, [o for o in block if o.violation], now - block_started)
            block_started = now
        block.clear()

    for n, outcome in enumerate(_outcomes(seeds, bug, jobs), 1):
        if block and (outcome.seed != block[-1].seed + 1 or len(block) >= PROGRESS_EVERY):
            write_block()
        block.append(outcome)
        if progress and n % PROGRESS_EVERY == 0:
            took = time.monotonic() - started
            print(f"{n} seeds, {len(found)} violations, {n / took:.2f} seeds/s", flush=True)
        if totals is not None:
            for k, v in outcome.coverage.items():
                totals[k] = totals.get(k, 0) + v
        if outcome.violation:
            found.append(outcome)
            if stop_at_first:
                break
    write_block()
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
    count = a.seeds if a.seeds is not None else LONG_SEEDS if a.long else DEFAULT_SEEDS
    seeds = whole = range(a.first, a.first + count)
    ledger = Ledger(Path(a.ledger), tree_digest()) if a.ledger else None
    if ledger is not None:
        done = ledger.done()
        seeds = [s for s in whole if s not in done]  # type: ignore[assignment]
        print(f"ledger {a.ledger}: tree {ledger.tree}, {count - len(seeds)} of seeds {a.first}-{whole[-1]} run")
        count = len(seeds)
    found = run_seeds(
        seeds,
        bug=a.plant_bug,
        stop_at_first=bool(a.plant_bug),
        totals=totals,
        jobs=a.jobs,
        progress=a.long,
        ledger=ledger,
    )
    took = time.monotonic() - started
    groups: dict[str, list[Outcome]] = {}
    for out in found:
        groups.setdefault(out.signature, []).append(out)
    for outs in groups.values():  # the first seed of each kind of failure, with its trace
        print(f"seed {outs[0].seed}: {outs[0].violation}")
        print("  " + "\n  ".join(outs[0].trace[-12:]))
    ran = count if not (a.plant_bug and found) else found[0].seed - a.first + 1
    bug = f" with bug {a.plant_bug!r} planted" if a.plant_bug else ""
    print(f"{ran} seeds, {len(found)} violations{bug} ({took:.1f} s, {ran / max(took, 1e-9):.2f} seeds/s)")
    if groups:
        print(f"{len(groups)} signatures:")
        for sig, outs in sorted(groups.items(), key=lambda g: -len(g[1])):
            more = ", ..." if len(outs) > 10 else ""
            print(f"  {len(outs)} x {sig}: seeds {', '.join(str(o.seed) for o in outs[:10])}{more}")
    print(coverage_line(totals))
    if ledger is not None:  # what the ledger says of the whole range, this run and earlier ones on this tree
        done, bad = ledger.done(), ledger.violations(whole)
        ran_all = sum(s in done for s in whole)
        print(
            f"ledger: {ran_all} of {len(whole)} seeds {whole[0]}-{whole[-1]} run on tree {ledger.tree}, "
            f"{len(bad)} violations" + "".join(f"\n  seed {s}: {v}" for s, v in bad)
        )
        return 1 if bad else 0
    return 1 if found else 0  # with a planted bug, exit 1 is the checker doing its job


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m handofflock.testing.sim",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--seeds", type=int, help=f"how many seeds (default {DEFAULT_SEEDS}; with --long, {LONG_SEEDS:,})")
    p.add_argument("--jobs", type=int, default=1, help="run the seeds on this many processes (default 1)")
    p.add_argument("--first", type=int, default=0, help="first seed (default 0)")
    p.add_argument("--seed", type=int, help="replay this one seed")
    p.add_argument("--trace", action="store_true", help="with --seed: print the whole trace")
    p.add_argument("--list-bugs", action="store_true", help="name the bugs that can be planted")
    p.add_argument("--plant-bug", metavar="NAME", help="plant this bug; the run must find it")
    p.add_argument("--model-check", action="store_true", help="check every interleaving of the pure protocol")
    p.add_argument(
        "--long",
        action="store_true",
        help=f"{LONG_SEEDS:,} seeds, saying how far it got with seeds per second; with --model-check: go deeper",
    )
    p.add_argument(
        "--ledger",
        metavar="PATH",
        help="append a line per 1,000 seeds run to PATH, and skip the seeds PATH says ran on this tree already",
    )
    p.add_argument("--log", action="store_true", help="show the library's log as it runs")
    a = p.parse_args(argv)
    if not a.log:
        _quiet()
    names = PROTOCOL_BUGS if a.model_check else tuple(BUGS)
    if a.list_bugs:
        for name in names:
            print(f"{name}: {BUGS[name]}")
        return 0
    if a.ledger and (a.plant_bug or a.model_check or a.seed is not None):
        p.error("--ledger counts the seeds a tree passes: not with --plant-bug, --model-check or --seed")
    if a.plant_bug and a.plant_bug not in names:
        p.error(f"unknown bug {a.plant_bug!r}; see --list-bugs" + (" --model-check" if a.model_check else ""))
    return check_all(bug=a.plant_bug, long=a.long) if a.model_check else _simulate(a)


if __name__ == "__main__":
    sys.exit(main())
