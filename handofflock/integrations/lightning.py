"""A Lightning callback: hold the lock for the fit, yield at a checkpoint on every rank, resume from it.

>>> callback = HandoffLockCallback(url, checkpoint="ckpts/handoff.ckpt", every=10, ttl=60.0)
>>> trainer = lightning.Trainer(callbacks=[callback], ...)
>>> while True:
...     callback.acquire()                        # every rank; needs the process group (or one process)
...     trainer.fit(model, ckpt_path=callback.resume_path)
...     if not callback.yielded:
...         break                                 # done; else wait for the lock again and resume
...     trainer = lightning.Trainer(callbacks=[callback], ...)

* before fit: the job takes the lock (the holder rank acquires; all ranks
  return together). ``setup`` does it if :meth:`acquire` was not called, but
  then ``ckpt_path`` was chosen before the lock was held: call
  :meth:`acquire` first to resume from the checkpoint the last holder left.
* every ``every`` training batches all ranks agree whether to yield; on a
  release request every rank saves ``checkpoint`` through
  ``trainer.save_checkpoint`` (Lightning writes it once and waits for all
  ranks) and fit stops cleanly after that batch;
* at the end of fit, all ranks meet and the holder hands the lock off;
* if the holder loses the lock, every rank raises
  :class:`~handofflock.LockLost` at the same batch.

The collective is :func:`handofflock.integrations.torch.torch_agree` on the
default process group (Lightning's own, or one you initialised first).
Importing this module imports lightning.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback

from .ranks import RankLock
from .torch import rank_lock

__all__ = ["HandoffLockCallback"]


class HandoffLockCallback(Callback):
    """Hold a :class:`~handofflock.HandoffLock` for ``trainer.fit`` on one rank; yield on all ranks together.

    ``url`` and ``lock_kwargs`` open the lock on ``holder_rank``; ``every`` is
    the number of batches between agreements; ``checkpoint`` the file the
    yield writes (and :attr:`resume_path` names once it exists).

    After a fit: ``yielded`` is True if it ended because the lock was asked
    for, and ``yield_step`` is the ``trainer.global_step`` the checkpoint holds.
    """

    def __init__(
        self,
        url: str | os.PathLike[str],
        *,
        checkpoint: str | os.PathLike[str],
        holder_rank: int = 0,
        every: int = 1,
        poll: float = 1.0,
        **lock_kwargs: Any,
    ) -> None:
        super().__init__()
        self.url = url
        self.checkpoint = Path(checkpoint)
        self.holder_rank = holder_rank
        self.every = every
        self.poll = poll
        self.lock_kwargs = lock_kwargs
        self.ranks: RankLock | None = None
        self.yielded = False
        self.yield_step: int | None = None

    @property
    def resume_path(self) -> str | None:
        """The yield checkpoint, if one was written: pass it as ``trainer.fit(..., ckpt_path=)``."""
        return str(self.checkpoint) if self.checkpoint.exists() else None

    def acquire(self) -> None:
        """Take the lock for the job (call on every rank). A no-op while it is held."""
        if self.ranks is None:
            self.ranks = rank_lock(
                self.url, holder_rank=self.holder_rank, every=self.every, poll=self.poll, **self.lock_kwargs
            )
        if not self.ranks.held:
            self.ranks.acquire()
        self.yielded, self.yield_step = False, None

    # ------------------------------------------------------------------ hooks

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage == "fit" and (self.ranks is None or not self.ranks.held):
            self.acquire()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        # After the optimizer step: a yield saves exactly the steps done, and the next batch never starts.
        assert self.ranks is not None
        if self.yielded or not self.ranks.should_stop():  # raises LockLost on every rank at once
            return
        self.yielded, self.yield_step = True, trainer.global_step
        self.checkpoint.parent.mkdir(parents=True, exist_ok=True)
        trainer.save_checkpoint(self.checkpoint)  # every rank calls it; Lightning writes once and barriers
        trainer.should_stop = True  # the epoch loop ends before the next batch

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        if self.ranks is not None and self.ranks.held:
            self.ranks.release()  # all ranks meet (checkpoint written), then the holder hands off

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        if self.ranks is not None:
            self.ranks.abandon()  # no meeting: the other ranks may be gone
