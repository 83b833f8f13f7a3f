"""Sections 2, 3 and 4: handoff and notice latency between processes, and the hot path's cost."""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
import timeit
import uuid
from typing import Any

from bench.counts import bench_rtt  # noqa: E402
from bench.support import BUCKET, Backend, LocalStorage, phases, summary  # noqa: E402
from handofflock import HandoffLock, Scheduler, signals  # noqa: E402
from handofflock.storage.gcs import GCSStorage  # noqa: E402

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
    lock = HandoffLock(f"{store.url}/{key}", storage=store, key=key, min_write_interval=0.0, min_hold=0.0, **options)
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
            send("acquired", time.monotonic(), bool(ok))
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


def bench_hot_path(number: int = 200_000) -> dict[str, Any]:
    """Per-call cost of what a training loop calls every step, on a held lock (no I/O involved): the best
    of five timings of ``number`` calls each."""
    name = f"bench-hot-{uuid.uuid4().hex[:8]}"
    sched = Scheduler(autostart=False)
    # No renewals run (the scheduler is not started): a ttl of an hour keeps check() healthy however long the
    # timing takes on a loaded machine (past renew_deadline, check() raises LockLost).
    lock = HandoffLock(f"memory://{name}/locks/hot.json", scheduler=sched, ttl=3600.0)
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
            best = min(timeit.Timer(stmt, globals=env).repeat(repeat=5, number=number)) / number
            out[label] = round(best * 1e9, 1)
    finally:
        lock.release()
    return out
