"""A Lightning job for the resume tests: DDP on gloo under torchrun, a ModelCheckpoint beside the callback.

    torchrun --nproc-per-node 2 lightning_resume_job.py URL WORKDIR train    # yield, resume, save, crash
    torchrun --nproc-per-node 2 lightning_resume_job.py URL WORKDIR resume   # a new process: where does it resume?

``train``: the first fit yields after step YIELD_AT (a stop asked on rank 0);
the job takes the lock again and resumes from the yield checkpoint;
ModelCheckpoint saves its ``last`` (``last-token<T>-step=<N>.ckpt``) every SAVE_EVERY steps; the fit crashes at
step CRASH_AT on every rank. ``resume``: each rank says what ``resume_path``
names, then fits on from it for two steps and says where it started.
"""

import datetime
import os
import sys
import warnings
from pathlib import Path

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import ModelCheckpoint

from handofflock.integrations.lightning import HandoffLockCallback


def say(line: str) -> None:
    """One write per line: two ranks share torchrun's unbuffered stdout, and print's two writes could splice."""
    os.write(1, f"{line}\n".encode())


YIELD_AT, SAVE_EVERY, CRASH_AT = 3, 10, 24

url, workdir, phase = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
warnings.filterwarnings("ignore", message=".*does not have many workers.*")  # the toy's data, nothing else
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank()


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 1)

    def on_train_start(self) -> None:
        say(f"rank {rank} starts at step {self.trainer.global_step}")

    def training_step(self, batch, batch_idx):
        step = self.trainer.global_step
        if step == YIELD_AT and rank == 0 and not callback.yielded and phase == "train" and step < SAVE_EVERY:
            callback.ranks.request_stop()  # as a waiter's request would: every rank stops at the next agreement
        if step == CRASH_AT and phase == "train":
            raise RuntimeError(f"crash at step {step}")
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x).squeeze(1), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def trainer(max_steps: int) -> pl.Trainer:
    saves = ModelCheckpoint(dirpath=workdir / "mc", every_n_train_steps=SAVE_EVERY, save_top_k=0, save_last=True)
    return pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=max_steps, logger=False,
                      enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                      callbacks=[callback, saves])


gen = torch.Generator().manual_seed(0)
data = torch.utils.data.TensorDataset(torch.randn(64, 4, generator=gen), torch.randn(64, generator=gen))
callback = HandoffLockCallback(url, checkpoint=workdir / "handoff.ckpt", every=1, poll=0.2, owner_id="job-A",
                               ttl=30.0)  # no waiter: a long lease only keeps a loaded machine from losing the lock
if phase == "train":
    callback.acquire()
    trainer(100).fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=2), ckpt_path=callback.resume_path)
    say(f"rank {rank} yielded after step {callback.yield_step}")
    callback.acquire()  # the lock again, in this process: resume from the yield, then crash
    try:
        trainer(100).fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=2), ckpt_path=callback.resume_path)
    except RuntimeError as exc:
        say(f"rank {rank} crashed: {exc}")
        os._exit(3)
else:
    callback.acquire()
    say(f"rank {rank} resume_path {callback.resume_path}")
    trainer(CRASH_AT + 2).fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=2), ckpt_path=callback.resume_path)
    dist.barrier()
    dist.destroy_process_group()
