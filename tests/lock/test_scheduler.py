"""The scheduler that runs every lock's duties: its contract, grouped waiter checks, and a loop that never spins or dies."""

from __future__ import annotations

import math
import threading
import time
import uuid
import warnings
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import pytest
from lockutil import eventually, raw_read, raw_write

from handofflock import (
    FakeClock,
    HandoffLock,
    Scheduler,
    StorageError,
    TransientStorageError,
    signals,
)
from handofflock.core.clock import Clock
from handofflock.core.errors import RenewalsBehindWarning
from handofflock.lock import events
from handofflock.lock.handoff import _Reaper
from handofflock.lock.scheduler import BEHIND_SHARE, Scheduled
from handofflock.storage import MemoryStorage, open_url
from handofflock.storage.records import WriteGate


class WallTicker:
    """Due every ``every`` seconds on the real clock; sets ``ran`` when run."""

    check_interval = math.inf
    request_timeout = 5.0

    def __init__(self, clock, store, key, every=0.02):
        self.clock, self.store, self.key, self.every = clock, store, key, every
        self.next_at = clock.monotonic() + every
        self.ran = threading.Event()

    def next_due(self):
        return self.next_at

    def next_due_besides_check(self):
        return self.next_at

    def next_check_at(self):
        return math.inf

    def deadline(self):
        return math.inf

    def run_due(self):
        self.next_at = self.clock.monotonic() + self.every
        self.ran.set()

    def check_against(self, generation):
        pass


class Ticker:
    """Due every ``every`` seconds; counts its runs and its checks."""

    def __init__(self, clock, store, key, every=1.0, check=math.inf):
        self.clock, self._store, self._key = clock, store, key
        self.every, self.check = every, check
        self.next_at = clock.monotonic() + every
        self.next_check = clock.monotonic() + check
        self.runs, self.checked = 0, []
        self.ran = threading.Event()

    check_interval = property(lambda self: self.check)
    store = property(lambda self: self._store)
    key = property(lambda self: self._key)
    request_timeout = 5.0

    def next_due(self):
        return min(self.next_at, self.next_check)

    def next_due_besides_check(self):
        return self.next_at

    def next_check_at(self):
        return self.next_check

    def deadline(self):
        return math.inf

    def run_due(self):
        now = self.clock.monotonic()
        if now >= self.next_at:
            self.runs += 1
            self.next_at = now + self.every
            self.ran.set()
        if now >= self.next_check:
            self.checked.append(None)
            self.next_check = now + self.check

    def check_against(self, generation):
        self.checked.append(generation)
        self.next_check = self.clock.monotonic() + self.check

N = 50

CHECK = 2.0


class Requests:
    """What a store asked of its backend: storage calls (memory) or HTTP requests (GCS), by kind."""

    def __init__(self, store) -> None:
        self.store = store
        self.gcs = not isinstance(store, MemoryStorage)
        self.log: list[str] = []
        if self.gcs:
            # private (google-cloud-storage's): the client's HTTP session is the one place that sees every request it sends
            session = store.client._http
            original = session.request

            def recording(method, url, **kwargs):
                self.log.append(_kind(method, url))
                return original(method, url, **kwargs)

            session.request = recording

    def snapshot(self) -> Counter:
        if self.gcs:
            return Counter(self.log)
        return Counter({op: n for op, n in self.store.calls.items()})

    def since(self, before: Counter) -> Counter:
        after = self.snapshot()
        return Counter({k: after[k] - before[k] for k in after if after[k] - before[k]})


def _kind(method: str, url: str) -> str:
    path = urlsplit(url).path
    if method == "GET" and path.startswith("/download/"):
        return "read"
    if method == "GET" and path.endswith("/o"):
        return "list"
    return {"POST": "write", "DELETE": "delete"}.get(method, f"{method} {path}")


@pytest.fixture(params=["memory", "gcs"])
def base(request):
    """A fresh lock-URL prefix (``.../locks/``) on each backend."""
    unique = uuid.uuid4().hex[:10]
    if request.param == "memory":
        yield f"memory://group-{unique}/locks/"
        MemoryStorage.forget(f"group-{unique}")
    else:
        emulator = request.getfixturevalue("gcs_emulator")
        emulator.create_bucket(f"group-{unique}")
        yield f"gs://group-{unique}/locks/"


