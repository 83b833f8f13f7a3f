"""The race and error-path defects a review found (issue 12), one regression test each.

Most run on the memory store and a :class:`SimClock` (the ``world`` of
``test_faults_memory``): waiting advances simulated time and runs the
scheduler, so every interleaving here is exact. The release-racing-acquire
test uses real threads, since the race between threads is its point.
"""

from __future__ import annotations

import math
import pickle
import threading
import time
from concurrent.futures import ProcessPoolExecutor

import pytest

from handofflock import (
    RequestReason,
    AcquireCancelled,
    Clock,
    ConfigurationError,
    HandoffLock,
    LockLost,
    LockRecord,
    LockContended,
    LockRecordCorrupt,
    LockTimeout,
    ReleaseRequest,
    Scheduler,
    StorageError,
    TokensExhausted,
    TransientStorageError,
    signals,
)
from handofflock.core import errors
from handofflock.fencing import FencedObject
from handofflock.core.record import MAX_TOKEN
from handofflock.storage import MemoryStorage
from simworld import KEY, World


def _403() -> StorageError:
    return StorageError("injected: 403 permission denied")


# --------------------------------------------------------------------------- 1. every way out gives the slot back


class Flaky(MemoryStorage):
    """Refuses every read until a (simulated) time: a store down across an acquire's deadline."""

    def __init__(self, name, clock):
        super().__init__(name)
        self.clock = clock
        self.refuse_reads_until = -math.inf

    def read(self, key, *, max_bytes=None):
        if self.clock.monotonic() < self.refuse_reads_until:
            raise TransientStorageError("injected: 503 while the store is down", status=503, ambiguous=False)
        return super().read(key, max_bytes=max_bytes)


@pytest.mark.parametrize("how", ["permanent error on a poll", "KeyboardInterrupt in a receiver", "transient error at the deadline"])
def test_a_waiter_that_leaves_acquire_on_an_exception_gives_its_slot_back(world, how):
    owner, waiter = world.lock("O"), world.lock("W")
    assert owner.acquire()
    if how == "permanent error on a poll":
        def arm(sender, **kw):
            world.store.faults.fail_next("read", key=KEY, exc=_403)
        expected: type[BaseException] = StorageError
    elif how == "KeyboardInterrupt in a receiver":
        def arm(sender, **kw):
            raise KeyboardInterrupt
        expected = KeyboardInterrupt
    else:
        store = Flaky(world.store.name + "-flaky", world.clock)
        world.store = store
        owner, waiter = world.lock("O"), world.lock("W")
        assert owner.acquire()

        def arm(sender, **kw):
            store.refuse_reads_until = world.clock.monotonic() + 3.0  # past the acquire's deadline
        expected = TransientStorageError
    # signals.send logs receivers' Exceptions; KeyboardInterrupt is a BaseException and goes through.
    with signals.waiting.connected_to(arm, sender=waiter):
        with pytest.raises(expected):
            waiter.acquire(timeout=3.0)
    world.store.faults.clear()
    assert world.record().waiting_owner_id is None, "the departed waiter still holds the slot"
    # ... so the owner's release frees the lock instead of handing it to nobody.
    assert owner.release() is None
    assert world.record().owner_id is None


# --------------------------------------------------------------------------- 2. two incarnations of one owner id


@pytest.mark.timeout(60)
def test_two_live_instances_with_one_owner_id_never_both_own_the_lock():
    """X waits; a second instance with the same stable owner id starts a blocking acquire (a restart whose
    predecessor still lives). The newer one reclaims the slot, the superseded one defers (LockContended):
    after the handoff exactly one instance holds the lock, the newer one."""
    store = MemoryStorage(f"twins-{time.monotonic_ns()}")
    kw = dict(storage=store, key=KEY, ttl=3.0, waiter_poll_interval=0.05, waiter_check_interval=0.05)
    owner = HandoffLock("memory://x", owner_id="O", **kw)
    first, twin = HandoffLock("memory://x", owner_id="X", **kw), HandoffLock("memory://x", owner_id="X", **kw)
    assert owner.acquire()
    boxes: dict[str, dict[str, object]] = {"first": {}, "twin": {}}

    def run(name, lock):
        try:
            boxes[name]["value"] = lock.acquire(timeout=10)
        except BaseException as exc:  # handed to the test
            boxes[name]["error"] = exc

    t1 = threading.Thread(target=run, args=("first", first))
    t1.start()
    deadline = time.monotonic() + 10
    while not owner.release_requested and time.monotonic() < deadline:
        time.sleep(0.01)
    t2 = threading.Thread(target=run, args=("twin", twin))
    t2.start()
    time.sleep(0.3)  # the twin has read the record naming X as the waiter
    assert owner.release() == "X"
    t1.join(10)
    t2.join(10)
    time.sleep(0.5)  # a few renewals of whoever holds it
    try:
        both = first.healthy and twin.healthy
        assert not both, f"two instances hold the lock at once, tokens {first.token} and {twin.token}"
        assert twin.is_held and boxes["twin"].get("value") is True, boxes
        assert not first.is_held and isinstance(boxes["first"].get("error"), LockContended), boxes
    finally:
        for lock in (first, twin, owner):
            lock._unschedule()


