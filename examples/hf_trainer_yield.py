"""A Hugging Face Trainer yields the lock at a checkpoint on every rank, and resumes from it when the lock comes back.

    torchrun --nproc-per-node 2 examples/hf_trainer_yield.py   # CPU, DDP on gloo, local backend
    python examples/hf_trainer_yield.py                        # one process

Job A trains a tiny model with :class:`handofflock.integrations.transformers.HandoffLockTrainerCallback`.
A while after it starts, rank 0 launches job B (this file with ``--job-b``, a
separate process), which asks for the lock. At the same step on every rank the
callback sets ``should_save`` and ``should_training_stop``: the Trainer saves
``checkpoint-N`` (the holder renames it ``checkpoint-0N-token<T>``) and stops; A hands off, waits for the lock again, and when B
releases it resumes training from that checkpoint.
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
    import transformers

    from handofflock.integrations.transformers import HandoffLockTrainerCallback

    transformers.logging.set_verbosity_error()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:  # initialised here with a short timeout; the Trainer (accelerate) uses this group
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.group_timeout))
    rank = dist.get_rank() if world > 1 else 0
    say, who = Timeline(), f"A{rank}"

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))

        def forward(self, x, labels=None):
            out = self.net(x).squeeze(1)
            time.sleep(args.step_time)  # the rest of a real step
            return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}

    class Synthetic(torch.utils.data.Dataset):
        def __init__(self) -> None:
            gen = torch.Generator().manual_seed(0)
            self.x = torch.randn(256, 8, generator=gen)
            self.y = self.x @ (torch.arange(8, dtype=torch.float32) / 8)

        def __len__(self) -> int:
            return len(self.x)

        def __getitem__(self, i):
            return {"x": self.x[i], "labels": self.y[i]}

    def token() -> int | None:
        return callback.ranks.lock.token if callback.ranks and callback.ranks.lock else None

    class Report(transformers.TrainerCallback):
        def on_train_begin(self, args_, state, control, **kw):
            if state.global_step:
                say(who, f"resumes from the checkpoint of step {state.global_step} at step {state.global_step}", token())
            elif rank == 0:
                say("A", "no checkpoint: training from step 0", token())

        def on_log(self, args_, state, control, logs=None, **kw):
            if rank == 0 and logs and "loss" in logs:
                say("A", f"step {state.global_step:3d}  loss {logs['loss']:.4f}", token())

    workdir = Path(args.workdir)
    output_dir = workdir / "hf"
    callback = HandoffLockTrainerCallback(args.url, every=args.every, poll=0.5, owner_id="job-A", **TIMING)
    if rank == 0:
        print(f"handofflock HF Trainer example: job A with {world} ranks, one lock at {args.url}", flush=True)
        print(f"{'elapsed':>7}  {'who':<3}  {'token':<13}  what", flush=True)

    training_args = transformers.TrainingArguments(
        output_dir=str(output_dir), max_steps=args.steps, per_device_train_batch_size=8, learning_rate=0.05,
        lr_scheduler_type="constant", save_strategy="no", logging_strategy="steps", logging_steps=20, report_to=[],
        use_cpu=True, disable_tqdm=True, remove_unused_columns=False, dataloader_num_workers=args.num_workers,
        ddp_timeout=int(args.group_timeout), ddp_find_unused_parameters=False, seed=0,
    )
    handed_back = False
    while True:
        trainer = transformers.Trainer(model=Tiny(), args=training_args, train_dataset=Synthetic(),
                                       callbacks=[callback, Report()])
        callback.acquire()  # here only to print the timeline; callback.train() takes the lock itself
        if rank == 0:
            say("A", "acquired the lock" + (" (handed back by B)" if handed_back else ""), token())
            if args.b_after >= 0 and not handed_back:  # job B asks a while after A started
                def launch_b() -> None:
                    time.sleep(args.b_after)
                    subprocess.Popen([sys.executable, __file__, "--job-b", "--url", args.url, "--workdir", args.workdir,
                                      "--b-work", str(args.b_work), "--t0", repr(say.start)])
                threading.Thread(target=launch_b, daemon=True).start()
        held = token()
        decision = callback.train(trainer)  # resumes from the newest checkpoint; an exception lets the lock go
        if decision is None:
            break
        if rank == 0 and callback.ranks.request is not None and not decision.exit:
            say("A", f"told: {callback.ranks.request.requester} wants the lock ({callback.ranks.request.reason.value})", held)
        say(who, f"stopped after step {callback.yield_step} (agreed with all {world} ranks: {decision.action}, "
                 f"{decision.cause})", held)
        if rank == 0:
            say("A", f"checkpointed step {callback.yield_step} as checkpoint-0{callback.yield_step}-token{held}; handed off", held)
        if decision.exit:  # a signal or a notice: end; a restart resumes from the checkpoint
            say(who, f"exits ({decision.cause}), status {decision.exit_status}", None)
            if world > 1:
                dist.destroy_process_group()
            return decision.exit_status
        handed_back = True
    say(who, f"finished all {trainer.state.global_step} steps", None)
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
    parser.add_argument("--every", type=int, default=5, help="optimizer steps between agreements")
    parser.add_argument("--b-after", type=float, default=2.0, help="seconds after A first holds the lock until job B asks (-1: never)")
    parser.add_argument("--b-work", type=float, default=1.0)
    parser.add_argument("--num-workers", type=int, default=0, help="DataLoader worker processes per rank")
    parser.add_argument("--group-timeout", type=float, default=60.0, help="gloo timeout, seconds")
    parser.add_argument("--job-b", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--t0", type=float, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.workdir is None or args.url is None:  # every rank must agree on both: the ranks share a parent
        if "WORLD_SIZE" in os.environ:
            base = Path(tempfile.gettempdir()) / f"handofflock-hf-{os.getppid()}"
            base.mkdir(parents=True, exist_ok=True)
        else:
            base = Path(tempfile.mkdtemp(prefix="handofflock-hf-"))
        args.workdir = args.workdir or str(base)
        args.url = args.url or (base / "train.lock.json").as_uri()
    return job_b(args) if args.job_b else train(args)


if __name__ == "__main__":
    sys.exit(main())
