"""Renewal and the lease it keeps: when renewals go out, how long a lease counts, and when the owner
calls itself unhealthy or lost (throttling, stalls, suspends, clock jumps, a thief).

On simulated time, except where a test names the real thing it needs (a GCS emulator behind the fault proxy).
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from lockparts import new_lock
from lockutil import FAST, raw_read, raw_write, stepped_until
from simworld import KEY

from handofflock import (
    Clock,
    FakeClock,
    HandoffLock,
    LockLost,
    LockTimeout,
    Scheduler,
    TransientStorageError,
    signals,
)
from handofflock.core.timing import MIN_REQUEST_TIME
from handofflock.storage import MemoryStorage
from handofflock.storage.gcs import GCSStorage
from handofflock.storage.records import gate_for, write_resolving
from handofflock.testing.faultproxy import FaultProxy

GCS_SPACING = 1.0


def _429() -> TransientStorageError:
    return TransientStorageError("429: the object exceeded the rate limit for mutations", status=429, ambiguous=False)


def _503() -> TransientStorageError:
    return TransientStorageError("503: backend error", status=503, ambiguous=True)  # as GCS's 503 maps

FAULTS = {"429": _429, "503": _503}


def why_lost(lock: HandoffLock) -> str:
    """Why ``check()`` says the lock is lost (``LockLost.reason``), or "" while it is healthy."""
    try:
        lock.check()
    except LockLost as lost:
        return lost.reason
    return ""


def owner_meets(world, ttl: float, answers: list[str]) -> tuple[HandoffLock, list[float]]:
    """An owner at GCS's spacing whose next renewals are answered ``answers``, then 30 s on; and the times
    of its write calls."""
    write_times = world.timed_writes()
    a = world.lock("A", ttl=ttl, min_write_interval=GCS_SPACING)
    assert a.acquire()
    world.clock.run_for(3 * a.renew_interval + 0.1)  # steady renewals first
    for answer in answers:
        world.store.faults.fail_next("write", key=KEY, exc=FAULTS[answer])
    world.clock.run_for(30.0)
    return a, write_times

STALL = 6.0


def _sim_held_through_a_stalled_read(sim, lock: HandoffLock, arm_stall) -> None:
    """:func:`_held_through_a_stalled_read` on simulated time: the stall is a simulated thread asleep."""
    lost: list[dict] = []

    def on_lost(sender, **kw):
        lost.append(kw)

    with signals.lost.connected_to(on_lost, sender=lock):
        assert sim.call(lambda: lock.acquire(timeout=10))
        started = arm_stall()
        sim.run_until(started.is_set, limit=lock.waiter_check_interval + 3, what="a waiter check reading the record")
        sim.run_for(STALL + 1.0)
        assert lock.healthy and not lost, f"a stalled waiter-check read cost the lease: {lost}"
        sim.call(lock.release)


def _stall_once(sim, started: threading.Event):
    def stall(op, key):
        if not started.is_set():
            started.set()
            sim.sleep(STALL)

    return stall


def _held_through_a_stalled_read(lock: HandoffLock, arm_stall) -> list[dict]:
    """Hold ``lock``, stall its next background read for STALL seconds, and return the losses seen."""
    lost: list[dict] = []

    def on_lost(sender, **kw):
        lost.append(kw)

    with signals.lost.connected_to(on_lost, sender=lock):
        assert lock.acquire(timeout=10)
        try:
            started = arm_stall()
            assert started.wait(lock.waiter_check_interval + 3), "no waiter check read the record"
            time.sleep(STALL + 1.0)
            assert lock.healthy and not lost, f"a stalled waiter-check read cost the lease: {lost}"
        finally:
            lock.release()
    return lost


@pytest.mark.parametrize("ttl", [5.0, 6.0])
def test_one_429_on_a_renewal_costs_no_lease_at_the_shortest_ttls(world, ttl):
    a, write_times = owner_meets(world, ttl, ["429"])
    assert a.healthy and a.is_held, f"lost at ttl {ttl}: {why_lost(a)}"
    gaps = [later - earlier for earlier, later in zip(write_times, write_times[1:], strict=False)]
    assert max(gaps) < 2.0, f"a retry waited out the widened spacing: {gaps}"


@pytest.mark.parametrize("answers", [["429", "429"], ["429", "503"]], ids="-then-".join)
@pytest.mark.parametrize("ttl", [7.0, 8.0, 10.0])
def test_two_failures_in_a_row_starting_with_a_429_cost_no_lease_from_ttl_7(world, ttl, answers):
    a, _ = owner_meets(world, ttl, answers)
    assert a.healthy and a.is_held, f"lost at ttl {ttl} after {answers}: {why_lost(a)}"


def test_a_renewal_with_room_still_waits_out_the_backoff_gcs_asked_for(world):
    """At ttl 60 a renewal has 22.5 s to spare: after a 429 its retry waits the widened 2 s."""
    a, write_times = owner_meets(world, 60.0, ["429"])
    assert a.healthy
    refused = next(i for i, t in enumerate(write_times) if i > 0 and t - write_times[i - 1] < 7.4)
    assert write_times[refused] - write_times[refused - 1] >= 2.0 - 1e-9, write_times


def test_the_shortest_ttl_on_gcs_is_still_5_s(world):
    a = world.lock("A", ttl=5.0, min_write_interval=GCS_SPACING)
    assert a.timing.backoff_until(100.0) == 100.0 - 1.5


@pytest.mark.gcs
def test_one_429_from_gcs_on_a_renewal_costs_no_lease_at_ttl_6(gcs_emulator):
    """Through the fault proxy to fake-gcs-server, at GCS's default pacing; the lock's time is a stepping
    fake clock (each step runs its due renewals in this thread), on which the store's answers take no time.

    ttl 6: a renewal every second, 2 s between a renewal and its deadline. A retry that waited
    out the widened 2 s spacing would leave the owner calling itself lost; it goes a second
    after the 429'd send."""
    bucket = f"t-{uuid.uuid4().hex[:16]}"
    gcs_emulator.create_bucket(bucket)
    clock = FakeClock(start=time.time(), step=0.05)
    sched = Scheduler(clock, autostart=False)
    clock.on_tick.append(sched.run_pending)
    lost: list[dict] = []
    with FaultProxy(gcs_emulator.url, lifetime=120) as proxy:
        with proxy.env():
            store = GCSStorage(bucket, timeout=(1.0, 2.0))
        sent: list[float] = []  # the lock's time as each write call begins
        write = store.write

        def stamped(*args, **kwargs):
            sent.append(clock.monotonic())
            return write(*args, **kwargs)

        store.write = stamped
        lock = HandoffLock(f"gs://{bucket}/{KEY}", storage=store, key=KEY, ttl=6.0, clock=clock, scheduler=sched)
        assert lock.min_write_interval == GCS_SPACING, "GCS's default spacing"

        def on_lost(sender, **kw):
            lost.append(kw)

        with signals.lost.connected_to(on_lost, sender=lock):
            assert lock.acquire(timeout=10)
            try:
                clock.run_for(2.2)
                rule = proxy.inject("429", method="POST")
                stepped_until(clock, lambda: rule.fired, within=5, what="a renewal sent")
                clock.run_for(4.0)
                assert lock.healthy and not lost, f"lost after one 429: {lost}"
                posts = [ex for ex in proxy.exchanges("POST")]
                assert len(sent) == len(posts), "one request a write call"
                i = next(i for i, ex in enumerate(posts) if ex.fault == "429")
                assert posts[i + 1].status == 200
                assert sent[i + 1] - sent[i] < 2.0, "the retry waited the widened spacing"
            finally:
                lock.release()


