"""The waiter check: the owner reads the record now and then, hears of a waiter (or a patient one, or a
decline), and a request is withdrawn when its waiter leaves or its hold is lost."""

from __future__ import annotations

import uuid

import pytest
from lockparts import held, new_lock, owner_and_waiter, wait_in_thread, waiter_is
from lockutil import FAST
from simworld import KEY

from handofflock import (
    FakeClock,
    HandoffLock,
    LockLost,
    Scheduler,
    signals,
)
from handofflock.cli import status_text
from handofflock.core import protocol
from handofflock.core.errors import TransientStorageError
from handofflock.core.protocol import Me, WaiterSeen
from handofflock.core.record import WaiterRequest
from handofflock.lock import Acquired
from handofflock.repair import force_release
from handofflock.storage import MemoryStorage

CHECK = 2.0


TIMING = dict(
    ttl=16.0, waiter_check_interval=0.2, waiter_poll_interval=0.1, max_clock_skew=0.5, min_write_interval=1.0
)


def lock_for(sim, owner, **kw):
    return sim.lock(owner, **{**TIMING, **kw})


NOW = 1_700_000_000.0

PATIENT = WaiterRequest(asks=False)


def test_a_lock_held_again_beside_a_neighbour_still_releasing_is_checked_for_waiters():
    name = f"group-inf-{uuid.uuid4().hex[:8]}"
    store = MemoryStorage.named(name)
    clock = FakeClock(step=0.5)
    sched = Scheduler(clock, autostart=False)
    timing = dict(ttl=600.0, renew_deadline=20.0, renew_interval=5.0, waiter_check_interval=CHECK)
    a, b = (
        HandoffLock(f"memory://{name}/locks/{n}.json", clock=clock, scheduler=sched, **timing)
        for n in ("a", "b")
    )
    looked: list[str | None] = []
    try:
        assert a.acquire() and b.acquire()
        store.faults.fail_next("write", count=10**6)
        for lock in (a, b):
            with pytest.raises(TransientStorageError):
                lock.release()  # both retried in the background: a group of two, neither held
        sched.run_pending()
        store.faults.clear()
        store.faults.fail_next("write", count=10**6, key="locks/b.json")  # b's outage goes on
        clock.advance(1.0)
        sched.run_pending()  # a's release lands; b's is retried again
        assert not a.is_held and not b.is_held
        assert a.acquire()  # a is held again; b is still releasing
        store.faults.before("list", lambda op, key: looked.append(key))
        store.faults.before("read", lambda op, key: looked.append(key), key="locks/a.json")
        for _ in range(4):
            clock.advance(CHECK)
            sched.run_pending()
        assert looked, f"no waiter check of a in {4 * CHECK} s (interval {CHECK} s) while b was releasing"
    finally:
        store.faults.clear()
        for lock in (a, b):
            if lock.is_held:
                lock.release()
        MemoryStorage.forget(name)


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


def test_a_holder_that_does_not_yield_declines_in_the_record_and_is_not_asked(sim):
    a, b = lock_for(sim, "a", yield_to_requests=False), lock_for(sim, "b")
    heard = []
    hold = lambda sender, **kw: heard.append(kw)  # noqa: E731
    signals.on_release_requested.connect(hold, sender=a)
    assert sim.call(a.acquire)
    box = sim.start(lambda: b.acquire(timeout=60))
    sim.run_until(lambda: sim.record().declined, limit=15, what="the decline written at a renewal")
    assert not a.release_requested and heard == []
    text = status_text(sim.call(a.status))
    assert "asked by " in text and "(b), declined" in text, text
    assert sim.call(a.release) == "b"  # it still hands the lock on when it is done
    sim.run_until(lambda: box.done)
    assert isinstance(box.result, Acquired)


def test_a_waiter_that_leaves_withdraws_its_request_and_the_holder_keeps_the_lock(sim):
    a, b, heard = owner_and_waiter(sim)
    t = wait_in_thread(sim, b)
    sim.run_until(lambda: a.release_requested, what="the holder was asked")
    request = a.release_request
    assert request.reason == "waiter" and request.requester == "b"
    b.cancel()
    sim.run_until(lambda: t.done)
    sim.run_until(lambda: not a.release_requested, what="the request was withdrawn")
    sim.run_until(lambda: heard.kinds() == [("requested", "b"), ("withdrawn", "b")], what="both signals, in order")
    assert heard.events[1][1] is request, "on_release_withdrawn carries the very ReleaseRequest"
    assert a.release_request is None and a.is_held and a.healthy
    assert sim.call(a.release) is None, "nobody to hand it to"


def test_a_waiter_whose_slot_expires_withdraws_its_request(sim):
    a, _, heard = owner_and_waiter(sim)
    # A waiter that registers and then dies: its slot runs out by itself.
    sim.update(waiting_owner_id="dead", waiter_expires_at=sim.time() + 0.6, waiter_instance="d1")
    sim.run_until(lambda: a.release_requested, what="the holder was asked")
    sim.run_until(lambda: not a.release_requested, limit=10, what="withdrawn once the slot expired")
    sim.run_until(lambda: heard.kinds() == [("requested", "dead"), ("withdrawn", "dead")])
    assert a.is_held


