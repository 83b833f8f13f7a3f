"""A tiny Hugging Face Trainer for the callback tests: a linear model, 64 pairs, on the CPU, in this process."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch


class Regressor(torch.nn.Module):
    """A model the Trainer can train: a loss from ``labels``. ``hook(n)`` runs at its n-th forward, if given."""

    def __init__(self, hook: Callable[[int], Any] | None = None) -> None:
        super().__init__()
        self.lin, self.calls, self.hook = torch.nn.Linear(4, 1), 0, hook

    def forward(self, x, labels=None):
        self.calls += 1
        if self.hook is not None:
            self.hook(self.calls)
        y = self.lin(x).squeeze(1)
        return {"loss": torch.nn.functional.mse_loss(y, labels), "logits": y}


class Pairs(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i):
        return {"x": torch.ones(4) * i / 64, "labels": torch.tensor(float(i) / 64)}


def hf_trainer(out: Path, callbacks: list | None, model: torch.nn.Module | None = None, *, evaluate: bool = False,
               **args: Any):
    """A ``transformers.Trainer`` writing to ``out``, 4 pairs a step; ``args`` go to ``TrainingArguments``.

    ``evaluate``: the pairs are the evaluation set too.
    """
    import transformers

    transformers.logging.set_verbosity_error()
    args = dict(per_device_train_batch_size=4, report_to=[], use_cpu=True, disable_tqdm=True,
                remove_unused_columns=False) | args
    return transformers.Trainer(model=model if model is not None else Regressor(),
                                args=transformers.TrainingArguments(output_dir=str(out), **args),
                                train_dataset=Pairs(), eval_dataset=Pairs() if evaluate else None,
                                callbacks=callbacks)
