"""The lock against the faults storage-testbench makes itself, through its Retry Test API.

The fault proxy imitates a server's faults from outside; these are Google's emulator's own: a 503
or 429 answered by the server, a connection it resets, a download it breaks off or stalls mid-body.
Each request of the lock's store carries the test's ``x-retry-test-id``, so each instruction hits
the lock's next request of its kind, once. Run with ``STORAGE_EMULATOR_HOST`` naming a
storage-testbench (docs/storage.md); on fake-gcs-server, which has no such API, they skip.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid

import pytest
from lockutil import FAST, raw_read

from handofflock import HandoffLock, LockTimeout
from handofflock.storage.gcs import GCSStorage

KEY = "locks/a.json"

pytestmark = pytest.mark.gcs


class Faults:
    """Retry Tests on the session's emulator, and locks whose every request names one."""

    def __init__(self, emulator) -> None:
        self.emulator = emulator
        self.bucket = f"r-{uuid.uuid4().hex[:16]}"
        emulator.create_bucket(self.bucket)
        self.url = f"gs://{self.bucket}/{KEY}"

    def _call(self, method: str, path: str, body: dict | None = None) -> dict:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.emulator.url + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=10) as reply:
            return json.load(reply)

    def plan(self, instructions: dict[str, list[str]]) -> str:
        """A Retry Test with ``instructions`` (per JSON API method, in order); its id."""
        try:
            return self._call("POST", "/retry_test", {"instructions": instructions})["id"]
        except urllib.error.HTTPError as exc:
            if exc.code in (400, 404, 405, 501):
                pytest.skip(f"the emulator at {self.emulator.url} has no Retry Test API (storage-testbench has)")
            raise

    def left(self, test_id: str) -> dict[str, list[str]]:
        """The instructions of ``test_id`` not yet used: empty once each fault was made."""
        return {m: rest for m, rest in self._call("GET", f"/retry_test/{test_id}")["instructions"].items() if rest}

    def lock(self, name: str, test_id: str | None = None, **timing) -> HandoffLock:
        store = GCSStorage(self.bucket, timeout=(1.0, 2.0))
        if test_id is not None:
            # private (google-cloud-storage's): the client's HTTP session, whose headers every request sends
            store.client._http.headers["x-retry-test-id"] = test_id
        return HandoffLock(self.url, storage=store, key=KEY, owner_id=name, **{**FAST, **timing})


@pytest.fixture
def faults(gcs_emulator):
    return Faults(gcs_emulator)


@pytest.mark.parametrize(
    "instructions",
    [["return-503", "return-503"], ["return-429"], ["return-reset-connection"]],
    ids=["503-twice", "429", "reset"],
)
def test_a_create_the_server_refuses_or_resets_is_retried_and_the_lock_is_held(faults, instructions):
    """The server turns the CREATE away (an answered 503 or 429, or a reset before it reads the upload):
    nothing was applied, and the lock, reading back or waiting out the answer, creates the record once."""
    test_id = faults.plan({"storage.objects.insert": instructions})
    a = faults.lock("A", test_id)
    try:
        assert a.acquire(timeout=10)
        assert faults.left(test_id) == {}, "the server did not make every fault"
        record, _ = raw_read(faults.url)
        assert record.owner_id == "A" and record.token == a.token
    finally:
        a.release()
    assert raw_read(faults.url)[0].owner_id is None


def test_a_read_the_server_breaks_off_mid_body_is_read_again_and_the_free_lock_taken(faults):
    """The record is there (free); the server sends part of it and closes the connection. A short
    record must never be decoded as the record: the lock reads again, then takes the lock."""
    first = faults.lock("X")
    assert first.acquire()
    first.release()
    test_id = faults.plan({"storage.objects.get": ["return-broken-stream"]})
    a = faults.lock("A", test_id)
    try:
        assert a.acquire(timeout=10)
        assert faults.left(test_id) == {}, "the server did not break the read"
        assert raw_read(faults.url)[0].owner_id == "A"
        assert a.token > first.token
    finally:
        a.release()


def test_a_read_the_server_stalls_is_cut_off_at_the_acquire_s_deadline(faults):
    """A holds the lock; the server stalls B's read for 6 s after sending nothing. acquire(timeout=1)
    ends with LockTimeout at its deadline (its one read allowed a second at least), not after the stall,
    and B left no trace in the record."""
    holder = faults.lock("A", ttl=30.0, renew_interval=10.0, renew_deadline=20.0)
    assert holder.acquire()
    try:
        test_id = faults.plan({"storage.objects.get": ["stall-for-6s-after-0K"]})
        b = faults.lock("B", test_id, ttl=30.0, renew_interval=10.0, renew_deadline=20.0)
        started = time.monotonic()
        with pytest.raises(LockTimeout):
            b.acquire(timeout=1.0)
        assert time.monotonic() - started < 4.0, "the acquire waited out the stall"
        assert faults.left(test_id) == {}, "the server did not stall the read"
        record, _ = raw_read(faults.url)
        assert record.owner_id == "A" and record.waiter is None
    finally:
        holder.release()
