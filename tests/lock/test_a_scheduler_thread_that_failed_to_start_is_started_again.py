"""A scheduler whose loop thread could not start (``can't start new thread``) starts one on the next add.

A process short of threads (a trainer's data loaders took them, RLIMIT_NPROC) may refuse one thread
start. That must cost one call, not the process: the scheduler is shared by every lock, and one it
believes running while nothing runs it never renews, checks or marks any lock lost again.
"""

import math
import threading

import pytest

from handofflock import Scheduler
from handofflock.core.clock import Clock
from handofflock.storage import MemoryStorage


class WallTicker:
    """Due every ``every`` seconds on the real clock; sets ``ran`` when run."""

    check_interval = math.inf
    request_timeout = 5.0

    def __init__(self, clock, store, key, every=0.02):
        self.clock, self.store, self.key, self.every = clock, store, key, every
        self.next_at = clock.monotonic() + every
        self.ran = threading.Event()

    def next_due(self):
        return self.next_at

    def next_due_besides_check(self):
        return self.next_at

    def next_check_at(self):
        return math.inf

    def run_due(self):
        self.next_at = self.clock.monotonic() + self.every
        self.ran.set()

    def check_against(self, generation):
        pass


def test_a_loop_thread_that_could_not_start_is_started_by_the_next_add(monkeypatch):
    real_start, refused = threading.Thread.start, []

    def start_once_refused(thread):
        if thread.name == "startfail-scheduler" and not refused:
            refused.append(thread.name)
            raise RuntimeError("can't start new thread")
        return real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", start_once_refused)
    clock = Clock()
    sched = Scheduler(clock, name="startfail")
    ticker = WallTicker(clock, MemoryStorage("startfail"), "dir/a.json")
    try:
        with pytest.raises(RuntimeError, match="can't start new thread"):
            sched.add(ticker)
        assert refused
        sched.add(ticker)  # the next add starts the loop
        assert ticker.ran.wait(10.0), "the scheduler believes a loop runs that never started"
    finally:
        sched.stop()