@pytest.fixture
def held(base):
    """N locks held under one prefix on a fake clock, with a scheduler that runs only when told.

    Without pacing (here and below): these tests count the requests of waiter checks, which
    pacing does not change; each lock is its own object, so GCS's per-object spacing would only
    delay the renewals of the fake clock, not the counts.
    """
    clock = FakeClock(start=time.time())
    sched = Scheduler(clock, autostart=False)
    locks = [
        HandoffLock(
            f"{base}l{i:03d}.json", ttl=60.0, waiter_check_interval=CHECK, min_write_interval=0.0,
            clock=clock, scheduler=sched, min_hold=0,
        )
        for i in range(N)
    ]
    with ThreadPoolExecutor(10) as pool:  # on GCS each acquire is two requests: the emulator answers several at once
        assert all(pool.map(lambda lock: lock.acquire(blocking=False), locks))
    store, _ = open_url(locks[0].url)
    requests = Requests(store)
    yield locks, clock, sched, requests
    for lock in locks:
        lock._unschedule()  # private: stop its renewals without releasing


def one_interval(clock, sched) -> None:
    clock.advance(CHECK)
    sched.run_pending()


def test_a_loop_thread_that_could_not_start_is_started_by_the_next_add(monkeypatch):
    real_start, refused = threading.Thread.start, []

    def start_once_refused(thread):
        if thread.name == "startfail-scheduler" and not refused:
            refused.append(thread.name)
            raise RuntimeError("can't start new thread")
        return real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", start_once_refused)
    clock = Clock()
    sched = Scheduler(clock, name="startfail")
    ticker = WallTicker(clock, MemoryStorage("startfail"), "dir/a.json")
    try:
        with pytest.raises(RuntimeError, match="can't start new thread"):
            sched.add(ticker)
        assert refused
        sched.add(ticker)  # the next add starts the loop
        assert ticker.ran.wait(10.0), "the scheduler believes a loop runs that never started"
    finally:
        sched.stop()


def test_a_scheduler_whose_stop_timed_out_never_runs_two_loops():
    gate, parked = threading.Event(), threading.Event()

    def park_the_first_sleep(timeout):
        """The loop's first sleep lasts until the test says so: stop() cannot join it in time."""
        if not parked.is_set():
            parked.set()
            gate.wait(10)

    clock = FakeClock()
    clock.on_wait.append(park_the_first_sleep)
    sched = Scheduler(clock, name="stop-test")
    # Private (Scheduler's): starting and restarting the loop with nothing scheduled is the race
    # under test, and only _ensure_thread does that; _loop_ended is set once the loop that must not be
    # doubled has returned.
    sched._ensure_thread()
    loop_ended = sched._loop_ended
    assert parked.wait(5)
    sched.stop(timeout=0.05)  # the loop is parked: the join times out
    assert not loop_ended.is_set()
    threading.Timer(0.1, gate.set).start()
    sched._ensure_thread()  # must not start a second loop beside the one still running
    time.sleep(0.3)  # the old loop is free again: had it been told to go on, it would still run
    alive = [t for t in threading.enumerate() if t.name == "stop-test-scheduler"]
    assert len(alive) == 1, f"{len(alive)} scheduler loops running"
    sched.stop()


def test_one_scheduler_thread_serves_many_locks():
    """The scheduler's loop on a fake clock: one step past the renewal interval makes all 50 renewals due at
    once, and they are written by the loop thread and its two I/O workers, no thread more."""
    clock = FakeClock(start=time.time())
    sched = Scheduler(clock, io_workers=2)
    name = f"many-{uuid.uuid4().hex[:8]}"
    store = MemoryStorage.named(name)
    held = [HandoffLock(f"memory://{name}/l{i}.json", ttl=3, clock=clock, scheduler=sched) for i in range(50)]
    _Reaper.ensure()  # private: the process's one reaper thread, started by its first acquire, is no scheduler's
    before = threading.active_count()
    try:
        for lock in held:
            assert lock.acquire()
        eventually(lambda: sched.threads >= 1, what="scheduler start")
        writes = store.calls["write"]
        clock.advance(held[0].renew_interval)
        eventually(lambda: store.calls["write"] >= writes + len(held), what="all 50 renewals written")
        assert sched.threads <= 3
        assert threading.active_count() - before <= 3
    finally:
        for lock in held:
            lock.release()
        sched.stop()
        MemoryStorage.forget(name)


