"""examples/async_worker.py: an asyncio worker hands over to a trio worker, which resumes at the next job."""

from __future__ import annotations

import re

import pytest
from jobsutil import runner_logic, shared_url  # noqa: F401
from test_examples import example, read_until

from handofflock import HandoffLock


@runner_logic  # the async lock on GCS across processes: tests/processes/test_aio_processes.py
@pytest.mark.timeout(90)
def test_async_worker_yields_at_a_job_boundary_and_the_next_worker_resumes_there(shared_url):
    # A's jobs leave B 6 s to start and ask; B, once it resumes, runs the rest quickly.
    common = ["--url", shared_url, "--jobs", "300", "--check-interval", "0.2"]
    a = example("async_worker.py", "--name", "A", *common, "--job-time", "0.02")
    seen_a = read_until(a, r"^A: got the lock")
    b = example("async_worker.py", "--name", "B", "--loop", "trio", *common, "--job-time", "0.002")
    out_a, err_a = a.communicate(timeout=60)
    out_a = "".join(seen_a) + out_a
    out_b, err_b = b.communicate(timeout=60)
    assert a.returncode == 0 and b.returncode == 0, err_a + err_b
    assert "A: B asked for the lock (waiter); finishing the job in hand" in out_a, out_a
    last_a = int(re.search(r"A: yielding after job (\d+)", out_a).group(1))
    token_a = int(re.search(r"A: got the lock, token (\d+); resuming at job 0", out_a).group(1))
    token_b, start_b = map(int, re.search(r"B: got the lock, token (\d+); resuming at job (\d+)", out_b).groups())
    assert start_b == last_a + 1 and token_b > token_a
    assert "B: finished all 300 jobs" in out_b and "B: released the lock" in out_b
    assert "heartbeat" in out_a  # the loop kept running other tasks
    assert HandoffLock(shared_url).status().owner_id is None
