"""A 2-rank torchrun job for tests: rank 1 asks to yield while rank 0 waits for the lock; what does each rank see?"""

import os
import sys
import threading
import time

import torch.distributed as dist

from handofflock.integrations.torch import rank_lock


def say(line: str) -> None:
    """One write per line: two ranks share torchrun's unbuffered stdout, and print's two writes could splice."""
    os.write(1, f"{line}\n".encode())


url = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
ranks = rank_lock(url, every=1, poll=0.2, owner_id="job-A", ttl=10.0, waiter_poll_interval=0.2)
if rank == 1:  # a follower's own reason to stop, while the job still waits for its turn
    threading.Timer(1.0, ranks.request_stop).start()
    say("rank 1 asks to yield while waiting")
ranks.acquire()
steps = ranks.steps(range(100))
for step in steps:
    time.sleep(0.01)
d = steps.decision
say(f"rank {rank}: count {steps.count} decision {d.action if d else None} {d.cause if d else None}")
ranks.release()
dist.destroy_process_group()
