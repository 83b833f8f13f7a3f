"""Review repros for the deferred release a signal handler leaves to the thread it interrupted: the
handler's callbacks ("end the process") must run only once no hold of ours is left in the record,
whatever another thread of the same lock is doing (a release write in flight)."""

from __future__ import annotations

import os
import signal
import threading
import uuid

import pytest
from lockutil import make_lock, raw_read
from signalsutil import kills, restore_signals  # noqa: F401

from handofflock import os_signals
from handofflock.storage import MemoryStorage

pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX signals")


@pytest.fixture
def url():
    name = f"deferred-review-{uuid.uuid4().hex[:8]}"
    yield f"memory://{name}/lock.json"
    MemoryStorage.forget(name)


def _kills_with_owner(monkeypatch, url) -> list[object]:
    """The "now" kill, recorded with the lock's owner in the record at that moment instead of sent."""
    killed: list[object] = []
    monkeypatch.setattr(os_signals.os, "kill", lambda pid, sig: killed.append(raw_read(url)[0].owner_id))
    return killed


def test_sigterm_inside_a_status_call_while_another_thread_releases_ends_the_process_after_that_release(
    url, restore_signals, monkeypatch
):
    """The main thread acquired the lock (the handler is armed); a worker thread calls ``release()`` (the
    job is done), its write out. SIGTERM lands while the main thread is inside ``lock.status()``: the
    handler finds the lock RELEASING and its release() is deferred to that status() call's return. That
    return finds the state RELEASING, not one of HELD/LOST/WAITING: it waits for nothing and runs "end the
    process" at once, while our hold is still in the record (a release at depth 0 would have waited for
    the I/O mutex, behind the worker's write)."""
    killed = _kills_with_owner(monkeypatch, url)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    lock = make_lock(url, release_on_signal=True, owner_id="job")
    assert lock.acquire()
    store = MemoryStorage.named(url.split("/")[2])
    writing, go = threading.Event(), threading.Event()
    main = threading.current_thread()

    def hold_release_write(op, key):
        if threading.current_thread() is not main and not writing.is_set():
            writing.set()
            go.wait(10)

    store.faults.before("write", hold_release_write)
    worker = threading.Thread(target=lock.release)
    worker.start()
    try:
        assert writing.wait(5)
        fired: list[bool] = []

        def signal_in_status(op, key):
            if threading.current_thread() is main and not fired:
                fired.append(True)
                signal.raise_signal(signal.SIGTERM)

        store.faults.before("read", signal_in_status)
        lock.status()
    finally:
        go.set()
        worker.join(10)
        store.faults.clear()
    assert fired
    assert killed, "the signal never took its default action"
    assert killed == [None], f"the process was ended with our hold in the record: {killed!r}"


def test_sigterm_inside_a_status_call_while_the_stopped_acquire_of_another_thread_releases_the_handed_lock(
    url, restore_signals, monkeypatch
):
    """The main thread holds the lock (``holder``); a worker thread waits on a second HandoffLock of it
    (``waiter``). SIGTERM lands while the main thread is inside ``waiter.status()``: the handler releases
    the holder (handing the lock to the waiter) and defers the waiter's release. The worker sees
    ``_deferred`` at its next poll first: its way out finds the lock handed to it, clears ``_deferred``
    and releases the handed lock itself. The main thread's status() returns while that release write is
    out: ``_carry_out_deferred`` finds nothing deferred and the state RELEASING, waits for nothing, and
    runs "end the process" with the handed lock still in the record (the guarantee the docstring states:
    "the callbacks never run while a slot or a handed lock of ours is in the record")."""
    killed = _kills_with_owner(monkeypatch, url)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    holder = make_lock(url, release_on_signal=True)
    assert holder.acquire()
    waiter = make_lock(url, release_on_signal=True, owner_id="waiter")
    store = MemoryStorage.named(url.split("/")[2])
    main = threading.current_thread()
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
    releasing, go = threading.Event(), threading.Event()
    states: list[object] = []

    def hold_handed_release(op, key):
        if threading.current_thread() is t and waiter._state.name == "RELEASING" and not releasing.is_set():
            states.append(waiter._state)
            releasing.set()
            go.wait(10)

    fired: list[bool] = []

    def signal_in_status(op, key):
        if threading.current_thread() is main and not fired:
            fired.append(True)
            signal.raise_signal(signal.SIGTERM)  # the holder released (handed to the waiter); waiter's deferred
            releasing.wait(10)  # the worker's way out is releasing the handed lock; this status() still runs

    store.faults.before("write", hold_handed_release)
    store.faults.before("read", signal_in_status)
    try:
        waiter.status()
    finally:
        go.set()
        t.join(10)
        store.faults.clear()
        if waiter.is_held:
            waiter.release()
    assert fired and releasing.is_set(), "the worker never released the handed lock"
    assert killed, "the signal never took its default action"
    assert killed == [None], f"the process was ended with the handed lock in the record: {killed!r}"