def test_a_plain_object_of_the_scheduled_shape_is_run_when_due():
    clock = FakeClock()
    sched = Scheduler(clock, autostart=False)
    ticker: Scheduled = Ticker(clock, MemoryStorage("contract"), "root.json", every=1.0)
    sched.add(ticker)
    sched.run_pending()
    assert ticker.runs == 0  # not due yet
    for _ in range(3):
        clock.advance(1.0)
        sched.run_pending()
    assert ticker.runs == 3
    sched.discard(ticker)
    clock.advance(5.0)
    sched.run_pending()
    assert ticker.runs == 3  # discarded: never run again


def test_objects_under_one_prefix_are_checked_against_one_listing():
    clock = FakeClock()
    store = MemoryStorage("contract-group")
    generation = store.write("jobs/a.json", b"{}", if_generation_match=0)
    sched = Scheduler(clock, autostart=False)
    a = Ticker(clock, store, "jobs/a.json", every=100.0, check=1.0)
    b = Ticker(clock, store, "jobs/b.json", every=100.0, check=1.0)
    sched.add(a)
    sched.add(b)
    clock.advance(1.0)
    sched.run_pending()
    assert a.checked == [generation] and b.checked == [0]  # b's object is not listed
    assert store.calls["list"] == 1


def test_a_quiet_interval_costs_one_listing_and_nothing_else(held):
    locks, clock, sched, requests = held
    for _ in range(3):
        before = requests.snapshot()
        one_interval(clock, sched)
        assert requests.since(before) == Counter(list=1)
    assert all(lock.is_held and not lock.release_requested for lock in locks)


def test_a_waiter_on_one_lock_costs_one_read_and_is_noticed(held):
    locks, clock, sched, requests = held
    target = locks[17]
    heard = []
    signals.on_release_requested.connect(lambda s, **kw: heard.append(kw["waiter_id"]), sender=target, weak=False)
    record, generation = raw_read(target.url)
    raw_write(target.url, record.replace(waiting_owner_id="waiter-w", waiter_expires_at=clock.time() + 60, nonce="w"), generation)
    before = requests.snapshot()
    one_interval(clock, sched)
    assert requests.since(before) == Counter(list=1, read=1)
    assert target.release_requested and target.release_request.requester == "waiter-w"
    assert heard == ["waiter-w"]
    assert sum(lock.release_requested for lock in locks) == 1
    # The read refreshed the cached record and generation: the next interval is quiet again.
    before = requests.snapshot()
    one_interval(clock, sched)
    assert requests.since(before) == Counter(list=1)


def test_changed_objects_are_read_and_only_they(held):
    locks, clock, sched, requests = held
    for lock in locks[:5]:
        record, generation = raw_read(lock.url)
        raw_write(lock.url, record.replace(waiting_owner_id="w", waiter_expires_at=clock.time() + 60, nonce="w"), generation)
    before = requests.snapshot()
    one_interval(clock, sched)
    assert requests.since(before) == Counter(list=1, read=5)
    assert [lock.release_requested for lock in locks] == [True] * 5 + [False] * (N - 5)


def test_a_deleted_lock_object_is_detected_as_lost(held):
    locks, clock, sched, requests = held
    target = locks[3]
    lost = []
    signals.lost.connect(lambda s, **kw: lost.append(kw["reason"]), sender=target, weak=False)
    store, key = open_url(target.url)
    store.delete(key, if_generation_match=raw_read(target.url)[1])
    before = requests.snapshot()
    one_interval(clock, sched)
    # Missing from the listing: one read confirms it (a listing alone never decides).
    assert requests.since(before) == Counter(list=1, read=1)
    assert not target.is_held and lost and "deleted" in lost[0]
    assert sum(lock.is_held for lock in locks) == N - 1


