"""acquire(): taking a free or expired lock, waiting in the waiter slot, and every way out of a wait.

Races between acquirers, the slot and its timeout, patient and prioritised waits, re-entry and
threads, the proxy it returns, and the slot given back on a timeout, an exception or a cancel.
Most run on simulated time (the ``sim`` and ``world`` fixtures of tests/support/simworld.py).
"""

from __future__ import annotations

import contextlib
import copy
import gc
import logging
import math
import pickle
import re
import threading
import uuid

import pytest
from lockparts import PACED as TIMING
from jobsutil import in_process
from lockparts import held, lock_for, waiter_is
from lockutil import FAST, eventually, make_lock, raw_read, url_for
from simworld import KEY  # the world fixture is in conftest.py

from handofflock import (
    AcquireCancelled,
    AlreadyAcquired,
    ConfigurationError,
    HandoffLock,
    HandoffLockError,
    LockContended,
    LockLost,
    LockRecord,
    LockTimeout,
    PreconditionFailed,
    StorageError,
    TokensExhausted,
    TransientStorageError,
    signals,
)
from handofflock.core import protocol
from handofflock.core.errors import StorageTimeout
from handofflock.core.protocol import Me, Write
from handofflock.core.record import MAX_TOKEN, Holder, Waiter, WaiterRequest
from handofflock.core.timing import MIN_REQUEST_TIME, Timing
from handofflock.fencing import FencedObject, StaleToken
from handofflock.lock import Acquired
from handofflock.storage import MemoryStorage

GCS_SPACING = 1.0  # GCS's default write spacing, given to the memory store where a test says so


def _owner_and_waiter(world):
    a = world.lock("A", ttl=10.0)
    assert a.acquire(timeout=5)
    b = world.lock("B", ttl=10.0, frozen=True)
    return a, b


def _record(store, key):
    found = store.read(key)
    return None if found is None else LockRecord.decode(found[0], key=key)


def _403() -> StorageError:
    return StorageError("injected: 403 permission denied")


def flaky(name, clock):
    """A memory store that refuses every read until a (simulated) time: a store down across an acquire's deadline.

    Set ``store.refuse_reads_until`` to take it down."""
    store = MemoryStorage(name)
    store.refuse_reads_until = -math.inf

    def refuse(op, key):
        if clock.monotonic() < store.refuse_reads_until:
            raise TransientStorageError("injected: 503 while the store is down", status=503, ambiguous=False)

    store.faults.before("read", refuse)
    return store

YEARS = 31 * 365 * 86400.0

OWNER, WAITER = "pod=ml/train-0 pid=1", "pod=ml/train-1 pid=1"

OWNER, WAITER = "pod=ml/train-0 pid=1", "pod=ml/train-1 pid=1"


def race(sim, fns):
    """Start every call at the same simulated instant; the seed picks who runs first. Results or exceptions."""
    calls = [sim.start(fn) for fn in fns]
    sim.run_until(lambda: all(calls), limit=30)
    return [c.error if c.error is not None else c.result for c in calls]


def _acquire_outcome(lock: HandoffLock) -> str:
    try:
        lock.acquire(timeout=20)
        return "acquired"
    except AcquireCancelled:
        return "cancelled"
    except Exception as exc:  # noqa: BLE001 - reported by the assertion
        return repr(exc)


NOW = 1_700_000_000.0

DECIDING = Timing.build(ttl=60.0, waiter_ttl=30.0, max_clock_skew=2.0)

GEN = 42

PATIENT = WaiterRequest(asks=False)


@pytest.fixture
def url():
    return f"memory://small-{uuid.uuid4().hex[:8]}/l.json"


@pytest.mark.parametrize("how", [copy.copy, copy.deepcopy, pickle.dumps])
def test_a_held_lock_cannot_be_copied_and_stays_held(how):
    lock = HandoffLock("memory://one-party/l.json", owner_id="a", ttl=10.0)
    try:
        assert lock.acquire()
        with pytest.raises(TypeError, match="cannot be copied or pickled"):
            how(lock)
        gc.collect()
        assert lock.is_held and lock.status().owner_id == "a"
        other = HandoffLock("memory://one-party/l.json", owner_id="b", ttl=10.0)
        assert other.acquire(blocking=False) is False
    finally:
        lock.release()
        MemoryStorage.forget("one-party")


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


def test_a_give_back_whose_retry_finds_no_time_left_leaves_its_next_round_the_stores_own_spacing(world):
    """A spacing earlier 429s widened holds the give-back's first write to just before its last second; the
    store refuses it (a 429), and its retry's spacing runs out half a millisecond before the budget, too late
    to send in. That retry sends nothing, so it spends no write of the gate: the next round's read and write
    go at the store's own spacing after the write that was refused, and the slot is given back. A slot spent
    for the retry held that write a spacing past its round, which gave up with the store answering all along
    and left the slot behind (sim seed 79571)."""
    a = world.lock("A", ttl=30.0, min_write_interval=GCS_SPACING, frozen=True)
    assert a.acquire()
    b = world.lock("B", ttl=30.0, min_write_interval=GCS_SPACING)
    timeout = 3.0
    gives_up = world.clock.monotonic() + timeout  # when b's acquire gives up and its give-back begins
    gate, writes, widened = b._io.gate(), [], []  # private: the store's write gate, widened as 429s would

    def read(op, key):
        now = world.clock.monotonic()
        if now >= gives_up:
            world.clock.advance(0.003)  # the give-back's reads take a round trip
        elif now >= gives_up - 1.0 and not widened:  # the last poll: earlier 429s widen the spacing
            widened.append(now)
            gate.ready_in(now)  # the bucket brought up to now, then emptied and slowed by the 429s
            # the give-back's first read ends, and its write goes, 0.5 ms before the round's send_by (its last second)
            gate.throttled(retry_after=gives_up + b.give_up_budget - MIN_REQUEST_TIME - 0.0035 - now)

    def write(op, key):
        if world.clock.monotonic() >= gives_up:
            writes.append(world.clock.monotonic())
            if len(writes) == 1:
                raise TransientStorageError("injected: 429", status=429, ambiguous=False)

    world.store.faults.before("read", read)
    world.store.faults.before("write", write)
    with pytest.raises(LockTimeout):
        b.acquire(timeout=timeout, request_release=False)
    world.store.faults.clear()
    assert widened and len(writes) == 2, writes
    last_second = gives_up + b.give_up_budget - MIN_REQUEST_TIME
    assert last_second - 0.001 < writes[0] < last_second, "the first write went outside the ms before the last second"
    assert writes[1] - writes[0] <= GCS_SPACING + 0.01, "the last round's write was held past the store's own spacing"
    assert world.record().waiting_owner_id is None, "the slot was left behind while the store answered"
    a.release()