def test_a_waiter_check_read_that_stalls_6_s_never_holds_back_a_renewal(sim):
    lock = sim.lock("A", key=KEY, ttl=10.0)
    assert lock.min_write_interval == 0.0 and lock.renew_deadline == 5.0  # default pacing
    writes: list[float] = []
    sim.store.faults.after("write", lambda op, key, result: writes.append(sim.monotonic()))

    def arm() -> threading.Event:
        started = threading.Event()
        sim.store.faults.before("read", _stall_once(sim, started))
        return started

    _sim_held_through_a_stalled_read(sim, lock, arm)
    gaps = [b - a for a, b in zip(writes, writes[1:])]
    assert max(gaps) < lock.renew_deadline - 1.0, f"renewals stopped during the stall: {gaps}"


def test_a_grouped_waiter_check_whose_read_stalls_never_holds_back_a_renewal(sim):
    """Two locks in one "directory" (one process) are checked by one listing; a lock the listing does not
    show is read, and that read stalls. Its renewals go on meanwhile."""
    other = sim.lock("B", key="locks/b.json", ttl=10.0)
    lock = sim.lock("A", key=KEY, ttl=10.0, beside=other)

    def arm() -> threading.Event:
        started = threading.Event()
        # The listing leaves the lock out, so its check reads it: that read stalls.
        sim.store.faults.after("list", lambda op, key, found: found.pop(KEY, None))
        sim.store.faults.before("read", _stall_once(sim, started), key=KEY)
        return started

    assert sim.call(lambda: other.acquire(timeout=10))
    _sim_held_through_a_stalled_read(sim, lock, arm)
    assert other.healthy
    sim.call(other.release)


