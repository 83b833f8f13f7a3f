"""A Lightning callback: hold the lock for the fit, yield at a checkpoint on every rank, resume from it.

>>> callback = HandoffLockCallback(url, checkpoint="ckpts/handoff.ckpt", every=10, ttl=60.0)
>>> trainer = lightning.Trainer(callbacks=[callback], ...)
>>> while True:
...     callback.acquire()                        # every rank; needs the process group (or one process)
...     trainer.fit(model, ckpt_path=callback.resume_path)
...     if not callback.yielded:
...         break                                 # done
...     if callback.decision.exit:                # a signal or a notice: end, be requeued, resume then
...         sys.exit(callback.decision.exit_status)
...     trainer = lightning.Trainer(callbacks=[callback], ...)   # a yield: wait for the lock again, resume

* before fit: the job takes the lock (the holder rank acquires; all ranks
  return together). ``setup`` does it if :meth:`acquire` was not called, but
  then ``ckpt_path`` was chosen before the lock was held: call
  :meth:`acquire` first to resume from the checkpoint the last holder left.
* every ``every`` training batches all ranks agree whether to yield; on a
  release request every rank saves ``checkpoint`` through
  ``trainer.save_checkpoint`` (Lightning writes it once and waits for all
  ranks) and fit stops cleanly after that batch;
* during fit's validation the ranks agree every ``every`` validation batches
  too, so a long validation does not hold a stop back: a stop there ends the
  validation loop after that batch (the rest of that validation is not run,
  its metrics are partial), and the checkpoint is written at
  ``on_validation_end``, where ``ModelCheckpoint`` writes its own (a resume
  goes on training after that validation). The sanity check, ``validate()``
  and ``test()`` never agree;
* at the end of fit, all ranks meet and the holder hands the lock off;
* if the holder loses the lock, every rank raises
  :class:`~handofflock.LockLost` at the same batch.
* SIGTERM, SIGINT and SIGUSR1 on any rank become one agreed exit
  (``callback.decision.exit``; exit with ``decision.exit_status``). During fit
  the callback's handlers sit on top of Lightning's: Lightning's SIGTERM
  handler would raise ``SIGTERMException`` on some ranks before any callback
  can checkpoint, so SIGTERM is ours until the checkpoint is written; a SIGTERM
  Lightning saw first (``trainer.received_sigterm``) counts as a vote too.
  SIGUSR1 is chained to the handler found (Lightning's ``SLURMEnvironment``
  auto-requeue keeps working), and our handlers are only installed once
  Lightning has installed its own, so theirs is never silently skipped.
* agreements fall only on optimizer-step boundaries
  (``accumulate_grad_batches``): a stop never drops accumulated gradients.
* a stop ends the fit even under ``min_steps`` / ``min_epochs`` (Lightning
  ignores ``should_stop`` until they are met; the callback lifts them for
  this fit and puts them back at its end).
* the yield checkpoint is ``checkpoint`` with the fencing token and the
  step in its name (``handoff.ckpt`` gives ``handoff-token<T>-step<N>.ckpt``:
  never overwritten by another hold) and carries ``checkpoint["handofflock"]``
  (the token, the decision);
* every full checkpoint the trainer saves while the job holds the lock (the
  yield's, and each ``ModelCheckpoint`` save) moves the job's
  latest-checkpoint pointer (``latest``, by default ``handoff.latest.json``
  beside ``checkpoint``; :mod:`handofflock.integrations.checkpoints`) once it
  is whole: a write fenced by the lock's token, so a replaced holder cannot
  move it back; a refused write raises :class:`~handofflock.LockLost` on every
  rank at that save. :attr:`resume_path` reads it: the newest checkpoint of the
  job, from this process or any before it.
* no file the pointer names is rewritten in place: ``ModelCheckpoint``'s
  ``last.ckpt``, one name rewritten by every save, is
  ``last-token<T>-step=<N>.ckpt`` during the fit (its ``CHECKPOINT_NAME_LAST``
  with the hold's token and ``{step}``; the previous one is still removed);
  its other names have the step in them, and a name already on disk gets a
  version (``-v1``) rather than being rewritten.

The collective during fit is the strategy's: :func:`strategy_agree`, one
``strategy.reduce(votes, reduce_op="max")`` of the vote's flags (on the
strategy's process group and ``root_device``). Not
``strategy.reduce_boolean_decision``: it reduces one boolean, and a vote
carries ``3 + len(EXIT_CAUSES)`` flags, which would be as many collectives.
Outside fit (:meth:`HandoffLockCallback.acquire` before it) the collective is
:func:`handofflock.integrations.torch.torch_agree` on the default process
group, the one Lightning's DDP strategy uses.

``python train.py`` with ``devices=N`` (Lightning's own launcher): the script
runs once, as global rank 0, until ``fit`` starts ranks 1..N-1 by running it
again. Rank 0's :meth:`~HandoffLockCallback.acquire` takes the lock alone (there
is no process group yet); in a relaunched rank (Lightning set ``LOCAL_RANK`` or
``NODE_RANK``, not ``RANK``, and there is no process group) it takes nothing and
returns at once: the job already holds the lock, since those ranks only start
inside rank 0's fit, so their ``resume_path`` is the one rank 0 chose. In
``setup`` every rank joins the hold (:meth:`RankLock.join`). Only
``holder_rank=0`` is possible then. Under torchrun (``RANK`` set), initialise the
process group before :meth:`~HandoffLockCallback.acquire`, as the example does.

Importing this module imports lightning.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

import torch.distributed as dist
from lightning.pytorch import Callback

from .checkpoints import LatestCheckpoint
from .ranks import Agree, local_agree
from .torch import RankHold, tensor_agree

__all__ = ["HandoffLockCallback", "strategy_agree"]


def strategy_agree(strategy: Any) -> Agree:
    """An :data:`~handofflock.integrations.ranks.Agree` on a Lightning strategy's collective.

    One ``strategy.reduce`` (MAX) of the vote's flags as an int32 tensor on
    ``strategy.root_device``: the strategy's process group and device, whatever
    the strategy (DDP, FSDP, DeepSpeed...). A failed reduce raises
    :class:`~handofflock.AgreementFailed`.
    """

    return tensor_agree(
        lambda votes: strategy.reduce(votes, reduce_op="max"),
        device=lambda: strategy.root_device,
        rank=lambda: int(strategy.global_rank),
        what="the strategy's reduce failed",
    )


def _relaunched_by_lightning() -> bool:
    """A rank Lightning's launcher started (``python train.py``, ``devices=N``) other than global rank 0.

    Lightning runs the script again for local ranks 1..N-1 with ``LOCAL_RANK``
    (and ``NODE_RANK``) set but not ``RANK`` (torchrun's), before any process group exists.
    """
    if dist.is_available() and dist.is_initialized():
        return False
    env = os.environ
    if "RANK" in env:  # torchrun, or another launcher: its ranks initialise the group themselves
        return False
    return env.get("LOCAL_RANK", "0") != "0" or env.get("NODE_RANK", "0") != "0"


class HandoffLockCallback(RankHold, Callback):
    """Hold a :class:`~handofflock.HandoffLock` for ``trainer.fit`` on one rank; yield on all ranks together.

    ``url`` and the other keywords open the lock on ``holder_rank`` (see
    :class:`~handofflock.integrations.torch.RankHold`); ``every`` is the number
    of batches between agreements; ``checkpoint`` names the file the yield
    writes (with the token and step added); ``latest`` is where the job's
    latest-checkpoint pointer lives (default: beside ``checkpoint``, ``.latest.json``).

    After a fit: ``yielded`` is True if it ended because the lock was asked
    for, ``yield_step`` is the ``trainer.global_step`` the checkpoint holds,
    and ``yield_path`` the file.
    """

    def __init__(
        self,
        url: str | os.PathLike[str],
        *,
        checkpoint: str | os.PathLike[str],
        latest: str | os.PathLike[str] | None = None,
        **options: Any,
    ) -> None:
        super().__init__(url, **options)
        self.checkpoint = Path(checkpoint)
        self.latest_url = os.fspath(latest) if latest is not None else str(self.checkpoint.with_suffix(".latest.json"))
        self._latest = LatestCheckpoint(self.latest_url)  # reads only: any rank, before or after acquire
        #: After a stop: the checkpoint file it wrote (``checkpoint`` with the token and step in its name).
        self.yield_path: Path | None = None
        self._lifted: tuple[Any, Any] | None = None
        #: A rank Lightning relaunched: it joins the hold in setup instead of acquiring before fit.
        self._joins = False
        #: The ranks agreed to stop during validation: the checkpoint waits for on_validation_end.
        self._stop_after_validation = False
        #: The ModelCheckpoints whose ``last`` name carries the token for this fit, with their own name (or None).
        self._last_names: list[tuple[Any, str | None]] = []

    @property
    def resume_path(self) -> str | None:
        """The newest whole checkpoint of the job, as the latest-checkpoint pointer names it; None before any.

        Read from the pointer at each access (every rank reads the same one):
        a yield checkpoint or a ``ModelCheckpoint`` save, from this process or
        any earlier one.
        """
        found = self._latest.read()
        return found.path if found is not None else None

    def acquire(self) -> None:
        """Take the lock for the job (call on every rank). A no-op while it is held.

        In a rank that Lightning's launcher started (``python train.py`` with
        ``devices=N``; see the module docstring) it returns at once: the job
        holds the lock already, and the rank joins the hold in ``setup``.
        """
        if self.ranks is None and _relaunched_by_lightning():
            self._joins = True
            self.yielded, self.yield_step, self.decision = False, None, None
            return
        super().acquire()

    # ------------------------------------------------------------------ hooks

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage == "fit":
            self._point_after_saves(trainer)
            if self.ranks is None:  # acquire() was not called, or this rank joins (the process group exists now)
                self.ranks = self._open()
            if trainer.world_size > 1:
                # Rank 0 of `python train.py` took the lock alone, before its fit started the other ranks.
                joins = self._joins or self.ranks.agree is local_agree
                self.ranks.agree, self.ranks.rank = strategy_agree(trainer.strategy), trainer.global_rank
                if joins:
                    self._joins = False
                    self.ranks.join()
            if not self.ranks.held:
                self.acquire()
            self._stamp_last_names(trainer)
        if self.ranks is not None and self.ranks.signals is not None:
            # Off until on_train_start: Lightning installs its own handlers (Slurm's SIGUSR1 requeue
            # among them) only where it finds none; ours then go on top of theirs.
            self.ranks.signals.uninstall()

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        # Lightning has installed its handlers by now (register_signal_handlers runs before the stage):
        # ours go on top, chaining SIGUSR1 to theirs.
        if self.ranks is not None and self.ranks.signals is not None:
            self.ranks.signals.install()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        assert self.ranks is not None
        if self.yielded or not self._at_optimizer_step(trainer, batch_idx) or not self._agreed_stop(trainer):
            return
        self._stop(trainer)

    def on_validation_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        ranks = self.ranks
        if ranks is None or not ranks.held or self.yielded or trainer.sanity_checking or trainer.state.fn != "fit":
            return
        if not self._agreed_stop(trainer):
            return
        self._stop_after_validation = True
        # Lightning's evaluation loop ends on a StopIteration from its step (its hooks included), then
        # runs on_validation_end: the checkpoint is written there, where ModelCheckpoint writes its own.
        raise StopIteration

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if self._stop_after_validation:
            self._stop_after_validation = False
            self._stop(trainer)

    def _agreed_stop(self, trainer: Any) -> bool:
        """Agree with every rank now: True when all must stop. Raises LockLost on every rank at once."""
        assert self.ranks is not None
        if getattr(trainer, "received_sigterm", False):  # Lightning heard it first: a vote like ours
            self.ranks.request_stop("exit", cause="SIGTERM")
        return self.ranks.should_stop()

    def _at_optimizer_step(self, trainer: Any, batch_idx: int) -> bool:
        """Whether this batch ended with an optimizer step (not in the middle of gradient accumulation)."""
        accumulate = int(getattr(trainer, "accumulate_grad_batches", 1) or 1)
        last = trainer.num_training_batches
        return (batch_idx + 1) % accumulate == 0 or (isinstance(last, int) and batch_idx + 1 == last)

    def _point_after_saves(self, trainer: Any) -> None:
        """Make every full checkpoint this trainer saves while the job holds the lock move the pointer.

        Wraps the instance's ``save_checkpoint`` (the class is untouched): our
        yield checkpoint and every ``ModelCheckpoint`` save go through it on
        every rank. It returns once the file is whole (Lightning waits for all
        ranks); then the holder points there. Weights-only saves cannot resume
        a fit and are left out.
        """
        save = trainer.save_checkpoint
        if getattr(save, "_handofflock_pointer", None) is self:
            return

        @functools.wraps(save)
        def save_checkpoint(filepath: Any, weights_only: bool | None = None, storage_options: Any = None) -> None:
            save(filepath, weights_only, storage_options)
            ranks = self.ranks
            if not weights_only and ranks is not None and ranks.held:
                ranks.point(filepath, trainer.global_step)  # every rank; if refused, LockLost on every rank

        save_checkpoint._handofflock_pointer = self  # type: ignore[attr-defined]
        trainer.save_checkpoint = save_checkpoint

    def _stamp_last_names(self, trainer: Any) -> None:
        """Give each ``ModelCheckpoint``'s ``last`` this hold's token and the step, for this fit.

        ``last.ckpt`` is one name that every save rewrites in place, so the
        pointer would name a file another save (of this hold, a later one, or a
        replaced one) is rewriting. As ``last-token<T>-step=<N>.ckpt`` each save
        is a new file; ``ModelCheckpoint`` still removes its previous ``last``
        (after the pointer moved on). Lightning's documented way:
        ``CHECKPOINT_NAME_LAST`` on the instance; the names found come back at
        the end of the fit.
        """
        from lightning.pytorch.callbacks import ModelCheckpoint

        lock = self.ranks.lock if self.ranks is not None else None
        token = trainer.strategy.broadcast(lock.token if lock is not None else None, src=self.holder_rank)
        stamped = {id(saver) for saver, _ in self._last_names}
        for saver in trainer.checkpoint_callbacks:
            if isinstance(saver, ModelCheckpoint) and saver.save_last and id(saver) not in stamped:
                self._last_names.append((saver, vars(saver).get("CHECKPOINT_NAME_LAST")))
                saver.CHECKPOINT_NAME_LAST = f"{saver.CHECKPOINT_NAME_LAST}-token{token}-{{step}}"

    def _restore_last_names(self) -> None:
        for saver, own in self._last_names:
            if own is None:
                del saver.CHECKPOINT_NAME_LAST  # the class's name again
            else:
                saver.CHECKPOINT_NAME_LAST = own
        self._last_names = []

    def _stop(self, trainer: Any) -> None:
        assert self.ranks is not None
        self._stopped(trainer.global_step)
        # A name no other hold uses, the same on every rank (sharded strategies write on all of them).
        lock = self.ranks.lock
        token = trainer.strategy.broadcast(lock.token if lock is not None else None, src=self.holder_rank)
        name = f"{self.checkpoint.stem}-token{token}-step{trainer.global_step}{self.checkpoint.suffix}"
        self.yield_path = self.checkpoint.with_name(name)
        self.yield_path.parent.mkdir(parents=True, exist_ok=True)
        trainer.save_checkpoint(self.yield_path)  # every rank calls it; Lightning writes once, barriers, then we point
        # Lightning ignores should_stop until min_steps/min_epochs are met: lift them for this fit.
        fit_loop = trainer.fit_loop
        self._lifted = (fit_loop.epoch_loop.min_steps, fit_loop.min_epochs)
        fit_loop.epoch_loop.min_steps, fit_loop.min_epochs = None, None
        trainer.should_stop = True  # the epoch loop ends before the next batch

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        lock = self.ranks.lock if self.ranks is not None else None
        checkpoint["handofflock"] = {
            "token": lock.token if lock is not None else None,  # known on the holder (rank 0 writes the file)
            "decision": self._decision_json(),
        }

    def _restore_limits(self, trainer: Any) -> None:
        self._restore_last_names()
        if self._lifted is not None:
            trainer.fit_loop.epoch_loop.min_steps, trainer.fit_loop.min_epochs = self._lifted
            self._lifted = None

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self._restore_limits(trainer)
        self._end_run()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._restore_limits(trainer)
        self._end_run(failed=True)
