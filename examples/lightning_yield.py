"""A Lightning fit yields the lock at a checkpoint on every rank, and resumes from it when the lock comes back.

    torchrun --nproc-per-node 2 examples/lightning_yield.py   # CPU, DDP on gloo, local backend
    python examples/lightning_yield.py                        # one process

Job A fits a tiny model with :class:`handofflock.integrations.lightning.HandoffLockCallback`.
A while after it starts, rank 0 launches job B (this file with ``--job-b``, a
separate process), which asks for the lock. Every rank of A saves the
checkpoint at the same step and fit stops; A hands off, waits for the lock
again, and when B releases it resumes the fit from that checkpoint.
"""

from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

from handofflock import HandoffLock
from handofflock.demo import Timeline

# min_hold=0: job A is asked as soon as B waits, to show a yield in seconds; real jobs keep the default
# minimum hold (30 s), which lets a new holder work before it is asked.
TIMING = dict(ttl=10.0, waiter_check_interval=0.5, waiter_poll_interval=0.2, min_hold=0.0)


def job_b(args: argparse.Namespace) -> int:
    """The second job: asks for the lock, works a little, releases. Never imports torch."""
    say = Timeline()
    if args.t0 is not None:
        say.start = args.t0
    lock = HandoffLock(args.url, owner_id="job-B", **TIMING)
    say("B", "asks for the lock")
    lock.acquire(timeout=120)
    say("B", "acquired the lock (handed over by A)", lock.token)
    time.sleep(args.b_work)
    token = lock.token
    heir = lock.release()
    say("B", f"handed off to {heir}" if heir else "released the lock (nobody waiting)", token)
    return 0


def train(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist
    import lightning.pytorch as pl

    from handofflock.integrations.lightning import HandoffLockCallback

    # Lightning's own warnings stay visible; only its advice to add DataLoader workers is about this toy's data.
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:  # initialised here, so the lock can be taken before fit; Lightning uses this group
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.group_timeout))
    rank = dist.get_rank() if world > 1 else 0
    say, who = Timeline(), f"A{rank}"

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x).squeeze(1), y)
            time.sleep(args.step_time)  # the rest of a real step
            if rank == 0 and self.trainer.global_step % 20 == 0:
                say("A", f"step {self.trainer.global_step:3d}  loss {loss.item():.4f}", callback.ranks.lock.token)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    class Report(pl.Callback):
        def on_train_start(self, trainer, pl_module) -> None:
            token = callback.ranks.lock.token if callback.ranks.lock else None
            if trainer.global_step:
                say(who, f"resumes from the checkpoint of step {trainer.global_step} at step {trainer.global_step}", token)
            elif rank == 0:
                say("A", "no checkpoint: training from step 0", token)

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(256, 8, generator=gen)
    data = torch.utils.data.TensorDataset(x, x @ (torch.arange(8, dtype=torch.float32) / 8))
    loader = torch.utils.data.DataLoader(data, batch_size=8, num_workers=args.num_workers)
    workdir = Path(args.workdir)
    callback = HandoffLockCallback(args.url, checkpoint=workdir / "handoff.ckpt", every=args.every, poll=0.5,
                                   owner_id="job-A", **TIMING)
    if rank == 0:
        print(f"handofflock Lightning example: job A with {world} ranks, one lock at {args.url}", flush=True)
        print(f"{'elapsed':>7}  {'who':<3}  {'token':<13}  what", flush=True)

    handed_back = False
    while True:
        callback.acquire()
        token = callback.ranks.lock.token if callback.ranks.lock else None
        if rank == 0:
            say("A", "acquired the lock" + (" (handed back by B)" if handed_back else ""), token)
            if args.b_after >= 0 and not handed_back:  # job B asks a while after A started
                def launch_b() -> None:
                    time.sleep(args.b_after)
                    subprocess.Popen([sys.executable, __file__, "--job-b", "--url", args.url, "--workdir", args.workdir,
                                      "--b-work", str(args.b_work), "--t0", repr(say.start)])
                threading.Thread(target=launch_b, daemon=True).start()
        trainer = pl.Trainer(
            accelerator="cpu", devices=world, strategy="ddp" if world > 1 else "auto", max_steps=args.steps,
            min_steps=args.min_steps, accumulate_grad_batches=args.accumulate,
            callbacks=[callback, Report()], enable_checkpointing=False, logger=False, enable_progress_bar=False,
            enable_model_summary=False, num_sanity_val_steps=0,
        )
        trainer.fit(Tiny(), loader, ckpt_path=callback.resume_path)
        if not callback.yielded:
            break
        decision = callback.decision
        if rank == 0 and callback.ranks.request is not None and not decision.exit:
            say("A", f"told: {callback.ranks.request.requester} wants the lock ({callback.ranks.request.reason.value})", token)
        say(who, f"stopped after step {callback.yield_step} (agreed with all {world} ranks: {decision.action}, "
                 f"{decision.cause})", token)
        if rank == 0:
            say("A", f"checkpointed step {callback.yield_step} as {callback.yield_path.name}; handed off", token)
        if decision.exit:  # a signal or a notice: end; a restart resumes from the checkpoint
            say(who, f"exits ({decision.cause}), status {decision.exit_status}", None)
            if world > 1:
                dist.destroy_process_group()
            return decision.exit_status
        handed_back = True
    say(who, f"finished all {trainer.global_step} steps", None)
    if world > 1:
        dist.barrier()  # every rank is past its last collective before any tears the group down
        dist.destroy_process_group()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="lock URL (default: a file in a temporary directory)")
    parser.add_argument("--workdir", help="where the checkpoint goes (default: a temporary directory)")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--step-time", type=float, default=0.03)
    parser.add_argument("--every", type=int, default=5, help="batches between agreements")
    parser.add_argument("--min-steps", type=int, default=None, help="Lightning's min_steps")
    parser.add_argument("--accumulate", type=int, default=1, help="Lightning's accumulate_grad_batches")
    parser.add_argument("--b-after", type=float, default=2.0, help="seconds after A first holds the lock until job B asks (-1: never)")
    parser.add_argument("--b-work", type=float, default=1.0)
    parser.add_argument("--num-workers", type=int, default=0, help="DataLoader worker processes per rank")
    parser.add_argument("--group-timeout", type=float, default=60.0, help="gloo timeout, seconds")
    parser.add_argument("--job-b", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--t0", type=float, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.workdir is None or args.url is None:  # every rank must agree on both: the ranks share a parent
        if "WORLD_SIZE" in os.environ:
            base = Path(tempfile.gettempdir()) / f"handofflock-lightning-{os.getppid()}"
            base.mkdir(parents=True, exist_ok=True)
        else:
            base = Path(tempfile.mkdtemp(prefix="handofflock-lightning-"))
        args.workdir = args.workdir or str(base)
        args.url = args.url or (base / "train.lock.json").as_uri()
    return job_b(args) if args.job_b else train(args)


if __name__ == "__main__":
    sys.exit(main())
