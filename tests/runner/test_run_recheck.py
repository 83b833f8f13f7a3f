"""run reads a declined waiter's request again each interval: one read that falls while the waiter re-registers
must not leave the waiter waiting for the command to end.

Interleaving (all of it real writes to a real store; the proxy below only
times them): the holder's check sees waiter W (id and instance) and raises
request R. ``run`` re-reads before signalling the command; that read lands
in the instant W's slot is empty: W's ``acquire(timeout=...)`` ran out and
gave the slot back, and W's retry loop registers again right after (same
lock instance, so same id and instance). ``run`` marks R declined. The
holder's checks never saw W leave, so R is never withdrawn and no new
request comes: ``lock.release_request is declined`` stays true, and run
never signals the command. W waits for the command to end by itself
(forever for a server), though the holder says ``release_requested``.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from lockutil import eventually

from handofflock import cli
from handofflock import runner as runner_module
from handofflock.core.record import LockRecord
from handofflock.runner import CommandRunner
from handofflock.storage import MemoryStorage

pytestmark = pytest.mark.timeout(90)


class GapAtRecheck:
    """The store, except that run's re-check read happens while W's slot is briefly empty."""

    def __init__(self, inner, key):
        self.inner, self.key, self.url = inner, key, inner.url
        self.gaps = 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def _set_waiter(self, waiter: bool) -> None:
        data, gen = self.inner.read(self.key)
        r = LockRecord.decode(data)
        if waiter:
            r = r.replace(waiting_owner_id="W", waiter_expires_at=time.time() + 30, waiter_ttl=30.0,
                          waiter_instance="feedfacefeedface")
        else:
            r = r.replace(waiting_owner_id=None, waiter_expires_at=None, waiter_ttl=None, waiter_instance=None)
        self.inner.write(self.key, r.encode(), if_generation_match=gen)

    def read(self, key, **kw):
        if threading.current_thread().name == "handofflock-run-recheck" and self.gaps == 0:
            self.gaps += 1
            self._set_waiter(False)  # W's acquire(timeout) ran out: it gives the slot back
            try:
                return self.inner.read(key, **kw)  # run's re-check read
            finally:
                self._set_waiter(True)  # W's retry registers again (same instance)
        return self.inner.read(key, **kw)


def run_while(runner: CommandRunner, name: str, arrives) -> tuple[int, float]:
    """``runner.run()`` while ``arrives`` runs in a thread; its exit code and seconds. Forgets the store ``name``."""
    threading.Thread(target=arrives, daemon=True).start()
    started = time.monotonic()
    try:
        code = runner.run()
        return code, time.monotonic() - started
    finally:
        runner.lock._unschedule()  # private: stop its renewals (the store is forgotten next)
        MemoryStorage.forget(name)


def test_run_signals_a_waiter_it_once_read_as_gone_while_its_request_still_stands(monkeypatch):
    monkeypatch.setattr(runner_module, "RECHECK_TIMEOUT", 0.1)  # a declined request read again sooner (memory://)
    name = f"edge-{uuid.uuid4().hex[:8]}"
    url = f"memory://{name}/locks/l.json"
    # private: CommandRunner takes parsed arguments; cli's own parser makes them as `handofflock run` would
    args = cli._parser().parse_args(
        ["run", url, "--ttl", "5", "--grace", "1", "--poll-interval", "0.1", "--min-hold", "0"]
    )
    args.command = ["sleep", "15"]
    runner = CommandRunner(args)
    lock = runner.lock
    proxy = GapAtRecheck(lock.storage, lock.key)
    lock._io.storage = proxy  # private: run makes its own lock; the proxy must sit between it and its store

    def waiter_arrives():
        eventually(lambda: lock.is_held, timeout=20, what="run holds the lock")
        time.sleep(0.1)  # run settles as the holder first
        proxy._set_waiter(True)  # W registers as the waiter

    code, took = run_while(runner, name, waiter_arrives)
    assert proxy.gaps == 1, "run never re-checked the request"
    # W is the waiter all along (the holder's own checks never saw it gone): run must ask the
    # command to stop (exit 143 after SIGTERM) within a few grace periods, not wait out `sleep 15`.
    assert code == 143 and took < 10, f"run exited {code} after {took:.1f} s: the command was never asked to stop"


def test_run_signals_for_a_waiter_under_its_own_owner_id():
    """A second job that derived run's --owner-id waits in the slot (another instance): it is a waiter
    like any other, and run asks the command to stop for it, never taking it for itself."""
    name = f"same-id-{uuid.uuid4().hex[:8]}"
    url = f"memory://{name}/locks/l.json"
    # private: CommandRunner takes parsed arguments; cli's own parser makes them as `handofflock run` would
    args = cli._parser().parse_args(
        ["run", url, "--ttl", "5", "--grace", "1", "--poll-interval", "0.1", "--min-hold", "0", "--owner-id", "job-1"]
    )
    args.command = ["sleep", "15"]
    runner = CommandRunner(args)
    lock = runner.lock
    store = lock.storage

    def twin_arrives():
        eventually(lambda: lock.is_held, timeout=20, what="run holds the lock")
        data, gen = store.read(lock.key)
        r = LockRecord.decode(data).replace(waiting_owner_id="job-1", waiter_expires_at=time.time() + 30,
                                            waiter_ttl=30.0, waiter_instance="feedfacefeedface")
        store.write(lock.key, r.encode(), if_generation_match=gen)

    code, took = run_while(runner, name, twin_arrives)
    assert code == 143 and took < 10, f"run exited {code} after {took:.1f} s: the command was never asked to stop"
