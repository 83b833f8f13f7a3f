"""examples/gpu_pool.py: more workers than GPUs, each GPU a lock; every worker runs, one at a time per GPU."""

from __future__ import annotations

import itertools
import sys

import pytest
from test_examples import example

PY = sys.executable
#: The command each worker runs: it notes its device and when it began and ended (appended in one write each).
JOB = ("import os, sys, time; dev = os.environ['CUDA_VISIBLE_DEVICES']; log = sys.argv[1]\n"
       "def note(what):\n"
       "    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT); os.write(fd, f'{dev} {what} {time.time()!r}\\n'.encode()); os.close(fd)\n"
       "note('start'); time.sleep(0.4); note('end')")


@pytest.mark.timeout(120)
def test_more_workers_than_gpus_each_gpu_held_by_one_worker_at_a_time(tmp_path):
    urls = [(tmp_path / f"gpu{i}.json").as_uri() for i in range(2)]
    log = tmp_path / "log"
    workers = [example("gpu_pool.py", "--patience", "1", *urls, "--", PY, "-c", JOB, str(log)) for _ in range(5)]
    for worker in workers:
        out, err = worker.communicate(timeout=100)
        assert worker.returncode == 0, err
    notes = [line.split() for line in log.read_text().splitlines()]
    assert len(notes) == 2 * 5, notes  # every worker ran its command once
    for device in ("0", "1"):
        starts = [float(t) for d, what, t in notes if d == device and what == "start"]
        ends = [float(t) for d, what, t in notes if d == device and what == "end"]
        spans = sorted(zip(sorted(starts), sorted(ends)))
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert start >= end, f"GPU {device} had two workers at once: {spans}"
    assert {d for d, _, _ in notes} == {"0", "1"}, "both GPUs were used"
