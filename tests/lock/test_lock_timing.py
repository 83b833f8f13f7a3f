"""Renewal, waiter checks, deadlines and re-entrancy, driven by a fake clock instead of sleeps."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from handofflock import (
    AcquireCancelled,
    ConfigurationError,
    FakeClock,
    HandoffLock,
    LockLost,
    LockRecordCorrupt,
    Scheduler,
    signals,
)
from handofflock.lock.primitives import Primitives
from handofflock.storage import MemoryStorage
from lockutil import eventually, make_lock, raw_read, raw_write


@pytest.fixture
def env():
    name = f"timing-{uuid.uuid4().hex[:8]}"
    clock = FakeClock()
    sched = Scheduler(clock, autostart=False)
    yield name, clock, sched, MemoryStorage.named(name)
    MemoryStorage.forget(name)


def new_lock(name, clock, sched, **kw):
    opts = dict(ttl=60.0, waiter_check_interval=2.0, waiter_poll_interval=1.0, clock=clock, scheduler=sched)
    opts.update(kw)
    return HandoffLock(f"memory://{name}/train.json", **opts)


def test_renewal_runs_every_ttl_over_eight_and_pushes_expiry(env):
    name, clock, sched, store = env
    lock = new_lock(name, clock, sched)
    assert lock.acquire()
    writes0 = store.calls["write"]
    expiries = []
    for _ in range(8):
        clock.advance(7.5)  # ttl/8
        sched.run_pending()
        expiries.append(raw_read(f"memory://{name}/train.json")[0].expires_at)
    assert store.calls["write"] - writes0 == 8
    assert expiries == sorted(expiries) and expiries[-1] == pytest.approx(clock.time() + 60.0)
    assert lock.healthy


def test_the_waiter_check_only_reads(env):
    name, clock, sched, store = env
    lock = new_lock(name, clock, sched, renew_interval=7.5)
    assert lock.acquire()
    writes0, reads0 = store.calls["write"], store.calls["read"]
    for _ in range(3):
        clock.advance(2.0)
        sched.run_pending()
    assert store.calls["write"] == writes0
    assert store.calls["read"] - reads0 == 3


def test_a_process_paused_past_the_renew_deadline_is_unhealthy_before_any_code_runs(env):
    name, clock, sched, store = env
    lock = new_lock(name, clock, sched)
    assert lock.acquire()
    errors, lost = [], []
    signals.on_renewal_error.connect(lambda s, error: errors.append(error), sender=lock, weak=False)
    signals.lost.connect(lambda s, **kw: lost.append(kw), sender=lock, weak=False)
    clock.advance(30.0)  # renew_deadline = ttl/2: the "process" was stopped all along
    assert not lock.healthy
    with pytest.raises(LockLost):
        lock.check()
    writes = store.calls["write"]
    sched.run_pending()
    assert store.calls["write"] == writes, "a lock past its deadline must not renew on waking"
    assert len(errors) == 1 and len(lost) == 1
    sched.run_pending()
    assert len(errors) == 1, "on_renewal_error fires once"


def test_transient_failures_are_retried_but_give_up_at_the_deadline_before_the_lease_expires(env):
    name, clock, sched, store = env
    lock = new_lock(name, clock, sched)
    assert lock.acquire()
    expires_at = raw_read(f"memory://{name}/train.json")[0].expires_at
    errors = []
    signals.on_renewal_error.connect(lambda s, error: errors.append((clock.time(), error)), sender=lock, weak=False)
    store.faults.fail_next("write", count=10_000)
    attempts0 = store.calls["write"]
    while not errors and clock.time() < expires_at + 10:
        clock.advance(0.5)
        sched.run_pending()
    store.faults.clear()
    assert errors, "on_renewal_error never fired"
    fired_at, error = errors[0]
    assert isinstance(error, LockLost)
    assert fired_at < expires_at, "the owner must give up before its lease can expire"
    assert store.calls["write"] - attempts0 >= 3, "transient failures were not retried"


def test_a_renewal_that_loses_a_race_with_the_waiter_retries_and_keeps_the_waiter(env):
    name, clock, sched, store = env
    url = f"memory://{name}/train.json"
    lock = new_lock(name, clock, sched)
    assert lock.acquire()
    record, gen = raw_read(url)
    raw_write(url, record.replace(waiting_owner_id="w", waiter_expires_at=clock.time() + 60, nonce="w1"), gen)
    clock.advance(7.5)
    sched.run_pending()
    after, _ = raw_read(url)
    assert after.owner_id == lock.owner_id and after.waiting_owner_id == "w"
    assert after.expires_at == pytest.approx(clock.time() + 60)
    assert lock.release_requested and lock.release_request.requester == "w"


def test_the_constructor_does_no_io_and_validates_intervals():
    from handofflock import ConfigurationError

    HandoffLock("gs://no-such-bucket-anywhere/x.json")  # no request: nothing raised
    for bad in (dict(ttl=0), dict(ttl=-1), dict(ttl=10, renew_interval=6, renew_deadline=5),
                dict(ttl=10, renew_deadline=10), dict(waiter_check_interval=0), dict(waiter_poll_interval=float("nan")),
                dict(max_clock_skew=-1), dict(ttl=1e9), dict(waiter_ttl=1.0, waiter_poll_interval=1.0),
                dict(waiter_ttl=1e12)):
        with pytest.raises(ConfigurationError):
            HandoffLock("memory://cfg/x.json", **bad)


@pytest.mark.parametrize("owner_id", ["", "a\nb", "tab\there", "del\x7f", "x" * 513, 7])
def test_an_owner_id_the_decoder_would_call_corrupt_is_refused_before_anything_is_written(owner_id):
    """The constructor applies the decoder's rule for ids: otherwise the lock would write a record
    that it, and every contender, then reads as corrupt, stuck until someone forces it."""
    from handofflock import ConfigurationError
    from handofflock.core.record import Holder, LockRecord

    with pytest.raises(ConfigurationError, match="owner_id"):
        HandoffLock("memory://cfg/x.json", owner_id=owner_id)
    if isinstance(owner_id, str):  # what a record naming it would have been taken for
        with pytest.raises(LockRecordCorrupt):
            LockRecord.decode(LockRecord(Holder(owner_id, 1.0), ttl=1.0).encode())


def test_the_longest_valid_owner_id_round_trips_through_the_record():
    name = f"id-{uuid.uuid4().hex[:8]}"
    owner = "host.example:1234:" + "x" * (512 - 18)
    lock = HandoffLock(f"memory://{name}/x.json", owner_id=owner, scheduler=Scheduler(FakeClock(), autostart=False), clock=FakeClock())
    assert lock.acquire()
    assert lock.status().owner_id == owner
    lock.release()


def test_one_scheduler_thread_serves_many_locks():
    sched = Scheduler(io_workers=2)
    name = f"many-{uuid.uuid4().hex[:8]}"
    held = [HandoffLock(f"memory://{name}/l{i}.json", ttl=3, scheduler=sched) for i in range(50)]
    before = threading.active_count()
    for lock in held:
        assert lock.acquire()
    eventually(lambda: sched.threads >= 1, what="scheduler start")
    time.sleep(0.6)
    assert sched.threads <= 3
    assert threading.active_count() - before <= 3
    for lock in held:
        lock.release()
    sched.stop()


class _YieldingMutex:
    """A mutex that, once released, lets a thread queued on it run before its releaser goes on."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()

    def __enter__(self) -> "_YieldingMutex":
        self._mutex.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self._mutex.release()
        time.sleep(0.1)


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
    renewing = threading.Thread(target=lock._duties.run_due)  # private: the duty the scheduler had already started
    renewing.start()
    time.sleep(0.1)  # it is now waiting for the mutex the release holds
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


