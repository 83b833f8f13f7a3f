"""The pod command of docs/jobs.md, ``handofflock exec -- torchrun ...``, as PID 1 of a PID namespace.

A pod's deletion sends SIGTERM to the container's PID 1 only, and SIGKILL after the grace
(30 s by default). Real gloo ranks under torchrun (examples/torchrun_yield.py), a file lock,
``unshare --pid --fork --mount-proc`` for the namespace; skipped, saying why, where the kernel
refuses one.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from jobsutil import CONSOLE_SCRIPT, UNSHARE_PID, pid_namespace_refused
from ranksutil import EXAMPLES, ROOT, TORCHRUN, Lines, free_port

from handofflock import HandoffLock

pytestmark = pytest.mark.skipif((why := pid_namespace_refused()) is not None, reason=str(why))


@pytest.mark.timeout(120)
def test_sigterm_to_the_pod_command_as_pid1_checkpoints_every_rank_at_one_step_frees_the_lock_and_exits_143(tmp_path):
    url = (tmp_path / "train.lock.json").as_uri()
    cmd = [*UNSHARE_PID, str(CONSOLE_SCRIPT), "exec", "--", *TORCHRUN, "--nproc-per-node", "2", "--master-addr",
           "127.0.0.1", "--master-port", str(free_port()), str(EXAMPLES / "torchrun_yield.py"), "--url", url,
           "--workdir", str(tmp_path), "--every", "2", "--b-after", "-1", "--step-time", "0.02", "--steps", "100000"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                            env=dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1"), start_new_session=True)
    try:
        lines = Lines(proc)
        lines.wait_for(r"step  40 ", timeout=60)
        [pid1] = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        signalled = time.time()
        os.kill(int(pid1), signal.SIGTERM)  # what the kubelet does: PID 1 only
        code = proc.wait(timeout=40)
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
    [saved] = tmp_path.glob(f"checkpoint-{step:06d}-token-*.pt")
    assert saved.stat().st_mtime >= signalled - 0.01  # written after the signal
    assert torch.load(saved)["step"] == step
    assert HandoffLock(url).status().owner_id is None  # released, not left to a dead process
    assert code == 143, out  # the ranks' decision, not torchrun's own 1
    assert took < 30, f"the pod command took {took:.1f} s to end after SIGTERM (SIGKILL comes at 30 s)"
    print(f"SIGTERM to the pod command as PID 1: ended in {took:.2f} s with status {code}")
