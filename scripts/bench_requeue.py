#!/usr/bin/env python3
"""Two requeue loops that both ask for one lock: handoffs per hour and training seconds per turn.

    .venv/bin/python scripts/bench_requeue.py                    # 120 s, the default minimum hold
    .venv/bin/python scripts/bench_requeue.py --min-hold 0       # the same without a minimum hold
    .venv/bin/python scripts/bench_requeue.py --seconds 60 --restart 2

Each job is what a scheduler requeue loop runs (Slurm ``--requeue``, a Kubernetes Job's restarts):
a process starts (``--restart`` seconds of scheduling and start-up), asks for the lock (the
default ``acquire()``, which asks the holder to yield), trains in steps of ``--step`` seconds until
it is asked to stop (``lock.steps``), checkpoints (``--checkpoint`` seconds), releases (handing the
lock to the other job) and exits 75; its loop starts it again. Turns still going when the run ends
are not counted. Printed, all measured in this run:
turns, handoffs per hour, training seconds per turn (min, median, max) and the share of the
wall time spent training. Default store pacing, file:// lock, one process per job incarnation.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

JOB = r"""
import itertools, json, sys, time
from handofflock import HandoffLock
url, name, step, checkpoint, min_hold, out = sys.argv[1:7]
kw = {} if min_hold == "default" else {"min_hold": float(min_hold)}
lock = HandoffLock(url, owner_id=name, label=name, **kw)
with lock.acquire():
    start = time.time()
    for _ in lock.steps(itertools.count()):
        time.sleep(float(step))
    trained = time.time() - start
    time.sleep(float(checkpoint))
with open(out, "a") as f:
    f.write(json.dumps({"job": name, "start": start, "trained": trained}) + "\n")
sys.exit(75)
"""


def loop(url: str, name: str, args: argparse.Namespace, out: str, until: float) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    while time.monotonic() < until:
        time.sleep(args.restart)
        job = [sys.executable, "-c", JOB, url, name, str(args.step), str(args.checkpoint), args.min_hold, out]
        proc = subprocess.Popen(job, env=env)
        while proc.poll() is None:
            if time.monotonic() > until:  # the run is over: a turn still going is not counted
                proc.kill()
            time.sleep(0.1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=120.0, help="how long both loops run (default 120)")
    parser.add_argument("--restart", type=float, default=3.0, help="scheduling and start-up seconds per restart")
    parser.add_argument("--step", type=float, default=0.5, help="seconds per training step (default 0.5)")
    parser.add_argument("--checkpoint", type=float, default=1.0, help="seconds per checkpoint (default 1)")
    parser.add_argument("--min-hold", default="default", help="the jobs' min_hold (default: the library's)")
    args = parser.parse_args(argv)
    print(f"two requeue loops, {args.seconds:g} s: Python {platform.python_version()}, {os.cpu_count()} CPUs, "
          f"load {os.getloadavg()[0]:.2f}; restart {args.restart:g} s, step {args.step:g} s, "
          f"checkpoint {args.checkpoint:g} s, min_hold {args.min_hold}; file:// lock, default pacing", flush=True)
    with tempfile.TemporaryDirectory(prefix="handofflock-requeue-") as tmp:
        url, out = f"file://{tmp}/gpu.json", os.path.join(tmp, "turns.jsonl")
        Path(out).touch()
        began = time.monotonic()
        until = began + args.seconds
        loops = [threading.Thread(target=loop, args=(url, n, args, out, until)) for n in ("job-a", "job-b")]
        for t in loops:
            t.start()
        for t in loops:
            t.join()
        wall = min(time.monotonic() - began, args.seconds)  # turns end within the run's window
        turns = [json.loads(line) for line in Path(out).read_text().splitlines()]
    trained = [t["trained"] for t in turns]
    if not trained:
        print("no turn finished")
        return 1
    print(f"turns {len(turns)} in {wall:.0f} s: {len(turns) / wall * 3600:.0f} handoffs per hour; training per turn "
          f"min {min(trained):.1f} s, median {statistics.median(trained):.1f} s, max {max(trained):.1f} s; "
          f"training {sum(trained) / wall:.0%} of the wall time")
    return 0


if __name__ == "__main__":
    sys.exit(main())