@pytest.mark.parametrize("op", ["read", "write"])
def test_a_cancelled_waiter_still_retries_giving_its_slot_back(op):
    """cancel() stops the polling, not the clean-up: a transient error while giving the waiter slot
    back is retried, so the slot is freed now instead of blocking everyone until it expires."""
    from handofflock import TransientStorageError

    name = f"cancel-{uuid.uuid4().hex[:8]}"
    url = f"memory://{name}/train.json"
    owner = make_lock(url)
    assert owner.acquire()
    waiter = make_lock(url, waiter_ttl=30.0)
    store = MemoryStorage.named(name)
    real = getattr(store, op)
    failed = []

    def flaky(*args, **kw):
        # private: the cancel event is the only sign that the give-up has begun
        if waiter._cancel.is_set() and not failed:  # the first call of the give-up
            failed.append(op)
            raise TransientStorageError(f"injected: {op} failed", status=503, ambiguous=False)
        return real(*args, **kw)

    setattr(store, op, flaky)
    outcome = []
    thread = threading.Thread(target=lambda: outcome.append(_acquire_outcome(waiter)))
    thread.start()
    eventually(lambda: raw_read(url)[0].waiting_owner_id == waiter.owner_id, what="waiter registered")
    waiter.cancel()
    thread.join(10)
    setattr(store, op, real)
    try:
        assert failed == [op], "the fault was not hit"
        assert outcome == ["cancelled"], outcome
        assert raw_read(url)[0].waiting_owner_id is None, "the slot was left to expire"
    finally:
        owner.release()