def test_a_lock_taken_over_by_someone_else_is_detected_as_lost(held):
    locks, clock, sched, requests = held
    target = locks[8]
    record, generation = raw_read(target.url)
    raw_write(target.url, record.replace(owner_id="thief", nonce="t"), generation)
    one_interval(clock, sched)
    assert not target.is_held
    with pytest.raises(Exception):
        target.check()


def test_renewals_still_write_once_each_and_checks_stay_one_listing(held):
    locks, clock, sched, requests = held
    # Four check beats take us to 8 s: every lock renews once (ttl/8 = 7.5 s).
    before = requests.snapshot()
    for _ in range(4):
        one_interval(clock, sched)
    assert requests.since(before) == Counter(list=4, write=N)
    assert all(lock.healthy for lock in locks)


def test_a_lock_acquired_later_joins_the_beat_without_a_read_of_its_own(held, base):
    locks, clock, sched, requests = held
    one_interval(clock, sched)
    clock.advance(0.5)
    # No pacing, as the fixture's locks (see ``held``): the subject is which requests a check costs.
    late = HandoffLock(f"{base}late.json", ttl=60.0, waiter_check_interval=CHECK, min_write_interval=0.0, clock=clock, scheduler=sched, min_hold=0)
    assert late.acquire(blocking=False)
    try:
        before = requests.snapshot()
        clock.advance(CHECK - 0.5)
        sched.run_pending()
        assert requests.since(before) == Counter(list=1)
        record, generation = raw_read(late.url)
        raw_write(late.url, record.replace(waiting_owner_id="w", waiter_expires_at=clock.time() + 60, nonce="w"), generation)
        one_interval(clock, sched)
        assert late.release_requested
    finally:
        late.release()


def test_one_lock_alone_keeps_its_single_read():
    name = f"alone-{uuid.uuid4().hex[:8]}"
    clock = FakeClock(start=time.time())
    sched = Scheduler(clock, autostart=False)
    lock = HandoffLock(f"memory://{name}/locks/only.json", waiter_check_interval=CHECK, clock=clock, scheduler=sched)
    store = MemoryStorage.named(name)
    try:
        assert lock.acquire()
        before = Counter(store.calls)
        one_interval(clock, sched)
        assert Counter(store.calls) - before == Counter(read=1)
    finally:
        lock.release()
        MemoryStorage.forget(name)


def test_locks_at_the_store_root_are_never_grouped():
    name = f"root-{uuid.uuid4().hex[:8]}"
    clock = FakeClock(start=time.time())
    sched = Scheduler(clock, autostart=False)
    locks = [HandoffLock(f"memory://{name}/r{i}.json", waiter_check_interval=CHECK, clock=clock, scheduler=sched) for i in range(3)]
    store = MemoryStorage.named(name)
    try:
        for lock in locks:
            assert lock.acquire()
        before = Counter(store.calls)
        one_interval(clock, sched)
        assert Counter(store.calls) - before == Counter(read=3)
    finally:
        for lock in locks:
            lock.release()
        MemoryStorage.forget(name)


@pytest.mark.parametrize("base", ["memory"], indirect=True)  # fault hooks are a memory-backend feature
def test_a_failed_listing_skips_one_beat_and_a_refused_one_falls_back_to_reads(held, base):
    locks, clock, sched, requests = held
    store = requests.store
    store.faults.fail_next("list")  # transient
    before = requests.snapshot()
    one_interval(clock, sched)
    assert requests.since(before) == Counter(list=1)
    assert all(lock.is_held for lock in locks)
    store.faults.fail_next("list", exc=lambda: StorageError("403: no storage.objects.list permission"))
    one_interval(clock, sched)
    before = requests.snapshot()
    one_interval(clock, sched)
    assert requests.since(before) == Counter(read=N), "after a refusal, each lock reads its own object"
    assert all(lock.is_held for lock in locks)
    # private: the scheduler's beats by prefix; no public name says whether a prefix still keeps one
    assert not sched._groups, "an ungrouped prefix keeps no beat (its locks wake the loop for their own checks)"
    for lock in locks:
        lock.release()
    sched.run_pending()
    # private: the prefixes the scheduler remembers as refused a listing
    assert not sched._ungrouped, "the verdict is dropped with the last lock under the prefix"


