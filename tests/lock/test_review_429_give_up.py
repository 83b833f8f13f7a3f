"""acquire(timeout) against a store that answers every write with 429 from some point on: its time runs out in
the store, and the way out must still say so (LockTimeout), whatever the slot's give-back meets."""

from __future__ import annotations

import pytest

from handofflock import LockTimeout
from handofflock.core.errors import TransientStorageError


def test_a_429_storm_through_the_give_back_is_still_a_lock_timeout(world):
    """B registers as A's waiter; from then on the store refuses every write with 429 (a throttled bucket). B's
    waiter refresh cannot go out before its deadline: the 429s left no time, a LockTimeout (acquire()'s docstring:
    "so is one whose refusals, 429s, leave no time to try again"). The give-back's own write is refused too: that
    is the cleanup's failure, logged as elsewhere; the caller's ``except LockTimeout`` must still catch the way out."""
    a = world.lock("A", ttl=10.0, frozen=True)
    assert a.acquire()
    b = world.lock("B", ttl=10.0)
    writes: list[float] = []

    def write(op, key):
        writes.append(world.clock.monotonic())
        if len(writes) > 1:  # the registration went through; nothing after it does
            raise TransientStorageError("injected: 429", status=429, ambiguous=False, retry_after=30.0)

    world.store.faults.before("write", write)
    try:
        b.acquire(timeout=60.0, request_release=False)
    except LockTimeout:
        pass
    except TransientStorageError as exc:
        pytest.fail(f"acquire(timeout) whose 429s left no time ended in {exc!r} (the give-back's 429), not LockTimeout")
    finally:
        world.store.faults.clear()
    assert len(writes) > 2, writes
