"""Helpers for lock tests: URLs per backend, fast timing, polling with a bound."""

from __future__ import annotations

import itertools
import time
import uuid
from typing import Any, Callable

from handofflock import HandoffLock
from handofflock.record import LockRecord
from handofflock.storage import open_url

_n = itertools.count()

#: Fast but valid timing for tests: ttl > renew_deadline > renew_interval.
FAST = dict(
    ttl=1.5,
    renew_interval=0.2,
    renew_deadline=0.8,
    waiter_ttl=1.0,
    waiter_check_interval=0.1,
    waiter_poll_interval=0.05,
    max_clock_skew=0.1,
    min_write_interval=0.0,
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
    raise AssertionError(kind)


def make_lock(url: str, **overrides: Any) -> HandoffLock:
    return HandoffLock(url, **{**FAST, **overrides})


def raw_read(url: str) -> tuple[LockRecord | None, int]:
    store, key = open_url(url)
    found = store.read(key)
    if found is None:
        return None, 0
    return LockRecord.decode(found[0]), found[1]


def raw_write(url: str, record: LockRecord, generation: int) -> int:
    store, key = open_url(url)
    return store.write(key, record.encode(), if_generation_match=generation)


def eventually(cond: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not become true within {timeout} s")
        time.sleep(interval)
