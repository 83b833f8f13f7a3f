"""release(): it writes the handoff or the free record, survives a failed write, and can be called from a signal handler.

Release requests (who asks the owner to give the lock up) are in test_waiter_check.py and test_signals.py; the
asynchronous lock's release under cancellation in tests/aio/test_aio_cancellation.py; force_release
of a corrupt record in tests/storage/test_record_corrupt.py.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid

import orjson
import pytest
from lockparts import new_lock, owner_and_waiter, wait_in_thread
from lockutil import FAST, make_lock, raw_read, raw_write
from simworld import KEY, Sim

from handofflock import (
    AcquireCancelled,
    LockLost,
    TransientStorageError,
    signals,
)
from handofflock.core.record import Label
from handofflock.lock.primitives import Primitives
from handofflock.repair import force_release
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
    owner, waiter = world.lock("O", min_hold=0), world.lock("W")
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


def test_a_release_goes_out_at_the_stores_own_spacing_where_a_429s_widened_one_would_pass_its_deadline(world):
    """Earlier 429s widened the write spacing to 8 s, past the release's deadline: the release goes out at the
    store's own spacing rather than give up with nothing sent. Given up, it would leave the lease behind until a
    background retry fits the spacing: released in an acquire's way out (a signal handler's release as the
    acquire took the lock), past that acquire's give-up budget (sim seed 1935)."""
    write_times = world.timed_writes()
    a = world.lock("A", ttl=10.0, min_write_interval=GCS_SPACING)
    assert a.acquire()
    taken = write_times[-1]
    a._io.gate().throttled(retry_after=8.0)  # private: the store's write gate, widened as a 429 would
    world.clock.advance(0.3)
    assert a.release() is None
    assert len(write_times) == 2 and write_times[-1] - taken <= GCS_SPACING + 1e-6
    assert world.record().owner_id is None and not a.is_held


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


@pytest.fixture
def url():
    name = f"labels-{uuid.uuid4().hex[:8]}"
    yield f"memory://{name}/locks/train.json"
    MemoryStorage.forget(name)


