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

from lockutil import FAST

from handofflock.core.errors import TransientStorageError


def test_a_status_read_riding_out_a_read_outage_never_holds_up_renewal(sim):
    lock = sim.lock("A", **FAST)  # ttl 1.5, renew_deadline 0.8
    assert sim.call(lock.acquire)
    until = sim.monotonic() + 4.0  # reads fail for 4 s; writes (renewals) still land

    def outage(op, key):
        if sim.monotonic() < until:
            raise TransientStorageError("503 on read (injected)", key=key, ambiguous=False)

    sim.store.faults.before("read", outage)
    sim.start(lock.status)  # as run's re-check thread does
    lost_at = None
    end = sim.monotonic() + 4.0
    while sim.monotonic() < end:
        if not lock.healthy:
            lost_at = 4.0 - (end - sim.monotonic())
            break
        sim.run_for(0.02)
    assert lost_at is None, (
        f"the lock went unhealthy {lost_at:.2f} s into a read-only outage: status() held _io through its "
        "retries and the renewal (a write, which would have landed) could not run"
    )
