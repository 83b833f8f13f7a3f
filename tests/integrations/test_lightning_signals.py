"""Lightning under torchrun (gloo, 2 ranks) told to stop by SIGTERM: one step, one checkpoint, the lock let go."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time

import pytest
import torch
from ranksutil import EXAMPLES, ROOT, TORCHRUN, Lines, free_port

from handofflock import HandoffLock


@pytest.mark.timeout(150)
def test_sigterm_during_a_fit_with_min_steps_and_accumulation_checkpoints_on_an_optimizer_step_and_exits(tmp_path):
    url = (tmp_path / "train.lock.json").as_uri()
    cmd = [*TORCHRUN, "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
           str(EXAMPLES / "lightning_yield.py"), "--url", url, "--workdir", str(tmp_path), "--steps", "100000",
           "--min-steps", "100000", "--accumulate", "3", "--every", "1", "--b-after", "-1", "--step-time", "0.02"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                            env=dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1"), start_new_session=True)
    try:
        lines = Lines(proc)
        lines.wait_for(r"step  20 ", timeout=90)
        signalled = time.time()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=40)
        took = time.time() - signalled
        out = lines.text(join=10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    stops = {int(r): (int(s), why) for r, s, why in
             re.findall(r"A(\d+)\s+\S+\s+stopped after step (\d+) \(agreed with all 2 ranks: (\w+, \w+)\)", out)}
    assert sorted(stops) == [0, 1] and len(set(stops.values())) == 1, out
    step, why = stops[0]
    assert why == "exit, SIGTERM", out
    [saved] = tmp_path.glob(f"handoff-token*-step{step}.ckpt")  # the yield checkpoint's name carries the token
    ckpt = torch.load(saved, weights_only=False)
    assert ckpt["global_step"] == step  # min_steps did not keep the fit going past the stop
    in_epoch = ckpt["loops"]["fit_loop"]["epoch_loop.batch_progress"]["current"]["processed"]
    assert in_epoch % 3 == 0 or in_epoch == 16, f"stopped {in_epoch % 3} batches into a gradient accumulation"
    assert ckpt["handofflock"]["token"] and ckpt["handofflock"]["decision"] == {"action": "exit", "cause": "SIGTERM"}
    assert saved.stat().st_mtime >= signalled - 0.01
    assert HandoffLock(url).status().owner_id is None
    assert took < 30, took
    assert len(re.findall(r"exits \(SIGTERM\), status 143", out)) == 2, out
    print(f"SIGTERM to all Lightning ranks exited: {took:.2f} s")
