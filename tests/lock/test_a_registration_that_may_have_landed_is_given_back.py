"""Issue 25, item 3: whenever a waiter registration may have been sent, the give-back reads and clears it.

A Ctrl-C that arrives after the store applied the registration but before
``acquire()`` saw the reply, and a ``cancel()`` that interrupts the retry of a
registration whose reply was lost, both left the slot behind: the owner was
then asked to release and handed the lock to a process that had left. And a
later ``acquire(blocking=False)`` on that instance refreshed the leaked slot
instead of leaving it. Memory store, simulated time, default pacing.
"""

from __future__ import annotations

import threading

import pytest

from handofflock import AcquireCancelled, TransientStorageError

from simworld import KEY  # noqa: F401  (the world fixture is in conftest.py)


def _owner_and_waiter(world):
    a = world.lock("A", ttl=10.0)
    assert a.acquire(timeout=5)
    b = world.lock("B", ttl=10.0, frozen=True)
    return a, b


def test_a_ctrl_c_as_the_registration_lands_gives_the_slot_back(world):
    a, b = _owner_and_waiter(world)

    def interrupt(op, key, result):
        world.store.faults.clear()
        raise KeyboardInterrupt  # the store applied the registration; acquire() never sees the reply

    world.store.faults.after("write", interrupt)
    with pytest.raises(KeyboardInterrupt):
        b.acquire(timeout=30)
    record = world.record()
    assert record.waiting_owner_id is None, "the registration that landed was left behind"
    world.clock.run_for(3 * a.waiter_check_interval)
    assert not a.release_requested, "the owner was asked to hand the lock to a process that left"
    assert a.release() is None


def test_a_cancel_during_the_retry_of_a_registration_whose_reply_was_lost_gives_the_slot_back(world):
    a, b = _owner_and_waiter(world)

    def lose_and_cancel(op, key, result):
        world.store.faults.clear()
        # The read that would find the registration fails once, and cancel() arrives while its retry waits.
        world.store.faults.fail_next("read")
        b.cancel()
        raise TransientStorageError("injected: reply lost after the write applied", ambiguous=True)

    world.store.faults.after("write", lose_and_cancel)
    with pytest.raises(AcquireCancelled):
        b.acquire(timeout=30)
    assert world.record().waiting_owner_id is None, "the registration that landed was left behind"
    world.clock.run_for(3 * a.waiter_check_interval)
    assert not a.release_requested
    a.release()


def test_a_non_blocking_acquire_leaves_a_leaked_slot_of_its_own_instead_of_refreshing_it(world):
    a, b = _owner_and_waiter(world)
    # The slot leaked (say the give-back itself could not reach the store): B is the waiter on record.
    refused = threading.Event()

    def refuse_the_give_back(op, key):
        if refused.is_set():
            raise TransientStorageError("injected: store unreachable", ambiguous=False)

    def interrupt(op, key, result):
        refused.set()
        raise KeyboardInterrupt

    world.store.faults.after("write", interrupt)
    world.store.faults.before("read", refuse_the_give_back)
    with pytest.raises(KeyboardInterrupt):
        b.acquire(timeout=30)
    world.store.faults.clear()
    assert world.record().waiting_owner_id == "B"
    world.clock.run_for(a.waiter_ttl * 0.6)  # past half-life: a poll would refresh the slot
    a._duties.run_due()  # private: the scheduler's duty, run here (the waiter check sees the leaked slot)
    assert b.acquire(blocking=False) is False
    assert world.record().waiting_owner_id is None, "acquire(blocking=False) kept (or refreshed) the leaked slot"
    a.release()