def test_a_signal_request_stays_when_the_waiter_leaves(sim):
    a, b, heard = owner_and_waiter(sim)
    t = wait_in_thread(sim, b)
    sim.run_until(lambda: a.release_requested and a.release_request.reason == "waiter")
    a.request_release("signal", requester="SIGTERM", deadline=sim.time() + 3600)  # later than the waiter's slot
    b.cancel()
    sim.run_until(lambda: t.done)
    sim.run_until(lambda: ("withdrawn", "b") in heard.kinds(), what="the waiter's request withdrawn")
    assert a.release_requested, "the signal still asks"
    assert a.release_request.reason == "signal" and a.release_request.requester == "SIGTERM"


def test_a_waiter_that_comes_back_asks_again(sim):
    a, b, heard = owner_and_waiter(sim)
    t = wait_in_thread(sim, b)
    sim.run_until(lambda: a.release_requested)
    b.cancel()
    sim.run_until(lambda: t.done)
    sim.run_until(lambda: not a.release_requested)
    t = wait_in_thread(sim, b)  # the same instance registers again
    sim.run_until(lambda: a.release_requested, what="asked again")
    sim.run_until(lambda: heard.kinds() == [("requested", "b"), ("withdrawn", "b"), ("requested", "b")])
    assert sim.call(a.release) == "b"
    sim.run_until(lambda: t.done)
    assert b.is_held


def test_a_new_waiter_replacing_one_that_expired_is_announced_after_the_withdrawal(sim):
    a, _, heard = owner_and_waiter(sim)
    sim.update(waiting_owner_id="w1", waiter_expires_at=sim.time() + 30, waiter_instance="i1")
    sim.run_until(lambda: a.release_requested and a.release_request.requester == "w1")
    # w1 is replaced before the holder looks again (its slot ran out and w2 took it).
    sim.update(waiting_owner_id="w2", waiter_expires_at=sim.time() + 30, waiter_instance="i2")
    sim.run_until(lambda: a.release_request.requester == "w2", what="w2's request stands")
    assert a.release_requested
    sim.run_until(lambda: heard.kinds() == [("requested", "w1"), ("withdrawn", "w1"), ("requested", "w2")])


def test_the_same_waiter_id_from_a_new_instance_is_a_new_request(sim):
    a, _, heard = owner_and_waiter(sim)
    sim.update(waiting_owner_id="job-7", waiter_expires_at=sim.time() + 30, waiter_instance="old")
    sim.run_until(lambda: a.release_requested)
    first = a.release_request
    # A restart of the waiter, with the same stable id.
    sim.update(waiter_instance="new", waiter_expires_at=sim.time() + 30)
    sim.run_until(lambda: len(heard.events) == 3, what="withdrawn and asked again")
    assert heard.kinds() == [("requested", "job-7"), ("withdrawn", "job-7"), ("requested", "job-7")]
    assert heard.events[1][1] is first and a.release_request is heard.events[2][1] and a.release_requested


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


@pytest.mark.parametrize("reason", ["signal", "preemption"])
def test_a_signal_or_a_notice_outlives_a_hold_that_was_lost(world, reason):
    """A SIGTERM's (or a preemption notice's) request is for the process, which is still going away once its hold
    is lost: no checkpoint answered it. It stands for the next hold, whose ``steps()`` stops before its first step,
    as after a signal that came while the lock was not held."""
    a = world.lock("A")
    assert a.acquire()
    a.request_release(reason, requester="SIGTERM" if reason == "signal" else "gce")
    record = world.record()
    world.store.write(KEY, record.replace(owner_id="thief", token=record.token + 1, nonce="t").encode(),
                      if_generation_match=world.generation())  # fmt: skip
    world.clock.advance(a.renew_interval)
    world.sched.run_pending()  # the renewal finds the lock taken: lost
    with pytest.raises(LockLost):
        a.release()
    assert a.release_requested and a.release_request.reason == reason
    world.store.write(KEY, world.record().replace(owner_id=None, expires_at=None, nonce="f").encode(),
                      if_generation_match=world.generation())  # fmt: skip
    assert a.acquire(timeout=5)
    assert list(a.steps(range(3))) == []
    a.release()