def test_a_keyboardinterrupt_from_one_deferred_callback_does_not_keep_sigterm_from_ending_the_process(
    url, restore_signals, monkeypatch
):
    """``install_signal_handlers(lock, [SIGINT])`` and the release-on-signal handler (SIGTERM) both act
    through ``then_after_deferred_release`` when their signal lands inside a call of the lock in the main
    thread (here a status()). Ctrl-C twice (the "now": its act raises KeyboardInterrupt), then SIGTERM,
    all inside that call: its return releases the lock, then runs the callbacks in order. The first raises
    KeyboardInterrupt and the loop stops there: SIGTERM's "end the process" is dropped with the list
    (already emptied), so a program that catches KeyboardInterrupt goes on running after SIGTERM. The
    handlers' own ``_act_all`` orders KeyboardInterrupt last and lets no raise keep the rest from acting."""

    killed = kills(monkeypatch)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    lock = make_lock(url, release_on_signal=True, owner_id="job")
    assert lock.acquire()
    assert signal.getsignal(signal.SIGTERM) is os_signals._release_and_reraise
    handlers = os_signals.install_signal_handlers(lock, [signal.SIGINT])
    store = MemoryStorage.named(url.split("/")[2])
    fired: list[bool] = []
    pending: list[int] = []

    def signals_in_status(op, key):
        if not fired:
            fired.append(True)
            signal.raise_signal(signal.SIGINT)  # a release request
            signal.raise_signal(signal.SIGINT)  # "now": the release deferred, KeyboardInterrupt after it
            signal.raise_signal(signal.SIGTERM)  # the release deferred (already), the default action after it
            pending.append(len(lock._after_deferred))

    store.faults.before("read", signals_in_status)
    try:
        with pytest.raises(KeyboardInterrupt):
            lock.status()
    finally:
        store.faults.clear()
        handlers.uninstall()
    assert pending == [2], "both handlers' acts were deferred to the status() call's return"
    assert raw_read(url)[0].owner_id is None
    assert killed == [signal.SIGTERM], f"SIGTERM never took its default action: {killed!r}"


def test_a_ctrl_c_as_the_outermost_call_takes_up_the_deferred_release_does_not_lose_it(
    url, restore_signals, monkeypatch
):
    """SIGTERM lands inside ``lock.status()`` in the main thread: release deferred, ``owes`` set. As that call's
    ``_guarded`` exit has cleared ``owes``, before ``_carry_out_deferred`` begins, a Ctrl-C's KeyboardInterrupt lands
    (a handler runs between any two bytecodes; here the assignment raises it, as the handler would there). The
    deferred release is then never carried out: nothing owes it any more, ``_deferred`` stays set, the lock stays
    held and renewed, and SIGTERM's "end the process" stays queued on a list nobody runs. (A later acquire that
    must wait then gives up at its first poll, hours later; a later SIGTERM finds the default action put back.)"""
    killed = kills(monkeypatch)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    lock = make_lock(url, release_on_signal=True, owner_id="job")
    assert lock.acquire()

    class CtrlCAsOwesIsCleared(threading.local):
        def __setattr__(self, name: str, value: object) -> None:
            super().__setattr__(name, value)
            if name == "owes" and value is False and not interrupted:
                interrupted.append(True)
                raise KeyboardInterrupt  # just after the assignment, before the next statement

    interrupted: list[bool] = []
    lock._depth = CtrlCAsOwesIsCleared()
    store = MemoryStorage.named(url.split("/")[2])
    fired: list[bool] = []

    def signal_in_status(op, key):
        if not fired:
            fired.append(True)
            signal.raise_signal(signal.SIGTERM)

    store.faults.before("read", signal_in_status)
    try:
        with pytest.raises(KeyboardInterrupt):
            lock.status()
        lock.status()  # the program goes on (it caught the Ctrl-C): a later call of the lock in this thread
    finally:
        store.faults.clear()
        held = lock.is_held
        if held:
            lock.release()
    assert interrupted
    assert not held, "the release SIGTERM deferred was never carried out: the lock is still held"
    assert killed == [signal.SIGTERM], f"SIGTERM never took its default action: {killed!r}"


