"""A Hugging Face Trainer whose model raises at step 3, in a process that lives on (a notebook, an HPO driver).

    python hf_raise_job.py URL OUTPUT_DIR [callback|plain]   # callback.train(trainer), or a plain trainer.train()
"""

import sys
import time

import torch
import transformers

from handofflock import HandoffLock
from handofflock.integrations.transformers import HandoffLockTrainerCallback

url, out = sys.argv[1], sys.argv[2]
how = sys.argv[3] if len(sys.argv) > 3 else "callback"
transformers.logging.set_verbosity_error()


class Boom(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.calls = torch.nn.Linear(4, 1), 0

    def forward(self, x, labels=None):
        self.calls += 1
        if self.calls == 3:
            raise RuntimeError("the model failed at step 3")
        y = self.lin(x).squeeze(1)
        return {"loss": torch.nn.functional.mse_loss(y, labels), "logits": y}


class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return {"x": torch.ones(4) * i, "labels": torch.tensor(float(i))}


args = transformers.TrainingArguments(output_dir=out, max_steps=20, per_device_train_batch_size=4, report_to=[],
                                      use_cpu=True, disable_tqdm=True, save_strategy="no", remove_unused_columns=False)
# renew_deadline 15 s: renewals can stall for seconds on a loaded 2-core machine while the Trainer's first
# step imports and compiles, and this job is about the release when training raises, not about renewals.
callback = HandoffLockTrainerCallback(url, owner_id="job-A", ttl=30.0)
trainer = transformers.Trainer(model=Boom(), args=args, train_dataset=Data(), callbacks=[callback])
try:
    if how == "plain":
        trainer.train()  # as most scripts (and HPO drivers) call it
    else:
        callback.train(trainer)
except RuntimeError as exc:
    print("training raised:", exc, flush=True)
    print(f"at once: owner {HandoffLock(url).status().owner_id}", flush=True)
time.sleep(3.0)  # the process lives on
status = HandoffLock(url).status()
print(f"after the exception: owner {status.owner_id}", flush=True)
