#!/usr/bin/env python3
"""The cost of one agreement (one 2-element MAX all-reduce) per check, on gloo over loopback.

    .venv/bin/python scripts/bench_ranks.py                 # 2 and 4 ranks, 2000 checks each
    .venv/bin/python scripts/bench_ranks.py --ranks 2 --checks 500

Each rank is a process (torch.multiprocessing spawn) in one gloo group on
127.0.0.1. Every rank times ``RankLock.should_stop()`` with ``every=1`` (so
each call is one all-reduce; rank 0 also runs ``lock.check()`` and reads
``release_requested`` on a held local-file lock), after a warm-up. Rank 0
prints the distribution of its per-check times and the conditions of the run.
Divide by ``every`` for the cost per training step.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, checks: int, warmup: int, lock_path: str, out: str) -> None:
    import torch.distributed as dist

    from handofflock.integrations.torch import rank_lock

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    ranks = rank_lock(Path(lock_path), every=1, poll=0.2, ttl=30.0)
    ranks.acquire()
    for _ in range(warmup):
        ranks.should_stop()
    times = []
    for _ in range(checks):
        t0 = time.perf_counter()
        ranks.should_stop()
        times.append(time.perf_counter() - t0)
    ranks.release()
    if rank == 0:
        Path(out).write_text("\n".join(f"{t:.9f}" for t in times))
    dist.destroy_process_group()


def measure(world: int, checks: int, warmup: int) -> list[float]:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "times.txt")
        mp.spawn(_worker, args=(world, _free_port(), checks, warmup, os.path.join(tmp, "lock.json"), out),
                 nprocs=world, join=True)
        return [float(line) for line in Path(out).read_text().split()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--checks", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=100)
    args = parser.parse_args(argv)
    import torch

    load = os.getloadavg()
    print(f"# agreement cost per check: torch {torch.__version__}, gloo on 127.0.0.1, {os.cpu_count()} cores, "
          f"load average {load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f} at start, Python {platform.python_version()}, "
          f"{args.checks} timed checks after {args.warmup} warm-up, every=1, rank 0's clock")
    print(f"{'ranks':>5}  {'p50 us':>8}  {'p90 us':>8}  {'p99 us':>8}  {'mean us':>8}  {'max us':>8}")
    for world in args.ranks:
        times = sorted(t * 1e6 for t in measure(world, args.checks, args.warmup))
        q = lambda p: times[min(len(times) - 1, int(p * len(times)))]  # noqa: E731
        print(f"{world:>5}  {q(0.5):8.0f}  {q(0.9):8.0f}  {q(0.99):8.0f}  {statistics.fmean(times):8.0f}  {times[-1]:8.0f}",
              flush=True)
    load = os.getloadavg()
    print(f"# load average {load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f} at end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
