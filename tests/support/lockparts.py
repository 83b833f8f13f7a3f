"""What the lock's behaviour tests share: a decided record with a waiter, a lock on a fake clock, and
the request signals one lock heard."""

from __future__ import annotations

import threading

from lockutil import FAST

from handofflock import AcquireCancelled, FakeClock, HandoffLock, LockTimeout, Scheduler, signals
from handofflock.core.record import ASKING, Holder, LockRecord, Waiter
from handofflock.storage import MemoryStorage

NOW = 1_700_000_000.0


def held(waiter_request=None, waiter="w", waiter_expires=NOW + 20, owner_expires=NOW + 30, **kw) -> LockRecord:
    return LockRecord(
        Holder("a", owner_expires, "ia"),
        Waiter(waiter, waiter_expires, instance="iw", request=waiter_request or ASKING) if waiter else None,
        ttl=60.0, token=7, nonce="old", **kw,
    )


def new_lock(name, clock, sched, **kw):
    opts = dict(ttl=60.0, waiter_check_interval=2.0, waiter_poll_interval=1.0, clock=clock, scheduler=sched)
    opts.update(kw)
    return HandoffLock(f"memory://{name}/train.json", **opts)


class Heard:
    """What one lock's request signals said, in order."""

    def __init__(self, lock: HandoffLock) -> None:
        self.events: list[tuple[str, object]] = []
        self._hold = (self._requested, self._withdrawn)  # blinker keeps weak references
        signals.on_release_requested.connect(self._requested, sender=lock)
        signals.on_release_withdrawn.connect(self._withdrawn, sender=lock)

    def _requested(self, sender, request, **kw):
        self.events.append(("requested", request))

    def _withdrawn(self, sender, request, requester, reason, **kw):
        assert (requester, reason) == (request.requester, "waiter")
        self.events.append(("withdrawn", request))

    def kinds(self) -> list[tuple[str, str]]:
        return [(kind, req.requester) for kind, req in self.events]


def owner_and_waiter(sim, **waiter_kw):
    a = sim.lock("a", **FAST)
    b = sim.lock("b", **{**FAST, **waiter_kw})
    sim.call(a.acquire)
    return a, b, Heard(a)


def wait_in_thread(sim, lock: HandoffLock, timeout: float = 30.0):
    """``lock.acquire(timeout=...)`` in a simulated thread; AcquireCancelled and LockTimeout end it quietly."""

    def go():
        try:
            lock.acquire(timeout=timeout)
        except (AcquireCancelled, LockTimeout):
            pass

    return sim.start(go)


def acquire_in_thread(lock: HandoffLock, timeout: float) -> threading.Thread:
    """``lock.acquire(timeout=...)`` in a started daemon thread; a ``cancel()`` (AcquireCancelled) ends it quietly."""

    def go():
        try:
            lock.acquire(timeout=timeout)
        except AcquireCancelled:
            pass

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    return thread


#: A lock on the simulated clock at GCS's pacing (one write a second per object) with a long lease.
PACED = dict(ttl=16.0, waiter_check_interval=0.2, waiter_poll_interval=0.1, max_clock_skew=0.5, min_write_interval=1.0)


def lock_for(sim, owner, **kw):
    return sim.lock(owner, **{**PACED, **kw})


def waiter_is(sim, who):
    return lambda: (sim.record() and sim.record().waiting_owner_id == who)


def heir_reads_its_handoff_late(name: str, clock: FakeClock, late: float, then) -> tuple[HandoffLock, list]:
    """An owner and an heir (ttl 4: renew deadline 2, interval 0.5) on ``clock``; once the heir waits, the
    owner hands it the lock, and the heir's next read of it comes ``late`` seconds after (a slow poll, a
    pause). ``then(store)`` arms what comes after that read. Returns the heir and what happened."""
    store = MemoryStorage.named(name)
    url = f"memory://{name}/lock.json"
    owner_sched = Scheduler(clock, autostart=False)
    clock.on_tick.append(owner_sched.run_pending)
    owner = HandoffLock(url, ttl=4.0, owner_id="O", min_hold=0, clock=clock, scheduler=owner_sched)
    heir = HandoffLock(url, ttl=4.0, owner_id="H", waiter_poll_interval=0.1, clock=clock,
                       scheduler=Scheduler(clock, autostart=False))  # fmt: skip
    seen: list[str] = []

    def late_read(op, key):
        if seen == ["handed"]:
            seen.append("read late")
            clock.advance(late)
            then(store)

    def hand_over():
        if not seen and owner.status().waiter_id == "H":
            seen.append("handed")
            assert owner.release() == "H"
            store.faults.before("read", late_read)

    assert owner.acquire()
    clock.on_tick.append(hand_over)
    return heir, seen