def test_a_twin_that_retakes_the_lock_fences_the_first_instance_out(world):
    first, twin = world.lock("X"), world.lock("X")
    assert first.acquire()
    assert twin.acquire(timeout=5)  # a restart under the same id takes it back with a higher token
    assert twin.token > first.token
    world.clock.advance(first.renew_interval)
    world.sched.run_pending()
    assert not first.healthy and not first.is_held
    fence = FencedObject(world.store, "locks/journal.json", writer_id="X", clock=world.clock)
    fence.write({"by": "twin"}, token=twin.token)
    with pytest.raises(errors.StaleToken):
        fence.write({"by": "first"}, token=first.token)


# --------------------------------------------------------------------------- 3. release() racing a blocking acquire()


class ReleasesDuringARead(MemoryStorage):
    """Calls ``during()`` in another thread while a read is in flight, once armed: a release() that
    lands after the read that will show the handoff, and before the acquire acts on it."""

    def __init__(self, name):
        super().__init__(name)
        self.during = None

    def read(self, key, *, max_bytes=None):
        found = super().read(key, max_bytes=max_bytes)
        during, self.during = self.during, None
        if during is not None:
            t = threading.Thread(target=during)
            t.start()
            t.join(0.5)  # the new code waits for the acquire to end: go on after a moment
        return found


@pytest.mark.timeout(60)
def test_release_racing_a_blocking_acquire_never_leaves_the_lock_held_behind_the_callers_back():
    store = ReleasesDuringARead(f"race-{time.monotonic_ns()}")
    kw = dict(storage=store, key=KEY, ttl=3.0, waiter_poll_interval=0.2, waiter_check_interval=0.05)
    owner = HandoffLock("memory://x", owner_id="O", **kw)
    waiter = HandoffLock("memory://x", owner_id="W", **kw)
    assert owner.acquire()
    box: dict[str, object] = {}

    def run():
        try:
            box["acquired"] = waiter.acquire(timeout=10)
        except BaseException as exc:  # handed to the test
            box["error"] = exc

    t = threading.Thread(target=run)
    t.start()
    deadline = time.monotonic() + 10
    while not owner.release_requested and time.monotonic() < deadline:
        time.sleep(0.01)
    store.during = lambda: box.setdefault("released", waiter.release())
    assert owner.release() == "W"  # the waiter's next poll reads the handoff, and meets our release()
    t.join(20)
    deadline = time.monotonic() + 20
    while "released" not in box and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        assert "released" in box, box
        assert not waiter.is_held, f"release() returned {box['released']!r} but the lock is still held: {box}"
        record = LockRecord.decode(store.read(KEY)[0])
        assert record.owner_id != "W", f"the record still names W as owner: {record}"
    finally:
        waiter._unschedule()
        owner._unschedule()


# --------------------------------------------------------------------------- 4. a failed release can be retried


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


# --------------------------------------------------------------------------- 5. a request belongs to its hold


def test_a_release_request_does_not_outlive_a_hold_that_was_lost(world):
    a = world.lock("A")
    assert a.acquire()
    a.request_release("operator")
    record = world.record()
    world.store.write(KEY, record.replace(owner_id="thief", token=record.token + 1, nonce="t").encode(),
                      if_generation_match=world.generation())
    world.clock.advance(a.renew_interval)
    world.sched.run_pending()  # the renewal finds the lock taken: lost
    assert not a.is_held
    with pytest.raises(LockLost):
        a.release()
    assert a.release_requested is False and a.release_request is None
    # The next hold starts un-asked: steps() yields.
    world.store.write(KEY, world.record().replace(owner_id=None, expires_at=None, nonce="f").encode(),
                      if_generation_match=world.generation())
    assert a.acquire(timeout=5)
    assert list(a.steps(range(3))) == [0, 1, 2]
    a.release()


# --------------------------------------------------------------------------- 7. smaller defects


def test_a_timeout_of_nan_is_refused(world):
    with pytest.raises(ConfigurationError):
        world.lock("A").acquire(timeout=math.nan)


def test_a_cancel_that_comes_just_before_acquire_starts_is_not_dropped(world):
    a = world.lock("A")
    a.cancel()
    with pytest.raises(AcquireCancelled):
        a.acquire(timeout=5)
    assert a.acquire(timeout=5), "a cancel applies to one acquire only"
    a.release()


def test_release_request_receivers_get_the_request(world):
    a = world.lock("A")
    assert a.acquire()
    got: list[dict] = []
    with signals.on_release_requested.connected_to(lambda s, **kw: got.append(kw), sender=a):
        a.request_release(RequestReason.OPERATOR, requester="ops")
        world.sched.run_pending()
    assert isinstance(got[0]["request"], ReleaseRequest) and got[0]["request"].requester == "ops"
    a.release()


