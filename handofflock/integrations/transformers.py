"""A Hugging Face ``TrainerCallback``: hold the lock for training, yield at a checkpoint on every rank, resume from it.

>>> callback = HandoffLockTrainerCallback(url, every=10, ttl=60.0)
>>> trainer = transformers.Trainer(..., callbacks=[callback])
>>> while True:
...     decision = callback.train(trainer)         # every rank: take the lock, resume from the newest checkpoint, train
...     if decision is None:
...         break                                  # done
...     if decision.exit:                          # SIGTERM, SIGINT, SIGUSR1, a preemption notice
...         sys.exit(decision.exit_status)         # checkpointed and released: be requeued, resume then
...     # "yield": checkpointed and handed off; wait for the lock again here

:meth:`train` is the exception path the Trainer lacks (``on_train_end`` is not
called when training raises): an exception releases the lock on the holder at
once, without meeting the other ranks, and propagates. A plain
``trainer.train()`` gets the same path: when the Trainer is built with the
callback (``callbacks=[callback]``), ``on_init_end`` wraps that Trainer's
``train`` (an attribute of the instance; the class is untouched) so an exception
lets the lock go and propagates. The Trainer does not pass itself to its
callbacks: the callback finds it as the ``Trainer`` whose ``state`` is the one
``on_init_end`` got, in the frames of the ``Trainer.__init__`` that calls it. A
callback added later (``trainer.add_callback``) gets no ``on_init_end``: there,
call :meth:`train` (a warning at ``on_train_begin`` says so). Signals (SIGTERM, SIGINT,
SIGUSR1) on any rank become one agreed exit at the next agreement: every rank
sets ``should_save`` and ``should_training_stop`` at the same step. With
``enable_jit_checkpoint`` the callback takes SIGTERM over from the Trainer's
just-in-time handler during training (its checkpoint is per rank, 3 s after the
signal, at whatever step each rank is; ours is agreed) and puts it back after.
After each save, once every rank has written its part, the holder writes
``handofflock.json`` (the fencing token and the decision) into the
checkpoint, renames ``checkpoint-N`` to ``checkpoint-0N-token<T>`` (the
Trainer writes ``checkpoint-N`` in place: a later hold, or a replaced one,
that saves step N again would rewrite it; the leading zero ranks a later
save of step N above this one in the Trainer's rotation), and points the job's
latest-checkpoint pointer (``handofflock-latest.json`` in ``output_dir``;
:mod:`handofflock.integrations.checkpoints`) at it: a write fenced by the
lock's token, so a replaced holder cannot move it back, and :meth:`resume_path`
names the newest save across processes, not the highest ``checkpoint-N``. A
refused write raises :class:`~handofflock.LockLost` on every rank at that
save. The Trainer's rotation (``save_total_limit``) counts and removes the
renamed folders as its own, and keeps the new ``checkpoint-N`` (it rotates
before the rename) over an earlier hold's save of step N even where it orders
by the step in the name, then by the name (mtimes within 1 s: a FUSE mount, a
quick job): ``checkpoint-N`` sorts after ``checkpoint-0N-token<T>``. Its
``resume_from_checkpoint=True`` looks for ``checkpoint-N`` only, so the guarded ``train()`` (:meth:`guard`) turns
``True`` into :meth:`resume_path` (:meth:`train` resumes from it anyway).

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

import functools
import inspect
import json
import os
import shutil
import warnings
from typing import Any

from transformers import TrainerCallback
from transformers.trainer_utils import get_last_checkpoint

from .checkpoints import LatestCheckpoint
from .ranks import StopDecision
from .torch import RankHold

__all__ = ["HandoffLockTrainerCallback", "latest_pointer"]

#: The latest-checkpoint pointer's name in the Trainer's ``output_dir`` (no ``checkpoint-`` prefix:
#: the Trainer's own search and rotation of its checkpoints never see it).
POINTER_NAME = "handofflock-latest.json"
#: The Trainer's state file in each checkpoint (``transformers.trainer.TRAINER_STATE_NAME``).
TRAINER_STATE_NAME = "trainer_state.json"


def latest_pointer(output_dir: str | os.PathLike[str]) -> str:
    """Where the latest-checkpoint pointer of a Trainer writing to ``output_dir`` lives."""
    return os.path.join(os.fspath(output_dir), POINTER_NAME)


class HandoffLockTrainerCallback(RankHold, TrainerCallback):
    """Hold a :class:`~handofflock.HandoffLock` for ``trainer.train`` on one rank; yield on all ranks together.

    The arguments are :class:`~handofflock.integrations.torch.RankHold`'s.
    After a run: ``yielded`` is True if it ended because the lock was asked
    for, and ``yield_step`` is the ``state.global_step`` of the checkpoint it saved.
    """

    def __init__(self, url: str | os.PathLike[str], **options: Any) -> None:
        super().__init__(url, **options)
        #: Whether a Trainer's ``train`` was guarded (:meth:`guard`); else on_train_begin warns, once.
        self._guarding = False
        self._warned = False

    def __enter__(self) -> HandoffLockTrainerCallback:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None:
            self._end_run(failed=True)  # on_train_end never comes: let the lock go now

    def train(self, trainer: Any, **train_kwargs: Any) -> StopDecision | None:
        """Take the lock, train from the newest checkpoint in ``output_dir``, release; on an exception, let go.

        Returns the :class:`~handofflock.integrations.ranks.StopDecision` if the
        ranks stopped early, None if training ran to its end.
        """
        self.guard(trainer)
        with self:
            self.latest_url = latest_pointer(trainer.args.output_dir)
            self.acquire()  # raises RankExit (a SystemExit) if a signal comes while the job waits
            train_kwargs.setdefault("resume_from_checkpoint", self.resume_path(trainer.args.output_dir))
            trainer.train(**train_kwargs)
        return self.decision

    @staticmethod
    def resume_path(output_dir: str | os.PathLike[str]) -> str | None:
        """The newest checkpoint of the job writing to ``output_dir``, or None: pass it as ``resume_from_checkpoint``.

        The one the latest-checkpoint pointer names (the last save of the
        newest hold, from this process or any before it, as
        ``checkpoint-0N-token<T>``); without a pointer
        (no save under the lock yet), or one naming a folder the Trainer's
        rotation removed before the pointer moved (with a warning), the
        Trainer's own choice: the highest ``checkpoint-N``.
        """
        found = LatestCheckpoint(latest_pointer(output_dir)).read()
        if found is not None and os.path.isdir(found.path):
            return found.path
        if found is not None:
            # The Trainer rotates old checkpoints (``save_total_limit``) before ``on_save`` moves the pointer
            # to the new one: a process that died between the two left the pointer on a deleted folder.
            warnings.warn(
                f"the latest-checkpoint pointer names {found.path}, which no longer exists (removed by the "
                "Trainer's checkpoint rotation before the pointer moved); resuming from the highest checkpoint-N",
                stacklevel=2,
            )
        if not os.path.isdir(output_dir):
            return None
        last: str | None = get_last_checkpoint(os.fspath(output_dir))  # type: ignore[no-untyped-call]
        return last

    def guard(self, trainer: Any) -> None:
        """Make ``trainer.train()`` let the lock go when it raises (``on_init_end`` does it for you).

        Wraps the instance's ``train``: on an exception the holder rank releases
        the lock at once (no meeting: the other ranks may be gone) and the
        exception propagates; ``resume_from_checkpoint=True`` resumes from
        :meth:`resume_path`, the newest save (the Trainer's own search sees no
        renamed one). Idempotent.
        """
        self._guarding = True
        if getattr(trainer.train, "_handofflock_guard", None) is self:
            return
        train = trainer.train

        @functools.wraps(train)
        def guarded_train(*args: Any, **kwargs: Any) -> Any:
            if args[:1] == (True,) or kwargs.get("resume_from_checkpoint") is True:
                # The Trainer's "newest in output_dir" finds checkpoint-N only, never a renamed save: a
                # checkpoint-N there is one a crash left between its save and its rename. The pointer's.
                found = self.resume_path(trainer.args.output_dir)
                if found is not None:
                    args, kwargs = args[1:], {**kwargs, "resume_from_checkpoint": found}
            try:
                return train(*args, **kwargs)
            except BaseException:
                self._end_run(failed=True)  # on_train_end never comes
                raise

        guarded_train._handofflock_guard = self  # type: ignore[attr-defined]
        trainer.train = guarded_train

    # ------------------------------------------------------------------ events

    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.ranks is None or not self.ranks.held:  # an acquire() before train() claims this trainer's pointer
            self.latest_url = latest_pointer(args.output_dir)
        trainer = _calling_trainer(state)
        if trainer is not None:
            self.guard(trainer)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self._guarding and not self._warned:
            self._warned = True
            warnings.warn(
                "HandoffLockTrainerCallback was added after the Trainer was built: a trainer.train() that raises "
                "keeps the lock until this process ends; call callback.train(trainer) or callback.guard(trainer)",
                UserWarning,
                stacklevel=2,
            )
        if self.ranks is None or not self.ranks.held:
            self.latest_url = latest_pointer(args.output_dir)
            self.acquire()
        assert self.ranks is not None
        handlers = self.ranks.signals
        if handlers is not None:
            handlers.install()  # over a JIT-checkpoint handler set up since

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        # After the optimizer step (gradient accumulation is inside the step): the Trainer's own boundary.
        assert self.ranks is not None
        if not self.yielded and self.ranks.should_stop():  # raises LockLost on every rank at once
            self._stopped(state.global_step)
            control.should_save = True  # the Trainer saves checkpoint-<global_step> (all ranks take part)
            control.should_training_stop = True
        return control

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        ranks = self.ranks
        if ranks is None or not ranks.held:
            return
        if ranks.latest is None:  # the lock was taken before this trainer was known: its pointer, unclaimed
            ranks.latest = LatestCheckpoint(latest_pointer(args.output_dir), lock=ranks.lock)
        step = state.global_step

        def seal(token: int) -> str | None:
            """On the holder, once every rank wrote its part: the token inside and in the name, then pointed at."""
            folder = os.path.join(args.output_dir, f"checkpoint-{step}")
            sealed = _sealed_checkpoint(args.output_dir, step, token)
            if not os.path.isdir(folder):
                return None
            if os.path.isdir(sealed):  # this hold saved this step before: that copy is whole and pointed at
                shutil.rmtree(folder)
                return sealed
            meta = {
                "token": token,
                "owner_id": ranks.lock.owner_id if ranks.lock else None,
                "step": step,
                "decision": self._decision_json(),
            }
            with open(os.path.join(folder, "handofflock.json"), "w", encoding="utf-8") as f:
                json.dump(meta, f)
            best = state.best_model_checkpoint
            if best is not None and os.path.abspath(best) == os.path.abspath(folder):
                _follow_rename(state, os.path.join(folder, TRAINER_STATE_NAME), sealed)
            os.rename(folder, sealed)  # no later save of this step, by any hold, writes into what the pointer names
            return sealed

        ranks.point(os.path.join(args.output_dir, f"checkpoint-{step}"), step, seal=seal)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._end_run()


def _sealed_checkpoint(output_dir: str | os.PathLike[str], step: int, token: int) -> str:
    """The name the holder gives the Trainer's ``checkpoint-<step>`` once sealed: ``checkpoint-0<step>-token<token>``.

    The step's leading zero is for the Trainer's rotation (``save_total_limit``),
    which runs inside the save, before the rename: where the checkpoints' mtimes
    lie within 1 s of each other (a FUSE mount, a quick job) it orders them by
    the number after ``checkpoint-`` (6 in each name below), then by path,
    and keeps the last. ``checkpoint-6`` sorts before ``checkpoint-6-token<T>``
    but after ``checkpoint-06-token<T>``: a new save of a step an earlier hold
    sealed is the one kept, never the one removed unsealed.
    """
    return os.path.join(os.fspath(output_dir), f"checkpoint-0{step}-token{token}")


def _follow_rename(state: Any, state_file: str, sealed: str) -> None:
    """The best checkpoint is being renamed: the Trainer's state, and its copy inside, name the new name.

    ``load_best_model_at_end`` and the rotation's protection of the best checkpoint go by that path.
    """
    state.best_model_checkpoint = sealed
    if os.path.isfile(state_file):
        with open(state_file, encoding="utf-8") as f:
            saved = json.load(f)
        saved["best_model_checkpoint"] = sealed
        with open(state_file, "w", encoding="utf-8") as f:
            json.dump(saved, f, indent=2, sort_keys=True)


def _calling_trainer(state: Any) -> Any:
    """The ``Trainer`` whose ``__init__`` is calling ``on_init_end`` with ``state``, or None."""
    from transformers import Trainer

    frame = inspect.currentframe()
    try:
        while frame is not None:
            candidate = frame.f_locals.get("self")
            if isinstance(candidate, Trainer) and getattr(candidate, "state", None) is state:
                return candidate
            frame = frame.f_back
        return None
    finally:
        del frame
