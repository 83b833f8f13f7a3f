"""Resuming in a new process names the newest checkpoint of the job, not the last yield's nor a stale writer's.

Real Lightning (DDP on gloo, 2 CPU ranks under torchrun, tests/integrations/lightning_resume_job.py)
and a real Hugging Face Trainer (in-process, one rank, a tiny model); a file lock.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest
import torch
from hfutil import hf_trainer
from ranksutil import PausedHolder, torchrun

from handofflock import HandoffLock, StaleToken
from handofflock.integrations.checkpoints import LatestCheckpoint

JOB = Path(__file__).resolve().parent / "lightning_resume_job.py"
POINT_JOB = Path(__file__).resolve().parent / "rank_point_job.py"
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
    # ModelCheckpoint's last save carries its hold's token and its step: no later save rewrites that file.
    [last] = (tmp_path / "mc").glob("last*-step=20.ckpt")
    saved_last = torch.load(last, weights_only=False)
    assert saved_last["global_step"] == 20 and saved_last["handofflock"]["token"] > token
    assert last.name == f"last-token{saved_last['handofflock']['token']}-step=20.ckpt"  # before: last.ckpt

    second = torchrun(JOB, 2, url, str(tmp_path), "resume", timeout=100)  # a new process: nothing in memory
    out = second.stdout
    assert second.returncode == 0, out + second.stderr[-4000:]
    # Before: both ranks resumed from the yield checkpoint of step 3, and silently redid 17 steps.
    assert re.findall(r"rank \d resume_path (\S+)", out) == [str(last)] * 2, out
    assert sorted(re.findall(r"rank (\d) starts at step (\d+)", out)) == [("0", "20"), ("1", "20")], out
    assert HandoffLock(url).status().owner_id is None


def saved(out: Path, step: int, token: int | str = "*") -> Path:
    """The Trainer's checkpoint of ``step`` in ``out``, as the holder renamed it: ``checkpoint-0N-token<T>``."""
    [folder] = out.glob(f"checkpoint-0{step}-token{token}")
    assert folder.name == f"checkpoint-0{step}-token{saved_token(folder)}"
    return folder


def saved_token(folder: Path) -> int:
    """The fencing token the holder wrote into a checkpoint it sealed."""
    return int(json.loads((folder / "handofflock.json").read_text())["token"])


@pytest.mark.timeout(120)
def test_an_hf_trainer_resumes_from_its_newest_save_not_from_a_stale_writers_higher_checkpoint(tmp_path):
    import transformers

    from handofflock.integrations.transformers import HandoffLockTrainerCallback, latest_pointer

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
        return hf_trainer(out, [script, job], max_steps=12, save_strategy="steps", save_steps=5), script

    job = HandoffLockTrainerCallback(url, every=1, owner_id="job-A", **TIMING)
    hf, script = trainer(job)
    assert job.train(hf).action == "yield" and job.yield_step == 3
    with pytest.raises(RuntimeError, match="crash at step 11"):
        job.train(hf)  # resumes from checkpoint-3, saves checkpoint-5 and checkpoint-10, crashes
    assert script.first_step == 4
    # The first hold, paused all along, wakes up and saves a later step: its pointer write is refused.
    stale = PausedHolder(json.loads((saved(out, 3) / "handofflock.json").read_text())["token"], owner_id="job-A")
    shutil.copytree(saved(out, 10), out / "checkpoint-99")
    with pytest.raises(StaleToken):
        LatestCheckpoint(latest_pointer(out), lock=stale).point(out / "checkpoint-99", 99)  # type: ignore[arg-type]

    again = HandoffLockTrainerCallback(url, every=1, owner_id="job-A", **TIMING)  # a new process's callback
    # Before: the highest checkpoint-N, the stale writer's checkpoint-99.
    assert again.resume_path(out) == str(saved(out, 10))
    hf, script = trainer(again)
    assert again.train(hf) is None and script.first_step == 11 and hf.state.global_step == 12
    assert HandoffLock(url).status().owner_id is None