@pytest.mark.gcs
def test_a_waiter_check_read_that_gcs_stalls_6_s_never_holds_back_a_renewal(gcs_emulator):
    """Through the fault proxy to fake-gcs-server, at GCS's default timeouts (5 s, 15 s) and pacing:
    the proxy holds the owner's next read 6 s before forwarding it."""
    bucket = f"t-{uuid.uuid4().hex[:16]}"
    gcs_emulator.create_bucket(bucket)
    with FaultProxy(gcs_emulator.url, lifetime=120) as proxy:
        with proxy.env():
            store = GCSStorage(bucket)
        lock = HandoffLock(f"gs://{bucket}/{KEY}", storage=store, key=KEY, ttl=10.0)
        assert lock.min_write_interval == 1.0 and lock.renew_deadline == 5.0

        def arm() -> threading.Event:
            started = threading.Event()
            proxy.inject("delay", method="GET", delay=STALL, when=lambda ex: bool(started.set()) or True)
            return started

        _held_through_a_stalled_read(lock, arm)
        posts = [ex.started for ex in proxy.exchanges("POST")]
        gaps = [b - a for a, b in zip(posts, posts[1:])]
        assert max(gaps) < lock.renew_deadline - 1.0, f"renewals stopped during the stall: {gaps}"


def test_a_wall_clock_that_jumps_while_monotonic_time_stands_still_fails_check(world):
    a = world.lock("A", ttl=10.0)
    assert a.acquire(timeout=5)
    world.clock.jump_wall(300.0)  # resumed from a suspend the monotonic clock did not see
    assert not a.healthy
    with pytest.raises(LockLost, match="suspended"):
        a.check()


def test_a_suspend_longer_than_the_renew_deadline_ends_the_hold(world):
    a = world.lock("A", ttl=10.0)
    assert a.acquire(timeout=5)
    mono = world.clock.monotonic()
    world.clock.suspend(300.0)
    assert world.clock.monotonic() == mono, "monotonic time stands still in a suspend"
    assert not a.healthy
    with pytest.raises(LockLost):
        a.check()
    world.clock.run_for(0.5)  # the scheduler's next look, on resume: the boot clock says it ran out
    assert a._state.value == "lost"
    with pytest.raises(LockLost, match="renew"):
        a.check()


def test_a_short_suspend_costs_nothing(world):
    a = world.lock("A", ttl=10.0)
    assert a.acquire(timeout=5)
    world.clock.suspend(1.0)
    assert a.healthy
    world.clock.run_for(30.0)
    assert a.healthy
    a.release()


def test_a_wall_clock_set_back_never_makes_a_healthy_lock_unhealthy(world):
    a = world.lock("A", ttl=10.0)
    assert a.acquire(timeout=5)
    world.clock.jump_wall(-300.0)
    assert a.healthy
    world.clock.run_for(30.0)  # renewals go on from the wall clock as it is now
    assert a.healthy
    a.check()
    a.release()


def test_a_wall_clock_set_forward_fails_check_only_until_the_next_renewal(world):
    a = world.lock("A", ttl=10.0)
    assert a.acquire(timeout=5)
    world.clock.jump_wall(60.0)
    assert not a.healthy
    world.clock.run_for(a.renew_interval + 0.5)
    assert a.healthy, "a renewal written from the new wall clock makes the lease good again"
    a.release()