def test_with_the_real_scheduler_thread_a_waiter_is_noticed_and_checks_stay_batched(sim):
    """The scheduler's own loop and workers (threads of one simulated process), 20 locks under one prefix."""
    first = sim.lock("o0", key="locks/l0.json", ttl=30.0, waiter_check_interval=0.2, min_hold=0)
    locks = [first] + [
        sim.lock(f"o{i}", key=f"locks/l{i}.json", ttl=30.0, waiter_check_interval=0.2, min_hold=0, beside=first)
        for i in range(1, 20)
    ]
    for lock in locks:
        assert sim.call(lock.acquire)
    sim.run_for(0.3)  # let the group settle on one beat
    before = Counter(sim.store.calls)
    sim.run_for(1.0)
    spent = Counter(sim.store.calls) - before
    # One listing a beat (about 5 in 1 s), never a read per lock.
    assert spent["read"] == 0 and 1 <= spent["list"] <= 7, spent
    noticed = threading.Event()
    signals.on_release_requested.connect(lambda s, **kw: noticed.set(), sender=locks[5], weak=False)
    waiter = sim.lock("w", key="locks/l5.json", ttl=30.0, waiter_poll_interval=0.05, beside=first)
    got = sim.start(lambda: waiter.acquire(timeout=10))
    sim.run_until(noticed.is_set, limit=5.0, what="the owner hearing of the waiter")
    sim.call(locks[5].release)
    sim.run_until(lambda: got.done, limit=10.0, what="the waiter's acquire to return")
    assert got.error is None and bool(got.result) is True
    sim.call(waiter.release)


def test_a_slow_listing_does_not_hold_up_the_renewals_of_the_group():
    """A beat's listing can take seconds on GCS. Meanwhile each member's renewal must still be
    planned on its own: a member is busy only while its own check runs, not for the whole beat."""
    name = f"slowlist-{uuid.uuid4().hex[:8]}"
    store = MemoryStorage.named(name)
    clock = FakeClock(start=time.time())
    sched = Scheduler(clock, autostart=False)
    locks = [HandoffLock(f"memory://{name}/locks/l{i}.json", ttl=60.0, waiter_check_interval=CHECK,
                         clock=clock, scheduler=sched) for i in range(3)]  # the store's default pacing (none on memory://)
    for lock in locks:
        assert lock.acquire(blocking=False)
    real_list, listing, go = store.list, threading.Event(), threading.Event()

    def slow_list(prefix, **kw):
        listing.set()
        assert go.wait(10)
        return real_list(prefix, **kw)

    store.list = slow_list
    try:
        clock.advance(CHECK)
        # private: plan one round by hand, as the loop does under its mutex, and run its jobs on threads we hold
        with sched._mutex:
            jobs, _ = sched._plan(clock.monotonic(), track=True)
        assert len(jobs) == 1, "one beat for the group"
        beat = threading.Thread(target=jobs[0].run)
        beat.start()
        assert listing.wait(5)
        clock.advance(7.5 - CHECK)  # the renewals fall due while the listing hangs
        with sched._mutex:  # private: as above
            jobs, _ = sched._plan(clock.monotonic(), track=True)
            second_beat = [job for job in jobs if not job.locks]
        renewing = {id(lock) for job in jobs for lock in job.locks}
        assert renewing == {id(lock._duties) for lock in locks}, "renewals waited for the listing"  # private: what the scheduler holds of each lock
        assert not second_beat, "a second beat started while the first still lists"
        for job in jobs:
            job.run()
        assert all(lock.healthy for lock in locks)
    finally:
        go.set()
        beat.join(10)
        store.list = real_list
        for lock in locks:
            lock.release()
        MemoryStorage.forget(name)
    assert not beat.is_alive()


