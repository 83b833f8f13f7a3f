"""release(): it writes the handoff or the free record, survives a failed write, and can be called from a signal handler.

Release requests (who asks the owner to give the lock up) are in test_release_requests.py; the
asynchronous lock's release under cancellation in tests/aio/test_aio_cancellation.py; force_release
of a corrupt record in tests/storage/test_record_corrupt.py.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid

import pytest
from lockutil import make_lock, raw_read
from simworld import KEY

from handofflock import AcquireCancelled, TransientStorageError, signals
from handofflock.storage import MemoryStorage

GCS_SPACING = 1.0  # GCS's default write spacing, given to the memory store where a test says so


def test_a_release_whose_write_failed_can_be_retried_and_hands_the_lock_to_the_waiter(world):
    owner, waiter = world.lock("O"), world.lock("W")
    assert owner.acquire()
    outcome: dict[str, object] = {}

    def asked(sender, **kw):
        world.store.faults.fail_next("write", key=KEY, count=1000)  # the store refuses every write for now
        try:
            sender.release()
        except TransientStorageError as exc:
            outcome["first"] = exc
        world.store.faults.clear()
        outcome["second"] = sender.release()

    with signals.on_release_requested.connected_to(asked, sender=owner):
        assert waiter.acquire(timeout=60)
    assert isinstance(outcome["first"], TransientStorageError)
    assert outcome["second"] == "W"
    assert world.record().owner_id == "W" and waiter.is_held


def test_a_release_whose_write_failed_is_retried_in_the_background(world):
    owner, waiter = world.lock("O"), world.lock("W")
    assert owner.acquire()
    outcome: dict[str, object] = {}

    def asked(sender, **kw):
        world.store.faults.fail_next("write", key=KEY, count=1000)
        try:
            sender.release()
        except TransientStorageError as exc:
            outcome["first"] = exc
        world.store.faults.clear()  # the store recovers; nobody calls release() again

    with signals.on_release_requested.connected_to(asked, sender=owner):
        assert waiter.acquire(timeout=60)
    assert isinstance(outcome["first"], TransientStorageError)
    assert world.record().owner_id == "W", "the background retry handed the lock over"
    assert not owner.is_held


def test_a_release_right_after_a_renewal_goes_out_at_once(world):
    write_times = world.timed_writes()
    a = world.lock("A", ttl=5.0, min_write_interval=GCS_SPACING)
    assert a.acquire()
    world.clock.advance(a.renew_interval)
    world.sched.run_pending()  # the renewal
    renewed = write_times[-1]
    world.clock.advance(0.05)
    released_at = world.clock.monotonic()
    a.release()
    assert write_times[-1] - released_at < 1e-9, "the release waited behind the renewal"
    assert write_times[-1] - renewed < 0.1


def test_release_from_a_signal_handler_during_a_blocking_acquire_cancels_it_without_deadlock():
    url = f"memory://sig-{uuid.uuid4().hex[:8]}/train.json"
    owner = make_lock(url)
    assert owner.acquire()
    waiter = make_lock(url, waiter_ttl=5.0)
    old = signal.signal(signal.SIGUSR1, lambda *a: waiter.release())
    try:
        timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGUSR1))
        timer.start()
        with pytest.raises(AcquireCancelled):
            waiter.acquire(timeout=10)
        timer.join()
    finally:
        signal.signal(signal.SIGUSR1, old)
        owner.release()
    assert raw_read(url)[0].waiting_owner_id is None


def test_release_from_a_signal_handler_while_the_main_thread_is_inside_the_library_is_deferred():
    url = f"memory://sig-{uuid.uuid4().hex[:8]}/train.json"
    lock = make_lock(url)
    assert lock.acquire()
    store = MemoryStorage.named(url.split("/")[2])
    fired = []
    # Deliver the signal while status() holds the lock's I/O mutex in this very thread.
    def get_signalled(op, key):
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.05)  # the handler runs here, between bytecodes of this thread

    old = signal.signal(signal.SIGUSR1, lambda *a: fired.append(lock.release()))
    store.faults.before("read", get_signalled)
    try:
        status = lock.status()
    finally:
        store.faults.clear()
        signal.signal(signal.SIGUSR1, old)
    assert fired == [None], "the handler ran and returned at once"
    assert status.owner_id == lock.owner_id
    assert not lock.is_held, "the deferred release ran when status() returned"
    assert raw_read(url)[0].owner_id is None
