"""A plain torch job for the pointer tests: 2 gloo ranks under torchrun, a checkpoint and a pointer move each step.

    torchrun --nproc-per-node 2 rank_point_job.py URL WORKDIR

Each step every rank writes its part of the checkpoint, then all move the job's
pointer (``ranks.point``). At step REPLACED_AT a newer holder claims the pointer
first (as a job that took the lock over would), so that move is refused. Each
rank prints each move and where it stopped, and why.
"""

import datetime
import os
import sys
from pathlib import Path

import torch.distributed as dist

from handofflock import FencedObject
from handofflock.integrations.torch import rank_lock
from handofflock.storage import open_url


def say(line: str) -> None:
    """One write per line: two ranks share torchrun's unbuffered stdout, and print's two writes could splice."""
    os.write(1, f"{line}\n".encode())


REPLACED_AT = 2

url, workdir = sys.argv[1], Path(sys.argv[2])
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
rank = dist.get_rank()
pointer = workdir / "latest.json"
ranks = rank_lock(url, every=1, signals=(), owner_id="job-A", ttl=30.0, latest=pointer)
ranks.acquire()
step = None
try:
    for step in ranks.steps(range(10)):
        (workdir / f"ckpt-{step}-rank{rank}").write_text(str(step))
        if step == REPLACED_AT and ranks.lock is not None:
            FencedObject(*open_url(pointer), writer_id="job-B").claim(ranks.lock.token + 1)
        ranks.point(workdir / f"ckpt-{step}", step)
        say(f"rank {rank} pointed at step {step}")
except Exception as exc:
    say(f"rank {rank} stopped at step {step}: {type(exc).__name__}")
    ranks.abandon()
    # Neither rank leaves before both have let go: torchrun ends the other ranks as soon as one exits.
    dist.barrier()
    dist.destroy_process_group()
    sys.exit(3)
say(f"rank {rank} finished")