@pytest.mark.parametrize("base", ["memory"], indirect=True)
def test_locks_that_renewed_while_the_group_was_listed_cost_no_read(held, base):
    """With many locks, renewals run while a beat lists and checks. A listing older than a lock's own
    renewal shows an older generation: that is no sign of a change, and must not cost a read each."""
    locks, clock, sched, requests = held
    store = requests.store
    real_list = store.list

    def list_then_renew(prefix, **kw):
        listing = real_list(prefix, **kw)
        for lock in locks:  # every lock renews after the listing was taken
            lock._renew()  # private: one renewal, run here as a scheduler worker would
        return listing

    store.list = list_then_renew
    try:
        clock.advance(CHECK)
        before = requests.snapshot()
        sched.run_pending()
    finally:
        store.list = real_list
    assert requests.since(before) == Counter(list=1, write=N), "a stale listing cost reads"
    record, generation = raw_read(locks[0].url)
    raw_write(locks[0].url, record.replace(waiting_owner_id="w", waiter_expires_at=clock.time() + 60, nonce="w"), generation)
    one_interval(clock, sched)
    assert locks[0].release_requested, "a change by someone else is still read and noticed"


def test_a_group_beat_slower_than_its_interval_does_not_set_the_loop_spinning(sim, monkeypatch):
    from handofflock.testing.sim.hub import SimClock

    first = sim.lock("a0", key="locks/l0.json", ttl=60.0, waiter_check_interval=CHECK)
    locks = [first, sim.lock("a1", key="locks/l1.json", ttl=60.0, waiter_check_interval=CHECK, beside=first)]
    for lock in locks:
        assert sim.call(lock.acquire)
    clock, zero_waits = first.clock, []
    real_wait = SimClock.wait

    def noting_zero_waits(self, event, timeout):
        if self is clock and timeout == 0.0:
            zero_waits.append(sim.monotonic())
        return real_wait(self, event, timeout)

    monkeypatch.setattr(SimClock, "wait", noting_zero_waits)
    listing: list[float] = []

    def stall(op, key):
        listing.append(sim.monotonic())
        sim.sleep(60.0)  # far longer than the test looks

    sim.store.faults.before("list", stall)
    sim.run_until(lambda: listing, limit=CHECK + 1.0, what="the group's beat")  # its listing stalls
    sim.run_for(3 * CHECK)  # the beat is now overdue, and still running
    sim.run_for(0.2)
    before = len(zero_waits)
    sim.run_for(0.5)
    spun = len(zero_waits) - before
    assert spun <= 2, f"the loop planned {spun} waits of 0 s in 0.5 s while the beat ran"


def test_a_lock_whose_release_is_being_retried_asks_for_no_waiter_check():
    name = f"spin-release-{uuid.uuid4().hex[:8]}"
    store = MemoryStorage.named(name)
    clock = FakeClock(step=0.5)
    sched = Scheduler(clock, autostart=False)
    lock = HandoffLock(f"memory://{name}/lock.json", ttl=30.0, clock=clock, scheduler=sched)
    try:
        assert lock.acquire()
        store.faults.fail_next("write", count=10**6)
        with pytest.raises(TransientStorageError):
            lock.release()  # retried until its deadline, long past the waiter check that was due
        # Releasing: the retry is due in a second; a waiter check would do nothing, so none is started.
        assert sched.run_pending() == 0
        store.faults.clear()
        clock.advance(1.0)
        assert sched.run_pending() == 1  # the retry, which lands
        assert not lock.is_held
    finally:
        store.faults.clear()
        MemoryStorage.forget(name)


def test_a_write_gate_never_asks_for_a_wait_that_take_would_not_honour():
    gate = WriteGate(1.0)
    assert gate.take(100.0) and gate.take(100.0, urgent=True)  # the burst: the bucket is empty now
    almost = 101.0 - 1e-13  # one write refilled, short by float dust only
    assert gate.ready_in(almost, urgent=True) == 0.0
    assert gate.take(almost, urgent=True)