def test_a_take_cut_off_at_the_timeout_that_landed_is_given_back_before_lock_timeout(world):
    b = world.lock("B", ttl=10.0, frozen=True)

    def landed_late(op, key, result):
        world.store.faults.clear()
        world.clock.advance(2.0)  # the store applied the take; its reply came after the caller's timeout
        raise StorageTimeout("injected: cut off at the deadline", ambiguous=True)

    world.store.faults.after("write", landed_late)
    try:
        got = bool(b.acquire(timeout=1.0))  # the give-up's read finds the take landed: kept, as a handoff is
    except LockTimeout:
        got = False
    record = world.record()
    named = record is not None and record.owner_id == "B"
    # Never held on record by an acquire that says it did not get it; kept only as a hold the lock has.
    assert named == got == b.is_held, (got, b.is_held, record)
    if got:
        b.release()


def test_a_timeout_whose_give_back_the_store_refuses_is_still_a_lock_timeout(world):
    """B waits in the slot; its poll is cut off at the deadline (no answer: its time ran out in the store, a
    LockTimeout), and the store then refuses the slot's give-back with 429s. That refusal is the way out's own
    failure, logged as at every way out: the caller's ``except LockTimeout`` must still catch the acquire."""
    a = world.lock("A", ttl=10.0, frozen=True)
    assert a.acquire()
    b = world.lock("B", ttl=10.0)
    reads: list[float] = []
    registered: list[bool] = []

    def poll_cut_off_at_the_deadline(op, key):
        if registered and not reads:  # B's first poll in the slot
            reads.append(world.clock.monotonic())
            world.clock.advance(30.0)
            raise StorageTimeout("injected: cut off at the deadline, no answer", ambiguous=False)

    def refused(op, key):
        if reads:
            raise TransientStorageError("injected: 429", status=429, ambiguous=False, retry_after=30.0)

    world.store.faults.before("read", poll_cut_off_at_the_deadline)
    world.store.faults.before("write", refused)
    world.store.faults.after("write", lambda op, key, result: registered.append(True))  # B's registration
    try:
        with pytest.raises(LockTimeout) as caught:
            b.acquire(timeout=20.0, request_release=False)
    finally:
        world.store.faults.clear()
    assert reads, "the poll was never cut off"
    assert isinstance(caught.value.__cause__, StorageTimeout)
    assert caught.value.owner_id == "A", caught.value  # who held it, as every LockTimeout says
    assert world.record().waiting_owner_id == "B"  # left behind: it expires by itself within waiter_ttl


def test_a_ctrl_c_as_the_take_lands_frees_the_lock(world):
    b = world.lock("B", ttl=10.0, frozen=True)

    def interrupt(op, key, result):
        world.store.faults.clear()
        raise KeyboardInterrupt  # the store applied the take; acquire() never sees the reply

    world.store.faults.after("write", interrupt)
    with pytest.raises(KeyboardInterrupt):
        b.acquire(timeout=30)
    record = world.record()
    assert not b.is_held
    assert record is None or record.owner_id != "B", "an interrupted acquire left the lock held by B on record"


@pytest.mark.parametrize("then", ["429", "403"])
def test_a_take_cut_off_then_refused_on_its_retry_cannot_land_after_the_acquire_left(world, monkeypatch, then):
    """The take is cut off at its request timeout with no answer (the store may still apply it), and its
    retry is answered with a refusal. The refusal speaks for its own attempt only: when the acquire
    leaves, the first attempt must not be able to land and hold the lock for an instance that is gone."""
    b = world.lock("B", ttl=10.0, frozen=True)
    real = MemoryStorage.write
    cut: list[tuple] = []

    def write(self, key, data, *, if_generation_match, timeout=None):
        if b'"B"' not in data:  # not the take (the give-up's write): as the store does
            return real(self, key, data, if_generation_match=if_generation_match, timeout=timeout)
        if not cut:
            cut.append((key, data, if_generation_match))
            raise StorageTimeout("injected: cut off at the request timeout, no answer", ambiguous=True)
        if then == "429":
            raise TransientStorageError("injected: 429", status=429, ambiguous=False)
        raise _403()

    monkeypatch.setattr(MemoryStorage, "write", write)
    with pytest.raises((LockTimeout, StorageError)):
        b.acquire(timeout=2.0)
    monkeypatch.setattr(MemoryStorage, "write", real)
    key, data, generation = cut[0]
    with contextlib.suppress(PreconditionFailed):  # the store applies the first attempt now, late
        world.store.write(key, data, if_generation_match=generation)
    record = world.record()
    assert not b.is_held
    assert record is None or record.owner_id != "B", f"a take landed after the acquire left: {record}"


def test_a_registration_cut_off_then_a_take_refused_at_its_generation_cannot_land_after_the_acquire_left(
    world, monkeypatch
):
    """B's registration is cut off at its request timeout with no answer (the store may still apply it).
    Its retry finds it stale as it is sent (the owner's lease ended meanwhile), so B decides again on the
    same generation: a take, which the store refuses before applying anything. That refusal speaks for
    the take only: when the acquire leaves, the registration must not be able to land and leave a slot
    for an instance that is gone."""
    a = world.lock("A", ttl=2.0, frozen=True)  # never renews: its lease ends while the registration is out
    assert a.acquire(timeout=5)
    b = world.lock("B", ttl=10.0, frozen=True)
    real = MemoryStorage.write
    cut: list[tuple] = []

    def write(self, key, data, *, if_generation_match, timeout=None):
        record = LockRecord.decode(data, key=key)
        if record.waiting_owner_id == "B" and not cut:  # the registration
            cut.append((key, data, if_generation_match))
            world.clock.advance(a.timing.ttl + a.timing.max_clock_skew)  # no answer until A's lease has ended
            raise StorageTimeout("injected: cut off at the request timeout, no answer", ambiguous=True)
        if record.owner_id == "B":  # the take, at the generation the registration was sent on
            raise TransientStorageError("injected: 503, nothing applied", status=503, ambiguous=False)
        return real(self, key, data, if_generation_match=if_generation_match, timeout=timeout)

    monkeypatch.setattr(MemoryStorage, "write", write)
    with pytest.raises((LockTimeout, StorageError)):
        b.acquire(timeout=30.0)
    monkeypatch.setattr(MemoryStorage, "write", real)
    key, data, generation = cut[0]
    with contextlib.suppress(PreconditionFailed):  # the store applies the registration now, late
        world.store.write(key, data, if_generation_match=generation)
    record = world.record()
    assert not b.is_held
    assert record.waiting_owner_id != "B", f"a registration landed after the acquire left: {record}"


