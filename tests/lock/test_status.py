"""``status()`` never holds the lock's I/O mutex, so its retries cannot hold up a renewal.

``HandoffLock.status()`` reads under ``self._io`` with a 30 s deadline, and
``read_retrying`` sleeps its backoff *inside* that mutex. ``handofflock run``
now calls ``status()`` while it holds the lock (the re-check before it signals
or kills, in a helper thread that it abandons after 2 s: the thread goes on).
During a burst of transient read errors (503s on reads while writes go
through), the renewal on the scheduler thread waits for ``_io`` the whole
time; the renew deadline passes and the lock is declared lost, though every
renewal write would have landed. (The scheduler thread is shared by all locks
of the process, so their duties wait too.)
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from lockutil import make_lock

from handofflock.core.errors import TransientStorageError
from handofflock.storage import MemoryStorage

pytestmark = pytest.mark.timeout(60)


class ReadOutage:
    def __init__(self, inner):
        self.inner, self.url = inner, inner.url
        self.until = 0.0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def read(self, key, **kw):
        if time.monotonic() < self.until:
            raise TransientStorageError("503 on read (injected)", key=key, ambiguous=False)
        return self.inner.read(key, **kw)


def test_a_status_read_riding_out_a_read_outage_never_holds_up_renewal():
    name = f"edge-{uuid.uuid4().hex[:8]}"
    store = ReadOutage(MemoryStorage.named(name))
    from handofflock import HandoffLock
    from lockutil import FAST

    lock = HandoffLock("unused", storage=store, key="l.json", **FAST)  # ttl 1.5, renew_deadline 0.8
    try:
        assert lock.acquire()
        store.until = time.monotonic() + 4.0  # reads fail for 4 s; writes (renewals) still land
        t = threading.Thread(target=lambda: lock.status(), daemon=True)  # as run's re-check thread does
        t.start()
        lost_at = None
        end = time.monotonic() + 4.0
        while time.monotonic() < end:
            if not lock.healthy:
                lost_at = 4.0 - (end - time.monotonic())
                break
            time.sleep(0.02)
        assert lost_at is None, (
            f"the lock went unhealthy {lost_at:.2f} s into a read-only outage: status() held _io through its "
            "retries and the renewal (a write, which would have landed) could not run"
        )
    finally:
        store.until = 0.0
        lock._unschedule()  # private: stop its renewals without releasing
        MemoryStorage.forget(name)