def test_the_boot_clock_is_one_time_base_of_its_own():
    real = Clock()
    b1 = real.boottime()
    time.sleep(0.01)
    assert real.boottime() > b1
    fake = FakeClock()
    boot, mono = fake.boottime(), fake.monotonic()
    fake.suspend(5.0)
    assert fake.boottime() == boot + 5.0 and fake.monotonic() == mono
    fake.advance(1.0)
    assert fake.boottime() == boot + 6.0 and fake.skewed(3.0).boottime() == boot + 6.0


def test_a_lease_counts_from_the_send_of_the_write_that_landed_after_a_503_and_a_429(world):
    store, write_times = world.store, world.timed_writes()
    store.faults.fail_next("write", key=KEY)  # 503
    store.faults.fail_next("write", key=KEY, exc=lambda: TransientStorageError(
        "429: slow down", status=429, ambiguous=False, retry_after=3.0))
    a = world.lock("A", ttl=4.0, renew_interval=0.5, renew_deadline=2.0)
    started = world.clock.monotonic()
    assert a.acquire(timeout=30)
    sent = write_times[-1]
    assert sent - started >= 3.0, "the retries took their time"
    assert a.healthy, "the lease was counted from before the retries"
    # The record's lease runs ttl from the send, and the owner counts renew_deadline from it.
    assert abs(world.record().expires_at - (world.clock.time() - (world.clock.monotonic() - sent) + 4.0)) < 1e-6
    assert abs(a._lease.valid_until - (sent + 2.0)) < 1e-6  # private: how long the owner counts itself safe


def test_a_lease_that_waited_for_the_write_gate_counts_from_its_send(world):
    write_times = world.timed_writes()
    a = world.lock("A", ttl=5.0, min_write_interval=GCS_SPACING)
    b = world.lock("B", ttl=5.0, min_write_interval=GCS_SPACING)
    assert a.acquire()
    a.release()  # two writes in a moment: the bucket is empty
    assert b.acquire(timeout=10)
    sent = write_times[-1]
    assert sent > write_times[-2], "B's write waited for the gate"
    assert abs(b._lease.valid_until - (sent + b.renew_deadline)) < 1e-6  # private: as above


def test_a_gate_compares_times_of_one_clock_only():
    store = MemoryStorage("gate-clocks")
    fake = FakeClock()
    assert gate_for(store, KEY, 1.0, fake) is not gate_for(store, KEY, 1.0, Clock())
    assert gate_for(store, KEY, 1.0, Clock()) is gate_for(store, KEY, 1.0, Clock(offset=5.0)), "real clocks share one"
    # A fake clock at 1000 s writing does not make a real-clock lock wait on a freshly booted machine.
    fake_gate = gate_for(store, KEY, 1.0, fake)
    assert fake_gate.take(fake.monotonic()) and fake_gate.take(fake.monotonic(), urgent=True)
    assert gate_for(store, KEY, 1.0, Clock()).ready_in(time.monotonic()) == 0.0


def test_a_writer_that_gives_up_books_nothing(world):
    gate = gate_for(world.store, KEY, GCS_SPACING, world.clock)
    now = world.clock.monotonic()
    assert gate.take(now)  # one ordinary write: the next ordinary one waits a spacing
    before = gate.ready_in(now)
    with pytest.raises(TransientStorageError, match="would pass the operation's deadline"):
        write_resolving(world.store, KEY, b"{}", if_generation_match=0, is_ours=lambda d: False, clock=world.clock,
                        deadline=now + 0.1, max_bytes=1024, gate=gate)
    assert gate.ready_in(world.clock.monotonic()) == before, "the writer that gave up took a slot"
    assert world.store.read(KEY) is None


def test_a_retry_whose_spacing_leaves_no_time_to_send_in_books_nothing(world):
    # An urgent write refused with a 429 past its send_by retries at the store's own spacing, which ends half a
    # millisecond before its deadline: too late to send in. It raises the 429 with nothing sent, and the next
    # write (the give-back's next round) goes a spacing after the refused one, not a spacing after the retry.
    gate = gate_for(world.store, KEY, GCS_SPACING, world.clock)
    now = world.clock.monotonic()
    world.store.faults.fail_next("write", exc=_429)
    with pytest.raises(TransientStorageError, match="429"):
        write_resolving(world.store, KEY, b"{}", if_generation_match=0, is_ours=lambda d: False, clock=world.clock,
                        deadline=now + GCS_SPACING + 0.0005, max_bytes=1024, gate=gate, urgent=True, send_by=now)
    later = world.clock.monotonic()
    assert later >= now + GCS_SPACING - 1e-6, "the retry did not wait out the store's own spacing"
    assert gate.ready_in(later, urgent=True, by=later) == 0.0, "the retry that sent nothing took a write"
    assert world.store.read(KEY) is None