def test_a_second_ctrl_c_during_the_release_of_an_interrupted_take_still_frees_the_lock(world):
    """A Ctrl-C as the take lands, and another as the acquire's way out releases what it took (a user
    pressing Ctrl-C twice): the release goes on in the background, as after a store error, instead of
    leaving the lock on record under an idle instance until its lease runs out (ttl + skew)."""
    b = world.lock("B", ttl=10.0)
    presses = []

    def first(op, key, result):
        world.store.faults.clear()
        world.store.faults.before("write", second)
        presses.append("take")
        raise KeyboardInterrupt  # the store applied the take; acquire() never sees the reply

    def second(op, key):
        world.store.faults.clear()
        presses.append("release")
        raise KeyboardInterrupt  # the release write, before it is sent

    world.store.faults.after("write", first)
    with pytest.raises(KeyboardInterrupt):
        b.acquire(timeout=30)
    assert presses == ["take", "release"]
    assert world.record().owner_instance == b.instance  # the take landed, its release did not
    world.clock.run_for(3.0)  # well inside the lease (10 s): the background duties run
    record = world.record()
    assert record.owner_id is None, f"the lock stays held on record by an idle instance: {record}"
    assert not b.is_held


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
        store = flaky(world.store.name + "-flaky", world.clock)
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


@pytest.mark.timeout(60)
def test_two_live_instances_with_one_owner_id_wait_for_each_other_as_any_two_parties(sim):
    """X waits; a second instance with the same stable owner id (a restart whose predecessor still lives,
    or a second job that derived the same id) starts a blocking acquire. It is another party: it waits
    for X's slot, then for X's hold, and gets the lock when X releases, never by taking it.

    (An earlier version let the newer instance reclaim the slot and the first defer with LockContended;
    the first, alive and waiting, lost its place to a job it could not tell from itself.)"""
    kw = dict(ttl=3.0, waiter_poll_interval=0.05, waiter_check_interval=0.05, min_hold=0)
    owner = sim.lock("O", **kw)
    first, twin = sim.lock("X", **kw), sim.lock("X", **kw)
    assert sim.call(owner.acquire)
    boxes: dict[str, dict[str, object]] = {"first": {}, "twin": {}}

    def run(name, lock):
        try:
            boxes[name]["value"] = lock.acquire(timeout=20)
        except BaseException as exc:  # handed to the test
            boxes[name]["error"] = exc

    t1 = sim.start(lambda: run("first", first))
    sim.run_until(lambda: owner.release_requested, limit=10)
    t2 = sim.start(lambda: run("twin", twin))
    sim.run_for(0.3)  # the twin has read the record naming X (the first instance) as the waiter
    assert sim.record().waiter_instance == first.instance, "the twin left the first's live slot alone"
    assert sim.call(owner.release) == "X"
    sim.run_until(lambda: t1.done, limit=10)
    assert first.is_held and bool(boxes["first"].get("value")), boxes
    held_by_first = sim.record().token
    for _ in range(20):  # the twin waits (its slot, its request) while the first holds and renews
        sim.run_for(0.25)
        assert not (first.healthy and twin.healthy), f"both hold the lock, tokens {first.token} and {twin.token}"
        assert first.healthy and not t2.done, boxes
    assert sim.record().waiter_instance == twin.instance and first.release_requested
    assert sim.call(first.release) == "X"  # handed to the twin, the waiter under the same id
    sim.run_until(lambda: t2.done, limit=10)
    assert twin.is_held and bool(boxes["twin"].get("value")), boxes
    assert twin.token > held_by_first and not first.is_held
    assert sim.record().owner_instance == twin.instance


def test_a_second_instance_with_the_same_owner_id_never_takes_the_live_ones_lock(world):
    """Two steps of one Slurm allocation, or two launches with one --rdzv-id: one owner id, two live jobs.
    The second times out as a waiter behind the first's live, renewed lease; the first stays healthy.
    (An earlier version retook the lock at once with a new token, and the first got LockLost mid-job.)"""
    first, twin = world.lock("slurm:812345"), world.lock("slurm:812345")
    assert first.acquire()
    token = first.token
    with pytest.raises(LockTimeout, match="a live lease its holder renews while it runs"):
        twin.acquire(timeout=5)
    world.clock.run_for(first.waiter_check_interval * 3)  # the first's checks read the record
    first.check()
    assert first.healthy and first.token == token and not twin.is_held
    assert world.record().owner_instance == first.instance and world.record().token == token
    fence = FencedObject(world.store, "locks/journal.json", writer_id="slurm:812345", clock=world.clock)
    fence.write({"by": "first"}, token=first.token)
    # Released (as a job does at exit, SIGTERM included), the lock is the next instance's at once.
    first.release()
    assert twin.acquire(blocking=False)
    assert twin.token > token
    fence.write({"by": "twin"}, token=twin.token)
    with pytest.raises(StaleToken):  # the token still rises across incarnations: the first is fenced out
        fence.write({"by": "first"}, token=token)


def test_a_restart_gets_its_dead_predecessors_lock_once_the_lease_runs_out(world):
    """The predecessor was killed holding the lock (no release, no renewals): the restart under the same id
    waits for its lease like anyone, ttl + max_clock_skew after its last renewal (62 s at the defaults),
    then takes it with a higher token. A paused process cannot be told from a dead one."""
    dead = world.lock("job-7", frozen=True)  # its renewals never run again: killed right after acquiring
    assert dead.acquire()
    last_renewal, token = world.clock.time(), dead.token
    restart = world.lock("job-7")
    assert restart.acquire(timeout=120)
    waited = world.clock.time() - last_renewal
    timing = restart.timing
    assert timing.ttl + timing.max_clock_skew < waited <= timing.ttl + timing.max_clock_skew + 2 * timing.waiter_poll_interval
    assert restart.token > token and world.record().owner_instance == restart.instance


