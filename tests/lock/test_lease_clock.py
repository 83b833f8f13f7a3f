"""One lease clock, and pacing that never costs the lock (issue 11).

A lease is valid from the send of the write attempt that made it, for the
ttl in that record, less the margin ``ttl - renew_deadline``. Writes to one
object pass one gate per clock, where a release goes ahead of a renewal,
nothing is booked that is not used, and a renewal that would wait is deferred.
Receivers run off the renewal path.

Most tests run on the memory store and a :class:`SimClock`. Where a test sets
``min_write_interval=1`` on the memory store, it does so to give it GCS's
default spacing (the memory store's own default is 0).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time

import pytest

from handofflock import Clock, ConfigurationError, FakeClock, HandoffLock, TransientStorageError, signals
from handofflock.storage.records import write_resolving
from handofflock.storage.records import gate_for
from handofflock.storage import MemoryStorage
from simworld import KEY, TimedStore, World

GCS_SPACING = 1.0  # GCS's default write spacing, given to the memory store where a test says so


# --------------------------------------------------------------------------- the lease clock


def test_an_heir_with_a_longer_ttl_than_its_predecessor_is_healthy_on_arrival_and_stays_held(world):
    owner = world.lock("O", ttl=4.0)
    heir = world.lock("H", ttl=20.0)
    assert owner.acquire()

    def hand_over(sender, **kw):
        sender.release()

    with signals.on_release_requested.connected_to(hand_over, sender=owner):
        assert heir.acquire(timeout=30)
    assert heir.healthy, "the heir was lost on arrival"
    record = world.record()
    assert record.ttl == 20.0, "the handoff wrote the heir's own ttl"
    for _ in range(40):  # 40 renew intervals of the heir
        world.clock.advance(heir.renew_interval / 2)
        world.sched.run_pending()
        assert heir.healthy
    assert world.record().owner_id == "H" and world.record().expires_at > record.expires_at


def test_an_heir_is_asked_at_once_for_a_waiter_that_registered_during_the_handoff(world):
    """The owner hands over to H; before H's next poll reads the handoff, C registers as the
    waiter. The record H takes already names C, and H's renewals, which write against that very
    generation, would never meet C: before, H heard of C only at its first waiter check, a full
    check interval later (30 s here). Now that check runs at once, after acquire() has returned
    (receivers never run inside acquire(): the caller has not loaded its state yet)."""
    owner = world.lock("O", ttl=10.0)
    heir = world.lock("H", ttl=10.0, waiter_check_interval=30.0)
    asked: list[str] = []
    assert owner.acquire()

    def hand_over(sender, **kw):
        sender.release()
        record = world.record()
        assert record.owner_id == "H"  # handed over; H has not read it yet
        world.store.write(KEY, record.replace(nonce="c", waiting_owner_id="C", waiter_expires_at=world.clock.time() + 5).encode(),
                          if_generation_match=world.generation())

    heir_asked = lambda sender, waiter_id=None, **kw: asked.append(waiter_id)  # noqa: E731
    with signals.on_release_requested.connected_to(hand_over, sender=owner), \
            signals.on_release_requested.connected_to(heir_asked, sender=heir):
        assert heir.acquire(timeout=30)
        assert asked == [], "a receiver ran inside acquire()"
        world.sched.run_pending()  # the scheduler's next pass, no time passing
        assert heir.release_requested and asked == ["C"], "the heir did not hear of the waiter in the record it took"


def test_a_lease_counts_from_the_send_of_the_write_that_landed_after_a_503_and_a_429(world):
    store = TimedStore("lease-503-429", world.clock)
    world.store = store
    store.faults.fail_next("write", key=KEY)  # 503
    store.faults.fail_next("write", key=KEY, exc=lambda: TransientStorageError(
        "429: slow down", status=429, ambiguous=False, retry_after=3.0))
    a = world.lock("A", ttl=4.0, renew_interval=0.5, renew_deadline=2.0)
    started = world.clock.monotonic()
    assert a.acquire(timeout=30)
    sent = store.write_times[-1]
    assert sent - started >= 3.0, "the retries took their time"
    assert a.healthy, "the lease was counted from before the retries"
    # The record's lease runs ttl from the send, and the owner counts renew_deadline from it.
    assert abs(world.record().expires_at - (world.clock.time() - (world.clock.monotonic() - sent) + 4.0)) < 1e-6
    assert abs(a._lease.valid_until - (sent + 2.0)) < 1e-6  # private: how long the owner counts itself safe


def test_a_lease_that_waited_for_the_write_gate_counts_from_its_send(world):
    store = TimedStore("lease-gate", world.clock)
    world.store = store
    a = world.lock("A", ttl=5.0, min_write_interval=GCS_SPACING)
    b = world.lock("B", ttl=5.0, min_write_interval=GCS_SPACING)
    assert a.acquire()
    a.release()  # two writes in a moment: the bucket is empty
    assert b.acquire(timeout=10)
    sent = store.write_times[-1]
    assert sent > store.write_times[-2], "B's write waited for the gate"
    assert abs(b._lease.valid_until - (sent + b.renew_deadline)) < 1e-6  # private: as above


# --------------------------------------------------------------------------- the gate


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


def test_a_renewal_that_finds_the_gate_closed_defers_without_holding_the_lock(world):
    # ttl 20: the renewal has room (renew_deadline - renew_interval = 7.5 s) to wait out the 3 s
    # a 429 asked for; at the shortest ttl it would go at the store's own spacing (issue 25).
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
    store = TimedStore("renew-412", world.clock)
    world.store = store
    a = world.lock("A", ttl=5.0, min_write_interval=GCS_SPACING)
    assert a.acquire()
    for _ in range(3):  # a waiter that registers, leaves and registers again, between renewals
        record = world.record()
        store.write(KEY, record.replace(nonce=f"w{_}", waiting_owner_id="W", waiter_expires_at=world.clock.time() + 5).encode(),
                    if_generation_match=world.generation())
        world.clock.advance(a.renew_interval)
        world.sched.run_pending()
        assert a.healthy and world.record().nonce != f"w{_}", "the renewal did not land"


# --------------------------------------------------------------------------- configuration


def test_a_ttl_the_stores_spacing_cannot_serve_is_refused_naming_the_minimum():
    store = MemoryStorage("ttl-floor")
    with pytest.raises(ConfigurationError, match="at least 5 s"):
        HandoffLock("memory://x", storage=store, key=KEY, ttl=4.0, min_write_interval=GCS_SPACING)
    HandoffLock("memory://x", storage=store, key=KEY, ttl=5.0, min_write_interval=GCS_SPACING)
    with pytest.raises(ConfigurationError, match="renew_interval"):
        HandoffLock("memory://x", storage=store, key=KEY, ttl=10.0, renew_interval=0.5, min_write_interval=GCS_SPACING)


@pytest.mark.gcs
def test_gcs_default_pacing_refuses_a_ttl_it_cannot_serve(gcs_emulator):
    with pytest.raises(ConfigurationError, match="at least 5 s"):
        HandoffLock("gs://handofflock-test/locks/short.json", ttl=4.0)
    lock = HandoffLock("gs://handofflock-test/locks/five.json", ttl=5.0)
    assert lock.min_write_interval == 1.0 and lock.renew_interval == 1.0 and lock.renew_deadline == 2.5


def test_a_configuration_error_names_what_the_user_set():
    store = MemoryStorage("ttl-names")
    with pytest.raises(ConfigurationError) as info:
        HandoffLock("memory://x", storage=store, key=KEY, ttl=0.1)
    # The user set ttl alone: the error is about ttl, not about waiter_ttl, which they never set (issue 17).
    assert str(info.value).startswith("ttl=0.1 is too short") and "waiter_ttl =" not in str(info.value)


# --------------------------------------------------------------------------- receivers off the renewal path


@pytest.mark.timeout(60)
def test_a_slow_receiver_never_delays_a_renewal():
    store = MemoryStorage(f"slow-receiver-{time.monotonic_ns()}")
    kw = dict(storage=store, key=KEY, ttl=1.5, renew_interval=0.2, renew_deadline=0.8, waiter_check_interval=0.05,
              waiter_poll_interval=0.05, waiter_ttl=2.0)
    owner = HandoffLock("memory://x", owner_id="O", **kw)
    waiter = HandoffLock("memory://x", owner_id="W", **kw)
    assert owner.acquire()
    receiving = threading.Event()
    healthy: list[bool] = []

    def checkpoint(sender, **kw):  # a checkpoint that takes four renew deadlines
        receiving.set()
        for _ in range(32):
            time.sleep(0.1)
            healthy.append(sender.healthy)

    signals.on_release_requested.connect(checkpoint, sender=owner, weak=False)
    try:
        t = threading.Thread(target=lambda: waiter.acquire(timeout=30))
        t.start()
        assert receiving.wait(10)
        first = LockRecord_expires(store)
        time.sleep(2.0)
        assert LockRecord_expires(store) > first + 1.0, "no renewal while the receiver ran"
        assert owner.healthy
        while t.is_alive() and len(healthy) < 32:
            time.sleep(0.05)
        assert all(healthy), "the owner was unhealthy while its receiver ran"
        owner.release()
        t.join(10)
        assert waiter.is_held
    finally:
        signals.on_release_requested.disconnect(checkpoint, sender=owner)
        waiter._unschedule()  # private: stop its renewals without releasing
        owner._unschedule()  # private: stop its renewals without releasing


def LockRecord_expires(store: MemoryStorage) -> float:
    from handofflock import LockRecord

    return LockRecord.decode(store.read(KEY)[0]).expires_at


@pytest.mark.timeout(60)
def test_exit_does_not_wait_for_a_receiver(tmp_path):
    script = textwrap.dedent(f"""
        import time
        from handofflock import HandoffLock, signals
        lock = HandoffLock({str(tmp_path / 'lock.json')!r}, ttl=2.0, renew_interval=0.2, renew_deadline=1.0)
        lock.acquire()
        signals.on_release_requested.connect(lambda s, **kw: time.sleep(60), sender=lock, weak=False)
        lock.request_release("manual")
        time.sleep(0.8)  # the receiver is running
        print("exiting", flush=True)
    """)
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=50)
    assert proc.returncode == 0, proc.stderr
    assert "exiting" in proc.stdout
    assert time.monotonic() - started < 30, "interpreter exit waited for the receiver"