def test_a_wait_for_the_gate_before_a_read_leaves_the_read_its_time(world):
    # A waiter giving its slot back (or a lock handed to it meanwhile) reads after the urgent write
    # slot; a 429 that widened the spacing past its budget must not leave that read no time at all.
    a = world.lock("A", ttl=10.0, min_write_interval=GCS_SPACING)
    gate = a._io.gate()  # private: the store's write gate, closed as a 429 would
    start = world.clock.monotonic()
    assert gate.take(start, urgent=True)  # a write went out, and met a 429 asking for a long pause
    gate.throttled(retry_after=30.0)
    assert gate.ready_in(start, urgent=True) > a.give_up_budget
    deadline = start + a.give_up_budget
    a._io.wait_for_gate(deadline, urgent=True)  # private: the wait before a read that decides a write
    assert world.clock.monotonic() <= deadline - MIN_REQUEST_TIME + 1e-9
    assert a._io.read(deadline) == (None, 0)  # sent, and answered, within the deadline


def test_a_renewal_that_finds_the_gate_closed_defers_without_holding_the_lock(world):
    # ttl 20: the renewal has room (renew_deadline - renew_interval = 7.5 s) to wait out the 3 s
    # a 429 asked for; at the shortest ttl it would go at the store's own spacing.
    a = world.lock("A", ttl=20.0, min_write_interval=GCS_SPACING)
    assert a.acquire()
    gate = a._io.gate()  # private: the store's write gate, to close it as a 429 would
    throttled_at = world.clock.monotonic()
    gate.throttled(retry_after=3.0)  # a 429 elsewhere: nothing may be written for 3 s
    world.clock.advance(a.renew_interval)
    writes, started = world.writes, world.clock.monotonic()
    a._duties.run_due()  # private: the scheduler's duty, run here (as the scheduler would)
    assert world.clock.monotonic() == started and world.writes == writes, "the renewal waited"
    # private: when the renewal is next due; no public name says it
    assert a._lease.next_renew >= throttled_at + 3.0 - 1e-6, "deferred to when the gate opens"
    assert a._mutex.acquire(blocking=False), "the renewal holds the I/O mutex"  # private: it must be free
    a._mutex.release()
    assert a.status().owner_id == "A" and a.is_held


def test_a_renewal_that_meets_a_waiters_write_renews_again_at_once_under_pacing(world):
    store = world.store
    a = world.lock("A", ttl=5.0, min_write_interval=GCS_SPACING)
    assert a.acquire()
    for _ in range(3):  # a waiter that registers, leaves and registers again, between renewals
        record = world.record()
        store.write(KEY, record.replace(nonce=f"w{_}", waiting_owner_id="W", waiter_expires_at=world.clock.time() + 5).encode(),
                    if_generation_match=world.generation())
        world.clock.advance(a.renew_interval)
        world.sched.run_pending()
        assert a.healthy and world.record().nonce != f"w{_}", "the renewal did not land"


@pytest.mark.timeout(60)
def test_a_slow_receiver_never_delays_a_renewal(sim):
    kw = dict(ttl=1.5, renew_interval=0.2, renew_deadline=0.8, waiter_check_interval=0.05,
              waiter_poll_interval=0.05, waiter_ttl=2.0, min_hold=0)  # fmt: skip
    owner = sim.lock("O", **kw)
    waiter = sim.lock("W", **kw)
    assert sim.call(owner.acquire)
    receiving = threading.Event()
    healthy: list[bool] = []

    def checkpoint(sender, **kw):  # a checkpoint that takes four renew deadlines, on the owner's notifier thread
        receiving.set()
        for _ in range(32):
            sim.sleep(0.1)
            healthy.append(sender.healthy)

    signals.on_release_requested.connect(checkpoint, sender=owner, weak=False)
    try:
        t = sim.start(lambda: waiter.acquire(timeout=30))
        sim.run_until(receiving.is_set, limit=10)
        first = sim.record().expires_at
        sim.run_for(2.0)
        assert sim.record().expires_at > first + 1.0, "no renewal while the receiver ran"
        assert owner.healthy
        sim.run_until(lambda: t.done or len(healthy) >= 32)
        assert all(healthy), "the owner was unhealthy while its receiver ran"
        sim.call(owner.release)
        sim.run_until(lambda: t.done, limit=10)
        assert waiter.is_held
    finally:
        signals.on_release_requested.disconnect(checkpoint, sender=owner)