def test_a_timeout_of_nan_is_refused(world):
    with pytest.raises(ConfigurationError):
        world.lock("A").acquire(timeout=math.nan)


def test_a_cancel_while_no_acquire_runs_cancels_nothing(world):
    # A stray cancel() must not cancel the next acquire, even of a free lock.
    a = world.lock("A")
    a.cancel()
    assert a.acquire(timeout=5), "a cancel applies only to an acquire that runs"
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
    store.write(KEY, LockRecord(token=MAX_TOKEN, nonce="m").encode(), if_generation_match=0)
    with pytest.raises(TokensExhausted):
        world.lock("A").acquire(timeout=5)
    assert world.record().token == MAX_TOKEN and world.record().owner_id is None


@pytest.mark.parametrize("pacing", [0.0, 1.0], ids=["unpaced", "gcs-pacing"])
def test_a_lease_31_years_ahead_is_taken_once_its_ttl_and_the_skew_have_passed(sim, pacing, caplog):
    record = LockRecord(Holder("ghost", sim.time() + YEARS), ttl=3.0, token=5, nonce="n")
    sim.store.write(KEY, record.encode(), if_generation_match=0)
    lock = sim.lock("taker", ttl=5.0, min_write_interval=pacing)  # skew allowance 2 s
    started = sim.monotonic()
    with caplog.at_level(logging.WARNING, logger="handofflock.acquire"):
        assert sim.call(lambda: lock.acquire(timeout=30))
    took = sim.monotonic() - started
    assert 3.0 + 2.0 - 0.5 <= took < 15, took  # the record's ttl plus the skew, from the first read
    record = sim.record()
    assert record.owner_id == lock.owner_id and record.token > 5
    assert record.expires_at < sim.time() + 5.0 + 1  # our own lease, a normal one
    assert any("further ahead than its ttl" in r.getMessage() for r in caplog.records), caplog.text


def test_lock_contended_names_the_owner_and_the_waiter_by_label_and_id(sim):
    owner = sim.lock("O", label=OWNER)
    waiter = sim.lock("W", label=WAITER, waiter_ttl=60)
    third = sim.lock("T", wait_for_slot=False)  # raises at once instead of waiting its turn
    assert sim.call(owner.acquire)
    sim.start(lambda: waiter.acquire(timeout=20))
    sim.run_until(lambda: sim.record().waiting_owner_id == "W", what="W registered as the waiter")
    with pytest.raises(LockContended) as info:
        sim.call(third.acquire)
    text = str(info.value)
    assert f"{OWNER} (O)" in text and f"{WAITER} (W)" in text, text
    assert (info.value.owner_label, info.value.waiter_label) == (OWNER, WAITER)


def test_lock_timeout_names_the_owner_by_label(request, tmp_path):
    url = url_for("local", request, tmp_path)
    owner = HandoffLock(url, owner_id="O", label=OWNER)
    assert owner.acquire()
    try:
        with pytest.raises(LockTimeout) as info:
            HandoffLock(url, owner_id="W").acquire(timeout=0.2)
        assert f"held by {OWNER} (O)" in str(info.value), str(info.value)
    finally:
        owner.release()


def test_run_nonblock_names_the_holder_by_label(request, tmp_path, capsys):
    url = url_for("local", request, tmp_path)
    owner = HandoffLock(url, owner_id="O", label=OWNER)
    assert owner.acquire()
    try:
        # -v: a plain --nonblock is silent on contention, as flock -n (tests/runner/test_cli.py).
        done = in_process(["run", "--nonblock", "-v", url, "--", "true"], capsys)
        assert done.returncode == 75, done.stderr
        assert f"held by {OWNER} (O)" in done.stderr, done.stderr
    finally:
        owner.release()


def test_two_would_be_waiters_get_one_slot_and_each_waits_for_it_up_to_its_timeout(sim):
    # A timeout promises a wait up to it, for the slot too (an acquire without
    # one is refused at once: test_with_a_timeout_an_acquire_waits_for_the_slot_and_without_one_says_how_to).
    owner = sim.lock("owner", **FAST)
    assert sim.call(owner.acquire)
    b, c = sim.lock("b", **FAST), sim.lock("c", **FAST)
    results = race(sim, [lambda: b.acquire(timeout=1.0), lambda: c.acquire(timeout=1.0)])
    assert all(isinstance(r, LockTimeout) for r in results), results
    assert all(r.owner_id == owner.owner_id and owner.owner_id in str(r) for r in results)
    # The waiter that timed out gave its slot back.
    record, _ = sim.read()
    assert record.owner_id == owner.owner_id and record.waiting_owner_id is None


def test_two_contenders_reclaiming_an_expired_lease_exactly_one_wins(sim):
    dead = sim.lock("dead", paused=True, **FAST)
    assert sim.call(dead.acquire)
    sim.run_for(FAST["ttl"] + FAST["max_clock_skew"] + 0.2)
    b, c = sim.lock("b", **FAST), sim.lock("c", **FAST)
    results = race(sim, [lambda: b.acquire(blocking=False), lambda: c.acquire(blocking=False)])
    assert sorted(map(bool, results)) == [False, True], results
    winner = b if results[0] else c
    record, _ = sim.read()
    assert record.owner_id == winner.owner_id and winner.token > dead.token


def test_a_stable_owner_id_waits_for_its_stopped_predecessors_lease_then_takes_it_with_a_new_token(sim):
    # An earlier version retook the lock at once under the same id; the predecessor may be alive (paused,
    # or a second job that derived the id), so the restart waits for its lease, as for anyone's.
    old = sim.lock("trainer-7", paused=True, **FAST)
    assert sim.call(old.acquire)
    restarted = sim.lock("trainer-7", **FAST)
    assert not sim.call(lambda: restarted.acquire(blocking=False))  # the lease is live: not taken
    assert sim.record().owner_instance == old.instance
    timing = restarted.timing
    started = sim.monotonic()
    assert sim.call(lambda: restarted.acquire(timeout=timing.ttl + timing.max_clock_skew + 30))
    assert sim.monotonic() - started > timing.renew_deadline  # not at once: the lease had to run out
    assert restarted.token > old.token
    with pytest.raises(LockLost):
        sim.call(old.release)  # the old incarnation's lock is another instance's now: it writes nothing
    assert sim.record().token == restarted.token