@pytest.mark.timeout(120)
def test_an_hf_save_of_a_step_an_earlier_hold_pointed_at_never_writes_into_that_checkpoint(tmp_path):
    import transformers

    from handofflock.integrations.transformers import HandoffLockTrainerCallback

    out, url = tmp_path / "hf", (tmp_path / "l.json").as_uri()
    first = HandoffLockTrainerCallback(url, every=1, owner_id="job-A", **TIMING)
    assert first.train(hf_trainer(out, [first], max_steps=6, save_steps=2, save_total_limit=2)) is None
    kept = sorted(p.name for p in out.glob("checkpoint-*"))
    pointed = Path(first.resume_path(out))
    weights = (pointed / "model.safetensors").read_bytes()

    class Watch(transformers.TrainerCallback):
        """Runs after the Trainer wrote step 6 again and before the holder points at it: what does the pointer name?"""

        seen: list[tuple[Path, bytes]] = []

        def on_save(self, args, state, control, **kw):
            where = Path(HandoffLockTrainerCallback.resume_path(out))
            self.seen.append((where, (where / "model.safetensors").read_bytes()))

    # A later hold starts over (another run in the same output_dir) with other weights, and saves step 6 again.
    later = HandoffLockTrainerCallback(url, every=1, owner_id="job-B", **TIMING)
    hf = hf_trainer(out, [Watch(), later], max_steps=6, save_steps=6, save_total_limit=2, learning_rate=0.5, seed=7)
    assert later.train(hf, resume_from_checkpoint=False) is None
    # Before: both holds wrote checkpoint-6; the second rewrote the folder the pointer named, under the pointer.
    assert Watch.seen == [(pointed, weights)]
    assert (pointed / "model.safetensors").read_bytes() == weights
    newest = Path(later.resume_path(out))
    assert newest != pointed and newest.name.startswith("checkpoint-06-token")
    assert (newest / "model.safetensors").read_bytes() != weights
    assert sorted(p.name for p in out.glob("checkpoint-*")) == sorted([pointed.name, newest.name])
    # Each hold's saves carry its token; the Trainer's rotation keeps the newest save_total_limit, renamed ones too.
    tokens = [json.loads((p / "handofflock.json").read_text())["token"] for p in (pointed, newest)]
    assert tokens[0] < tokens[1] and pointed == saved(out, 6, tokens[0]) and newest == saved(out, 6, tokens[1])
    assert kept == [f"checkpoint-04-token{tokens[0]}", pointed.name]


@pytest.mark.timeout(120)
def test_a_refused_pointer_move_stops_every_rank_at_that_checkpoint_with_lock_lost(tmp_path):
    url = (tmp_path / "l.json").as_uri()
    started = time.monotonic()
    run = torchrun(POINT_JOB, 2, url, str(tmp_path), timeout=90)
    took, out = time.monotonic() - started, run.stdout
    assert run.returncode != 0, out
    # Before: the holder raised StaleToken alone; the other rank pointed "at step 2" and trained on into a
    # collective nobody else came to.
    assert sorted(re.findall(r"rank (\d) pointed at step (\d+)", out)) == [("0", "0"), ("0", "1"), ("1", "0"), ("1", "1")], out
    assert sorted(re.findall(r"rank (\d) stopped at step (\d+): (\w+)", out)) == [
        ("0", "2", "LockLost"), ("1", "2", "LockLost")], out + run.stderr[-4000:]
    found = LatestCheckpoint(tmp_path / "latest.json").read()
    assert found is not None and found.step == 1  # the newer holder's claim kept the pointer where it was
    assert HandoffLock(url).status().owner_id is None  # the holder let the lock go on its way out
    print(f"a refused pointer move: torchrun of 2 ranks ended in {took:.1f} s")