def _acquire_outcome(lock: HandoffLock) -> str:
    try:
        lock.acquire(timeout=20)
        return "acquired"
    except AcquireCancelled:
        return "cancelled"
    except Exception as exc:  # noqa: BLE001 - reported by the assertion
        return repr(exc)


def test_writes_to_one_gcs_object_are_spaced_a_second_apart_by_default_and_elsewhere_not():
    from handofflock.fencing import FencedObject
    from handofflock.storage import open_url

    gcs_lock = HandoffLock("gs://some-bucket/locks/a.json")  # no I/O: nothing is sent
    assert gcs_lock.min_write_interval == 1.0
    assert FencedObject.beside(gcs_lock, "ckpt.json").min_write_interval == 1.0
    # The option itself: an explicit 0 turns the default spacing off (for a store that allows it).
    assert HandoffLock("gs://some-bucket/locks/a.json", min_write_interval=0.0).min_write_interval == 0.0
    for url in ("memory://spacing/a.json", "file:///tmp/never-written/a.json"):
        lock = HandoffLock(url)
        assert lock.min_write_interval == 0.0
        assert FencedObject(open_url(url)[0], "ckpt.json").min_write_interval == 0.0


def test_a_timing_value_built_directly_obeys_the_same_rules():
    from handofflock import Timing

    good = Timing.build(ttl=10.0)
    assert Timing(**{**good.__dict__}) == good  # every field explicit: accepted as built
    with pytest.raises(ConfigurationError, match="renew_deadline"):
        Timing(**{**good.__dict__, "renew_deadline": good.ttl})  # ttl > renew_deadline broken
    with pytest.raises(ConfigurationError):
        Timing(**{**good.__dict__, "min_write_interval": 1.0, "renew_interval": 0.5})  # faster than the store takes


def test_a_lock_takes_a_shared_timing_value_or_keywords_but_not_both(tmp_path):
    from handofflock import Timing

    timing = Timing.build(ttl=12.0, waiter_check_interval=0.5)
    lock = HandoffLock(str(tmp_path / "a.json"), timing=timing)
    assert lock.timing is timing and lock.ttl == 12.0 and lock.waiter_check_interval == 0.5
    with pytest.raises(ConfigurationError, match="not both"):
        HandoffLock(str(tmp_path / "b.json"), timing=timing, ttl=30.0)
    with pytest.raises(ConfigurationError, match="Timing"):
        HandoffLock(str(tmp_path / "c.json"), timing={"ttl": 12.0})
