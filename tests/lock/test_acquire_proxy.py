"""``with lock.acquire(timeout=5):`` (filelock's idiom) takes the lock and releases it at the end of the block."""

import pickle

import pytest

from handofflock import HandoffLock
from handofflock.core.record import LockRecord


def _record(store, key):
    found = store.read(key)
    return None if found is None else LockRecord.decode(found[0], key=key)


def test_with_lock_acquire_timeout_releases_at_the_end_of_the_block(store):
    lock = HandoffLock("unused", storage=store, key="locks/proxy.json")  # the store's own pacing
    with lock.acquire(timeout=5) as held:
        assert held is lock and lock.is_held
        assert _record(store, "locks/proxy.json").owner_id == lock.owner_id
    assert not lock.is_held
    assert _record(store, "locks/proxy.json").owner_id is None


def test_an_exception_in_the_block_releases_and_is_not_masked(store):
    lock = HandoffLock("unused", storage=store, key="locks/proxy.json")
    with pytest.raises(KeyError):
        with lock.acquire():
            raise KeyError("boom")
    assert not lock.is_held and _record(store, "locks/proxy.json").owner_id is None


def test_a_successful_acquire_is_true_and_names_its_lock_and_a_failed_one_is_plain_false(world):
    owner, other = world.lock("O"), world.lock("W")
    got = owner.acquire()
    assert got and bool(got) is True and got.lock is owner
    assert other.acquire(blocking=False) is False
    with pytest.raises(TypeError, match="cannot be copied or pickled"):
        pickle.dumps(got)  # it holds the lock, which stays in this process
    owner.release()


def test_a_release_inside_the_block_leaves_nothing_for_its_end_to_do(world):
    owner = world.lock("O")
    with owner.acquire(timeout=5):
        assert owner.release() is None
    assert not owner.is_held and world.record().owner_id is None
