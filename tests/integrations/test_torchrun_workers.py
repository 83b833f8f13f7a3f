"""Jobs whose DataLoaders have worker processes, told to stop the ways real launchers tell them.

torchrun's shutdown signals each rank's whole process group (its DataLoader
workers too); Slurm signals every process of the step; SIGUSR1 kills torchrun
itself (its agent does not handle it), leaving the ranks in sessions of their
own. In each case every rank must stop after one agreed step, checkpoint after
the signal, and free the lock, inside torchrun's 30 s, with no process left behind.
Real gloo process groups under torchrun, 2 ranks with 2 workers each, the examples' jobs.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from ranksutil import EXAMPLES, ROOT, TORCHRUN, Lines, free_port

from childpipes import next_line
from handofflock import HandoffLock

EXAMPLE = {"torch": "torchrun_yield.py", "lightning": "lightning_yield.py", "hf": "hf_trainer_yield.py"}
STEP = re.compile(r"A(\d+)\s+\S+\s+stopped after step (\d+) \(agreed with all 2 ranks: (\w+, \w+)\)")


def start_job(framework: str, tmp_path: Path) -> tuple[subprocess.Popen, Lines, str]:
    url = (tmp_path / "train.lock.json").as_uri()
    cmd = [*TORCHRUN, "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
           str(EXAMPLES / EXAMPLE[framework]), "--url", url, "--workdir", str(tmp_path), "--steps", "100000",
           "--every", "2", "--b-after", "-1", "--step-time", "0.02", "--num-workers", "2"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                            env=dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1"), start_new_session=True)
    return proc, Lines(proc), url


def job_processes(proc: subprocess.Popen) -> tuple[list[psutil.Process], list[psutil.Process]]:
    """(the ranks, their DataLoader workers) now running under torchrun ``proc``."""
    ranks = psutil.Process(proc.pid).children()
    workers = [w for r in ranks for w in r.children()]
    return ranks, workers


def checkpoint_after(framework: str, tmp_path: Path, step: int) -> float:
    """When the checkpoint of ``step`` was written (asserting it holds that step)."""
    if framework == "torch":
        [saved] = tmp_path.glob(f"checkpoint-{step:06d}-token-*.pt")
        assert torch.load(saved)["step"] == step
        return saved.stat().st_mtime
    if framework == "lightning":
        [saved] = tmp_path.glob(f"handoff-token*-step{step}.ckpt")
        assert torch.load(saved, weights_only=False)["global_step"] == step
        return saved.stat().st_mtime
    [saved] = (tmp_path / "hf").glob(f"checkpoint-0{step}-token*")
    assert json.loads((saved / "trainer_state.json").read_text())["global_step"] == step
    return (saved / "model.safetensors").stat().st_mtime


def gone(processes: list[psutil.Process], within: float) -> list[psutil.Process]:
    """Those of ``processes`` still running after ``within`` seconds (zombies count as gone)."""
    _, alive = psutil.wait_procs(processes, timeout=within)
    return [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]


def stop_and_check(framework: str, tmp_path: Path, send, *, cause: str, status: int) -> float:
    proc, lines, url = start_job(framework, tmp_path)
    ranks: list[psutil.Process] = []
    workers: list[psutil.Process] = []
    try:
        lines.wait_for(r"step  40 ", timeout=90)
        ranks, workers = job_processes(proc)
        assert len(ranks) == 2 and len(workers) >= 2, (ranks, workers)  # the workers are running
        signalled = time.time()
        send(proc, ranks)
        lines.wait_for(r"A1\s+\S+\s+exits |is killed by signal", timeout=40)
        left = gone(ranks, within=max(0.5, 30 - (time.time() - signalled)))
        took = time.time() - signalled
        proc.wait(timeout=10)
        out = lines.text(join=10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for p in ranks + workers:  # an orphaned rank or worker, whatever happened
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
    assert "is killed by signal" not in out, out
    assert not left, f"still running {took:.1f} s after the signal: {left}\n{out}"
    stops = {int(r): (int(s), why) for r, s, why in STEP.findall(out)}
    assert sorted(stops) == [0, 1] and len(set(stops.values())) == 1, out  # every rank at one step
    step, why = stops[0]
    assert why == f"exit, {cause}", out
    assert len(re.findall(rf"A\d\s+\S+\s+exits \({cause}\), status {status}", out)) == 2, out
    assert checkpoint_after(framework, tmp_path, step) >= signalled - 0.01  # written after the signal
    assert HandoffLock(url).status().owner_id is None  # released, not held by a dead process
    assert took < 30, f"the ranks took {took:.1f} s to end (torchrun's SIGKILL comes at 30 s)"
    assert not gone(workers, within=10), "a DataLoader worker outlived its rank"
    return took


def to_torchrun(proc: subprocess.Popen, ranks: list[psutil.Process]) -> None:
    """What torchrun does on SIGTERM: it signals each rank's process group (the rank and its workers)."""
    proc.send_signal(signal.SIGTERM)


