"""Section 6: what users would pick instead (gcslock, the naive create-if-absent lock)."""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

from bench.support import BUCKET, GcsBackend, HttpCount, as_counts, diff, phases, run_in_thread, spent, summary  # noqa: E402
from handofflock import Scheduler  # noqa: E402

# --------------------------------------------------------------------------- 6. what users would pick instead


class NaiveLock:
    """Seed 003's lock, as published: create-if-absent to take it, delete to give it back, poll every 5 s.

    (The seed's logging calls are left out; nothing else is changed.)
    """

    def __init__(self, bucket_name: str, lock_name: str, lock_timeout_seconds: int = 60, poll_seconds: float = 5.0) -> None:
        from google.cloud import storage

        self.bucket_name = bucket_name
        self.lock_name = lock_name
        self.lock_timeout_seconds = lock_timeout_seconds
        self.poll_seconds = poll_seconds
        self.client = storage.Client()
        self.bucket = self.client.bucket(bucket_name)
        self.lock_blob = self.bucket.blob(lock_name)

    def lock(self) -> bool:
        try:
            self.lock_blob.upload_from_string("lock", if_generation_match=0)
            return True
        except Exception:
            return False

    def unlock(self) -> None:
        self.lock_blob.delete()

    def wait_for_lock(self, timeout: int) -> None:
        start_time = time.time()
        while not self.lock():
            if time.time() - start_time > timeout:
                raise TimeoutError(f"Could not acquire lock {self.lock_name}")
            time.sleep(self.poll_seconds)


def quiet_gcslock() -> None:
    """gcslock logs a warning on every client made against an emulator; keep the table readable."""
    log = logging.getLogger("gcslock")
    log.addHandler(logging.NullHandler())  # its get_logger() then adds no handler of its own
    log.setLevel(logging.ERROR)


def cycle_latency(acquire: Callable[[], Any], release: Callable[[], Any], n: int) -> dict[str, Any]:
    """``n`` uncontended acquire-then-release cycles: each step's latency, and the whole cycle's."""
    acq, rel, cyc = [], [], []
    for _ in range(n):
        t0 = time.perf_counter()
        if acquire() is False:
            raise RuntimeError("an uncontended acquire failed")
        t1 = time.perf_counter()
        release()
        t2 = time.perf_counter()
        acq.append(t1 - t0)
        rel.append(t2 - t1)
        cyc.append(t2 - t0)
    return {"acquire": summary(acq), "release": summary(rel), "cycle": summary(cyc)}


def bench_compare(
    *, cycles: int, paced_cycles: int, naive_handoffs: int, naive_poll: float, gcslock_handoffs: int, gcslock_lease: int
) -> dict[str, Any]:
    """Ours, gcslock and seed 003's naive lock, on the same emulator in the same run.

    ``cycles`` uncontended cycles of each (``paced_cycles`` of ours at the default pacing, a second each);
    ``naive_handoffs`` of the naive lock polling every ``naive_poll`` s, ``gcslock_handoffs`` of gcslock
    with a ``gcslock_lease``-second lease.
    """
    import gcslock

    quiet_gcslock()
    n = cycles
    out: dict[str, Any] = {"cycles": n}
    backend = GcsBackend()
    p = backend.prefix("compare")

    # -- acquire/release cycles (no contention)
    store, counter = backend.store()
    sched = Scheduler(autostart=False)
    ours = backend.lock(store, p + "ours.json", scheduler=sched, min_write_interval=0.0)
    ours.acquire(blocking=False)
    ours.release()  # the object exists from now on: each cycle below takes a free lock
    c0 = counter.snapshot()
    out["ours"] = cycle_latency(lambda: ours.acquire(blocking=False), ours.release, n)
    out["ours"]["requests_per_cycle"] = round(sum(diff(c0, counter.snapshot()).values()) / n, 2)
    paced = backend.lock(store, p + "ours-paced.json", scheduler=sched)  # the GCS default: 1 write/s per object
    out["ours_paced"] = cycle_latency(lambda: paced.acquire(blocking=False), paced.release, paced_cycles)
    store.close()

    g = gcslock.GcsLock()
    # private (gcslock's, google-cloud-storage's): each lock's HTTP session, to count the requests it sends
    gcount = HttpCount(g._accessor._authed_session)
    held: list[Any] = []
    g0 = gcount.snapshot()
    out["gcslock"] = cycle_latency(
        lambda: held.append(g.acquire(BUCKET, p + "gcslock.lock", expires_seconds=60)),
        lambda: g.release(held.pop()),
        n,
    )
    out["gcslock"]["requests_per_cycle"] = round(sum(diff(g0, gcount.snapshot()).values()) / n, 2)

    naive = NaiveLock(BUCKET, p + "naive.lock")
    # private: as above
    ncount = HttpCount(naive.client._http)
    naive.lock()
    naive.unlock()  # the first use also fetches the bucket; count steady cycles only
    n0 = ncount.snapshot()
    out["naive"] = cycle_latency(naive.lock, naive.unlock, n)
    out["naive"]["requests_per_cycle"] = round(sum(diff(n0, ncount.snapshot()).values()) / n, 2)

    # -- requests per operation
    ops: dict[str, dict[str, Any]] = {"gcslock": {}, "naive": {}}
    key = p + "gcslock-ops.lock"
    c, state = spent(gcount, lambda: g.acquire(BUCKET, key, expires_seconds=60))
    ops["gcslock"]["acquire, object absent"] = as_counts(c)
    c, state = spent(gcount, lambda: g.acquire(BUCKET, key, expires_seconds=60))
    ops["gcslock"]["renew (acquire again while holding)"] = as_counts(c)
    ops["gcslock"]["release"] = as_counts(spent(gcount, lambda: g.release(state))[0])
    other = gcslock.GcsLock()
    # private: as above
    ocount = HttpCount(other._accessor._authed_session)
    held_state = g.acquire(BUCKET, key, expires_seconds=60)
    c, _ = spent(ocount, lambda: _swallow(lambda: other.acquire(BUCKET, key, expires_seconds=60, max_wait_seconds=0)))
    ops["gcslock"]["acquire, held by another (no wait)"] = as_counts(c)
    g.release(held_state)
    key = p + "naive-ops.lock"
    first = NaiveLock(BUCKET, key)
    # private: as above
    fcount = HttpCount(first.client._http)
    ops["naive"]["acquire, object absent (first use of a client)"] = as_counts(spent(fcount, first.lock)[0])
    first.unlock()
    ops["naive"]["acquire, object absent"] = as_counts(spent(fcount, first.lock)[0])
    second = NaiveLock(BUCKET, key)
    # private: as above
    scount = HttpCount(second.client._http)
    second.lock()  # fails: held; also the client's first use
    ops["naive"]["acquire attempt while held (one poll)"] = as_counts(spent(scount, second.lock)[0])
    ops["naive"]["release"] = as_counts(spent(fcount, first.unlock)[0])
    out["requests"] = ops

    # -- handoff: a second thread waits while the first holds
    out["naive_handoff"] = naive_handoff(p, naive_handoffs, naive_poll)
    out["gcslock_handoff"] = gcslock_handoff(p, gcslock_handoffs, expires=gcslock_lease)
    return out