@pytest.mark.parametrize("how", ["stolen", "deleted"])
def test_renewal_catches_a_stolen_or_deleted_record_and_never_rewrites_it(sim, how):
    owner = sim.lock("owner", **FAST)
    errors, lost = [], threading.Event()
    signals.on_renewal_error.connect(lambda s, error: errors.append(error), sender=owner, weak=False)
    signals.lost.connect(lambda s, **kw: lost.set(), sender=owner, weak=False)
    assert sim.call(owner.acquire)
    record, gen = sim.read()
    if how == "stolen":
        thief = record.replace(owner_id="thief", token=record.token + 1, expires_at=sim.time() + 60)
        sim.store.write(KEY, thief.encode(), if_generation_match=gen)
    else:
        sim.store.delete(KEY, if_generation_match=gen)
    sim.run_until(lost.is_set, limit=5, what="the owner noticing")
    assert not owner.healthy and not owner.is_held
    with pytest.raises(LockLost):
        owner.check()
    assert len(errors) == 1 and isinstance(errors[0], LockLost)
    sim.run_for(3 * FAST["renew_interval"])
    after, _ = sim.read()
    if how == "stolen":
        assert after.owner_id == "thief"
    else:
        assert after is None


@pytest.mark.parametrize("paced", [False, True], ids=["unpaced", "gcs-pacing"])
def test_renewal_keeps_a_lock_held_for_many_ttls(sim, paced):
    # At GCS's write spacing (1 s) the shortest ttl it serves is 5 s; unpaced, a 1 s renew deadline.
    if paced:
        timing = dict(ttl=5.0, min_write_interval=1.0, max_clock_skew=FAST["max_clock_skew"])
    else:
        timing = dict(FAST, ttl=2.0, renew_interval=0.25, renew_deadline=1.0, waiter_ttl=1.5)
    owner = sim.lock("owner", **timing)
    assert sim.call(owner.acquire)
    ttl = timing["ttl"]
    contender = sim.lock("contender", **timing)
    start = sim.time()
    rounds = 4 if paced else 5
    for _ in range(rounds):
        sim.run_for(ttl)
        assert owner.healthy
        assert sim.call(lambda: contender.acquire(blocking=False)) is False
    record, _ = sim.read()
    assert record.owner_id == owner.owner_id
    assert record.expires_at > start + (rounds - 1) * ttl


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
    lock = new_lock(name, clock, sched, min_hold=0)
    assert lock.acquire()
    record, gen = raw_read(url)
    raw_write(url, record.replace(waiting_owner_id="w", waiter_expires_at=clock.time() + 60, nonce="w1"), gen)
    clock.advance(7.5)
    sched.run_pending()
    after, _ = raw_read(url)
    assert after.owner_id == lock.owner_id and after.waiting_owner_id == "w"
    assert after.expires_at == pytest.approx(clock.time() + 60)
    assert lock.release_requested and lock.release_request.requester == "w"


def test_the_holder_hears_a_waiter_with_its_own_owner_id_as_any_waiter_and_is_never_ended_by_it(world):
    """A second instance under the holder's id is another party. It waits and asks; the holder's checks see
    its request (never taking it for itself) and the holder stays healthy, its lease and token its own.
    (An earlier version let the second retake the lock with a new token, which ended the first at its next check.)"""
    first = world.lock("job-7", ttl=60.0, min_hold=0)
    assert first.acquire(timeout=5)
    token = first.token
    second = world.lock("job-7", ttl=60.0)
    with pytest.raises(LockTimeout):
        second.acquire(timeout=first.waiter_check_interval * 3)
    assert first.release_requested and first.release_request.requester == "job-7"
    first.check()
    assert first.token == token and world.record().owner_instance == first.instance
    world.clock.run_for(first.waiter_check_interval + 0.25)  # the slot was given back: the request is withdrawn
    assert not first.release_requested
    first.check()
    first.release()