def test_a_scheduler_with_only_add_and_discard_serves_a_release_request():
    """``scheduler=`` needs ``add`` and ``discard``; ``notify_inline`` is optional (a signal handler's request_release)."""

    class AddDiscard:
        def __init__(self) -> None:
            self.duties: set = set()

        def add(self, duties) -> None:
            self.duties.add(duties)

        def discard(self, duties) -> None:
            self.duties.discard(duties)

    sched = AddDiscard()
    lock = HandoffLock("memory://duck-scheduler/l.json", owner_id="A", ttl=10.0, scheduler=sched, release_at_exit=False)
    assert lock.acquire()
    lock.request_release("operator")
    for duties in list(sched.duties):
        duties.run_due()
    assert lock.release_requested
    lock.release()


# --------------------------------------------------------------------------- falling behind: more locks than the workers renew

SLOW = 0.05  # seconds every request takes: GCS's round trip


def _slow_requests(sim) -> None:
    """Every request of a simulated thread takes SLOW seconds of simulated time (the test's own calls take none)."""

    def slow(op, key):
        if sim.hub.current is not None:
            sim.hub.park(sim.hub.now + SLOW)

    sim.store.faults.before("*", slow)


def _hold_many(sim, n: int, *, prefix: str = "locks/", ttl: float = 5.0):
    """``n`` locks taken at once by one simulated process, with GCS's write spacing; their times of loss, as lost."""
    first = sim.lock("p", key=f"{prefix}l0000.json", ttl=ttl, min_write_interval=1.0)
    locks = [first] + [
        sim.lock("p", beside=first, key=f"{prefix}l{i:04d}.json", ttl=ttl, min_write_interval=1.0) for i in range(1, n)
    ]
    calls = [sim.start(lambda lock=lock: lock.acquire(blocking=False)) for lock in locks]
    sim.run_until(lambda: all(calls), limit=60)
    assert all(call.result for call in calls)
    lost: list[float] = []
    signals.lost.connect(lambda sender, **kw: lost.append(sim.monotonic()), weak=False)
    return locks, sim._processes[id(first)][3], lost  # private: the process's scheduler, as the sim made it


class _Lateness(events.Observer):
    """The lock observer, keeping what the scheduler reports of each renewal it starts."""

    def __init__(self, sim) -> None:
        self.sim, self.started = sim, []

    def renewal_started(self, scheduler, lateness, share):
        self.started.append((self.sim.monotonic(), share))


def test_behind_its_work_a_scheduler_runs_renewals_before_checks_and_the_most_urgent_lease_first(sim):
    from handofflock.testing.sim.hub import Proc, SimClock, sim_primitives

    proc = Proc("one-worker")
    clock = SimClock(sim.hub, proc, 0.0)
    sched = Scheduler(clock, name="one-worker", primitives=sim_primitives(sim.hub, proc), io_workers=1)
    ran: list[str] = []

    class Duty(Ticker):
        def __init__(self, name, deadline, check=math.inf):
            super().__init__(clock, sim.store, f"{name}.json", every=1.0, check=check)
            self.name, self.lease_end = name, deadline

        def deadline(self):
            return self.lease_end

        def run_due(self):
            ran.append(f"renew {self.name}")
            sim.sleep(SLOW)
            super().run_due()

        def check_against(self, generation):
            ran.append(f"check {self.name}")
            sim.sleep(SLOW)
            super().check_against(generation)

    now = clock.monotonic()
    checker = Duty("checker", math.inf, check=1.0)  # at the store's root: a waiter check of its own
    checker.next_at = math.inf
    late = Duty("late", now + 3.0)
    urgent = Duty("urgent", now + 1.5)
    for duty in (checker, late, urgent):  # in this order: the plan meets the check first
        sched.add(duty)
    sim.run_for(1.2)
    assert ran[:3] == ["renew urgent", "renew late", "check checker"]


