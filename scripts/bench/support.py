"""Shared by every section: constants, statistics, request counting, and where each backend's stores come from.

What the project's test support already has is used from there: the servers are
:class:`handofflock.testing.FakeGCSServer` and :class:`~handofflock.testing.MotoS3Server` (started in
``__main__``), the clock is :class:`handofflock.FakeClock`, and a delayed round trip is
:class:`~handofflock.testing.FaultProxy`'s ``delay`` fault (scale.py). What stays here is the bench's own:

- counting requests, synchronously, per store instance: :class:`HttpCount` on a GCS client's HTTP
  session (also gcslock's and the naive lock's, which a proxy could not tell apart from ours without
  adding a hop to every latency measured), :class:`BotoCount` on a boto3 client's events, and
  :class:`CountingStorage` around a local store (its "request" is a storage call);
- :class:`Backend`: a fresh store instance (own connections) with its counter, for each party of an
  operation, so that each side's requests are counted alone;
- the statistics (nearest-rank percentiles, stratified phases) and the report's units.
"""

from __future__ import annotations

import math
import random
import statistics
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from handofflock import FakeClock, HandoffLock, LockRecord  # noqa: E402
from handofflock.core.record import Holder  # noqa: E402
from handofflock.storage.gcs import GCSStorage  # noqa: E402
from handofflock.storage.base import S3_PROBE_MARK as PROBE_MARK  # noqa: E402

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

    def list(self, prefix: str, **kw: Any) -> dict[str, int]:
        self._count("list")
        return self.inner.list(prefix, **kw)

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
        kw.setdefault("min_hold", 0.0)  # the bench measures the mechanics: a holder is asked at once
        return cls(f"{store.url}/{key}", storage=store, key=key, **kw)


class GcsBackend(Backend):
    name = "gcs"

    def store(self) -> tuple[Any, Any]:
        s = GCSStorage(BUCKET)
        # private (google-cloud-storage's): the client's HTTP session sees every request it sends
        return s, HttpCount(s.client._http)


class S3Backend(Backend):
    """The S3 backend on moto's server: HTTP requests counted by botocore operation."""

    name = "s3"

    def store(self) -> tuple[Any, Any]:
        from handofflock.storage.s3 import S3Storage

        s = S3Storage(BUCKET)
        return s, BotoCount(s.client)


class BotoCount:
    """Counts, by kind, the HTTP requests one boto3 S3 client sends (a ``before-send`` hook).

    The S3 store's probe of the server's conditional writes (a scratch key beside the lock's, once
    per store instance, before its first request) is left out, as :meth:`FaultProxy.exchanges
    <handofflock.testing.FaultProxy.exchanges>` leaves it out: it is no request of the operation
    that happens to come first, and every party here has a fresh store.
    """

    KINDS = {"GetObject": "read", "PutObject": "write", "ListObjectsV2": "list", "DeleteObject": "delete"}

    def __init__(self, client: Any) -> None:
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        client.meta.events.register("before-send.s3", self._count)

    def _count(self, request: Any = None, event_name: str = "", **_: Any) -> None:
        op = event_name.rsplit(".", 1)[-1]
        if request is not None and PROBE_MARK in getattr(request, "url", ""):
            return None
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


def step(clock: FakeClock, thread: threading.Thread | None = None) -> None:
    """Let a waiter on ``clock`` finish its poll sleep, and wait until it is asleep again (or, with
    ``thread``, until that thread ends: the waiter is expected to be done)."""
    n = len(clock.waits)
    clock.advance(clock.waits[-1])
    if thread is not None:
        thread.join(10)
    else:
        clock.wait_for_waits(n + 1)


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
    return LockRecord(Holder("crashed-host:1:dead", now - 600), ttl=60.0, token=1, nonce="x").encode()