def test_a_lost_hold_does_not_pass_its_waiters_request_on_to_the_next_hold(sim):
    """A lock that was lost keeps its hold's requests (``_end_hold`` runs only from ``release()``),
    and ``acquire()`` is allowed from LOST. The next hold starts with ``release_requested`` True,
    naming a waiter of the previous hold who is long gone (here: it became the owner and left):
    a ``steps()`` loop stops before its first step and hands the lock to nobody. (The new
    withdrawal mechanism clears it at the first waiter check, an interval later; a signal's or
    a preemption notice's request from the previous hold is never withdrawn.)"""
    owner, waiter, _ = owner_and_waiter(sim)
    w = sim.start(lambda: waiter.acquire(timeout=20))
    sim.run_until(lambda: owner.release_requested, what="the owner hears of the waiter")
    # an operator clears the lock: the waiter takes it, the owner finds out
    sim.call(lambda: force_release(sim.lock("operator", **FAST)))
    sim.run_until(lambda: w.done, limit=20)
    assert isinstance(w.result, Acquired) and waiter.is_held
    # private: "lost" has no public flag of its own (is_held is False after a release too)
    sim.run_until(lambda: owner._state == "lost", what="the owner notices its loss")
    sim.call(waiter.release)
    assert sim.call(lambda: owner.acquire(blocking=False))  # the same instance again (no release() between)
    stale = owner.release_request
    assert not owner.release_requested, f"the new hold starts with the previous hold's request standing: {stale}"


def test_the_owner_is_not_told_of_a_patient_waiter_but_is_of_an_asking_one():
    me = Me("a", "ia")
    assert protocol.observe_as_owner(held(PATIENT), me=me, token=7, now=NOW) is None
    assert protocol.observe_as_owner(held(), me=me, token=7, now=NOW) == WaiterSeen("w", NOW + 20)


# -- the minimum hold: a waiter's request is in the record at once, and acted on when the hold is up --


def test_a_holder_is_not_asked_before_its_minimum_hold_and_is_asked_as_it_ends(sim):
    a, b = lock_for(sim, "a", min_hold=5.0), lock_for(sim, "b")
    heard = []
    signals.on_release_requested.connect(lambda sender, **kw: heard.append(sim.time()), sender=a, weak=False)
    assert sim.call(a.acquire)
    since = sim.record().held_since
    assert sim.record().min_hold == 5.0, "the record says how long the holder keeps the lock"
    box = sim.start(lambda: b.acquire(timeout=60))
    sim.run_until(waiter_is(sim, "b"), what="b registered: its request is recorded at once")
    while sim.time() < since + 5.0 - 0.05:
        assert not a.release_requested and heard == [], f"asked {sim.time() - since:.2f} s into the hold"
        sim.run_for(0.05)
    sim.run_until(lambda: a.release_requested, limit=1.0, what="asked as the minimum hold ends")
    assert since + 5.0 <= heard[0] <= since + 5.0 + 0.1, "a check is scheduled at the end of the hold"
    assert a.release_request.requester == "b"
    sim.call(a.release)
    sim.run_until(lambda: box.done)


def test_the_default_minimum_hold_is_thirty_seconds_and_is_written_beside_held_since(sim):
    a = lock_for(sim, "a")
    assert a.min_hold == 30.0
    assert sim.call(a.acquire)
    record = sim.record()
    assert (record.min_hold, record.held_since) == (30.0, pytest.approx(sim.time(), abs=1.0))


def test_signals_and_operator_requests_are_not_held_back_by_the_minimum_hold(sim):
    a, b = lock_for(sim, "a"), lock_for(sim, "b")
    assert sim.call(a.acquire)
    sim.start(lambda: b.acquire(timeout=60))
    sim.run_until(waiter_is(sim, "b"), what="b registered")
    sim.run_for(1.0)
    assert not a.release_requested, "the waiter's request waits for the minimum hold"
    a.request_release(requester="operator")
    assert a.release_requested and a.release_request.requester == "operator"
    a.cancel()


def test_an_heir_writes_its_own_minimum_hold_soon_after_the_handoff(sim):
    a, b = lock_for(sim, "a", min_hold=0), lock_for(sim, "b", min_hold=12.0)
    assert sim.call(a.acquire)
    box = sim.start(lambda: b.acquire(timeout=60))
    sim.run_until(lambda: a.release_requested, what="a asked at once (min_hold=0)")
    assert sim.call(a.release) == "b"  # the handoff is written by a, who does not know b's minimum hold
    sim.run_until(lambda: sim.record().min_hold == 12.0, limit=2.0, what="b's first renewal, at once")
    sim.run_until(lambda: box.done)


def test_a_holder_that_does_not_yield_declines_at_its_next_check_not_its_next_renewal(sim):
    a = lock_for(sim, "a", yield_to_requests=False, ttl=120.0, renew_interval=30.0, renew_deadline=60.0)
    b = lock_for(sim, "b")
    assert sim.call(a.acquire)
    box = sim.start(lambda: b.acquire(timeout=60))
    sim.run_until(waiter_is(sim, "b"), what="b registered")
    registered = sim.time()
    sim.run_until(lambda: sim.record().declined, limit=3.0, what="the decline, within a check and a write")
    assert sim.time() - registered < 2.0
    sim.run_until(lambda: b.declined_by == "a", limit=2.0, what="the waiter sees the decline at its next poll")
    assert not a.release_requested
    text = status_text(sim.call(b.status))
    assert "(b), declined" in text, text
    sim.call(a.release)
    sim.run_until(lambda: box.done)
    assert b.declined_by is None, "only while it waits"
