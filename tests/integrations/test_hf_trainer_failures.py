"""The Hugging Face Trainer integration when training fails: the lock goes at once, not at the process's end."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from ranksutil import ROOT

HERE = Path(__file__).resolve().parent


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["callback", "plain"])
def test_training_that_raises_while_the_process_lives_on_releases_the_lock(tmp_path, how):
    url = (tmp_path / "l.json").as_uri()
    proc = subprocess.run([sys.executable, str(HERE / "hf_raise_job.py"), url, str(tmp_path / "hf"), how],
                          capture_output=True, text=True, timeout=100, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert "training raised: the model failed at step 3" in proc.stdout, proc.stdout
    assert "at once: owner None" in proc.stdout, proc.stdout  # `how`: callback.train(trainer) or trainer.train()
    assert "after the exception: owner None" in proc.stdout, proc.stdout  # not held (and renewed) by a live process