@pytest.mark.timeout(120)
def test_lightnings_last_checkpoint_is_a_new_file_for_each_hold_and_save_never_rewritten_in_place(tmp_path):
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint

    from handofflock.integrations.lightning import HandoffLockCallback

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x).squeeze(1), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.5)

    gen = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(32, 4, generator=gen), torch.randn(32, generator=gen))
    callback = HandoffLockCallback((tmp_path / "l.json").as_uri(), checkpoint=tmp_path / "handoff.ckpt", **TIMING)

    def fit(max_steps: int, ckpt_path: str | None) -> ModelCheckpoint:
        saver = ModelCheckpoint(dirpath=tmp_path / "mc", every_n_train_steps=2, save_top_k=0, save_last=True)
        callback.acquire()
        pl.Trainer(accelerator="cpu", devices=1, max_steps=max_steps, logger=False, enable_progress_bar=False,
                   enable_model_summary=False, callbacks=[callback, saver]).fit(
            Tiny(), torch.utils.data.DataLoader(data, batch_size=4), ckpt_path=ckpt_path)
        return saver

    saver = fit(4, None)
    first = Path(callback.resume_path)
    token = torch.load(first, weights_only=False)["handofflock"]["token"]
    assert first.name == f"last-token{token}-step=4.ckpt"  # before: last.ckpt, the name every save rewrites
    assert saver.CHECKPOINT_NAME_LAST == "last" and "CHECKPOINT_NAME_LAST" not in vars(saver)  # put back
    content = first.read_bytes()
    fit(8, str(first))  # a later hold resumes from it (and its ModelCheckpoint's state), saves steps 6 and 8
    newest = Path(callback.resume_path)
    assert newest.name.startswith("last-token") and newest.name.endswith("-step=8.ckpt") and newest != first
    assert first.read_bytes() == content  # before: last.ckpt again, rewritten in place at steps 6 and 8
    assert sorted(p.name for p in (tmp_path / "mc").iterdir()) == sorted([first.name, newest.name])


@pytest.mark.timeout(120)
def test_an_hf_trainers_best_checkpoint_follows_the_rename_for_rotation_and_load_best_model_at_end(tmp_path):
    from handofflock.integrations.transformers import HandoffLockTrainerCallback

    out, url = tmp_path / "hf", (tmp_path / "l.json").as_uri()
    job = HandoffLockTrainerCallback(url, every=1, owner_id="job-A", **TIMING)
    hf = hf_trainer(out, [job], evaluate=True, max_steps=8, save_steps=2, eval_strategy="steps", eval_steps=2,
                    save_total_limit=1, load_best_model_at_end=True, metric_for_best_model="loss", greater_is_better=True)
    assert job.train(hf) is None
    best = saved(out, hf.state.best_global_step)
    assert hf.state.best_model_checkpoint == str(best)  # the name load_best_model_at_end loaded from
    assert json.loads((best / "trainer_state.json").read_text())["best_model_checkpoint"] == str(best)
    # save_total_limit=1 keeps the best (and the newest until the end), as it would without the rename.
    assert [p.name for p in out.glob("checkpoint-*")] == [best.name]


