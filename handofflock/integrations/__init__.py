"""Integrations with training frameworks: one lock holder, one yield decision for every rank.

:mod:`handofflock.integrations.ranks` is framework-neutral (any launcher can
supply the collective), and so is :mod:`.checkpoints`, the job's fenced pointer
to its newest checkpoint; :mod:`.torch`, :mod:`.lightning` and
:mod:`.transformers` adapt it. Each adapter imports its framework only when it
is itself imported, so ``import handofflock`` never needs one.

>>> from handofflock.integrations.torch import rank_lock     # needs torch
>>> with rank_lock(url, holder_rank=0, every=10) as ranks:    # every rank
...     steps = ranks.steps(range(start, total))
...     for step in steps:
...         train(step)
...     save_checkpoint(steps.last)                          # every rank, same step
...     # leaving: all ranks meet, then the holder hands the lock off
"""

from .checkpoints import Checkpoint, LatestCheckpoint
from .ranks import Agree, RankLock, RankSteps, any_of_two, local_agree

__all__ = ["Agree", "Checkpoint", "LatestCheckpoint", "RankLock", "RankSteps", "any_of_two", "local_agree"]
