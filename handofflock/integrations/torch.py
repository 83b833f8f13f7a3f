"""The torch.distributed adapter: one tiny all-reduce per agreement, on the caller's process group.

>>> import torch.distributed as dist
>>> dist.init_process_group("gloo")              # or nccl; torchrun sets the environment
>>> with rank_lock(url, holder_rank=0, every=10, ttl=60.0) as ranks:
...     steps = ranks.steps(range(start, total))
...     for step in steps:
...         train(step)
...     save_checkpoint(steps.last)

The vote is a 2-element int32 tensor (yield, lost) all-reduced with MAX: one
collective carries both flags, so a loss is never missed by a rank waiting
for the yield flag. On nccl the tensor lives on the current CUDA device. A
failed all-reduce (a rank died, or the group's timeout passed) raises
:class:`~handofflock.AgreementFailed` with torch's error chained; set the
group's ``timeout`` to bound how long a rank can wait for a dead peer.

Importing this module imports torch.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from ..core.errors import AgreementFailed, ConfigurationError
from .ranks import Agree, RankLock, local_agree

if TYPE_CHECKING:
    from ..lock.handoff import HandoffLock

__all__ = ["rank_lock", "torch_agree"]


def torch_agree(group: Any = None, device: torch.device | str | None = None) -> Agree:
    """An :data:`~handofflock.integrations.ranks.Agree` doing one all-reduce (MAX) per call on ``group``.

    ``device`` defaults to the current CUDA device for nccl and the CPU otherwise.
    """
    if not dist.is_available() or not dist.is_initialized():
        raise ConfigurationError(
            "torch_agree() needs an initialised process group (torch.distributed.init_process_group)"
        )
    backend = dist.get_backend(group)
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
    where = torch.device(device)

    def agree(flags: Sequence[bool]) -> Sequence[bool]:
        votes = torch.tensor([1 if f else 0 for f in flags], dtype=torch.int32, device=where)
        try:
            dist.all_reduce(votes, op=dist.ReduceOp.MAX, group=group)
            values = votes.tolist()  # waits for the collective (and copies back from the GPU)
        except Exception as exc:  # DistBackendError, RuntimeError: a peer died or timed out
            raise AgreementFailed(
                f"rank {dist.get_rank()} could not agree with the other ranks ({backend} all-reduce failed: "
                f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}); another rank probably died "
                "or hung past the process group's timeout, so this rank stops"
            ) from exc
        return tuple(bool(v) for v in values)

    return agree


def rank_lock(
    url: str | os.PathLike[str] | None = None,
    *,
    lock: HandoffLock | None = None,
    holder_rank: int = 0,
    group: Any = None,
    every: int = 1,
    poll: float = 1.0,
    **lock_kwargs: Any,
) -> RankLock:
    """A :class:`~handofflock.integrations.ranks.RankLock` for this process's rank.

    On ``holder_rank`` (a global rank) it opens ``HandoffLock(url, **lock_kwargs)``
    (or uses ``lock``); elsewhere it opens nothing. Without an initialised
    process group the job is one rank, which holds the lock itself.
    """
    if (url is None) == (lock is None):
        raise ConfigurationError("pass either url or lock")
    if dist.is_available() and dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
        if not 0 <= holder_rank < world:
            raise ConfigurationError(f"holder_rank {holder_rank} is not a rank of this job (world size {world})")
        agree = torch_agree(group)
    else:
        rank, agree = 0, local_agree
        if holder_rank != 0:
            raise ConfigurationError(f"holder_rank {holder_rank} in a job of one rank (no process group)")
    if rank == holder_rank:
        if lock is None:
            from ..lock.handoff import HandoffLock

            assert url is not None
            lock = HandoffLock(url, **lock_kwargs)
    else:
        lock = None
    return RankLock(lock, agree, every=every, poll=poll, rank=rank)
