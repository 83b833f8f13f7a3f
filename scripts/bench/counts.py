"""Sections 0 and 1: round trips, and requests per lock operation."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from bench.support import Backend, as_counts, diff, expired_record, run_in_thread, spent, step, summary  # noqa: E402
from handofflock import FakeClock, LockRecord, Scheduler  # noqa: E402
from handofflock.core.record import Holder  # noqa: E402

# --------------------------------------------------------------------------- 0. round trips


def bench_rtt(backend: Backend, n: int) -> dict[str, Any]:
    """One small read, and one conditional write, of a lock-sized object."""
    store, _ = backend.store()
    key = backend.prefix("rtt") + "probe.json"
    data = LockRecord(Holder("probe", time.time() + 60), ttl=60.0, token=1, nonce="n").encode()
    generation = store.write(key, data, if_generation_match=0)
    reads, writes = [], []
    for _ in range(n):
        t = time.perf_counter()
        store.read(key, max_bytes=64 * 1024)
        reads.append(time.perf_counter() - t)
    for _ in range(max(10, n // 4)):
        t = time.perf_counter()
        generation = store.write(key, data, if_generation_match=generation)
        writes.append(time.perf_counter() - t)
    store.close()
    return {"read": summary(reads), "write": summary(writes)}


# --------------------------------------------------------------------------- 1. requests per operation

#: Operation -> (what the target is about, the target). "writes" targets count writes only.
COUNT_TARGETS: dict[str, tuple[str, int]] = {
    "acquire, object absent": ("total", 2),
    "acquire, lock free": ("total", 2),
    "acquire, lease expired": ("total", 2),
    "renew": ("total", 1),
    "release, no waiter": ("total", 1),
    "release, handing off": ("total", 1),
    "become the waiter": ("writes", 1),
    "waiter poll": ("total", 1),
    "waiter takes the handed-off lock": ("total", 1),
    "waiter check, one lock": ("total", 1),
    "waiter check that notices the waiter": ("total", 1),
    "waiter check, 50 locks in one prefix": ("total", 1),
    "waiter check, 50 locks, one has a new waiter": ("total", 2),
    "status": ("total", 1),
}


#: Where a backend's target differs, and why. An S3 listing carries each object's ETag but not its
#: generation (kept in the object's bytes: docs/storage.md), so a grouped check that finds a lock
#: changed reads that lock's header once before the check reads the lock: one read more than GCS.
BACKEND_COUNT_TARGETS: dict[str, dict[str, tuple[str, int]]] = {
    "s3": {"waiter check, 50 locks, one has a new waiter": ("total", 3)},
}


def count_target(backend: str, op: str) -> tuple[str, int] | None:
    """The target for ``op`` on ``backend``: the common one unless the backend has its own."""
    return BACKEND_COUNT_TARGETS.get(backend, {}).get(op) or COUNT_TARGETS.get(op)


def bench_counts(backend: Backend) -> dict[str, Any]:
    out: dict[str, Any] = {}
    p = backend.prefix("counts")

    def record(op: str, c: Counter[str]) -> None:
        out[op] = as_counts(c)
        out[op]["writes"] = c["write"]

    # An owner on a fake clock (started at real time, so its records are current) whose
    # scheduler runs only when told: renewal and checks happen exactly when we say.
    clock = FakeClock(start=time.time(), monotonic_start=time.monotonic())
    sched = Scheduler(clock, autostart=False)
    sa, ca = backend.store()
    a = backend.lock(sa, p + "a.json", clock=clock, scheduler=sched, min_write_interval=0.0)
    record("acquire, object absent", spent(ca, lambda: a.acquire(blocking=False))[0])
    record("status", spent(ca, a.status)[0])
    clock.advance(a.renew_interval)
    record("renew", spent(ca, sched.run_pending)[0])
    record("waiter check, one lock", spent(ca, sched.run_pending)[0])  # the check fell due meanwhile
    # A renewal after a waiter registered unseen: its write fails its precondition, it reads, writes again.
    data, generation = sa.read(a.key)
    doc = LockRecord.decode(data).replace(waiting_owner_id="someone", waiter_expires_at=clock.time() + 60, nonce="w")
    sa.write(a.key, doc.encode(), if_generation_match=generation)
    clock.advance(a.renew_interval)
    record("renew, a waiter registered since the owner last looked", spent(ca, sched.run_pending)[0])
    data, generation = sa.read(a.key)
    sa.write(a.key, LockRecord.decode(data).replace(waiting_owner_id=None, waiter_expires_at=None).encode(), if_generation_match=generation)
    sched.run_pending()  # a waiter check: the owner re-reads the record without the waiter
    record("release, no waiter", spent(ca, a.release)[0])

    sb, cb = backend.store()
    b = backend.lock(sb, p + "a.json", scheduler=Scheduler(autostart=False), min_write_interval=0.0)
    record("acquire, lock free", spent(cb, lambda: b.acquire(blocking=False))[0])
    b.release()

    raw, _ = backend.store()
    raw.write(p + "expired.json", expired_record(time.time()), if_generation_match=0)
    sc, cc = backend.store()
    c = backend.lock(sc, p + "expired.json", scheduler=Scheduler(autostart=False), min_write_interval=0.0)
    record("acquire, lease expired", spent(cc, lambda: c.acquire(blocking=False))[0])
    c.release()

    # Waiter and handoff: the waiter's poll sleeps are stepped by hand, so each poll is counted
    # alone; the owner's clock is fake, so its waiter check runs when we say.
    for noticed in (True, False):
        key = p + f"handoff-{noticed}.json"
        oclock = FakeClock(start=time.time(), monotonic_start=time.monotonic())
        osched = Scheduler(oclock, autostart=False)
        so, co = backend.store()
        owner = backend.lock(so, key, clock=oclock, scheduler=osched, min_write_interval=0.0)
        owner.acquire()
        sw, cw = backend.store()
        # A fake clock started at real time (its records are current) that moves only when we
        # step it: the waiter's poll sleeps end one at a time, so each poll is counted alone.
        stepped = FakeClock(start=time.time(), monotonic_start=time.monotonic())
        waiter = backend.lock(sw, key, clock=stepped, scheduler=Scheduler(autostart=False), min_write_interval=0.0)
        before = cw.snapshot()
        thread, result = run_in_thread(lambda: waiter.acquire(timeout=60))
        stepped.wait_for_waits(1)  # registered, asleep before its first poll
        if noticed:
            record("become the waiter", diff(before, cw.snapshot()))
            record("waiter poll", spent(cw, lambda: step(stepped))[0])
            oclock.advance(owner.waiter_check_interval)
            record("waiter check that notices the waiter", spent(co, osched.run_pending)[0])
            if not owner.release_requested:
                raise RuntimeError("the owner's check did not notice the waiter")
            record("release, handing off", spent(co, owner.release)[0])
        else:
            record("release, handing off before any check noticed the waiter", spent(co, owner.release)[0])
        before = cw.snapshot()
        step(stepped, thread)
        if noticed:
            record("waiter takes the handed-off lock", diff(before, cw.snapshot()))
        if [bool(r) for r in result] != [True]:
            raise RuntimeError(f"the counted handoff did not complete: {result}")
        waiter.release()
        so.close()
        sw.close()

    # Grouped waiter checks: 50 locks under one prefix, one scheduler, one beat.
    sg, cg = backend.store()
    gclock = FakeClock(start=time.time(), monotonic_start=time.monotonic())
    gsched = Scheduler(gclock, autostart=False)
    group = [backend.lock(sg, f"{p}group/l{i:02d}.json", clock=gclock, scheduler=gsched, min_write_interval=0.0) for i in range(50)]
    for lock in group:
        lock.acquire(blocking=False)
    gclock.advance(group[0].waiter_check_interval)
    record("waiter check, 50 locks in one prefix", spent(cg, gsched.run_pending)[0])
    key = group[7].key
    data, generation = raw.read(key)
    doc = LockRecord.decode(data).replace(waiting_owner_id="someone", waiter_expires_at=gclock.time() + 60, nonce="w")
    raw.write(key, doc.encode(), if_generation_match=generation)
    gclock.advance(group[0].waiter_check_interval)
    record("waiter check, 50 locks, one has a new waiter", spent(cg, gsched.run_pending)[0])
    if not group[7].release_requested:
        raise RuntimeError("the grouped check did not notice the waiter")
    for lock in group:
        lock.release()

    # What a renewal costs when it reads before it writes, as in seed 004's design.
    ss, cs = backend.store()
    key = p + "seed004.json"
    generation = ss.write(key, LockRecord(Holder("me", time.time() + 60)).encode(), if_generation_match=0)

    def renew_by_reading_first() -> None:
        data, gen = ss.read(key)
        ss.write(key, LockRecord.decode(data).replace(expires_at=time.time() + 60).encode(), if_generation_match=gen)

    record("seed-004 renew (read, then write)", spent(cs, renew_by_reading_first)[0])
    for s in (sa, sb, raw, sc, sg, ss):
        s.close()
    return out


def count_targets_met(counts: dict[str, Any]) -> dict[str, bool]:
    met = {}
    for op, (what, target) in COUNT_TARGETS.items():
        if op in counts:
            value = counts[op]["writes" if what == "writes" else "total"]
            met[op] = value <= target
    return met
