"""Helpers for lock tests: URLs per backend, fast timing, polling with a bound."""

from __future__ import annotations

import itertools
import time
import uuid
from typing import Any, Callable

from handofflock import HandoffLock
from handofflock.core.record import LockRecord
from handofflock.storage import open_url

_n = itertools.count()

#: Fast but valid timing for tests: ttl > renew_deadline > renew_interval.
#:
#: Without write pacing (``min_write_interval=0``): these tests exercise the protocol's
#: logic at a ttl of 1.5 s, which GCS's one write per second per object cannot serve
#: (Timing refuses it: a ttl under 5 s on GCS). What users get, the store's default
#: pacing, is tested on its own: tests/processes/test_xproc_gcs.py (separate processes, default
#: pacing, ttl 5 and 60), tests/lock/test_renew.py, tests/lock/test_fork.py, the GCS runs of
#: tests/runner/test_cli.py, tests/lock/test_renew.py::test_renewal_keeps_a_lock_held_for_many_ttls
#: (simulated, writes 1 s apart), and the simulation (tests/sim/test_simulation.py), where 3 seeds in
#: 10 run at GCS pacing (ttl 5, writes 1 s apart).
FAST = dict(
    ttl=1.5,
    renew_interval=0.2,
    renew_deadline=0.8,
    waiter_ttl=1.0,
    waiter_check_interval=0.1,
    waiter_poll_interval=0.05,
    max_clock_skew=0.1,
    min_write_interval=0.0,
    min_hold=0.0,  # the handoff mechanics at once; the minimum hold's own tests set it
)


def url_for(kind: str, request: Any, tmp_path: Any, name: str = "train.json") -> str:
    """A fresh lock URL on the given backend."""
    unique = f"{next(_n)}-{uuid.uuid4().hex[:8]}"
    if kind == "memory":
        return f"memory://lock-{unique}/locks/{name}"
    if kind == "local":
        d = tmp_path / f"locks-{unique}"
        return (d / name).as_uri()
    if kind == "gcs":
        emulator = request.getfixturevalue("gcs_emulator")
        bucket = f"l{unique}"
        emulator.create_bucket(bucket)
        return f"gs://{bucket}/locks/{name}"
    if kind == "s3":
        server = request.getfixturevalue("s3_server")
        bucket = f"l{unique}"
        server.create_bucket(bucket)
        return f"s3://{bucket}/locks/{name}"
    raise AssertionError(kind)


#: FAST on S3: moto's server answers one request at a time from one Python process, and on a
#: loaded 2-core machine a reply can take most of a second (a 0.3 s request bound and a 0.8 s renew
#: deadline lost a healthy owner in CI). The same shape with a 1 s request bound.
FAST_S3 = {**FAST, "ttl": 4.0, "renew_interval": 0.3, "renew_deadline": 2.3, "waiter_ttl": 2.0}


def fast(url: str) -> dict[str, Any]:
    """The fast timing :func:`make_lock` gives a lock on ``url``."""
    return FAST_S3 if url.startswith("s3://") else FAST


def make_lock(url: str, **overrides: Any) -> HandoffLock:
    return HandoffLock(url, **{**fast(url), **overrides})


def raw_read(url: str) -> tuple[LockRecord | None, int]:
    store, key = open_url(url)
    found = store.read(key)
    if found is None:
        return None, 0
    return LockRecord.decode(found[0]), found[1]


def raw_write(url: str, record: LockRecord, generation: int) -> int:
    store, key = open_url(url)
    return store.write(key, record.encode(), if_generation_match=generation)


def raw_update(url: str, **changes: Any) -> int:
    """Change fields of the record behind a live lock's back, as another process would: read, then a
    conditional write, read again when a renewal landed in between (a 412). Returns the new generation."""
    from handofflock import PreconditionFailed

    for _ in range(20):
        record, generation = raw_read(url)
        assert record is not None, f"no record at {url}"
        try:
            return raw_write(url, record.replace(**changes), generation)
        except PreconditionFailed:
            continue
    raise AssertionError(f"20 writes to {url} in a row lost the race to the lock's own")


def eventually(cond: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not become true within {timeout} s")
        time.sleep(interval)


def stepped_until(clock: Any, cond: Callable[[], Any], within: float = 10.0, what: str = "condition") -> Any:
    """Let time pass on a stepping FakeClock (``step`` set: each step runs its tick callbacks, the locks'
    due duties) until ``cond()`` holds; ``within`` is in the clock's seconds."""
    end = clock.monotonic() + within
    while not (value := cond()):
        if clock.monotonic() >= end:
            raise AssertionError(f"{what} did not become true within {within} s of the fake clock")
        clock.run_for(clock.step)
    return value


def moved_on(clock: Any, seconds: float, timeout: float = 10.0) -> None:
    """Wait, in real time, until another thread waiting on a stepping FakeClock has moved it ``seconds`` on."""
    start = clock.monotonic()
    eventually(lambda: clock.monotonic() >= start + seconds, timeout=timeout, what=f"the fake clock moved {seconds} s on")
