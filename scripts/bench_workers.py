#!/usr/bin/env python3
"""Worker pools on one lock: holds, starvation and overhead for 2, 4 and 8 asking workers.

    .venv/bin/python scripts/bench_workers.py                 # 2, 4 and 8 workers, file:// and the GCS emulator
    .venv/bin/python scripts/bench_workers.py --quick         # 2 and 4 workers, file:// only
    .venv/bin/python scripts/bench_workers.py --min-hold 0    # also a row without the minimum hold

Each worker is a process of its own with two or three jobs of ``--job`` seconds (the worker's index
decides which), and runs the loop a worker pool writes::

    while jobs:
        with HandoffLock(url).acquire(timeout=120):      # asks the holder, as every worker does
            for job in lock.steps(jobs):                  # stops early if asked to yield
                work(job); jobs.remove(job)

Printed per row, all measured in this run: holds (in all, and the most by one worker), the jobs done
(each exactly once, or the row says not), starvation (the longest any worker waited from wanting the
lock to holding it), the total work (jobs x job seconds), the wall time from the first worker's start
to the last one's end, the overhead (wall - work) and wall / work. Holds that overlapped in time are
counted too: any is a mutual-exclusion failure. The store runs at its default pacing (GCS: one write
per second per object).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import platform
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

WORKER = r"""
import json, sys, time
from handofflock import HandoffLock
url, name, jobs, job_s, min_hold, out = sys.argv[1:7]
jobs, job_s = int(jobs), float(job_s)
kw = {} if min_hold == "default" else {"min_hold": float(min_hold)}
lock = HandoffLock(url, label=name, **kw)
todo = [f"{name}-job{i}" for i in range(jobs)]
with open(out, "a") as log:
    def note(event, **fields):
        log.write(json.dumps({"worker": name, "event": event, "t": time.time(), **fields}) + "\n"); log.flush()
    note("start")
    while todo:
        note("want")
        with lock.acquire(timeout=120):
            note("hold", token=lock.token)
            for job in lock.steps(list(todo)):
                time.sleep(job_s)
                todo.remove(job)
                note("done", job=job)
            note("release")
    note("end")
"""


def row(url: str, workers: int, job_s: float, min_hold: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="handofflock-workers-") as tmp:
        out = os.path.join(tmp, "events.jsonl")
        env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", WORKER, url, f"w{i}", str(2 + i % 2), str(job_s), min_hold, out], env=env
            )
            for i in range(workers)
        ]
        codes = [p.wait(timeout=600) for p in procs]
        events = [json.loads(line) for line in Path(out).read_text().splitlines()]
    by: dict[str, list[dict[str, Any]]] = {}
    for e in events:
        by.setdefault(e["worker"], []).append(e)
    holds, starved, done = {}, 0.0, []
    intervals = []
    for name, evs in by.items():
        holds[name] = sum(1 for e in evs if e["event"] == "hold")
        wanted = start = None
        for e in evs:
            if e["event"] == "want":
                wanted = e["t"]
            elif e["event"] == "hold" and wanted is not None:
                starved = max(starved, e["t"] - wanted)
                start = e["t"]
            elif e["event"] == "release" and start is not None:
                intervals.append((start, e["t"]))
            elif e["event"] == "done":
                done.append(e["job"])
    intervals.sort()
    overlaps = sum(1 for (_, end), (start, _) in itertools.pairwise(intervals) if start < end)
    jobs = sum(2 + i % 2 for i in range(workers))
    work = jobs * job_s
    wall = max(e["t"] for e in events) - min(e["t"] for e in events if e["event"] == "start")
    return {
        "workers": workers,
        "min_hold": min_hold,
        "exit_codes": codes,
        "holds": sum(holds.values()),
        "most_holds_by_one": max(holds.values()),
        "jobs": jobs,
        "jobs_done": len(done),
        "each_job_once": sorted(done) == sorted(set(done)) and len(done) == jobs,
        "starvation_s": round(starved, 2),
        "work_s": work,
        "wall_s": round(wall, 2),
        "overhead_s": round(wall - work, 2),
        "wall_per_work": round(wall / work, 2),
        "overlapping_holds": overlaps,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 and 4 workers on file:// only")
    parser.add_argument("--job", type=float, default=1.0, help="seconds per job (default 1)")
    parser.add_argument("--min-hold", default=None, help="also run each row with this min_hold (e.g. 0)")
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    args = parser.parse_args(argv)
    counts = (2, 4) if args.quick else (2, 4, 8)
    holds = ["default"] + ([args.min_hold] if args.min_hold is not None else [])
    rows: list[dict[str, Any]] = []
    print(
        f"worker pools: Python {platform.python_version()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}; "
        f"{args.job:g} s jobs, 2 or 3 per worker; each worker a process; default store pacing",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="handofflock-bench-") as tmp, contextlib.ExitStack() as stack:
        stores = [("file", lambda: f"file://{tmp}/{uuid.uuid4().hex[:8]}.json")]
        if not args.quick:
            from handofflock.testing import FakeGCSServer

            server = stack.enter_context(FakeGCSServer())
            stack.enter_context(server.env())
            server.create_bucket("handofflock-bench")
            stores.append(("gcs", lambda: f"gs://handofflock-bench/{uuid.uuid4().hex[:8]}.json"))
        print(
            f"{'store':<6}{'workers':>8}{'min_hold':>10}{'holds':>7}{'most/1':>7}{'jobs':>9}{'once':>6}"
            f"{'starved s':>11}{'work s':>8}{'wall s':>8}{'overhead s':>12}{'wall/work':>11}{'overlaps':>10}"
        )
        for store, url in stores:
            for n in counts:
                for mh in holds:
                    r = {"store": store, **row(url(), n, args.job, mh)}
                    rows.append(r)
                    print(
                        f"{store:<6}{n:>8}{mh:>10}{r['holds']:>7}{r['most_holds_by_one']:>7}"
                        f"{r['jobs_done']:>4}/{r['jobs']:<4}{'yes' if r['each_job_once'] else 'NO':>6}"
                        f"{r['starvation_s']:>11.2f}{r['work_s']:>8.1f}{r['wall_s']:>8.2f}{r['overhead_s']:>12.2f}"
                        f"{r['wall_per_work']:>11.2f}{r['overlapping_holds']:>10}",
                        flush=True,
                    )
    print(f"load at end {os.getloadavg()[0]:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    bad = [r for r in rows if r["overlapping_holds"] or not r["each_job_once"] or any(r["exit_codes"])]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
