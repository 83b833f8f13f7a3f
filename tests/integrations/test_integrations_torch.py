"""Multi-rank jobs on real gloo process groups: every rank yields at the same step, resumes there, stops together on loss.

The jobs are real processes (torchrun, or env:// ranks started here) on loopback,
the lock a local file; the second job is a separate process asking for the lock.
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
from ranksutil import EXAMPLES, TORCHRUN, Lines, check_handoff_timeline, free_port, rank_env, stop_torchrun, torchrun

from handofflock import HandoffLock, LockLost, force_release
from handofflock.integrations import RankLock, any_of_two, local_agree

EXAMPLE = EXAMPLES / "torchrun_yield.py"


@pytest.mark.timeout(150)
@pytest.mark.parametrize("world", [2, 4])
def test_torchrun_ranks_yield_at_the_same_step_hand_off_and_resume_there(tmp_path, world):
    url = (tmp_path / "train.lock.json").as_uri()
    proc = torchrun(EXAMPLE, world, "--url", url, "--workdir", str(tmp_path), "--steps", "160", "--every", "3",
                    "--b-after", "1.0", "--b-work", "0.5", "--step-time", "0.02", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr[:6000]
    yielded = check_handoff_timeline(proc.stdout, world, 160, resume_offset=1)
    [saved] = tmp_path.glob(f"checkpoint-{yielded:06d}-token-*.pt")  # the holder's fencing token is in the name
    state = torch.load(saved)
    assert state["step"] == yielded and saved.name == f"checkpoint-{yielded:06d}-token-{state['token']}.pt"
    assert [s.shape for s in state["data"]] == [state["data"][0].shape] * world  # every rank's data order
    assert f"sees A's checkpoint of step {yielded};" in proc.stdout  # and B, a separate process, read it
    assert HandoffLock(url).status().owner_id is None  # A released at the end


@pytest.mark.timeout(90)
def test_when_the_holder_loses_the_lock_every_rank_stops_after_the_same_step(tmp_path):
    url = (tmp_path / "train.lock.json").as_uri()
    cmd = [*TORCHRUN, "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
           str(EXAMPLE), "--url", url, "--workdir", str(tmp_path), "--steps", "100000", "--every", "2",
           "--b-after", "-1", "--step-time", "0.02"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        lines = Lines(proc)
        lines.wait_for(r"step  20 ", timeout=60)
        force_release(url)  # an operator frees the lock under job A: its holder finds out at the next renewal
        proc.wait(timeout=40)
        out = lines.text(join=10)
    finally:
        stop_torchrun(proc)
    assert proc.returncode != 0
    lost = {int(r): int(s) for r, s in re.findall(r"A(\d+)\s+\S+\s+lost the lock after step (\d+)", out)}
    assert sorted(lost) == [0, 1] and len(set(lost.values())) == 1, out
    assert "the holder rank lost the lock" in out  # rank 1 never touched the lock: it learnt it from the vote
    assert HandoffLock(url).status().owner_id is None  # and nobody wrote it back


@pytest.mark.timeout(90)
def test_when_rank_0_dies_the_other_rank_exits_with_a_clear_error_instead_of_hanging(tmp_path):
    port, url = free_port(), (tmp_path / "train.lock.json").as_uri()
    args = [sys.executable, str(EXAMPLE), "--url", url, "--workdir", str(tmp_path), "--steps", "100000",
            "--every", "1", "--b-after", "-1", "--no-ddp", "--group-timeout", "10"]
    procs = [subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=rank_env(r, 2, port))
             for r in range(2)]
    try:
        Lines(procs[0]).wait_for(r"step  20 ", timeout=60)
        procs[0].send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        out, err = procs[1].communicate(timeout=40)
        took = time.monotonic() - killed_at
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert procs[1].returncode not in (0, None)
    assert "AgreementFailed" in err and "could not agree with the other ranks" in err, err[-3000:]
    assert took < 35, took


def test_a_job_of_one_rank_agrees_with_itself_and_yields_when_asked(tmp_path):
    lock = HandoffLock(tmp_path / "l.json", ttl=5.0)
    with RankLock(lock, local_agree, every=2, rank=0) as ranks:
        steps = ranks.steps(range(100))
        for step in steps:
            if step == 4:
                lock.request_release("operator")
        # asked during step 4; agreements fall before steps 0, 2, 4, 6: the loop ends before step 6
        assert steps.stopped and steps.last == 5 and steps.request.reason == "operator"
    assert not lock.is_held


def test_a_holder_that_lost_the_lock_stops_every_rank_with_lock_lost(tmp_path):
    url = tmp_path / "l.json"
    lock = HandoffLock(url, ttl=2.0, renew_interval=0.1)
    votes = []

    def agree(flags):  # this rank and one follower that votes nothing
        votes.append(tuple(flags))
        return local_agree(flags)

    ranks = RankLock(lock, any_of_two(lambda f: agree([f])[0]), rank=0)
    ranks.acquire()
    assert ranks.should_stop() is False
    force_release(str(url))  # an operator frees the lock under the holder: its next renewal finds out
    with pytest.raises(LockLost):
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            ranks.should_stop()
            time.sleep(0.05)
    assert votes[-2:] == [(False,), (True,)]  # (yield, lost): one collective per flag with any_of_two
    assert not ranks.held


def test_importing_handofflock_and_the_neutral_core_imports_no_framework():
    code = ("import sys, handofflock, handofflock.integrations; "
            "print(sorted(m for m in ('torch', 'lightning', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


def test_every_must_be_a_positive_number_of_steps(tmp_path):
    from handofflock import ConfigurationError

    for bad in (0, -1, 1.5, True):
        with pytest.raises(ConfigurationError, match="every must be a positive int"):
            RankLock(None, local_agree, every=bad)


def test_poll_must_be_a_finite_positive_number_of_seconds():
    """An infinite poll would leave every rank waiting in one collective for as long as the holder waits."""
    from handofflock import ConfigurationError

    for bad in (0, -1, float("inf"), float("nan"), True, "1"):
        with pytest.raises(ConfigurationError, match="poll must be a positive finite number of seconds"):
            RankLock(None, local_agree, poll=bad)


@pytest.mark.timeout(90)
def test_the_agreement_benchmark_runs_and_prints_its_numbers_with_their_conditions():
    out = subprocess.run([sys.executable, str(EXAMPLES.parent / "scripts" / "bench_ranks.py"), "--ranks", "2",
                          "--checks", "50", "--warmup", "5"], capture_output=True, text=True, timeout=80)
    assert out.returncode == 0, out.stderr[-3000:]
    assert re.search(r"gloo on 127\.0\.0\.1, \d+ cores, load average", out.stdout), out.stdout
    p50, p90, p99, mean, worst = map(float, re.search(r"^\s+2\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)$", out.stdout, re.M).groups())
    assert 0 < p50 <= p90 <= p99 <= worst and mean > 0
