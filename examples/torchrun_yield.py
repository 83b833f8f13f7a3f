"""A multi-rank trainer yields at a checkpoint, on every rank at the same step, and resumes later.

    torchrun --nproc-per-node 2 examples/torchrun_yield.py            # CPU, gloo, local backend

Job A is this torchrun job: rank 0 holds the lock; all ranks agree every
``--every`` steps whether to yield. A while after A starts, rank 0 launches job
B (this file with ``--job-b``, a separate process) which asks for the lock. At
the next agreement every rank of A stops after the same step; A checkpoints and
hands off. B takes the lock, does its work, and releases; A, waiting for the
lock meanwhile, gets it back and resumes from its checkpoint. The timeline
has the demo's columns (``python -m handofflock.demo``).

The batches come from a DataLoader (``--num-workers`` worker processes): the
batch of step i on a rank is drawn from (the rank's data seed, i), so a resume
at step i draws what an uninterrupted run would have. ``rank_lock`` keeps the
workers alive through a signal until the ranks have agreed and checkpointed.

Works without torchrun too (set RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from handofflock import HandoffLock, LockLost
from handofflock.demo import Timeline
from handofflock.integrations.checkpoints import LatestCheckpoint
from handofflock.integrations.ranks import RankExit

# min_hold=0: job A is asked as soon as B waits, to show a yield in seconds; real jobs keep the default
# minimum hold (30 s), which lets a new holder work before it is asked.
TIMING = dict(ttl=10.0, waiter_check_interval=0.5, waiter_poll_interval=0.2, min_hold=0.0)


def job_b(args: argparse.Namespace) -> int:
    """The second job: asks for the lock, works a little, releases. Never imports torch."""
    say = Timeline()
    if args.t0 is not None:  # A's start: one monotonic clock for all processes of a host
        say.start = args.t0
    lock = HandoffLock(args.url, owner_id="job-B", **TIMING)
    say("B", "asks for the lock")
    lock.acquire(timeout=120)
    say("B", "acquired the lock (handed over by A)", lock.token)
    seen = LatestCheckpoint(Path(args.workdir) / "latest.json").read()  # A's pointer: B only reads it
    say("B", f"sees A's checkpoint of step {seen.step if seen else None}; works {args.b_work:g} s", lock.token)
    time.sleep(args.b_work)
    token = lock.token
    heir = lock.release()
    say("B", f"handed off to {heir}" if heir else "released the lock (nobody waiting)", token)
    return 0


class Batches:
    """A map-style dataset: the batch of step i is drawn from (seed, i), wherever (whichever worker) draws it."""

    def __init__(self, seed: int, steps: int) -> None:
        self.seed, self.steps = seed, steps

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, i: int):
        import torch

        return torch.randn(16, 8, generator=torch.Generator().manual_seed(self.seed * 1_000_003 + i))


def train(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist

    from handofflock.integrations.torch import rank_lock

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.group_timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    say = Timeline()
    who = f"A{rank}"
    workdir = Path(args.workdir)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    net = torch.nn.parallel.DistributedDataParallel(model) if args.ddp else model
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    seed = rank  # this rank's data seed; a checkpoint keeps every rank's
    true_w = torch.arange(8, dtype=torch.float32) / 8

    if rank == 0:
        print(f"handofflock torchrun example: job A with {world} ranks, one lock at {args.url}", flush=True)
        print(f"{'elapsed':>7}  {'who':<3}  {'token':<13}  what", flush=True)

    # owner_id: torchrun:<--rdzv-id> when given (a restarted job takes its place back), else job-A.
    # latest: the job's fenced pointer to its newest checkpoint (rank 0 claims it with each acquire).
    ranks = rank_lock(args.url, holder_rank=0, every=args.every, poll=0.5, latest=workdir / "latest.json",
                      owner_id=None if os.environ.get("TORCHELASTIC_RUN_ID", "none") != "none" else "job-A", **TIMING)
    if rank == 0 and ranks.lock is not None:
        say("A", f"owner id {ranks.lock.owner_id}")
    def leave(status: int) -> int:
        """Tear the group down. DDP keeps the group alive: let it go first, so the group is freed now, not
        while the interpreter shuts down (where gloo can abort a rank: "terminate called without an active
        exception")."""
        nonlocal net
        net = None
        gc.collect()
        dist.destroy_process_group()
        return status

    handed_back = False
    while True:
        try:
            ranks.acquire()
        except RankExit as stop:  # a signal while waiting for the lock: the slot is given back, nothing to save
            say(who, f"exits while waiting ({stop.decision.cause}), status {stop.code}", None)
            leave(stop.code)
            raise
        token = ranks.lock.token if ranks.lock else None
        if rank == 0:
            say("A", "acquired the lock" + (" (handed back by B)" if handed_back else ""), token)
            if args.b_after >= 0 and not handed_back:  # job B asks a while after A started
                def launch_b() -> None:
                    time.sleep(args.b_after)
                    subprocess.Popen([sys.executable, __file__, "--job-b", "--url", args.url, "--workdir", args.workdir,
                                      "--b-work", str(args.b_work), "--t0", repr(say.start)])
                threading.Thread(target=launch_b, daemon=True).start()
        start = 0
        found = ranks.latest.read()  # every rank reads the same pointer, claimed before acquire returned
        if found is not None:
            state = torch.load(found.path)
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["opt"])
            seed = int(state["data"][rank])  # the same batches as an uninterrupted run
            start = state["step"] + 1
            say(who, f"resumes from the checkpoint of step {state['step']} at step {start}", token)
        elif rank == 0:
            say("A", "no checkpoint: training from step 0", token)
        steps = ranks.steps(range(start, args.steps))
        loader = torch.utils.data.DataLoader(torch.utils.data.Subset(Batches(seed, args.steps), range(start, args.steps)),
                                             batch_size=None, num_workers=args.num_workers)
        try:
            for step, x in zip(steps, loader):  # the agreement first: a stop takes no batch
                loss = torch.nn.functional.mse_loss(net(x).squeeze(1), x @ true_w)
                opt.zero_grad()
                loss.backward()
                opt.step()
                time.sleep(args.step_time)  # the rest of a real step
                if step % 20 == 0 and rank == 0:
                    say("A", f"step {step:3d}  loss {loss.item():.4f}", token)
        except LockLost as exc:  # every rank learns it at the same agreement: stop, save nothing
            say(who, f"lost the lock after step {steps.last}; stopping: {exc}", token)
            dist.barrier()
            return leave(3)
        last = steps.last if steps.last is not None else start - 1
        decision = steps.decision
        if decision is not None:
            if rank == 0 and steps.request is not None and not decision.exit:
                say("A", f"told: {steps.request.requester} wants the lock ({steps.request.reason.value})", token)
            say(who, f"stopped after step {last} (agreed with all {world} ranks: {decision.action}, "
                     f"{decision.cause})", token)
        # Every rank's data seed goes into the checkpoint: a resume draws the batches it would have drawn.
        data_states = [None] * world
        dist.all_gather_object(data_states, torch.tensor(seed))
        path = workdir / f"checkpoint-{last:06d}-token-{token}.pt"  # the token fences a stale writer's file
        if rank == 0:  # one writer (the holder: the token is its)
            torch.save({"step": last, "model": model.state_dict(), "opt": opt.state_dict(), "data": data_states,
                        "token": token}, path)
        ranks.point(path, last)  # every rank, once its part is written; a refused move is LockLost on every rank
        if rank == 0:
            say("A", f"checkpointed step {last} as {path.name}", token)
        heir = ranks.release()
        if rank == 0:
            say("A", f"handed off to {heir}" if heir else "released the lock (nobody waiting)", token)
        if decision is None:
            break
        if decision.exit:  # a signal or a notice: end now; a restart resumes from the checkpoint
            say(who, f"exits ({decision.cause}), status {decision.exit_status}", None)
            return leave(decision.exit_status)
        handed_back = True
    say(who, f"finished all {args.steps} steps", None)
    dist.barrier()  # every rank is past its last collective before any tears the group down
    return leave(0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="lock URL (default: a file in a temporary directory)")
    parser.add_argument("--workdir", help="where the checkpoint goes (default: a temporary directory)")
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--step-time", type=float, default=0.03)
    parser.add_argument("--every", type=int, default=5, help="steps between agreements")
    parser.add_argument("--b-after", type=float, default=2.0, help="seconds after A first holds the lock until job B asks (-1: never)")
    parser.add_argument("--b-work", type=float, default=1.0)
    parser.add_argument("--num-workers", type=int, default=0, help="DataLoader worker processes per rank")
    parser.add_argument("--group-timeout", type=float, default=60.0, help="gloo timeout, seconds")
    parser.add_argument("--no-ddp", dest="ddp", action="store_false", help="no DDP: the agreement is the only collective")
    parser.add_argument("--job-b", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--t0", type=float, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.workdir is None or args.url is None:  # every rank must agree on both: the ranks share a parent, the launcher
        if "WORLD_SIZE" in os.environ:
            base = Path(tempfile.gettempdir()) / f"handofflock-torchrun-{os.getppid()}"
            base.mkdir(parents=True, exist_ok=True)
        else:
            base = Path(tempfile.mkdtemp(prefix="handofflock-torchrun-"))
        args.workdir = args.workdir or str(base)
        args.url = args.url or (base / "train.lock.json").as_uri()
    return job_b(args) if args.job_b else train(args)


if __name__ == "__main__":
    sys.exit(main())
