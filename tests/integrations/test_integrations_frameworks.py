"""Lightning and the Hugging Face Trainer on real gloo process groups: yield at one step on every rank, resume there.

Each test runs an example (examples/lightning_yield.py, examples/hf_trainer_yield.py)
as job A, under torchrun with 2 ranks or as one process; job B is a separate
process the example starts once A holds the lock. The lock is a local file.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from ranksutil import EXAMPLES, ROOT, check_handoff_timeline, torchrun

from handofflock import HandoffLock

STEPS = 60
# Job B is started as A takes the lock and A's 60 steps last at least 7.2 s: B (a new interpreter) must
# ask before A finishes; on a loaded machine it once took 1.8 s, under the fresh-boot shim with the
# suite beside it more than 3.7 s (A finished first). A yields at B's request, so the run is not longer.
ARGS = ["--steps", str(STEPS), "--every", "2", "--b-after", "0", "--b-work", "0.5", "--step-time", "0.12"]


def run_example(name: str, world: int, tmp_path) -> str:
    url = (tmp_path / "train.lock.json").as_uri()
    args = ["--url", url, "--workdir", str(tmp_path), *ARGS]
    if world == 1:
        proc = subprocess.run([sys.executable, str(EXAMPLES / name), *args], capture_output=True, text=True,
                              timeout=150, cwd=ROOT)
    else:
        proc = torchrun(EXAMPLES / name, world, *args, timeout=150)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-6000:]
    assert HandoffLock(url).status().owner_id is None  # A released when it finished
    return proc.stdout


@pytest.mark.timeout(180)
@pytest.mark.parametrize("world", [2, 1])
def test_lightning_ranks_save_one_checkpoint_at_one_step_hand_off_and_resume_from_it(tmp_path, world):
    out = run_example("lightning_yield.py", world, tmp_path)
    yielded = check_handoff_timeline(out, world, STEPS, resume_offset=0)  # global_step counts steps done
    [saved] = tmp_path.glob(f"handoff-token*-step{yielded}.ckpt")  # the yield checkpoint's name carries the token
    assert torch.load(saved, weights_only=False)["global_step"] == yielded


@pytest.mark.timeout(180)
@pytest.mark.parametrize("world", [2, 1])
def test_hf_trainer_ranks_save_one_checkpoint_at_one_step_hand_off_and_resume_from_it(tmp_path, world):
    out = run_example("hf_trainer_yield.py", world, tmp_path)
    yielded = check_handoff_timeline(out, world, STEPS, resume_offset=0)
    [saved] = (tmp_path / "hf").glob("checkpoint-*")
    token = json.loads((saved / "handofflock.json").read_text())["token"]
    assert saved.name == f"checkpoint-0{yielded}-token{token}"  # the holder's fencing token is in the name
    assert json.loads((saved / "trainer_state.json").read_text())["global_step"] == yielded