def to_every_process(proc: subprocess.Popen, ranks: list[psutil.Process]) -> None:
    """What Slurm does: the signal reaches every process of the step at once, torchrun and each rank's group."""
    proc.send_signal(signal.SIGTERM)
    for rank in ranks:
        os.killpg(rank.pid, signal.SIGTERM)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("send", [to_torchrun, to_every_process], ids=["torchrun", "every_process"])
@pytest.mark.parametrize("framework", ["torch", "lightning", "hf"])
def test_sigterm_with_dataloader_workers_stops_every_rank_at_one_step_after_a_checkpoint_within_30_s(
    tmp_path, framework, send
):
    took = stop_and_check(framework, tmp_path, send, cause="SIGTERM", status=143)
    print(f"{framework}, SIGTERM {send.__name__}: every rank ended {took:.2f} s after the signal")


@pytest.mark.timeout(200)
def test_sigusr1_kills_torchrun_and_its_orphaned_ranks_stop_checkpoint_and_free_the_lock_within_30_s(tmp_path):
    def usr1(proc: subprocess.Popen, ranks: list[psutil.Process]) -> None:
        proc.send_signal(signal.SIGUSR1)  # torchrun dies of it at once; the ranks, in their own sessions, get nothing
        assert proc.wait(timeout=10) == -signal.SIGUSR1

    took = stop_and_check("torch", tmp_path, usr1, cause="launcher", status=75)
    print(f"SIGUSR1 to torchrun: the orphaned ranks ended {took:.2f} s after it")


WORKERS_JOB = """
import multiprocessing, sys, time, torch
from handofflock.integrations.torch import rank_lock, shield_worker
url, context = sys.argv[1], sys.argv[2]
ranks = rank_lock(url, owner_id="job", ttl=4.0)
ranks.acquire()
loader = torch.utils.data.DataLoader(range(100000), batch_size=None, num_workers=2, multiprocessing_context=context,
                                     worker_init_fn=shield_worker if context == "spawn" else None)
batches = iter(loader)
next(batches), next(batches)  # one from each worker: both are running the worker loop
print("workers", *(p.pid for p in multiprocessing.active_children()), flush=True)
sys.stdin.readline()  # the test signals the workers meanwhile
print("served", next(batches), next(batches), next(batches), flush=True)
ranks.release()
if context == "spawn":
    del batches  # a spawned worker shares nothing with its rank: shut it down before exiting
print("exiting", flush=True)
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_workers_of_a_rank_ignore_the_signals_and_never_hold_up_its_exit(tmp_path, context):
    url = (tmp_path / "l.json").as_uri()
    proc = subprocess.Popen([sys.executable, "-c", WORKERS_JOB, url, context], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        line = next_line(proc)
        assert line.startswith("workers "), line + proc.communicate(timeout=30)[1]
        workers = [psutil.Process(int(pid)) for pid in line.split()[1:]]
        assert len(workers) == 2
        for worker in workers:
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):  # torchrun's group, a terminal, Slurm
                worker.send_signal(sig)
        time.sleep(1.0)
        assert all(w.is_running() and w.status() != psutil.STATUS_ZOMBIE for w in workers)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert next_line(proc).startswith("served "), proc.communicate(timeout=30)[1]
        assert next_line(proc) == "exiting\n"
        exiting = time.monotonic()
        _, err = proc.communicate(timeout=30)
        took = time.monotonic() - exiting
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0 and "killed by signal" not in err and "exited unexpectedly" not in err, err
    # multiprocessing's exit hook joins its workers with no timeout: shielded workers that never ended would hold
    # the exit forever. 25 s, not less: a loaded 2-core machine took 17 s for torch's own teardown (suite run).
    assert took < 25, f"the exit waited {took:.1f} s for the workers"
    assert not gone(workers, within=10)
    assert HandoffLock(url).status().owner_id is None
