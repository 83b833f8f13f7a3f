"""scripts/bench --quick runs, writes its JSON, and its request counts meet the targets.

Only what is deterministic is checked: the exit status, the JSON, and the
number of requests each operation makes (counted at the HTTP layer on GCS,
as storage calls on local). Latencies depend on the machine and are not
asserted here; docs/benchmarks.md shows a full run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: Operation -> the most requests it may cost (the brief's targets).
AT_MOST = {
    "acquire, object absent": 2,
    "acquire, lock free": 2,
    "acquire, lease expired": 2,
    "renew": 1,
    "release, no waiter": 1,
    "release, handing off": 1,
    "waiter poll": 1,
    "waiter takes the handed-off lock": 1,
    "waiter check, one lock": 1,
    "waiter check that notices the waiter": 1,
    "waiter check, 50 locks in one prefix": 1,
    "waiter check, 50 locks, one has a new waiter": 2,
    "status": 1,
}


#: ``scripts/bench --quick`` with each section's sample counts and windows cut to the least that still
#: runs every code path and prints a measured number (a few seconds instead of minutes).
SMALLER = """
import sys
sys.path.insert(0, sys.argv[1])
import bench.__main__ as bench

class Smaller(bench.Plan):
    def __init__(self, quick):
        super().__init__(quick)
        self.rtt_n, self.polls, self.handoffs, self.local_handoffs, self.notices = 5, (0.1,), 1, 1, 1
        self.hot_calls = 2_000
        self.scale_locks, self.scale_window = (1, 10), 1.0
        self.async_rows, self.async_window = (("local", "asyncio", 10, 1, 60.0, None),), 2.0
        # The handoff rows sleep out a poll or a lease: the naive lock polls every second, gcslock's lease is 1 s.
        self.compare = {**self.compare, "naive_poll": 1.0, "gcslock_lease": 1}

bench.Plan = Smaller
sys.exit(bench.main(sys.argv[2:]))
"""


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    env = {k: v for k, v in os.environ.items() if k != "STORAGE_EMULATOR_HOST"}  # it starts its own
    proc = subprocess.run(
        [sys.executable, "-c", SMALLER, str(ROOT / "scripts"), "--quick", "--json", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240,
    )
    return proc, out


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_quick_bench_exits_cleanly_and_writes_json(quick_run):
    proc, out = quick_run
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    results = json.loads(out.read_text())
    assert results["meta"]["mode"] == "quick"
    for section in ("rtt", "requests", "handoff", "notice", "hot_path_ns", "scale", "compare", "targets"):
        assert section in results, section
    for header in ("1. Requests per operation", "2. Handoff latency", "5. Scale", "6. What users would pick instead"):
        assert header in proc.stdout
    # The async row asks its holder at once (min_hold 0): its notice measures the waiter check, not the
    # library's default minimum hold of 30 s.
    (row,) = results["async"]
    assert row["handoffs_done"] == 1 and row["notice_p50_ms"] < 20_000, row


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend", ["gcs", "local", "s3"])
def test_every_operation_costs_at_most_its_target_in_requests(quick_run, backend):
    proc, out = quick_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    counts = json.loads(out.read_text())["requests"][backend]
    # An S3 listing has no generations: a grouped check that finds a changed lock reads its header first.
    at_most = {**AT_MOST, **({"waiter check, 50 locks, one has a new waiter": 3} if backend == "s3" else {})}
    over = {op: counts[op]["total"] for op, limit in at_most.items() if counts[op]["total"] > limit}
    assert over == {}
    assert counts["become the waiter"]["writes"] == 1
    assert counts["waiter check, 50 locks in one prefix"].get("list") == 1
    # Ours renews from the cached generation: one write, where read-then-write costs two.
    assert counts["renew"]["total"] == 1 and counts["seed-004 renew (read, then write)"]["total"] == 2


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_bench_flags_no_request_target_as_missed(quick_run):
    proc, out = quick_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    targets = json.loads(out.read_text())["targets"]
    missed = [t for t in targets if t["kind"] == "requests" and not t["met"]]
    assert missed == []
    assert any(t["kind"] == "requests" for t in targets)
