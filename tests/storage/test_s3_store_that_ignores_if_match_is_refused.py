"""An S3-compatible store that ignores If-Match / If-None-Match is refused, never raced on (issue 25).

With the conditions stripped (the fault proxy's ``strip_conditions``, in front
of the real moto server the tests start) every racing writer used to win.
Now the store is probed once, before its first write, and refused with
``LockingUnsupported``; moto itself, which honours both, passes the probe.
"""

from __future__ import annotations

import threading
import uuid
from urllib.parse import unquote

import pytest

from handofflock import HandoffLock, LockingUnsupported
from handofflock.storage.s3 import S3Storage
from handofflock.testing.faultproxy import Exchange, FaultProxy

pytestmark = pytest.mark.s3
KEY = "locks/job.json"


@pytest.fixture(scope="module")
def raw(s3_server):
    """One plain boto3 client on moto for the module's checks behind the locks' backs (a client costs a
    tenth of a second to make, seconds on a loaded machine: one per check held the proxy's requests)."""
    import boto3

    return boto3.client("s3", endpoint_url=s3_server.url)


@pytest.fixture
def bucket(s3_server):
    name = f"p-{uuid.uuid4().hex[:16]}"
    s3_server.create_bucket(name)
    return name


def keys(raw, bucket: str) -> list[str]:
    listed = raw.list_objects_v2(Bucket=bucket).get("Contents", [])
    return [o["Key"] for o in listed]


def test_a_store_that_honours_the_conditions_passes_the_probe_once_and_keeps_no_scratch_key(s3_server, bucket, raw):
    store = S3Storage(bucket, endpoint_url=s3_server.url)
    lock = HandoffLock(f"s3://{bucket}/{KEY}", storage=store, key=KEY, ttl=5.0)
    assert lock.acquire(timeout=10)
    lock.release()
    # private: whether the conditional-write probe has run; it leaves nothing public behind when it passes
    assert store._probed and keys(raw, bucket) == [KEY]


def exists(raw, ex: Exchange) -> bool:
    """Whether the object a request of the proxy's is aimed at exists now (asked of moto, not through the proxy)."""
    import botocore.exceptions

    bucket, _, key = unquote(ex.path.lstrip("/")).partition("/")
    try:
        raw.head_object(Bucket=bucket, Key=key)
    except botocore.exceptions.ClientError:
        return False
    return True


@pytest.mark.parametrize(
    "stripped", [None, "if-none-match", "if-match-on-existing"], ids=["both", "if-none-match-only", "if-match-on-existing"]
)
def test_racing_writers_on_a_store_that_ignores_the_conditions_are_all_refused(s3_server, bucket, raw, stripped):
    """16 locks race for one object through a proxy that strips the conditions: before, all 16
    acquired it; now each is refused with LockingUnsupported and none writes the lock object.

    ``if-match-on-existing``: a store that refuses a wrong If-Match on a missing key (there is
    nothing to replace) but replaces an existing object whatever its ETag. The probe's first
    check passes there; its check over an existing scratch object refuses the store."""
    with FaultProxy(s3_server.url, lifetime=60, dialect="s3") as proxy:
        if stripped is None:
            proxy.inject("strip_conditions", method="PUT", times=10_000, probes=True)
        elif stripped == "if-none-match":  # a MinIO older than 2024-05: If-Match honoured, If-None-Match ignored
            proxy.inject("strip_conditions", method="PUT", times=10_000, probes=True,
                         when=lambda ex: "if-none-match" in ex.headers)
        else:
            proxy.inject("strip_conditions", method="PUT", times=10_000, probes=True,
                         when=lambda ex: "if-match" in ex.headers and exists(raw, ex))
        results: list[object] = []

        def race() -> None:
            store = S3Storage(bucket, endpoint_url=proxy.url, timeout=(2.0, 5.0))
            # ttl 20: 3.75 s a request. At ttl 5 (0.94 s) sixteen new clients on one moto, on a loaded
            # machine, timed out before the probe could tell (the verdict the test is about).
            lock = HandoffLock(f"s3://{bucket}/{KEY}", storage=store, key=KEY, ttl=20.0)
            try:
                results.append(lock.acquire(timeout=10))
            except Exception as exc:  # collected for the assertions below
                results.append(exc)

        threads = [threading.Thread(target=race) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert len(results) == 16 and all(isinstance(r, LockingUnsupported) for r in results), results
    message = str(results[0])
    named = {None: "If-Match on PUT", "if-none-match": "If-None-Match", "if-match-on-existing": "existing object"}
    assert named[stripped] in message and "docs/storage.md" in message
    assert KEY not in keys(raw, bucket)
