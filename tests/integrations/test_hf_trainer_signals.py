"""A Hugging Face Trainer under torchrun (gloo, 2 ranks) told to stop by SIGTERM: one step, one checkpoint, the lock let go."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

import pytest
from ranksutil import EXAMPLES, ROOT, TORCHRUN, Lines, free_port

from handofflock import HandoffLock


@pytest.mark.timeout(150)
def test_sigterm_to_torchrun_stops_every_hf_rank_at_one_step_checkpoints_and_frees_the_lock_within_30_s(tmp_path):
    url = (tmp_path / "train.lock.json").as_uri()
    cmd = [*TORCHRUN, "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
           str(EXAMPLES / "hf_trainer_yield.py"), "--url", url, "--workdir", str(tmp_path), "--steps", "100000",
           "--every", "1", "--b-after", "-1", "--step-time", "0.02"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                            env=dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1"), start_new_session=True)
    try:
        lines = Lines(proc)
        lines.wait_for(r"step  20 ", timeout=90)
        signalled = time.time()
        proc.send_signal(signal.SIGTERM)  # torchrun forwards it to both workers, and SIGKILLs them 30 s later
        proc.wait(timeout=40)
        took = time.time() - signalled
        out = lines.text(join=10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    stops = {int(r): (int(s), why) for r, s, why in
             re.findall(r"A(\d+)\s+\S+\s+stopped after step (\d+) \(agreed with all 2 ranks: (\w+, \w+)\)", out)}
    assert sorted(stops) == [0, 1] and len(set(stops.values())) == 1, out  # every rank at one step
    step, why = stops[0]
    assert why == "exit, SIGTERM", out
    assert len(re.findall(r"A\d\s+\S+\s+exits \(SIGTERM\), status 143", out)) == 2, out
    [saved] = (tmp_path / "hf").glob("checkpoint-*")
    assert saved.name.startswith(f"checkpoint-0{step}-token"), out
    assert (saved / "model.safetensors").stat().st_mtime >= signalled - 0.01  # written after the signal
    meta = json.loads((saved / "handofflock.json").read_text())
    assert meta["step"] == step and saved.name == f"checkpoint-0{step}-token{meta['token']}" and meta["decision"] == {"action": "exit", "cause": "SIGTERM"}
    assert json.loads((saved / "trainer_state.json").read_text())["global_step"] == step
    assert HandoffLock(url).status().owner_id is None  # released, not held by a dead process
    assert took < 30, f"torchrun took {took:.1f} s to end after SIGTERM (SIGKILL comes at 30 s)"
    print(f"SIGTERM to all HF ranks exited: {took:.2f} s")