_SIGTERM_WHILE_THE_SCHEDULER_MUTEX_IS_HELD = """
import signal, sys, threading
sys.path.insert(0, {support!r})
from lockutil import make_lock

signal.signal(signal.SIGTERM, signal.SIG_DFL)
a = make_lock("memory://review-a/lock.json", release_on_signal=True)
b = make_lock("memory://review-b/lock.json", release_on_signal=True)
assert a.acquire() and b.acquire()
scheduler = a._scheduler
assert scheduler is b._scheduler  # the process-wide one
real = scheduler._mutex
fired = []


class SignalOnceHeld:
    def __enter__(self):
        real.acquire()
        if not fired and threading.current_thread() is threading.main_thread():
            fired.append(True)
            signal.raise_signal(signal.SIGTERM)  # its handler runs here, the scheduler's mutex held
        return self

    def __exit__(self, *exc):
        real.release()

    def acquire(self, *args, **kw):
        return real.acquire(*args, **kw)

    def release(self):
        real.release()


scheduler._mutex = SignalOnceHeld()
a.release()
print("SIGTERM never ended the process", flush=True)
"""


@pytest.mark.xfail(
    strict=True,
    reason="known defect: with two locks held, SIGTERM landing while one lock's release holds the shared scheduler's "
    "mutex releases the other lock directly from the handler, which takes that mutex again: the process hangs",
)
def test_sigterm_while_the_main_thread_holds_the_scheduler_mutex_in_one_locks_call_ends_the_process():
    """Two locks held in the main thread, both released on SIGTERM. SIGTERM lands while the main thread is
    inside ``a.release()``, just as ``_stop_duties`` took the process-wide scheduler's (non-reentrant) mutex
    in ``discard``. The handler defers ``a``'s release (``a``'s depth is 1) but releases ``b`` at once (its
    depth in this thread is 0): ``b._stop_duties`` takes that same mutex, in the same thread, and the process
    hangs in the signal handler for good (the per-lock depth protects only the lock's own mutex). Run in a
    child process: here it is killed after 20 s."""
    import subprocess
    import sys
    from pathlib import Path

    support = str(Path(__file__).resolve().parents[1] / "support")
    script = _SIGTERM_WHILE_THE_SCHEDULER_MUTEX_IS_HELD.format(support=support)
    try:
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        pytest.fail("the process hung in the SIGTERM handler (deadlock on the scheduler's mutex)")
    assert done.returncode == -signal.SIGTERM, (done.returncode, done.stdout, done.stderr[-2000:])


@pytest.mark.xfail(
    strict=True,
    reason="known gap of the simulation: its primitives keep the lock's call depth in a threading.local, shared by "
    "every greenlet, so a release from another simulated thread takes the signal handler's deferred path",
)
def test_in_the_simulation_a_release_from_another_thread_waits_for_the_acquire_it_stops_as_a_real_thread_does(sim):
    """With real threads, ``release()`` from a second thread while the first waits in ``acquire()`` runs at
    once (that thread's depth is 0): it cancels the acquire and returns only once the acquire has ended
    (``_not_acquiring``). The simulation's primitives keep ``threading.local`` for ``_depth``, one for every
    greenlet (they share one OS thread): the second greenlet's release() sees the first's depth, takes the
    signal handler's path (``_deferred``, ``owes`` on the shared local) and returns None at once, the acquire
    still running. So the simulation never runs the release-while-acquiring path of real threads, and sets
    ``owes`` where no signal came."""
    owner = sim.lock("O")
    assert sim.call(owner.acquire)
    waiter = sim.lock("W")
    acquiring = sim.start(waiter.acquire, name="acquire")
    sim.run_until(lambda: waiter._state.name == "WAITING")
    sim.run_for(0.2)
    assert not acquiring, "the acquire should still be waiting"
    assert sim.call(waiter.release) is None
    assert waiter._state.name != "WAITING", "release() from another thread returned while the acquire still waited"


def test_with_real_threads_a_release_from_another_thread_waits_for_the_acquire_it_stops(url):
    """The real-thread counterpart of the simulation test above (it holds)."""
    owner = make_lock(url)
    assert owner.acquire()
    waiter = make_lock(url, owner_id="waiter")
    outcome: list[object] = []

    def wait() -> None:
        try:
            outcome.append(waiter.acquire(timeout=10))
        except BaseException as exc:
            outcome.append(exc)

    t = threading.Thread(target=wait)
    t.start()
    for _ in range(500):
        if raw_read(url)[0].waiting_owner_id == "waiter":
            break
        threading.Event().wait(0.01)
    assert waiter._state.name == "WAITING"
    assert waiter.release() is None
    assert waiter._state.name != "WAITING", "release() from another thread returned while the acquire still waited"
    t.join(10)
    owner.release()
