"""The callbacks a signal handler registers with ``then_after_deferred_release`` (the release-on-signal handler's
"end the process once every deferred release ran"): run once, in the thread the signal interrupted, after the
release landed, whatever another thread does with the same lock meanwhile (a status() from a progress thread)."""

from __future__ import annotations

import os
import signal
import threading
import uuid

import pytest
from lockutil import make_lock, raw_read
from signalsutil import kills, restore_signals  # noqa: F401

from handofflock import os_signals
from handofflock.core.errors import AcquireCancelled
from handofflock.storage import MemoryStorage

pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX signals")


@pytest.fixture
def url():
    name = f"deferred-{uuid.uuid4().hex[:8]}"
    yield f"memory://{name}/lock.json"
    MemoryStorage.forget(name)


def _status_in_another_thread(lock) -> list[BaseException]:
    """``lock.status()`` from a second thread (a progress thread), run to its end; what it raised."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            lock.status()
        except BaseException as exc:
            raised.append(exc)

    t = threading.Thread(target=run)
    t.start()
    t.join(10)
    assert not t.is_alive()
    return raised


def _holder_and_waiter(url, monkeypatch):
    killed = kills(monkeypatch)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    holder = make_lock(url, release_on_signal=True)
    assert holder.acquire()
    assert signal.getsignal(signal.SIGTERM) is os_signals._release_and_reraise
    waiter = make_lock(url, release_on_signal=True, owner_id="waiter")
    return killed, holder, waiter


def test_a_status_in_another_thread_while_the_stopped_acquire_releases_the_handed_lock_lets_sigterm_end_it(
    url, restore_signals, monkeypatch
):
    """One process holds the lock; a second HandoffLock of it waits in the main thread (the job that waits on
    itself of tests/processes/test_exit_release.py). SIGTERM releases the hold, handing it to that waiter, and
    defers the waiter's release: its acquire, stopped, releases the handed lock itself (``_leave_slot`` clears
    ``_deferred``). While that release write is out, a progress thread calls ``waiter.status()``: its
    ``_guarded`` exit finds the callbacks pending and runs the handler's "end the process" in that thread,
    before the release landed; ``signal.signal`` refuses there (ValueError out of status()), the callbacks are
    gone, and the process never ends (the exit-0 bug the deferred callbacks were made to fix)."""
    killed, _holder, waiter = _holder_and_waiter(url, monkeypatch)
    store = MemoryStorage.named(url.split("/")[2])
    writes: list[str] = []
    raised: list[BaseException] = []
    record_when_status_ran: list[object] = []

    def after_write(op, key, result):
        writes.append(op)
        if len(writes) == 1:  # the waiter's registration: it waits now
            signal.raise_signal(signal.SIGTERM)  # the handler runs here, in the main thread, inside acquire()

    def before_write(op, key):
        if len(writes) == 2:  # the handoff landed; this is the stopped acquire's release of the handed lock
            record_when_status_ran.append(raw_read(url)[0].owner_id)
            raised.extend(_status_in_another_thread(waiter))

    store.faults.after("write", after_write)
    store.faults.before("write", before_write)
    try:
        with pytest.raises(AcquireCancelled):
            waiter.acquire(timeout=10)
    finally:
        store.faults.clear()
    assert record_when_status_ran == ["waiter"], "the status() ran while the handed lock was being released"
    assert raw_read(url)[0].owner_id is None
    assert not raised, f"status() in the progress thread raised {raised!r}"
    assert killed == [signal.SIGTERM], f"the signal never took its default action: {killed!r}"


def test_a_status_in_another_thread_before_the_waiting_acquire_sees_the_deferred_release_lets_sigterm_end_it(
    url, restore_signals, monkeypatch
):
    """As above, but the progress thread's status() returns in the poll interval between the signal and the
    waiting acquire's next look at ``_deferred``: its ``_guarded`` exit takes the deferred release (no release:
    the waiter is WAITING) and runs the handler's callbacks in that thread (ValueError from ``signal.signal``).
    The acquire never sees it was stopped, takes the lock handed to it and returns: the job goes on holding
    the lock after SIGTERM, and the process does not end."""
    killed, _holder, waiter = _holder_and_waiter(url, monkeypatch)
    store = MemoryStorage.named(url.split("/")[2])
    writes: list[str] = []
    raised: list[BaseException] = []

    def after_write(op, key, result):
        writes.append(op)
        if len(writes) == 1:  # the waiter's registration: it waits now
            signal.raise_signal(signal.SIGTERM)
            raised.extend(_status_in_another_thread(waiter))

    store.faults.after("write", after_write)
    got = None
    try:
        with pytest.raises(AcquireCancelled):
            got = waiter.acquire(timeout=10)
    finally:
        store.faults.clear()
        if waiter.is_held:
            waiter.release()
    assert got is None
    assert not raised, f"status() in the progress thread raised {raised!r}"
    assert killed == [signal.SIGTERM], f"the signal never took its default action: {killed!r}"


def test_sigterm_inside_a_status_call_while_another_thread_waits_on_the_lock_ends_the_process_after_the_release(
    url, restore_signals, monkeypatch
):
    """The main thread holds the lock (``holder``); a worker thread waits on a second HandoffLock of it (``waiter``).
    SIGTERM lands while the main thread is inside ``waiter.status()``: the handler releases the holder (handing
    the lock to the waiter) and defers the waiter's release to that status() call's return. That return finds the
    waiter WAITING (its thread has not looked yet), releases nothing, and runs the "end the process" callbacks at
    once: the process dies with the lock handed to it, held by nobody alive until the lease runs out. The worker's
    acquire, its ``_deferred`` cleared, never stops: here, with the kill recorded instead, it takes the lock."""
    killed_with_owner: list[object] = []
    monkeypatch.setattr(os_signals.os, "kill", lambda pid, sig: killed_with_owner.append(raw_read(url)[0].owner_id))
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    holder = make_lock(url, release_on_signal=True)
    assert holder.acquire()
    waiter = make_lock(url, release_on_signal=True, owner_id="waiter")
    store = MemoryStorage.named(url.split("/")[2])
    registered = threading.Event()
    store.faults.after("write", lambda op, key, result: registered.set())
    outcome: list[object] = []

    def wait() -> None:
        try:
            outcome.append(waiter.acquire(timeout=5))
        except BaseException as exc:
            outcome.append(exc)

    t = threading.Thread(target=wait)
    t.start()
    assert registered.wait(5)
    store.faults.clear()
    fired: list[bool] = []

    def signal_in_status(op, key):
        if not fired:
            fired.append(True)
            signal.raise_signal(signal.SIGTERM)  # runs here, in the main thread, inside waiter.status()

    store.faults.before("read", signal_in_status)
    try:
        waiter.status()
    finally:
        store.faults.clear()
    t.join(10)
    if waiter.is_held:
        waiter.release()
    assert killed_with_owner, "the signal never took its default action"
    assert killed_with_owner == [None], f"the process was ended with the lock handed to it: {killed_with_owner!r}"
    assert isinstance(outcome[0], AcquireCancelled), outcome
