"""A Lightning fit for tests: DDP on gloo, a validation that may be long; under torchrun or Lightning's own launcher.

    torchrun --nproc-per-node 2 lightning_job.py URL WORKDIR --strategy counting --val-batches 200 --val-time 0.05
    python lightning_job.py URL WORKDIR --strategy ddp     # devices=2: Lightning runs this file again for rank 1

Each rank says whether it holds the lock object, how many agreements went
through the strategy's collective, and where it stopped (or that it finished).
"""

import argparse
import datetime
import os
import sys
import time
import warnings
from pathlib import Path

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from lightning.pytorch.strategies import DDPStrategy

from handofflock import HandoffLock
from handofflock.integrations.lightning import HandoffLockCallback


def say(line: str) -> None:
    """One write per line: two ranks share torchrun's unbuffered stdout, and print's two writes could splice."""
    os.write(1, f"{line}\n".encode())


parser = argparse.ArgumentParser()
parser.add_argument("url")
parser.add_argument("workdir")
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--strategy", choices=["ddp", "counting"], default="ddp")
parser.add_argument("--val-batches", type=int, default=0, help="validation batches per rank (0: no validation)")
parser.add_argument("--val-every", type=int, default=5, help="training batches between validations")
parser.add_argument("--val-time", type=float, default=0.0, help="seconds per validation batch")
args = parser.parse_args()
warnings.filterwarnings("ignore", message=".*does not have many workers.*")  # the toy's data, nothing else

if "RANK" in os.environ:  # torchrun: the group exists before the lock is taken
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))


class CountingDDP(DDPStrategy):
    """Lightning's DDP strategy, counting the MAX reductions (the lock's agreements go through them)."""

    max_reduces = 0

    def reduce(self, tensor, group=None, reduce_op="mean"):
        if reduce_op == "max":
            CountingDDP.max_reduces += 1
        return super().reduce(tensor, group=group, reduce_op=reduce_op)


class Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(4, 1)
        self.last_val_batch = None

    def training_step(self, batch, batch_idx):
        x, y = batch
        if self.global_rank == 0 and self.global_step == 2:
            status = HandoffLock(args.url).status()
            say(f"during fit: owner {status.owner_id} waiter {status.waiter_id}")
        return torch.nn.functional.mse_loss(self.net(x).squeeze(1), y)

    def validation_step(self, batch, batch_idx):
        time.sleep(args.val_time)  # the rest of a long validation step
        self.last_val_batch = batch_idx
        signals = callback.ranks.signals if callback.ranks is not None else None
        heard = " heard" if signals is not None and signals.received else ""  # this rank has had its signal
        say(f"rank {self.global_rank} val batch {batch_idx}{heard}")

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


gen = torch.Generator().manual_seed(0)
train = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(64, 4, generator=gen), torch.randn(64, generator=gen)), batch_size=2)
val = None
if args.val_batches:
    n = 2 * args.val_batches  # two ranks, one sample a batch
    val = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(n, 4, generator=gen), torch.randn(n, generator=gen)), batch_size=1)
callback = HandoffLockCallback(args.url, checkpoint=Path(args.workdir) / "handoff.ckpt", every=1, poll=0.2, owner_id="job-A",
                               ttl=10.0, waiter_check_interval=0.5, waiter_poll_interval=0.2)
callback.acquire()  # the documented way: before fit, so the resume checkpoint is chosen under the lock
trainer = pl.Trainer(accelerator="cpu", devices=2, strategy=CountingDDP() if args.strategy == "counting" else "ddp",
                     max_steps=args.steps, val_check_interval=args.val_every if val is not None else None,
                     limit_val_batches=args.val_batches or None, num_sanity_val_steps=0, logger=False,
                     enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, callbacks=[callback])
model = Tiny()
trainer.fit(model, train, val, ckpt_path=callback.resume_path)
rank, ranks = trainer.global_rank, callback.ranks
say(f"rank {rank} {'holder' if ranks.is_holder else 'follower'}: {ranks.agreements} agreements, "
      f"{CountingDDP.max_reduces} through the strategy")
if callback.yielded:
    d = callback.decision
    say(f"rank {rank} stopped after step {callback.yield_step} val batch {model.last_val_batch} ({d.action}, {d.cause})")
    sys.exit(d.exit_status if d.exit else 0)
say(f"rank {rank} finished at step {trainer.global_step}")