def test_a_third_process_never_takes_the_lock_from_a_live_waiter(sim):
    now = sim.time()
    seeded = LockRecord(Holder("dead-owner", now - 100), Waiter("live-waiter", now + 30), ttl=1.5, token=5, nonce="seed")
    gen = sim.store.write(KEY, seeded.encode(), if_generation_match=0)
    third = sim.lock("third", **FAST)
    assert sim.call(lambda: third.acquire(blocking=False)) is False
    with pytest.raises(LockContended) as info:
        sim.call(lambda: third.acquire(timeout=0.3))
    assert info.value.waiter_id == "live-waiter"
    patient = sim.lock("patient", wait_for_slot=True, **FAST)
    with pytest.raises(LockTimeout):
        sim.call(lambda: patient.acquire(timeout=0.5))
    assert sim.read() == (seeded, gen)


def test_a_waiter_that_gives_up_frees_the_slot_for_the_next(sim):
    owner = sim.lock("owner", **FAST)
    assert sim.call(owner.acquire)
    quitter = sim.lock("quitter", **FAST)
    with pytest.raises(LockTimeout) as info:
        sim.call(lambda: quitter.acquire(timeout=0.5))
    assert isinstance(info.value, TimeoutError)
    record, _ = sim.read()
    assert record.owner_id == owner.owner_id and record.waiting_owner_id is None
    nxt = sim.lock("next", **FAST)
    t = sim.start(lambda: nxt.acquire(timeout=5))
    sim.run_until(lambda: sim.record().waiting_owner_id == nxt.owner_id, what="the next waiter registering")
    sim.call(owner.release)
    sim.run_until(lambda: t.done, limit=5)
    assert nxt.is_held


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


def test_an_asking_request_takes_the_slot_from_a_patient_one_which_waits_on(sim):
    a, p, q = lock_for(sim, "a"), lock_for(sim, "p"), lock_for(sim, "q")
    assert sim.call(a.acquire)
    bp = sim.start(lambda: p.acquire(request_release=False, timeout=60))
    sim.run_until(waiter_is(sim, "p"), what="p registered")
    bq = sim.start(lambda: q.acquire(timeout=60))
    sim.run_until(lambda: waiter_is(sim, "q")() or bq, what="q took the slot")
    assert not bq, bq
    sim.run_until(lambda: a.release_requested, what="the holder was asked by q")
    assert a.release_request.requester == "q"
    assert sim.call(a.release) == "q"
    sim.run_until(lambda: bq.done)
    assert isinstance(bq.result, Acquired)
    sim.run_until(waiter_is(sim, "p"), what="p waits again, now for q")
    assert not q.release_requested  # p is patient with q too
    sim.call(q.release)
    sim.run_until(lambda: bp.done)
    assert isinstance(bp.result, Acquired), bp


def test_with_a_timeout_an_acquire_waits_for_the_slot_and_with_wait_for_slot_false_says_how_to(sim):
    a, w, c = lock_for(sim, "a"), lock_for(sim, "w"), lock_for(sim, "c", wait_for_slot=False)
    assert sim.call(a.acquire)
    w_call = sim.start(lambda: w.acquire(timeout=60))
    sim.run_until(waiter_is(sim, "w"), what="w registered")
    started = sim.monotonic()
    with pytest.raises(LockContended) as now:
        sim.call(c.acquire)
    assert not isinstance(now.value, LockTimeout) and sim.monotonic() - started < 3
    message = str(now.value)
    assert "wait_for_slot=True" in message and "--wait-for-slot" in message and "timeout" in message
    assert "(+" not in message and "until" not in message, message  # no expiry of a lease that is renewed
    started = sim.monotonic()
    with pytest.raises(LockTimeout) as late:
        sim.call(lambda: c.acquire(timeout=1.5))
    assert sim.monotonic() - started >= 1.5, "a timeout is a promise to wait up to it"
    # Parties are named by label with the id in brackets, as status names them.
    text = str(late.value)
    assert "(c)" not in text and f"slot is {w.label.text} (w)'s" in text, text
    w.cancel()
    sim.run_until(lambda: w_call.done)


def test_a_timed_out_waiter_is_not_named_as_someone_else_waiting(sim):
    a, b = lock_for(sim, "a"), lock_for(sim, "b")
    assert sim.call(a.acquire)
    with pytest.raises(LockTimeout) as info:
        sim.call(lambda: b.acquire(timeout=1.0))
    message = str(info.value)
    # Not "...; waiter 'b'", the caller itself: it says the slot was ours (or, where the store's
    # pacing kept our registration from landing within the second, that nobody else waits).
    assert "(b)" not in message, message  # named by label, with the id in brackets
    assert "we held the waiter slot" in message or "nobody else waits" in message, message


def test_a_stray_cancel_does_not_spoil_the_next_acquire(sim):
    a = lock_for(sim, "a")
    a.cancel()
    assert sim.call(lambda: a.acquire(timeout=5))
    sim.call(a.release)
    a.cancel()  # while nothing runs, again
    assert sim.call(a.acquire)


@pytest.mark.parametrize(
    "kwargs,says",
    [
        (dict(timeout="1"), "timeout must be a number"),
        (dict(timeout=True), "timeout must be a number"),
        (dict(blocking=False, timeout=5), "blocking=False never waits"),
        (dict(request_release="no"), "request_release must be True or False"),
        (dict(priority=1.5), "priority must be an integer"),
    ],
)
def test_acquire_refuses_arguments_it_cannot_honour_before_any_io(kwargs, says):
    lock = HandoffLock("memory://never-read/x.json", **TIMING)
    with pytest.raises(ConfigurationError, match=says):
        lock.acquire(**kwargs)
    assert MemoryStorage.named("never-read").read("x.json") is None


def test_a_cancel_still_stops_a_running_acquire(sim):
    a, b = lock_for(sim, "a"), lock_for(sim, "b")
    assert sim.call(a.acquire)
    box = sim.start(lambda: b.acquire(request_release=False))
    sim.run_until(waiter_is(sim, "b"), what="b registered")
    b.cancel()
    sim.run_until(lambda: box.done)
    assert isinstance(box.error, AcquireCancelled)
    assert sim.record().waiting_owner_id is None


