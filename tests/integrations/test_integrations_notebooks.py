"""The callbacks in a process that lives on (a notebook, an HPO driver), and jobs that wait patiently.

In-process, one rank on the CPU, a real Lightning Trainer and a real Hugging Face
Trainer with tiny models: after a run (finished or stopped by an interrupt) the
signal handlers found before are back, the same callback serves the next run,
and what the user must see is a warning.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import warnings

import pytest
import torch
from hfutil import Regressor
from hfutil import hf_trainer as tiny_trainer

from handofflock import HandoffLock
from handofflock.integrations.torch import rank_lock

# ttl 30: nothing here waits for a lease to run out, and a framework's start-up on a loaded machine can hold
# the renewals past a 4 s lease's 2 s deadline. The checks stay fast: a waiter is seen within 0.1 s.
TIMING = dict(ttl=30.0, waiter_check_interval=0.1, waiter_poll_interval=0.05)
HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)


def handlers() -> dict[signal.Signals, object]:
    return {sig: signal.getsignal(sig) for sig in HANDLED}


def interrupt_this_process() -> None:
    """What a notebook's "interrupt kernel" does: SIGINT to the kernel."""
    os.kill(os.getpid(), signal.SIGINT)


def data(n: int = 64) -> torch.utils.data.TensorDataset:
    gen = torch.Generator().manual_seed(0)
    return torch.utils.data.TensorDataset(torch.randn(n, 4, generator=gen), torch.randn(n, generator=gen))


@pytest.mark.timeout(120)
def test_a_lightning_callback_interrupted_puts_the_handlers_back_and_serves_the_next_fit(tmp_path):
    import lightning.pytorch as pl

    from handofflock.integrations.lightning import HandoffLockCallback

    warnings.filterwarnings("ignore", message=".*does not have many workers.*")

    class Tiny(pl.LightningModule):
        def __init__(self, interrupt_at: int | None) -> None:
            super().__init__()
            self.net, self.interrupt_at = torch.nn.Linear(4, 1), interrupt_at

        def training_step(self, batch, batch_idx):
            if self.global_step == self.interrupt_at:
                interrupt_this_process()  # handled by the callback: an agreed exit at the next batch
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x).squeeze(1), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    def trainer() -> pl.Trainer:
        return pl.Trainer(accelerator="cpu", devices=1, max_steps=8, logger=False, enable_checkpointing=False,
                          enable_progress_bar=False, enable_model_summary=False, callbacks=[callback])

    url = (tmp_path / "l.json").as_uri()
    callback = HandoffLockCallback(url, checkpoint=tmp_path / "handoff.ckpt", every=1, **TIMING)
    before = handlers()
    trainer().fit(Tiny(interrupt_at=3), torch.utils.data.DataLoader(data(), batch_size=4))
    assert callback.yielded and callback.decision.action == "exit" and callback.decision.cause == "SIGINT"
    assert callback.yield_step < 8 and callback.yield_path.exists() and callback.resume_path == str(callback.yield_path)
    assert handlers() == before  # the next "interrupt kernel" is the notebook's again
    with pytest.raises(KeyboardInterrupt):
        interrupt_this_process()
        time.sleep(1)  # the handler runs between two bytecodes of this thread
    assert HandoffLock(url).status().owner_id is None

    again = trainer()
    again.fit(Tiny(interrupt_at=None), torch.utils.data.DataLoader(data(), batch_size=4), ckpt_path=callback.resume_path)
    assert not callback.yielded and callback.decision is None and again.global_step == 8  # resumed, ran to its end
    assert handlers() == before
    assert HandoffLock(url).status().owner_id is None


def interrupt_at(call: int):
    """A Regressor hook: "interrupt kernel" at the model's ``call``-th forward."""
    return lambda n: n == call and interrupt_this_process()


def hf_trainer(out, callback, model: torch.nn.Module, *, callbacks: bool = True):
    return tiny_trainer(out, [callback] if callbacks else None, model, max_steps=8, save_strategy="no")


@pytest.mark.timeout(120)
def test_an_hf_callback_interrupted_puts_the_handlers_back_and_serves_the_next_train(tmp_path):
    from handofflock.integrations.transformers import HandoffLockTrainerCallback

    url = (tmp_path / "l.json").as_uri()
    callback = HandoffLockTrainerCallback(url, every=1, **TIMING)
    before = handlers()
    decision = callback.train(hf_trainer(tmp_path / "hf", callback, Regressor(interrupt_at(3))))
    assert decision is not None and decision.action == "exit" and decision.cause == "SIGINT"
    [saved] = (tmp_path / "hf").glob(f"checkpoint-0{callback.yield_step}-token*")  # renamed by the holder, whole
    assert saved.is_dir()
    assert handlers() == before
    with pytest.raises(KeyboardInterrupt):
        interrupt_this_process()
        time.sleep(1)
    assert HandoffLock(url).status().owner_id is None

    again = hf_trainer(tmp_path / "hf", callback, Regressor())
    assert callback.train(again) is None  # no RankExit 130 from the last run's interrupt: it resumed and finished
    assert again.state.global_step == 8 and not callback.yielded
    assert handlers() == before
    assert HandoffLock(url).status().owner_id is None


@pytest.mark.timeout(120)
def test_an_hf_callback_added_after_the_trainer_was_built_warns_where_the_user_sees_it(tmp_path):
    from handofflock.integrations.transformers import HandoffLockTrainerCallback

    callback = HandoffLockTrainerCallback((tmp_path / "l.json").as_uri(), **TIMING)
    trainer = hf_trainer(tmp_path / "hf", callback, Regressor(), callbacks=False)
    trainer.add_callback(callback)
    with pytest.warns(UserWarning, match="added after the Trainer was built"):
        trainer.train()
    assert handlers()[signal.SIGINT] is signal.default_int_handler


@pytest.mark.timeout(60)
def test_a_patient_job_waits_for_the_lock_without_ever_making_the_holder_yield(tmp_path):
    url = (tmp_path / "l.json").as_uri()
    holder = rank_lock(url, signals=(), owner_id="job-A", **TIMING)
    holder.acquire()
    patient = rank_lock(url, signals=(), owner_id="job-B", request_release=False, priority=0, poll=0.1, **TIMING)
    got = threading.Event()

    def wait_patiently() -> None:
        patient.acquire(timeout=30)
        got.set()

    waiting = threading.Thread(target=wait_patiently, daemon=True)
    waiting.start()
    deadline = time.monotonic() + 10
    while HandoffLock(url).status().waiter_id != "job-B":
        assert time.monotonic() < deadline, "job B never became the waiter"
        time.sleep(0.05)
    steps = holder.steps(range(40))
    for _ in steps:
        time.sleep(0.05)  # 2 s of training, twenty waiter checks: nobody asks
    assert not steps.stopped and steps.last == 39 and not holder.lock.release_requested
    assert not got.is_set()
    holder.release()  # finished on its own: handed to the patient job
    assert got.wait(10) and patient.lock.is_held
    patient.release()
    waiting.join(5)