@pytest.mark.timeout(120)
def test_an_hf_resume_from_checkpoint_true_resumes_from_the_pointer_not_from_a_leftover_unsealed_save(tmp_path):
    """``resume_from_checkpoint=True`` is the Trainer's habit for "the newest checkpoint in output_dir"; its search
    sees ``checkpoint-N`` only. Renamed saves are invisible to it: it raised "no valid checkpoint", or took a
    ``checkpoint-N`` a crash left between the save and its rename (never whole, never pointed at) over newer saves."""
    import transformers

    from handofflock.integrations.transformers import HandoffLockTrainerCallback

    out, url = tmp_path / "hf", (tmp_path / "l.json").as_uri()

    class First(transformers.TrainerCallback):
        step: int | None = None

        def on_step_end(self, args, state, control, **kw):
            First.step = First.step or state.global_step

    job = HandoffLockTrainerCallback(url, every=1, owner_id="job-A", **TIMING)
    assert job.train(hf_trainer(out, [job], max_steps=4, save_steps=2)) is None
    newest = saved(out, 4)
    # What a crash between a save and its rename leaves: an older step, under the Trainer's own name.
    shutil.copytree(saved(out, 2), out / "checkpoint-2")

    again = HandoffLockTrainerCallback(url, every=1, owner_id="job-A", **TIMING)
    hf = hf_trainer(out, [First(), again], max_steps=6, save_steps=2)
    assert again.train(hf, resume_from_checkpoint=True) is None
    assert First.step == 5 and hf.state.global_step == 6, f"resumed at step {First.step}, not after {newest.name}"

    # The same habit on the Trainer itself, the callback only among its callbacks (it guards train()).
    First.step = None
    last = HandoffLockTrainerCallback(url, every=1, owner_id="job-A", **TIMING)
    hf = hf_trainer(out, [First(), last], max_steps=8, save_steps=2)
    hf.train(resume_from_checkpoint=True)
    assert First.step == 7 and hf.state.global_step == 8


@pytest.mark.timeout(120)
def test_an_hf_save_of_a_step_an_earlier_hold_sealed_survives_a_rotation_of_one(tmp_path, monkeypatch):
    """The Trainer rotates (``save_total_limit``) inside its save, before the holder renames the new
    ``checkpoint-N``. Where the checkpoints' mtimes lie within 1 s of each other (a FUSE mount, a quick job) it
    orders them by the step in the name, then by the name, and keeps the last."""
    import transformers.trainer

    from handofflock.integrations.transformers import HandoffLockTrainerCallback

    rotate, rotated = transformers.trainer.rotate_checkpoints, []

    def rotate_where_mtimes_do_not_tell(output_dir, **kwargs):
        """As on a FUSE mount: every checkpoint folder has the same mtime, so the Trainer orders them by name."""
        folders = sorted(Path(output_dir).glob("checkpoint-*"))
        for folder in folders:
            os.utime(folder, (1_700_000_000, 1_700_000_000))
        rotated.append([folder.name for folder in folders])
        rotate(output_dir=output_dir, **kwargs)

    monkeypatch.setattr(transformers.trainer, "rotate_checkpoints", rotate_where_mtimes_do_not_tell)
    out, url = tmp_path / "hf", (tmp_path / "l.json").as_uri()
    first = HandoffLockTrainerCallback(url, every=1, owner_id="job-A", **TIMING)
    assert first.train(hf_trainer(out, [first], max_steps=6, save_steps=2, save_total_limit=1)) is None
    pointed = Path(first.resume_path(out))
    weights, token = (pointed / "model.safetensors").read_bytes(), saved_token(pointed)
    later = HandoffLockTrainerCallback(url, every=1, owner_id="job-B", **TIMING)
    hf = hf_trainer(out, [later], max_steps=6, save_steps=6, save_total_limit=1, learning_rate=0.5, seed=7)
    assert later.train(hf, resume_from_checkpoint=False) is None
    assert rotated[-1] == sorted([pointed.name, "checkpoint-6"])  # the rotation saw both saves of step 6, mtimes equal
    # Before: the rotation sorted checkpoint-6 before checkpoint-6-token<T> and removed the later hold's save
    # unsealed; the pointer stayed on the earlier hold's.
    newest = Path(later.resume_path(out))
    assert newest != pointed, "the later hold's save of step 6 was removed by the rotation"
    assert newest == saved(out, 6) and saved_token(newest) > token and not pointed.exists()
    assert (newest / "model.safetensors").read_bytes() != weights
    assert [p.name for p in out.glob("checkpoint-*")] == [newest.name]  # save_total_limit=1: the newest save only