def test_a_cancel_stops_an_acquire_whose_write_waits_out_a_spacing_a_429_widened(sim):
    """A 429 on the registration widens the write spacing to 8 s; a cancel() while the retry waits it out ends
    the acquire within its give-up budget, with nothing more sent: not once the spacing lets the write go, then
    the give-up after it (sim seed 3910)."""
    a, b = lock_for(sim, "a", paused=True), lock_for(sim, "b")  # a never renews: every write is b's
    assert sim.call(a.acquire)
    writes = []

    def refuse_once(op, key):
        writes.append(sim.monotonic())
        if len(writes) == 1:
            raise TransientStorageError("injected: 429", status=429, ambiguous=False, retry_after=8.0)

    sim.store.faults.before("write", refuse_once)
    box = sim.start(lambda: b.acquire(request_release=False))
    sim.run_until(lambda: writes, what="b's registration refused")
    sim.run_for(2.0)  # past the retry's backoff: the retry waits out the widened spacing
    assert len(writes) == 1 and not box.done
    cancelled = sim.monotonic()
    b.cancel()
    sim.run_until(lambda: box.done, limit=30)
    assert isinstance(box.error, AcquireCancelled), box.error
    assert sim.monotonic() - cancelled <= b.give_up_budget, "the cancel waited for the write spacing"
    assert len(writes) == 1, "the registration went out after the cancel"
    assert sim.record().waiting_owner_id is None
    sim.store.faults.clear()


def test_a_waiter_displaced_by_a_higher_priority_waits_for_the_slot_again_without_a_timeout(sim):
    # design.md: "The displaced waiter sees the slot taken at its next poll and waits for it again".
    # A plain acquire() (asking, no timeout) that had registered must not turn the displacement into
    # LockContended halfway through its wait.
    o, w1, w2 = lock_for(sim, "o"), lock_for(sim, "w1"), lock_for(sim, "w2")
    assert sim.call(o.acquire)
    b1 = sim.start(w1.acquire)
    sim.run_until(waiter_is(sim, "w1"), what="w1 registered")
    b2 = sim.start(lambda: w2.acquire(priority=5, timeout=60))
    sim.run_until(lambda: waiter_is(sim, "w2")() or b2, what="w2 took the slot")
    assert not b2, b2
    sim.run_for(1.0)  # several of w1's polls with the slot taken
    assert not b1, f"the displaced waiter gave up: {b1}"
    assert sim.call(o.release) == "w2"
    sim.run_until(lambda: b2.done)
    assert isinstance(b2.result, Acquired)
    sim.run_until(lambda: waiter_is(sim, "w1")() or b1, what="w1 waits again, now for w2")
    assert not b1, b1
    sim.call(w2.release)
    sim.run_until(lambda: b1.done)
    assert isinstance(b1.result, Acquired) and w1.is_held, b1


def test_giving_up_the_slot_clears_the_request_and_the_decline():
    d = protocol.decide_give_up_wait(held(PATIENT, waiter="me", declined=True), GEN, me=Me("me", "iw"), now=NOW, timing=DECIDING, nonce="n")
    assert isinstance(d, Write) and d.record.waiter_request is None and not d.record.declined


@pytest.mark.parametrize("timeout", [float("nan"), -2.0, -0.5, float("-inf")])  # -1 is "no timeout"
def test_acquire_refuses_a_timeout_that_is_not_a_number_of_seconds(url, timeout):
    lock = HandoffLock(url)
    with pytest.raises(ConfigurationError, match="timeout must be >= 0"):
        lock.acquire(timeout=timeout)
    assert not lock.is_held


def test_lock_timeout_prints_an_iso_time_with_its_age_not_an_epoch(url):
    holder = make_lock(url, owner_id="holder", ttl=30.0, renew_interval=3.0, renew_deadline=15.0)
    holder.acquire()
    try:
        with pytest.raises(LockTimeout) as info:
            make_lock(url, owner_id="late", ttl=30.0, renew_interval=3.0, renew_deadline=15.0).acquire(timeout=0.2)
        message = str(info.value)
        # A live lease is renewed while its holder lives: its expiry says when the lock frees only if the
        # holder is gone (kill -9), and the message says so, as an ISO time with its age.
        assert "a live lease its holder renews while it runs" in message, message
        assert re.search(r"if the holder is gone, the lease runs out \S+Z \(in \d+\.\d s\)", message), message
        assert not re.search(r"\d{10}\.\d", message), "no raw epoch"
    finally:
        holder.release()


@pytest.mark.parametrize("backend", ["memory", "local"])
def test_threads_sharing_one_instance_are_told_at_once_to_use_one_instance_each(backend, request, tmp_path):
    url = url_for(backend, request, tmp_path)
    lock = HandoffLock(url)
    inside, leave = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def holder() -> None:
        with lock:
            inside.set()
            leave.wait(20)

    def other() -> None:
        try:
            with lock:
                pass
        except BaseException as exc:  # handed to the test
            errors.append(exc)

    first = threading.Thread(target=holder)
    first.start()
    assert inside.wait(20)
    others = [threading.Thread(target=other) for _ in range(2)]
    for t in others:
        t.start()
    for t in others:
        t.join(5)
    leave.set()
    first.join(20)
    assert len(errors) == 2 and all(isinstance(e, AlreadyAcquired) for e in errors), errors
    assert all(isinstance(e, HandoffLockError) and isinstance(e, RuntimeError) for e in errors)
    assert "give each thread its own HandoffLock" in str(errors[0]), str(errors[0])
    assert raw_read(url)[0].owner_id is None  # the holder's block released it; the others changed nothing


def test_a_nested_acquire_in_the_same_thread_is_refused_and_the_outer_hold_goes_on(request, tmp_path):
    url = url_for("local", request, tmp_path)
    lock = HandoffLock(url)
    with lock:
        token = lock.token
        with pytest.raises(AlreadyAcquired, match="not reentrant"):
            with lock:
                pass
        assert lock.is_held and lock.token == token and raw_read(url)[0].owner_id == lock.owner_id
    assert not lock.is_held and raw_read(url)[0].owner_id is None


