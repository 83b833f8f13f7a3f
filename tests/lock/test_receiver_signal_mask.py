"""A receiver's processes can be stopped: the notifier thread does not keep the scheduler's blocked signal mask.

core/threads.py says every library thread blocks asynchronous signals, with one
exception: the notifier thread that runs ``on_release_requested`` and the other
receivers, because a process started from user code would inherit the blocked
mask. But a thread inherits the mask of the thread that creates it, and the
notifier is started from the scheduler thread (``Duties.run_due`` -> ``Notifier.notify``),
which blocked everything first thing. Nothing unblocks it. So a receiver that
starts a process (a checkpoint uploader, ``subprocess.run(["gsutil", ...])``)
starts it with SIGTERM, SIGINT, SIGHUP... blocked: it cannot be stopped by
SIGTERM and its own handlers never run.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import threading
import uuid

import pytest
from lockutil import make_lock

from handofflock import AcquireCancelled, signals
from handofflock.storage import MemoryStorage

pytestmark = pytest.mark.timeout(60)


def _blocked_in_child() -> set[int]:
    out = subprocess.run(["cat", "/proc/self/status"], capture_output=True, text=True, check=True).stdout
    mask = int(next(line for line in out.splitlines() if line.startswith("SigBlk:")).split()[1], 16)
    return {n for n in range(1, 65) if mask & (1 << (n - 1))}


def test_a_release_requested_receiver_starts_processes_that_sigterm_can_stop():
    name = f"edge-{uuid.uuid4().hex[:8]}"
    url = f"memory://{name}/locks/l.json"
    owner, waiter = make_lock(url), make_lock(url)
    seen: dict[str, object] = {}
    done = threading.Event()

    def receiver(sender, **kw):
        seen["thread"] = threading.current_thread().name
        seen["thread_mask"] = set(signal.pthread_sigmask(signal.SIG_BLOCK, []))
        seen["child_mask"] = _blocked_in_child()
        done.set()

    signals.on_release_requested.connect(receiver, sender=owner)
    try:
        assert owner.acquire()
        def wait() -> None:
            with contextlib.suppress(AcquireCancelled):  # the test ends by cancelling it
                waiter.acquire(timeout=20)

        t = threading.Thread(target=wait, daemon=True)
        t.start()
        assert done.wait(20), "on_release_requested never came"
        assert signal.SIGTERM not in seen["thread_mask"], (
            f"receiver runs in {seen['thread']} with {len(seen['thread_mask'])} signals blocked (SIGTERM among them)"
        )
        assert signal.SIGTERM not in seen["child_mask"], "a process started by the receiver has SIGTERM blocked"
    finally:
        signals.on_release_requested.disconnect(receiver, sender=owner)
        waiter.cancel()
        if owner.is_held:
            owner.release()
        t.join(10)
        owner._unschedule()  # private: stop its renewals without releasing
        waiter._unschedule()  # private: stop its renewals without releasing
        MemoryStorage.forget(name)