@pytest.mark.parametrize("ending", ["timeout", "cancel"])
def test_giving_up_a_wait_ends_within_its_budget_even_when_the_store_keeps_failing(world, ending):
    owner, waiter = world.lock("O"), world.lock("W")
    assert owner.acquire()
    box: dict[str, float] = {}

    def fail_everything(sender, **kw):
        world.store.faults.fail_next("*", key=KEY, count=100_000)
        if ending == "cancel":
            sender.cancel()
        box["start"] = world.clock.monotonic()

    with signals.waiting.connected_to(fail_everything, sender=waiter):
        with pytest.raises((LockTimeout, AcquireCancelled, TransientStorageError)):
            waiter.acquire(timeout=2.0)
    elapsed = world.clock.monotonic() - box["start"]
    assert elapsed <= 2.0 + waiter.give_up_budget + 1.0, f"giving up took {elapsed:.1f} s of simulated time"
    world.store.faults.clear()


def test_a_token_at_its_maximum_is_never_issued_twice(world):
    store = world.store
    store.write(KEY, LockRecord(owner_id=None, token=MAX_TOKEN, nonce="m").encode(), if_generation_match=0)
    with pytest.raises(TokensExhausted):
        world.lock("A").acquire(timeout=5)
    assert world.record().token == MAX_TOKEN and world.record().owner_id is None


def test_a_record_with_a_duplicated_key_is_corrupt_not_free():
    data = b'{"ownerId":"X","expiresAt":4102444800,"waitingOwnerId":null,"waiterExpiresAt":null,"ownerId":null}'
    with pytest.raises(LockRecordCorrupt, match="duplicate key 'ownerId'"):
        LockRecord.decode(data)


def test_unknown_fields_with_integers_past_64_bits_are_kept_exactly():
    big = 2**70 + 1
    data = b'{"ownerId":null,"expiresAt":null,"waitingOwnerId":null,"waiterExpiresAt":null,"audit":%d}' % big
    record = LockRecord.decode(data)
    assert record.extra["audit"] == big and isinstance(record.extra["audit"], int)
    assert LockRecord.decode(record.replace(owner_id="A", expires_at=1.0).encode()).extra["audit"] == big


def test_a_scheduler_whose_stop_timed_out_never_runs_two_loops():
    gate, parked = threading.Event(), threading.Event()

    class ParkingClock(Clock):
        """The loop's first sleep lasts until the test says so: stop() cannot join it in time."""

        def wait(self, event, timeout):
            if not parked.is_set():
                parked.set()
                gate.wait(10)
            return super().wait(event, timeout)

    sched = Scheduler(ParkingClock(), name="stop-test")
    sched._ensure_thread()
    loop = sched._thread
    assert parked.wait(5)
    sched.stop(timeout=0.05)  # the loop is parked: the join times out
    assert loop.is_alive()
    threading.Timer(0.3, gate.set).start()
    sched._ensure_thread()  # must not start a second loop beside the one still running
    time.sleep(0.5)  # the old loop is free again: had it been told to go on, it would still run
    alive = [t for t in threading.enumerate() if t.name == "stop-test-scheduler"]
    assert len(alive) == 1, f"{len(alive)} scheduler loops running"
    sched.stop()


def _every_error_class() -> list[type]:
    return [c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.HandoffLockError)]


def _sample(cls: type) -> BaseException:
    samples = {
        errors.PreconditionFailed: lambda: cls("k", 3, url="gs://b/k"),
        errors.NotFound: lambda: cls("k", url="gs://b/k"),
        errors.LockRecordCorrupt: lambda: cls("k", "bad", generation=2, url="gs://b/k"),
        errors.StaleToken: lambda: cls("k", 1, 2, writer_id="w", holder_id="h"),
        errors.FencedObjectCorrupt: lambda: cls("k", "bad", generation=2),
        errors.FencedObjectFull: lambda: cls("k", 10, 5),
        errors.FencedObjectTooLarge: lambda: cls("k", 10, 5),
    }
    for base, make in samples.items():
        if cls is base:
            return make()
    try:
        return cls("a message")
    except TypeError:
        return cls("a message", url="gs://b/k")


@pytest.mark.parametrize("cls", _every_error_class(), ids=lambda c: c.__name__)
def test_every_error_survives_pickling_with_its_message_and_attributes(cls):
    exc = _sample(cls)
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is cls and str(back) == str(exc) and back.args == exc.args and vars(back) == vars(exc)


def _raise_precondition_failed() -> None:
    raise errors.PreconditionFailed("k", 3, url="gs://b/k")


@pytest.mark.timeout(60)
def test_an_error_raised_in_a_process_pool_worker_arrives_intact():
    with ProcessPoolExecutor(1) as pool:
        with pytest.raises(errors.PreconditionFailed) as info:
            pool.submit(_raise_precondition_failed).result(timeout=30)
    assert info.value.expected_generation == 3 and info.value.key == "k"