def test_one_instance_per_thread_takes_turns(request, tmp_path):
    url = url_for("memory", request, tmp_path)
    turns: list[str] = []
    mutex = threading.Lock()

    def worker(name: str) -> None:
        own = HandoffLock(url, owner_id=name, wait_for_slot=True, **FAST)
        with own.acquire(timeout=30):
            with mutex:
                turns.append(name)

    threads = [threading.Thread(target=worker, args=(f"t{i}",)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(40)
    assert sorted(turns) == ["t0", "t1", "t2"]


# -- waiting your turn: a blocking acquire waits for the slot, and those outside it take it oldest first --


def test_three_parties_with_a_plain_with_block_all_get_the_lock_in_turn(sim):
    """``with HandoffLock(url):`` in three processes: the third finds the slot taken and waits its turn."""
    locks = [sim.lock(name, ttl=10.0, waiter_poll_interval=0.1, waiter_check_interval=0.2) for name in "ABC"]
    held: list[str] = []

    def job(lock):
        with lock:
            held.append(lock.owner_id)
            sim.sleep(1.0)

    calls = []
    for lock in locks:
        calls.append(sim.start(lambda lock=lock: job(lock)))
        sim.run_for(0.3)
    sim.run_until(lambda: all(c.done for c in calls), limit=120, what="all three finished")
    assert [c.error for c in calls] == [None, None, None]
    assert held == ["A", "B", "C"]


def test_n_waiters_outside_the_slot_are_served_oldest_first(sim):
    """Four waiters start one after another while the lock is held; the slot goes to the oldest each time,
    whichever of them polls first when it frees: they hold the lock in the order they began to wait."""
    kw = dict(ttl=10.0, waiter_poll_interval=0.1, waiter_check_interval=0.2)
    holder = sim.lock("H", **kw)
    assert sim.call(holder.acquire)
    order: list[str] = []

    def job(lock):
        with lock.acquire():
            order.append(lock.owner_id)
            sim.sleep(1.0)

    # Started youngest-polls-first: each later waiter's first read comes before an earlier one's next poll.
    calls = []
    for name in ("W1", "W2", "W3", "W4"):
        calls.append(sim.start(lambda lock=sim.lock(name, **kw): job(lock)))
        sim.run_for(0.25)
    assert sim.record().waiting_owner_id == "W1"
    sim.call(holder.release)
    sim.run_until(lambda: all(c.done for c in calls), limit=120, what="every waiter served")
    assert [c.error for c in calls] == [None] * 4
    assert order == ["W1", "W2", "W3", "W4"]


def test_an_older_waiter_takes_the_slot_from_a_younger_one_of_equal_rank_and_never_the_reverse(sim):
    kw = dict(ttl=10.0, waiter_poll_interval=0.1, waiter_check_interval=0.2)
    holder, old, young = sim.lock("H", **kw), sim.lock("OLD", **kw), sim.lock("YOUNG", **kw)
    assert sim.call(holder.acquire)
    sim.start(lambda: old.acquire(timeout=60))
    sim.run_until(waiter_is(sim, "OLD"), what="OLD registered")
    sim.update(waiter=None)  # the slot empties behind their backs (as after a handoff to another)
    sim.start(lambda: young.acquire(timeout=60))
    sim.run_until(lambda: sim.record().waiting_owner_id is not None, what="someone took the empty slot")
    sim.run_until(waiter_is(sim, "OLD"), limit=1.0, what="OLD took the slot back from YOUNG")
    sim.run_for(3.0)
    assert sim.record().waiting_owner_id == "OLD", "a younger waiter never takes the slot from an older one"
    assert sim.record().waiting_since < young.clock.time() - 2.0


def test_wait_for_slot_false_and_a_non_blocking_acquire_still_raise_at_once(sim):
    kw = dict(ttl=10.0, waiter_poll_interval=0.1)
    holder, first = sim.lock("H", **kw), sim.lock("F", **kw)
    assert sim.call(holder.acquire)
    sim.start(lambda: first.acquire(timeout=60))
    sim.run_until(waiter_is(sim, "F"), what="F registered")
    started = sim.monotonic()
    with pytest.raises(LockContended):
        sim.call(sim.lock("X", wait_for_slot=False, **kw).acquire)
    assert sim.call(lambda: sim.lock("Y", **kw).acquire(blocking=False)) is False
    assert sim.monotonic() - started < 1.0


def test_timeout_minus_one_waits_forever_as_filelock_does(sim):
    kw = dict(ttl=10.0, waiter_poll_interval=1.0, min_hold=0)  # a look a second: 120 s of waiting in few steps
    holder, waiter = sim.lock("H", **kw), sim.lock("W", **kw)
    assert sim.call(holder.acquire)
    call = sim.start(lambda: waiter.acquire(timeout=-1, request_release=False))
    sim.run_for(120.0)  # far past any timeout: still waiting, patiently
    assert not call.done and sim.record().waiting_owner_id == "W"
    sim.call(holder.release)
    sim.run_until(lambda: call.done, limit=5)
    assert call.error is None and waiter.is_held
    with pytest.raises(ConfigurationError, match="timeout"):
        HandoffLock("memory://x/y.json").acquire(timeout=-2)


def test_four_asking_workers_do_every_job_once_in_two_holds_each_and_none_starves(sim):
    """The shape of the pool benchmark: four workers, each with two or three one-second jobs, each
    ``with lock.acquire(timeout=60):`` and ``lock.steps(jobs)``. The default minimum hold lets a holder
    finish its jobs before a waiter's request is acted on: no ping-pong."""
    jobs = {"w0": [1, 2], "w1": [3, 4, 5], "w2": [6, 7], "w3": [8, 9, 10]}
    done: list[int] = []
    holds: dict[str, int] = {name: 0 for name in jobs}
    first_hold: dict[str, float] = {}
    begun = sim.monotonic()

    def worker(name):
        lock = sim.lock(name, ttl=10.0, waiter_poll_interval=0.5, waiter_check_interval=0.5)
        left = list(jobs[name])
        while left:
            with lock.acquire(timeout=60):
                holds[name] += 1
                first_hold.setdefault(name, sim.monotonic() - begun)
                for job in lock.steps(list(left)):
                    sim.sleep(1.0)
                    done.append(job)
                    left.remove(job)

    calls = [sim.start(lambda name=name: worker(name)) for name in jobs]
    sim.run_until(lambda: all(c.done for c in calls), limit=120, what="every worker finished")
    took = sim.monotonic() - begun
    print(f"holds {holds}, took {took:.2f} s, first hold at {first_hold}")
    assert [c.error for c in calls] == [None] * 4
    assert sorted(done) == list(range(1, 11)), "every job exactly once"
    assert max(holds.values()) <= 2, holds
    work = 10.0
    assert took <= 1.5 * work + 2.0, f"took {took:.1f} s for {work:.0f} s of work"
    assert max(first_hold.values()) <= work, f"a worker waited {max(first_hold.values()):.1f} s: {first_hold}"


def test_a_short_handed_lease_is_renewed_even_if_a_waiter_registers_before_the_heir_writes(sim):
    """The heir finds a handed lease too short to use and renews it before acquire() returns; a waiter
    that registered in between moved the generation: a 412 the heir reads past, never a loss."""
    kw = dict(ttl=4.0, waiter_poll_interval=0.1, waiter_check_interval=0.1, min_hold=0)
    owner, heir = sim.lock("O", **kw), sim.lock("H", **kw)
    assert sim.call(owner.acquire)
    box = sim.start(lambda: heir.acquire(timeout=30))
    sim.run_until(waiter_is(sim, "H"), what="H registered")
    armed = [True]

    def register_a_waiter(op, key, found):
        if armed and found is not None and LockRecord.decode(found[0], key=key).owner_id == "H":
            armed.clear()  # the heir has read its handoff: a third party registers before the heir writes
            record, generation = LockRecord.decode(found[0], key=key), found[1]
            late = record.replace(waiting_owner_id="C", waiter_expires_at=sim.time() + 10, waiter_instance="c1")
            sim.store.write(key, late.encode(), if_generation_match=generation)

    sim.store.faults.after("read", register_a_waiter)
    owner._unschedule()  # private: the owner stops, as if it handed over and went; the test writes the handoff
    record = sim.record()
    sim.update(owner_id="H", owner_instance=heir.instance, expires_at=sim.time() + 1.95, token=record.token + 1,
               waiting_owner_id=None, held_since=sim.time())  # its safety margin already spent (a paused heir)
    sim.run_until(lambda: box.done, limit=10, what="the heir's acquire returned")
    assert box.error is None and heir.is_held and heir.healthy, box
    assert sim.record().waiting_owner_id == "C" and sim.record().expires_at > sim.time() + 3.0


def test_a_timed_out_acquire_never_keeps_the_token_of_a_hold_its_instance_lost(world, monkeypatch):
    """A's hold is lost at its renew deadline, its last renewal cut off at its timeout; the store applies
    that renewal late, so the record names this very instance again, with the lost hold's token. A's next
    acquire retakes (design.md, row 3), but the retake is cut off too and never lands; the acquire times
    out and its way out finds the lock its own. No handoff made that hold: it is the one A declared lost,
    and a writer left over from it still carries its token, which a fence takes from the same writer as
    readily as from the hold it would be returned as. The acquire keeps nothing: it gives the lock on (to
    the waiter behind it, with a new token) and raises LockTimeout, as it was going to."""
    a = world.lock("A", ttl=4.0)
    assert a.acquire(timeout=5)
    lost_token = a.token
    real = MemoryStorage.write
    cut: list[tuple] = []
    landed: list[int] = []  # the generation at which the late renewal landed

    def write(self, key, data, *, if_generation_match, timeout=None):
        record = LockRecord.decode(data, key=key)
        ours = record.owner_id == "A" and record.owner_instance == a.instance
        if ours and (not landed or record.token != lost_token):  # the hold's renewals, then the retake
            cut.append((key, data, if_generation_match))
            raise StorageTimeout("injected: cut off at the request timeout, no answer", ambiguous=True)
        return real(self, key, data, if_generation_match=if_generation_match, timeout=timeout)

    monkeypatch.setattr(MemoryStorage, "write", write)
    world.clock.run_for(a.renew_deadline + 1.0)
    assert not a.is_held and a.token == lost_token, "the hold was not lost at its renew deadline"
    key, data, generation = cut[-1]
    landed.append(real(world.store, key, data, if_generation_match=generation))  # the last renewal lands, late
    assert (world.record().owner_instance, world.record().token) == (a.instance, lost_token)
    slot = Waiter("B", world.clock.time() + 10.0, ttl=4.0, instance="b1", since=world.clock.time())
    sent = len(cut)
    world.store.write(KEY, world.record().replace(waiter=slot).encode(), if_generation_match=world.generation())
    try:
        got = a.acquire(timeout=1.0)
    except LockTimeout:
        got = False
    assert not got, f"the acquire returned a hold with token {a.token}, the lost hold's ({lost_token})"
    assert len(cut) > sent, "the acquire made no retake (the world of this test is not the one it is about)"
    assert not a.is_held
    record = world.record()
    assert (record.owner_id, record.owner_instance) == ("B", "b1"), f"the lock was not handed on: {record}"
    assert record.token > lost_token


def test_a_timeout_with_no_record_read_says_no_write_of_ours_landed_not_that_a_slot_was_taken():
    from handofflock.lock.handoff import _timeout_message  # private: the message of a LockTimeout

    said = _timeout_message("memory://x/l.json", None, Me("B", "b0"), 1_700_000_000.0)
    assert "waiter slot was taken" not in said and "no write of ours to take it landed in time" in said, said


@pytest.mark.parametrize("instance", ["wtwin", None], ids=["twin", "older-version"])
def test_a_try_that_may_not_wait_raises_over_a_slot_with_our_owner_id_and_not_our_instance_after_one_read(
    sim, instance
):
    """A slot with our owner id and another instance is a twin's (a second job that derived the same id), and
    one an older version wrote (no ``waiterInstance``) is another party's as well: never ours to give back. A
    try that may not wait for the slot raises LockContended after the one read that showed it; its way out
    reads nothing more and leaves the record as it was (simulation seed 22459: it read the record again)."""
    now = sim.time()
    slot = Waiter("w", now + 30, ttl=30.0, instance=instance, request=WaiterRequest(True, 5), since=now)
    held_by_a = LockRecord(Holder("a", now + 30, instance="a0"), ttl=30.0, waiter=slot, token=5, nonce="n")
    sim.store.write(KEY, held_by_a.encode(), if_generation_match=0)
    me = lock_for(sim, "w", wait_for_slot=False)
    before = dict(sim.store.calls)
    with pytest.raises(LockContended):
        sim.call(me.acquire)
    assert sim.store.calls["read"] - before.get("read", 0) == 1
    assert sim.store.calls["write"] == before.get("write", 0) and sim.record() == held_by_a
