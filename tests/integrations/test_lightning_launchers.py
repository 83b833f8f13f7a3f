"""Lightning as users launch it: `python train.py` with devices=2 (Lightning's own launcher), and a long validation.

Real Lightning, DDP on gloo, 2 CPU ranks, a file lock (tests/integrations/lightning_job.py).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from ranksutil import ROOT, TORCHRUN, Lines, free_port

from handofflock import HandoffLock

JOB = Path(__file__).resolve().parent / "lightning_job.py"
ENV = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))


def end(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)  # Lightning's rank 1 and torchrun's workers are in the session
        proc.wait()


@pytest.mark.timeout(120)
def test_python_train_py_with_two_devices_takes_the_lock_once_and_does_not_hang(tmp_path):
    url = (tmp_path / "l.json").as_uri()
    # No RANK, no process group: Lightning runs this file again for rank 1 from inside rank 0's fit.
    proc = subprocess.Popen([sys.executable, str(JOB), url, str(tmp_path), "--strategy", "ddp"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=ENV, start_new_session=True)
    try:
        out = proc.communicate(timeout=90)[0]  # before: rank 1 queued behind rank 0 for the lock, forever
    finally:
        end(proc)
    assert proc.returncode == 0, out
    assert "during fit: owner job-A waiter None" in out, out  # one holder; rank 1 never asked for the lock
    assert re.search(r"rank 0 holder: \d+ agreements", out) and re.search(r"rank 1 follower: \d+ agreements", out), out
    assert len(re.findall(r"rank \d finished at step 6", out)) == 2, out
    assert HandoffLock(url).status().owner_id is None


@pytest.mark.timeout(150)
def test_sigterm_during_a_long_validation_stops_every_rank_within_a_few_validation_batches_with_a_checkpoint(tmp_path):
    url = (tmp_path / "l.json").as_uri()
    cmd = [*TORCHRUN, "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(JOB),
           url, str(tmp_path), "--strategy", "counting", "--steps", "100000", "--val-batches", "400", "--val-time", "0.05"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=ENV,
                            start_new_session=True)
    try:
        lines = Lines(proc)
        # 400 batches of 0.05 s: 20 s of validation left, room for torchrun to pass the signal on late under load
        lines.wait_for(r"rank 0 val batch 10\b", timeout=90)
        signalled = time.time()
        proc.send_signal(signal.SIGTERM)  # torchrun forwards it to both workers
        proc.wait(timeout=40)
        took = time.time() - signalled
        out = lines.text(join=10)
    finally:
        end(proc)
    # Rank 0's validation batches up to its stop, and whether it had heard the signal by then. torchrun passes
    # the signal on when it gets to it (seconds later on a loaded machine): count from when rank 0 heard it.
    before_stop = out[: out.index("rank 0 stopped")]
    ran = [(int(b), bool(h)) for b, h in re.findall(r"rank 0 val batch (\d+)( heard)?", before_stop)]
    # No batch line after hearing it: it came after the last batch printed, and the stop followed that batch.
    heard = [i for i, (_, h) in enumerate(ran) if h]
    seen, after_heard = ran[-1][0], len(ran) - heard[0] if heard else 0
    assert seen < 399, f"the validation ran to its end: the stop did not come inside it: {out}"
    stops = {int(r): (int(s), int(v), why) for r, s, v, why in
             re.findall(r"rank (\d) stopped after step (\d+) val batch (\d+) \((\w+, \w+)\)", out)}
    assert sorted(stops) == [0, 1] and len(set(stops.values())) == 1, out  # every rank at one point
    step, val_batch, why = stops[0]
    assert why == "exit, SIGTERM", out
    # The stop ends the validation loop after the batch where the ranks agreed: within a few batches of the signal.
    assert val_batch == seen and after_heard <= 20, f"stopped at val batch {val_batch}, {after_heard} after the signal: {out}"
    [saved] = tmp_path.glob(f"handoff-token*-step{step}.ckpt")  # the yield checkpoint's name carries the token
    ckpt = torch.load(saved, weights_only=False)
    assert ckpt["global_step"] == step and ckpt["handofflock"]["decision"] == {"action": "exit", "cause": "SIGTERM"}
    assert saved.stat().st_mtime >= signalled - 0.01  # written after the signal
    assert HandoffLock(url).status().owner_id is None
    assert took < 30, took
    # The agreements during fit went through Lightning's strategy (its reduce, MAX), not around it.
    through = [(int(a), int(s)) for a, s in re.findall(r"rank \d \w+: (\d+) agreements, (\d+) through the strategy", out)]
    assert len(through) == 2 and all(s >= val_batch and a - s <= 1 for a, s in through), out
    print(f"SIGTERM during validation: stopped {val_batch - 10} validation batches later, {took:.2f} s")
