"""Signals while a "now" lets the lock go (os_signals.CaughtSignals._handle): copies wait for the release and then
act, handlers installed again act again, a release stuck for good still lets a later Ctrl-C end the process, and a
rank's "now" inside the lock's own call acts only after the deferred release."""

from __future__ import annotations

import os
import signal
import uuid

import pytest

from handofflock import FakeClock, HandoffLock, Scheduler
from handofflock import os_signals
from handofflock.os_signals import install_signal_handlers
from handofflock.storage import MemoryStorage
from signalsutil import held_lock, kills, restore_signals, signal_as_release_goes_out, store_name  # noqa: F401

pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX signals")


def test_handlers_installed_again_after_a_now_still_let_ctrl_c_act(store_name, restore_signals):
    """A notebook's next run: Ctrl-C twice ended the first run (released, KeyboardInterrupt); the same handlers
    are installed again for the next hold (install() is documented as callable again). Ctrl-C must still be
    able to interrupt: the "now" under way ended with the first run."""
    lock = held_lock(store_name)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    handlers = install_signal_handlers(lock)
    signal.raise_signal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)
    assert lock.status().owner_id is None
    lock.acquire()  # the next run
    handlers.install()
    with pytest.raises(KeyboardInterrupt):  # at the latest on the second press
        for _ in range(2):
            signal.raise_signal(signal.SIGINT)
    assert lock.status().owner_id is None, "the lock was let go before the interrupt"


def test_a_sigterm_while_a_ctrl_c_now_releases_still_ends_the_process(store_name, restore_signals, monkeypatch):
    """Ctrl-C twice, and while that release is on its way a SIGTERM comes (a kubelet, systemd): the release is
    not cut, but the SIGTERM must still act once the lock is let go. It is dropped instead: the process gets the
    KeyboardInterrupt alone, which an application may catch and carry on, surviving the SIGTERM."""
    lock = held_lock(store_name)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    handlers = install_signal_handlers(lock)
    killed = kills(monkeypatch)
    signal.raise_signal(signal.SIGINT)
    signal_as_release_goes_out(monkeypatch, lock, signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)
    assert lock.status().owner_id is None
    assert handlers.received == ["SIGINT", "SIGINT", "SIGTERM"]
    assert killed == [signal.SIGTERM], "the SIGTERM that came during the release never acted (on this process)"


CHILD_DEADLOCKED_IN_NOW = r'''
import signal
from handofflock import FakeClock, HandoffLock, Scheduler
from handofflock.os_signals import install_signal_handlers
from handofflock.storage import records

clock = FakeClock()
lock = HandoffLock("memory://now-deadlock/lock.json", ttl=60.0, owner_id="o", clock=clock,
                   scheduler=Scheduler(clock, autostart=False))
lock.acquire()
signal.signal(signal.SIGINT, signal.default_int_handler)
install_signal_handlers(lock)
signal.raise_signal(signal.SIGINT)  # the first Ctrl-C: a request
print("ready", flush=True)
with records._down_lock:  # the main thread, in another lock's request, notes that its store answered
    signal.raise_signal(signal.SIGINT)  # the second Ctrl-C lands here: "now" releases, and its request waits
print("unreachable", flush=True)
'''

CHILD_SLOW_RECEIVER_IN_NOW = r'''
import signal, time
from handofflock import FakeClock, HandoffLock, Scheduler, signals
from handofflock.os_signals import install_signal_handlers

clock = FakeClock()
lock = HandoffLock("memory://now-slow/lock.json", ttl=60.0, owner_id="o", clock=clock,
                   scheduler=Scheduler(clock, autostart=False))
lock.acquire()


def tell_the_team(sender, **kw):  # a webhook with no timeout, the network down
    time.sleep(120)


signals.released.connect(tell_the_team, sender=lock)
signal.signal(signal.SIGINT, signal.default_int_handler)
install_signal_handlers(lock)
signal.raise_signal(signal.SIGINT)  # the first Ctrl-C: a request
print("ready", flush=True)
signal.raise_signal(signal.SIGINT)  # the second: "now" releases, and the released receiver runs in the handler
print("unreachable", flush=True)
'''


@pytest.mark.parametrize("script", [CHILD_DEADLOCKED_IN_NOW, CHILD_SLOW_RECEIVER_IN_NOW], ids=["lock", "receiver"])
def test_a_now_release_stuck_for_good_still_lets_ctrl_c_and_sigterm_end_the_process(script):
    """The "now" release runs inside the signal handler, in the main thread, wherever it was interrupted: there
    it can wait for good on a process-wide lock the interrupted code holds (records._down_lock, taken around
    every request of every lock of the process; a WriteGate's or a Scheduler's mutex likewise). No deadline
    bounds that wait; nor a ``released`` receiver's, which runs inside the handler too. A signal within
    ``NOW_COPIES`` of the "now" is a copy and waits for the release; a later one acts at once, so Ctrl-C pressed
    again ends the process (had every later signal waited, only SIGKILL would)."""
    import subprocess
    import sys
    import time

    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        time.sleep(1.0)
        for sig in (signal.SIGINT, signal.SIGINT, signal.SIGINT, signal.SIGTERM):
            if child.poll() is not None:
                break
            child.send_signal(sig)
            time.sleep(0.5)
        try:
            child.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            pytest.fail("three more Ctrl-C and a SIGTERM did not end the process: only SIGKILL does")
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_torchruns_sigterm_now_inside_the_locks_own_call_ends_the_process_only_after_the_release(monkeypatch):
    """The holder rank is inside its lock's own call (a status(), a check at the step boundary) when
    torchrun's SIGTERM "now" lands: the release is deferred to that call's return, and the signal acts after
    it (as under install_signal_handlers), never ending the process with the lock still held."""
    import types
    import warnings

    from handofflock.core.errors import StoppedWithoutCheckpointWarning
    from handofflock.integrations.ranks import REPEAT_WINDOW, RankLock, RankSignals, local_agree

    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)}
    now = [1000.0]
    monkeypatch.setattr(os_signals, "time", types.SimpleNamespace(monotonic=lambda: now[0], time=os_signals.time.time))
    name = f"ranksig-{uuid.uuid4().hex[:8]}"
    clock = FakeClock()
    lock = HandoffLock(f"memory://{name}/lock.json", ttl=60.0, owner_id="job", clock=clock,
                       scheduler=Scheduler(clock, autostart=False))  # fmt: skip
    job = RankLock(lock, local_agree, rank=0, poll=0.01)
    job.acquire()
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        handlers = RankSignals(job).install()
        signal.raise_signal(signal.SIGINT)  # Ctrl-C: torchrun's SIGINT
        now[0] += REPEAT_WINDOW
        held_at_kill: list[bool] = []
        monkeypatch.setattr(os_signals.os, "kill", lambda pid, sig: held_at_kill.append(lock.is_held))
        store = MemoryStorage.named(name)
        fired: list[bool] = []

        def sigterm_now(op, key):
            if not fired:
                fired.append(True)
                signal.raise_signal(signal.SIGTERM)  # torchrun's shutdown, as the rank reads the record

        store.faults.before("read", sigterm_now)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", StoppedWithoutCheckpointWarning)
            lock.status()
        store.faults.clear()
        assert handlers.received == ["SIGINT", "SIGTERM"]
        assert held_at_kill, "the SIGTERM never acted"
        assert held_at_kill == [False], "SIGTERM's default action ended the process with the lock still held"
    finally:
        for s, h in saved.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)
        if lock.is_held:
            lock.release()
        MemoryStorage.forget(name)