def _swallow(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as exc:
        return exc


def naive_handoff(p: str, n: int, poll: float) -> dict[str, Any]:
    """Seed 003's lock: the owner releases at a stratified point of the waiter's poll cycle (5 s as published)."""
    key = p + "naive-handoff.lock"
    owner, waiter = NaiveLock(BUCKET, key, poll_seconds=poll), NaiveLock(BUCKET, key, poll_seconds=poll)
    # private (google-cloud-storage's): the session, to count the waiter's requests
    wcount = HttpCount(waiter.client._http)
    samples = []
    for phase in phases(n):
        if not owner.lock():
            raise RuntimeError("naive: could not take the free lock")
        before = sum(wcount.snapshot().values())
        got: list[float] = []
        thread, result = run_in_thread(lambda: (waiter.wait_for_lock(60), got.append(time.monotonic())))
        deadline = time.monotonic() + 10
        while sum(wcount.snapshot().values()) == before and time.monotonic() < deadline:
            time.sleep(0.001)  # until the waiter's first attempt failed; its 5 s sleep starts now
        time.sleep(phase * waiter.poll_seconds)
        owner.unlock()
        released = time.monotonic()
        thread.join(waiter.poll_seconds * 3 + 10)
        if not got:
            raise RuntimeError(f"naive: the waiter did not get the lock: {result}")
        samples.append(got[0] - released)
        waiter.unlock()
    return {"poll_s": waiter.poll_seconds, **summary(samples)}


def gcslock_handoff(p: str, n: int, expires: int) -> dict[str, Any]:
    """gcslock: a waiter that finds the lock held sleeps until the lease expires, whatever the owner does.

    The owner releases at a stratified point of its ``expires``-second lease.
    """
    import gcslock

    owner, waiter = gcslock.GcsLock(), gcslock.GcsLock()
    key = p + "gcslock-handoff.lock"
    # private (gcslock's): its HTTP session, to count the waiter's requests
    wcount = HttpCount(waiter._accessor._authed_session)
    samples = []
    for phase in phases(n):
        state = owner.acquire(BUCKET, key, expires_seconds=expires)
        taken = time.monotonic()
        before = sum(wcount.snapshot().values())
        got: list[float] = []
        thread, result = run_in_thread(
            lambda: got.append((waiter.acquire(BUCKET, key, expires_seconds=expires, max_wait_seconds=expires * 3), time.monotonic()))
        )
        deadline = time.monotonic() + 10
        while sum(wcount.snapshot().values()) < before + 3 and time.monotonic() < deadline:
            time.sleep(0.001)  # bucket check, read (held), read of the release time: now it sleeps
        time.sleep(max(0.0, taken + phase * expires * 0.9 - time.monotonic()))
        owner.release(state)
        released = time.monotonic()
        thread.join(expires * 3 + 10)
        if not got:
            raise RuntimeError(f"gcslock: the waiter did not get the lock: {result}")
        state2, acquired = got[0]
        samples.append(acquired - released)
        waiter.release(state2)
    return {"lease_s": expires, **summary(samples)}
