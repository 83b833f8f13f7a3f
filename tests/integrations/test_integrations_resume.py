"""Resuming in a new process names the newest checkpoint of the job, not the last yield's nor a stale writer's.

Real Lightning (DDP on gloo, 2 CPU ranks under torchrun, tests/integrations/lightning_resume_job.py)
and a real Hugging Face Trainer (in-process, one rank, a tiny model); a file lock.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from ranksutil import PausedHolder, torchrun

from handofflock import HandoffLock, StaleToken
from handofflock.integrations.checkpoints import LatestCheckpoint

JOB = Path(__file__).resolve().parent / "lightning_resume_job.py"
TIMING = dict(ttl=30.0)  # no waiter here: a long lease only keeps a loaded machine from losing the lock


@pytest.mark.timeout(240)
def test_lightning_resumes_from_model_checkpoints_save_after_a_yield_and_a_crash_in_a_new_process(tmp_path):
    url = (tmp_path / "l.json").as_uri()
    first = torchrun(JOB, 2, url, str(tmp_path), "train", timeout=100)
    out = first.stdout
    assert len(re.findall(r"rank \d crashed: crash at step 24", out)) == 2, out + first.stderr[-4000:]
    yielded = {int(s) for s in re.findall(r"rank \d yielded after step (\d+)", out)}
    assert len(yielded) == 1 and (step := yielded.pop()) < 10, out
    # The yield checkpoint's name carries the hold's token: no later hold writes that name.
    [saved] = tmp_path.glob(f"handoff-token*-step{step}.ckpt")
    token = torch.load(saved, weights_only=False)["handofflock"]["token"]
    assert saved.name == f"handoff-token{token}-step{step}.ckpt"
    assert torch.load(tmp_path / "mc" / "last.ckpt", weights_only=False)["global_step"] == 20

    second = torchrun(JOB, 2, url, str(tmp_path), "resume", timeout=100)  # a new process: nothing in memory
    out = second.stdout
    assert second.returncode == 0, out + second.stderr[-4000:]
    # Before: both ranks resumed from the yield checkpoint of step 3, and silently redid 17 steps.
    assert re.findall(r"rank \d resume_path (\S+)", out) == [str(tmp_path / "mc" / "last.ckpt")] * 2, out
    assert sorted(re.findall(r"rank (\d) starts at step (\d+)", out)) == [("0", "20"), ("1", "20")], out
    assert HandoffLock(url).status().owner_id is None


class Regressor(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)

    def forward(self, x, labels=None):
        y = self.lin(x).squeeze(1)
        return {"loss": torch.nn.functional.mse_loss(y, labels), "logits": y}


class Pairs(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i):
        return {"x": torch.ones(4) * i / 64, "labels": torch.tensor(float(i) / 64)}


@pytest.mark.timeout(120)
def test_an_hf_trainer_resumes_from_its_newest_save_not_from_a_stale_writers_higher_checkpoint(tmp_path):
    import transformers

    from handofflock.integrations.transformers import HandoffLockTrainerCallback, latest_pointer

    transformers.logging.set_verbosity_error()
    out, url = tmp_path / "hf", (tmp_path / "l.json").as_uri()

    class Script(transformers.TrainerCallback):
        """Run 1 yields after step 3; run 2 crashes at step 11, after the Trainer saved checkpoint-10."""

        def __init__(self, job: HandoffLockTrainerCallback) -> None:
            self.job, self.run, self.first_step = job, 0, None

        def on_train_begin(self, args, state, control, **kw):
            self.run, self.first_step = self.run + 1, None

        def on_step_begin(self, args, state, control, **kw):
            if self.run == 2 and state.global_step == 11:
                raise RuntimeError("crash at step 11")

        def on_step_end(self, args, state, control, **kw):
            self.first_step = self.first_step or state.global_step
            if self.run == 1 and state.global_step == 3:
                self.job.ranks.request_stop()  # as a waiter's request would

    def trainer(job: HandoffLockTrainerCallback) -> tuple[transformers.Trainer, Script]:
        script = Script(job)
        args = transformers.TrainingArguments(output_dir=str(out), max_steps=12, per_device_train_batch_size=4,
                                              report_to=[], use_cpu=True, disable_tqdm=True, save_strategy="steps",
                                              save_steps=5, remove_unused_columns=False)
        return transformers.Trainer(model=Regressor(), args=args, train_dataset=Pairs(), callbacks=[script, job]), script

    job = HandoffLockTrainerCallback(url, every=1, owner_id="job-A", **TIMING)
    hf, script = trainer(job)
    assert job.train(hf).action == "yield" and job.yield_step == 3
    with pytest.raises(RuntimeError, match="crash at step 11"):
        job.train(hf)  # resumes from checkpoint-3, saves checkpoint-5 and checkpoint-10, crashes
    assert script.first_step == 4
    # The first hold, paused all along, wakes up and saves a later step: its pointer write is refused.
    stale = PausedHolder(json.loads((out / "checkpoint-3" / "handofflock.json").read_text())["token"], owner_id="job-A")
    shutil.copytree(out / "checkpoint-10", out / "checkpoint-99")
    with pytest.raises(StaleToken):
        LatestCheckpoint(latest_pointer(out), lock=stale).point(out / "checkpoint-99", 99)  # type: ignore[arg-type]

    again = HandoffLockTrainerCallback(url, every=1, owner_id="job-A", **TIMING)  # a new process's callback
    # Before: the highest checkpoint-N, the stale writer's checkpoint-99.
    assert again.resume_path(out) == str(out / "checkpoint-10")
    hf, script = trainer(again)
    assert again.train(hf) is None and script.first_step == 11 and hf.state.global_step == 12
    assert HandoffLock(url).status().owner_id is None
