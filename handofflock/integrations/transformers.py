"""A Hugging Face ``TrainerCallback``: hold the lock for training, yield at a checkpoint on every rank, resume from it.

>>> callback = HandoffLockTrainerCallback(url, every=10, ttl=60.0)
>>> trainer = transformers.Trainer(..., callbacks=[callback])
>>> while True:
...     callback.acquire()                         # every rank; after the Trainer set up the process group
...     trainer.train(resume_from_checkpoint=callback.resume_path(trainer.args.output_dir))
...     if not callback.yielded:
...         break                                  # done; else wait for the lock again and resume

* before training: the job takes the lock (the holder rank acquires; all
  ranks return together); ``on_train_begin`` does it if :meth:`acquire` was
  not called, but then the checkpoint to resume from was chosen before the
  lock was held;
* every ``every`` optimizer steps (``on_step_end``) all ranks agree whether to
  yield; on a release request the callback sets ``control.should_save`` and
  ``control.should_training_stop``, so the Trainer saves
  ``checkpoint-<global_step>`` on every rank and leaves its loop;
* at ``on_train_end`` all ranks meet and the holder hands the lock off;
* if the holder loses the lock, every rank raises
  :class:`~handofflock.LockLost` at the same step.

Importing this module imports transformers (and torch).
"""

from __future__ import annotations

import os
from typing import Any

from transformers import TrainerCallback
from transformers.trainer_utils import get_last_checkpoint

from .ranks import RankLock
from .torch import rank_lock

__all__ = ["HandoffLockTrainerCallback"]


class HandoffLockTrainerCallback(TrainerCallback):
    """Hold a :class:`~handofflock.HandoffLock` for ``trainer.train`` on one rank; yield on all ranks together.

    After a run: ``yielded`` is True if it ended because the lock was asked
    for, and ``yield_step`` is the ``state.global_step`` of the checkpoint it saved.
    """

    def __init__(
        self,
        url: str | os.PathLike[str],
        *,
        holder_rank: int = 0,
        every: int = 1,
        poll: float = 1.0,
        **lock_kwargs: Any,
    ) -> None:
        self.url = url
        self.holder_rank = holder_rank
        self.every = every
        self.poll = poll
        self.lock_kwargs = lock_kwargs
        self.ranks: RankLock | None = None
        self.yielded = False
        self.yield_step: int | None = None

    @staticmethod
    def resume_path(output_dir: str | os.PathLike[str]) -> str | None:
        """The newest ``checkpoint-N`` in ``output_dir``, or None: pass it as ``resume_from_checkpoint``."""
        if not os.path.isdir(output_dir):
            return None
        last: str | None = get_last_checkpoint(os.fspath(output_dir))  # type: ignore[no-untyped-call]
        return last

    def acquire(self) -> None:
        """Take the lock for the job (call on every rank). A no-op while it is held."""
        if self.ranks is None:
            self.ranks = rank_lock(
                self.url, holder_rank=self.holder_rank, every=self.every, poll=self.poll, **self.lock_kwargs
            )
        if not self.ranks.held:
            self.ranks.acquire()
        self.yielded, self.yield_step = False, None

    # ------------------------------------------------------------------ events

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.ranks is None or not self.ranks.held:
            self.acquire()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        assert self.ranks is not None
        if not self.yielded and self.ranks.should_stop():  # raises LockLost on every rank at once
            self.yielded, self.yield_step = True, state.global_step
            control.should_save = True  # the Trainer saves checkpoint-<global_step> (all ranks take part)
            control.should_training_stop = True
        return control

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.ranks is not None and self.ranks.held:
            self.ranks.release()  # all ranks meet (the checkpoint is written), then the holder hands off