def test_a_process_with_more_locks_than_it_can_renew_warns_and_reports_it_before_it_loses_one(sim, monkeypatch):

    observer = _Lateness(sim)
    monkeypatch.setattr(events, "observer", observer)
    _slow_requests(sim)
    warned: list[float] = []
    with warnings.catch_warnings():
        warnings.simplefilter("always", RenewalsBehindWarning)
        warnings.showwarning = lambda *args, **kw: warned.append(sim.monotonic())
        locks, sched, lost = _hold_many(sim, 400)  # 8 workers at 50 ms renew 160 a second: 400 cannot all land
        sim.run_for(6.0)
    assert lost, "the test needs a process past its capacity"
    assert warned and warned[0] < min(lost), "no warning before the first lease was lost"
    assert len(warned) == 1, "warned once per episode"
    reported = [at for at, share in observer.started if share >= BEHIND_SHARE]
    assert reported and reported[0] < min(lost), "the lateness metric did not pass the warning's share before a loss"
    assert sched.lateness.behind and sched.lateness.worst >= 1.0


#: What ``scripts/bench --only capacity`` printed for ttl 5 at 50 ms per request (docs/benchmarks.md).
HEALTHY_AT_TTL_5, WITH_MARGIN_AT_TTL_5 = 244, 126


@pytest.mark.parametrize("prefix", ["locks/", ""], ids=["grouped", "each-checked-alone"])
def test_at_the_capacity_the_bench_reports_no_lease_is_lost(sim, prefix):
    _slow_requests(sim)
    locks, sched, lost = _hold_many(sim, HEALTHY_AT_TTL_5, prefix=prefix)
    sim.run_for(3 * locks[0].renew_deadline)
    assert not lost and all(lock.healthy for lock in locks)
    assert sched.lateness.worst < 1.0


def test_at_the_capacity_with_margin_the_bench_reports_the_scheduler_never_warns(sim):
    _slow_requests(sim)
    locks, sched, lost = _hold_many(sim, WITH_MARGIN_AT_TTL_5)
    sim.run_for(3 * locks[0].renew_deadline)
    assert not lost and not sched.lateness.behind and sched.lateness.worst < BEHIND_SHARE


@pytest.mark.parametrize("how", ["warnings-as-errors", "raising-observer"])
def test_a_renewal_whose_lateness_report_raises_still_runs_and_the_worker_serves_the_next(sim, monkeypatch, how):
    """Past half its margin the start of a renewal is warned and reported. A process run with ``-W error``
    (or an observer whose ``renewal_started`` raises) must still renew: the report is not the renewal, and
    a worker that left on it would hold its place in ``io_workers`` and its lock's ``running`` mark for good."""
    from handofflock.testing.sim.hub import Proc, SimClock, sim_primitives

    proc = Proc("one-worker-raising")
    clock = SimClock(sim.hub, proc, 0.0)
    sched = Scheduler(clock, name="one-worker-raising", primitives=sim_primitives(sim.hub, proc), io_workers=1)
    ran: list[str] = []

    class Duty(Ticker):
        def __init__(self, name, margin, takes):
            super().__init__(clock, sim.store, f"{name}.json", every=1.0)
            self.name, self.margin, self.takes = name, margin, takes
            self.next_at = clock.monotonic()

        def deadline(self):
            return self.next_at + self.margin

        def run_due(self):
            ran.append(self.name)
            sim.sleep(self.takes)
            super().run_due()

    if how == "raising-observer":

        class Raising(events.Observer):
            def renewal_started(self, scheduler, lateness, share):
                raise RuntimeError("the metrics backend is down")

        monkeypatch.setattr(events, "observer", Raising())
    # 'late' starts 0.3 s into its 0.5 s margin, first seen late by the worker that starts it
    slow, late = Duty("slow", 0.4, takes=0.3), Duty("late", 0.5, takes=0.01)
    with warnings.catch_warnings():
        warnings.simplefilter("error" if how == "warnings-as-errors" else "ignore", RenewalsBehindWarning)
        for duty in (slow, late):
            sched.add(duty)
        sim.run_for(5.0)
    assert ran.count("late") >= 3, ran
    assert ran.count("slow") >= 3, ran
