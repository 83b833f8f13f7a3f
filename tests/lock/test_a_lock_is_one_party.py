"""A HandoffLock is one party of the lock: it cannot be copied or pickled.

A copy would share the original's lease and requests with a life of its own: when it
was collected, the release at garbage collection (lock/lifetime.py) released the lock
that the original still held and renewed, and another party took it while the original
went on believing it held it (found by review, a repro under copy.copy + gc.collect).
"""

from __future__ import annotations

import copy
import gc
import pickle

import pytest

from handofflock import HandoffLock
from handofflock.storage import MemoryStorage


@pytest.mark.parametrize("how", [copy.copy, copy.deepcopy, pickle.dumps])
def test_a_held_lock_cannot_be_copied_and_stays_held(how):
    lock = HandoffLock("memory://one-party/l.json", owner_id="a", ttl=10.0)
    try:
        assert lock.acquire()
        with pytest.raises(TypeError, match="cannot be copied or pickled"):
            how(lock)
        gc.collect()
        assert lock.is_held and lock.status().owner_id == "a"
        other = HandoffLock("memory://one-party/l.json", owner_id="b", ttl=10.0)
        assert other.acquire(blocking=False) is False
    finally:
        lock.release()
        MemoryStorage.forget("one-party")