class _YieldingMutex:
    """A mutex that, once released, lets a thread queued on it run before its releaser goes on."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._state = threading.Condition()
        self.queued = self.entered = 0

    def __enter__(self) -> _YieldingMutex:
        with self._state:
            self.queued += 1
            self._state.notify_all()
        self._mutex.acquire()
        with self._state:
            self.queued -= 1
            self.entered += 1
            self._state.notify_all()
        return self

    def __exit__(self, *exc) -> None:
        with self._state:
            queued, entered = self.queued, self.entered
        self._mutex.release()
        if queued:
            with self._state:
                assert self._state.wait_for(lambda: self.entered > entered, timeout=5), "the queued thread never got in"

    def wait_until_queued(self) -> None:
        with self._state:
            assert self._state.wait_for(lambda: self.queued > 0, timeout=5), "nobody queued on the mutex"


def _race_once(i: int) -> str:
    """One race of the holder's release against the waiter's leaving; returns who won ("handed"/"freed").

    Each race is a world of its own, seeded ``i``: the seed picks which thread runs first at each instant.
    """
    sim = Sim(seed=i)
    try:
        a, b, _ = owner_and_waiter(sim)
        t = wait_in_thread(sim, b)
        sim.run_until(lambda: a.release_requested)
        result: dict[str, object] = {}
        first_leave = i % 2 == 0  # either side a little ahead of the other, and sometimes neither

        def release():
            sim.sleep(0.0005 * (i % 3) if first_leave else 0)
            result["heir"] = a.release()

        def leave():
            sim.sleep(0 if first_leave else 0.0005 * (i % 3))
            b.cancel()

        calls = [sim.start(release), sim.start(leave)]
        sim.run_until(lambda: all(calls) and t.done, limit=20)
        assert all(c.error is None for c in calls), [c.error for c in calls]
        record = sim.record()
        if result["heir"] == "b":
            assert b.is_held or record.owner_id is None, "handed to b: b holds it (or released it on its cancel)"
            outcome = "handed"
        else:
            assert result["heir"] is None and not b.is_held
            outcome = "freed"
        assert record.owner_id in (None, "b") and record.waiting_owner_id is None
        assert not (a.is_held and b.is_held)
        return outcome
    finally:
        sim.end()


def test_release_racing_a_blocking_acquire_never_leaves_the_lock_held_behind_the_callers_back(sim):
    during: list = []

    def run_during(op, key, found):
        """Once armed, call ``during`` in another thread while a read is in flight: a release() that lands
        after the read that will show the handoff, and before the acquire acts on it."""
        if during:
            call = sim.start(during.pop())
            waited = 0.0
            while not call.done and waited < 0.5:  # the new code waits for the acquire to end: go on after a moment
                sim.sleep(0.01)
                waited += 0.01

    sim.store.faults.after("read", run_during)
    kw = dict(ttl=3.0, waiter_poll_interval=0.2, waiter_check_interval=0.05, min_hold=0)
    owner = sim.lock("O", **kw)
    waiter = sim.lock("W", **kw)
    assert sim.call(owner.acquire)
    box: dict[str, object] = {}

    def run():
        try:
            box["acquired"] = waiter.acquire(timeout=10)
        except BaseException as exc:  # handed to the test
            box["error"] = exc

    t = sim.start(run)
    sim.run_until(lambda: owner.release_requested, limit=10)
    during.append(lambda: box.setdefault("released", waiter.release()))
    assert sim.call(owner.release) == "W"  # the waiter's next poll reads the handoff, and meets our release()
    sim.run_until(lambda: t.done, limit=20)
    sim.run_until(lambda: "released" in box, limit=20)
    assert "released" in box, box
    assert not waiter.is_held, f"release() returned {box['released']!r} but the lock is still held: {box}"
    record = sim.record()
    assert record.owner_id != "W", f"the record still names W as owner: {record}"


def test_a_forced_release_clears_both_labels(url):
    holder = make_lock(url, owner_id="h", label="holder-label")
    holder.acquire()
    try:
        assert raw_read(url)[0].owner_label == Label("holder-label")
        force_release(url)
        record = raw_read(url)[0]
        assert record.owner_label is None and record.waiter_label is None
        assert "ownerLabel" not in orjson.loads(record.encode())
    finally:
        holder._unschedule()  # private: stop its renewals without releasing


def test_a_stale_release_after_the_lease_expired_and_was_taken_writes_nothing(sim):
    stale = sim.lock("stale", paused=True, **FAST)
    assert sim.call(stale.acquire)
    sim.run_for(FAST["ttl"] + FAST["max_clock_skew"] + 0.2)
    assert not stale.healthy
    usurper = sim.lock("usurper", **FAST)
    assert sim.call(lambda: usurper.acquire(blocking=False))
    before = sim.read()
    with pytest.raises(LockLost):
        sim.call(stale.release)
    assert sim.read() == before
    assert before[0].owner_id == usurper.owner_id and usurper.token > stale.token


def test_a_renewal_queued_behind_a_release_finds_the_lock_released_not_lost(env):
    """The scheduler may have started a lock's renewal just before release() unscheduled it; that
    renewal waits for the lock's I/O mutex. When it gets it, the lock must already read as released:
    renewing from the replaced record would fail and report a clean release as a lost lock."""
    name, clock, sched, store = env
    lock = new_lock(name, clock, sched, primitives=Primitives(mutex=_YieldingMutex))
    assert lock.acquire()
    events = []
    signals.on_renewal_error.connect(lambda s, **kw: events.append("renewal error"), sender=lock, weak=False)
    signals.lost.connect(lambda s, **kw: events.append("lost"), sender=lock, weak=False)
    clock.advance(7.5)  # a renewal is due
    real_write, in_write, go = store.write, threading.Event(), threading.Event()

    def held_up_write(*args, **kw):
        in_write.set()
        assert go.wait(5)
        return real_write(*args, **kw)

    store.write = held_up_write
    releasing = threading.Thread(target=lock.release)
    releasing.start()
    assert in_write.wait(5)
    store.write = real_write
    # private: the renewal the scheduler had already started (its duty found it due while the lock was still held)
    renewing = threading.Thread(target=lock._renew)
    renewing.start()
    lock._mutex.wait_until_queued()  # private: the renewal now waits for the mutex the release holds
    writes = store.calls["write"]
    go.set()
    releasing.join(5)
    renewing.join(5)
    assert not releasing.is_alive() and not renewing.is_alive()
    assert events == [], "a clean release was reported as a lost lock"
    assert store.calls["write"] == writes + 1, "the queued renewal wrote after the release"
    assert raw_read(f"memory://{name}/train.json")[0].owner_id is None
    assert not lock.is_held
    assert lock.acquire(), "the instance can take the lock again"
    lock.release()


def test_a_receiver_of_lost_may_call_back_into_the_lock_while_release_reports_the_loss(env):
    name, clock, sched, store = env
    url = f"memory://{name}/train.json"
    lock = new_lock(name, clock, sched)
    assert lock.acquire()
    record, gen = raw_read(url)
    clock.advance(31.0)  # paused past the renew deadline (the scheduler did not run) and taken over
    raw_write(url, record.replace(owner_id="thief", token=record.token + 1, expires_at=clock.time() + 60, nonce="t1"), gen)
    seen = []
    signals.lost.connect(lambda s, **kw: seen.append(lock.status().owner_id), sender=lock, weak=False)
    outcome = []

    def release():
        try:
            lock.release()
        except LockLost as exc:
            outcome.append(exc)

    releasing = threading.Thread(target=release, daemon=True)
    releasing.start()
    releasing.join(5)
    assert not releasing.is_alive(), "release() deadlocked on a receiver calling status()"
    assert seen == ["thief"] and len(outcome) == 1
    assert raw_read(url)[0].owner_id == "thief", "nothing was written over the new owner"


def test_a_release_racing_a_withdrawal_hands_the_lock_to_exactly_one_or_frees_it():
    """The holder releases as the waiter gives up: the conditional writes let exactly one of them win."""
    outcomes = [_race_once(i) for i in range(12)]
    print("outcomes", {k: outcomes.count(k) for k in ("handed", "freed")})
    assert len(outcomes) == 12  # which side wins each time is up to the seed: both are correct


@pytest.mark.parametrize("held_back_by", ["429s", "the write gate"])
def test_a_handoff_held_back_past_the_waiters_slot_frees_the_lock_instead(world, held_back_by):
    """The release decides to hand off while the waiter's slot is live; its write is held back (a 429 and its
    retry, or the write spacing) until the slot has ended. Decided again as it is sent, it frees the lock:
    the slot's party may have left, and a handoff to it would hold the lock for nobody for a whole lease."""
    from handofflock.core.record import Waiter

    owner = world.lock("O", ttl=10.0, min_hold=0, min_write_interval=GCS_SPACING)
    assert owner.acquire()
    record = world.record()
    slot = Waiter("W", world.clock.time() + 3.0, ttl=10.0, instance="winstance")
    world.store.write(KEY, record.replace(waiter=slot).encode(), if_generation_match=world.generation())
    world.clock.run_for(owner.timing.waiter_check_interval + 0.2)  # the owner's check reads the slot
    assert owner.release_requested and world.clock.time() < slot.expires_at - 0.5
    applied: list[str | None] = []
    world.store.faults.after("write", lambda op, key, result: applied.append(world.record().owner_id), key=KEY)
    if held_back_by == "429s":
        refused = TransientStorageError("429: rate limit", status=429, ambiguous=False, retry_after=1.0)
        world.store.faults.fail_next("write", key=KEY, exc=lambda: refused)
    else:
        owner._io.gate().throttled(retry_after=2.0)  # a 429 a moment ago: the next write waits 2 s
    sent_at = world.clock.time()
    assert owner.release() is None
    assert world.clock.time() > slot.expires_at > sent_at  # the write went out after the slot ended
    assert world.record().owner_id is None and applied == [None], applied
