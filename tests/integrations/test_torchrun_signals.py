"""torchrun jobs told to stop by the operating system: SIGTERM during training, SIGTERM or SIGKILL while waiting.

Real gloo process groups under torchrun (examples/torchrun_yield.py), a file lock.
torchrun forwards SIGTERM to its workers and SIGKILLs them 30 s later: that is
the bound every stop below must meet, on a loaded machine.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest
import torch
from ranksutil import EXAMPLES, ROOT, TORCHRUN, Lines, free_port

from handofflock import HandoffLock
from childpipes import next_line

EXAMPLE = EXAMPLES / "torchrun_yield.py"
TIMING = dict(ttl=10.0, waiter_check_interval=0.5, waiter_poll_interval=0.2)


def start_job(url: str, workdir, *args: str, rdzv_id: str | None = None) -> subprocess.Popen:
    cmd = [*TORCHRUN, "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
           *(["--rdzv-id", rdzv_id] if rdzv_id else []), str(EXAMPLE), "--url", url, "--workdir", str(workdir),
           "--every", "2", "--b-after", "-1", "--step-time", "0.02", *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                            env=dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1"), start_new_session=True)


def end(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def hold_elsewhere(url: str, owner: str = "job-B") -> subprocess.Popen:
    """Another job holding the lock in a process of its own until its stdin closes."""
    code = ("import sys; from handofflock import HandoffLock; "
            f"lock = HandoffLock({url!r}, owner_id={owner!r}, ttl=10.0, waiter_check_interval=0.5); "
            "lock.acquire(); print('held', flush=True); sys.stdin.read(); print('releasing', lock.release(), flush=True)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert next_line(proc).strip() == "held"
    return proc


def wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.1)


@pytest.mark.timeout(120)
def test_sigterm_to_torchrun_stops_every_rank_at_one_step_checkpoints_and_frees_the_lock_within_30_s(tmp_path):
    url = (tmp_path / "train.lock.json").as_uri()
    proc = start_job(url, tmp_path, "--steps", "100000")
    try:
        lines = Lines(proc)
        lines.wait_for(r"step  40 ", timeout=60)
        signalled = time.time()
        proc.send_signal(signal.SIGTERM)  # torchrun forwards it to both workers
        proc.wait(timeout=40)
        took = time.time() - signalled
        out = lines.text(join=10)
    finally:
        end(proc)
    stops = {int(r): (int(s), why) for r, s, why in
             re.findall(r"A(\d+)\s+\S+\s+stopped after step (\d+) \(agreed with all 2 ranks: (\w+, \w+)\)", out)}
    assert sorted(stops) == [0, 1] and len(set(stops.values())) == 1, out
    step, why = stops[0]
    assert why == "exit, SIGTERM", out  # the decision and its reason reached the follower too
    assert len(re.findall(r"A\d\s+\S+\s+exits \(SIGTERM\), status 143", out)) == 2, out
    [saved] = tmp_path.glob(f"checkpoint-{step:06d}-token-*.pt")
    assert saved.stat().st_mtime >= signalled - 0.01  # written after the signal
    assert torch.load(saved)["step"] == step
    assert HandoffLock(url).status().owner_id is None  # released, not held by a dead process
    assert took < 30, f"torchrun took {took:.1f} s to end after SIGTERM (SIGKILL comes at 30 s)"
    assert "took the lock" not in out and out.count("acquired the lock") == 1, out  # never taken again
    print(f"SIGTERM to all ranks exited: {took:.2f} s")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_a_job_stopped_while_waiting_for_its_turn_runs_to_completion_when_started_again(tmp_path, how):
    url = (tmp_path / "train.lock.json").as_uri()
    holder = hold_elsewhere(url)
    first = start_job(url, tmp_path, "--steps", "30", rdzv_id="job-A")
    try:
        wait_until(lambda: HandoffLock(url).status().waiter_id == "torchrun:job-A", 60, "job A waits")
        if how == "SIGTERM":
            signalled = time.time()
            first.send_signal(signal.SIGTERM)
            out = first.communicate(timeout=40)[0]
            took = time.time() - signalled
            assert took < 30, took
            assert len(re.findall(r"exits while waiting \(SIGTERM\), status 143", out)) == 2, out
            assert HandoffLock(url).status().waiter_id is None  # it gave its place back
        else:  # no chance to clean up: its slot stays behind until waiter_ttl, and the restart waits it out
            os.killpg(first.pid, signal.SIGKILL)
            first.wait(timeout=10)
            assert HandoffLock(url).status().waiter_id == "torchrun:job-A"
        dead = HandoffLock(url).status().waiter_instance  # the killed incarnation's slot (None after SIGTERM)
        again = start_job(url, tmp_path, "--steps", "30", rdzv_id="job-A")  # the same command
        try:
            lines = Lines(again)
            time.sleep(2.0)
            assert again.poll() is None, lines.text()  # waiting, not failed with LockContended
            # The restart is another instance under the same id: it takes the slot only once the killed
            # one's has ended (waiter_ttl, 10 s here), never from it while it may be alive.
            wait_until(lambda: (HandoffLock(url).status().waiter_id == "torchrun:job-A"
                                and HandoffLock(url).status().waiter_instance not in (None, dead)),
                       60, "restarted job waits")
            token_b = HandoffLock(url).status().token
            holder.stdin.close()  # job B is done: it hands the lock to the restarted job
            assert holder.wait(timeout=30) == 0
            assert again.wait(timeout=90) == 0, lines.text(join=10)
            out = lines.text(join=10)
        finally:
            end(again)
    finally:
        end(first)
        if holder.poll() is None:
            holder.kill()
    assert len(re.findall(r"A\d\s+\S+\s+finished all 30 steps", out)) == 2, out
    token_a = int(re.search(r"A\s+(\d+)\s+acquired the lock", out).group(1))
    assert token_a > token_b  # the fencing token rose across the incarnations
    assert HandoffLock(url).status().owner_id is None
