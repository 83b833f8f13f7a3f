"""Edges of a "now" that lets the lock go (os_signals.CaughtSignals._handle): a copy that lands while the
release waits for the lock's own call to return, the order in which remembered signals act, and which signal is
a repeat at all (the first signal's request goes with the hold it asked to end)."""

from __future__ import annotations

import os
import signal
import uuid

import pytest

from handofflock import HandoffLock
from handofflock import os_signals
from handofflock.os_signals import install_signal_handlers
from handofflock.storage import MemoryStorage
from signalsutil import kills, new_lock, restore_signals, signal_as_release_goes_out, store_name  # noqa: F401

pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX signals")


def test_a_copy_of_a_now_deferred_to_the_locks_own_call_waits_for_the_release(store_name, restore_signals):
    """Handlers installed at start-up, the lock acquired after (so SIGTERM's earlier handler is the framework's
    or SIG_DFL, not the release-on-signal one). SIGTERM asks; a second SIGTERM ("now") lands while the main
    thread is inside the lock's own call (a status() at the step boundary): the release is deferred to that
    call's return. A copy of it (the launcher's and torchrun's, a burst) a few milliseconds later, still inside
    that call, is within NOW_COPIES: it must wait for the release as a copy does on the other path. Instead our
    handlers are already gone, and the earlier handler runs with the lock still held (SIG_DFL: the process
    ends with the lock held, and the heir waits out the lease)."""
    held_when_run: list[bool] = []
    lock = new_lock(store_name)
    signal.signal(signal.SIGTERM, lambda s, f: held_when_run.append(lock.is_held))  # the framework's handler
    handlers = install_signal_handlers(lock, [signal.SIGTERM])
    lock.acquire()
    signal.raise_signal(signal.SIGTERM)  # the request (which chains to the earlier handler: by design)
    held_when_run.clear()
    store = MemoryStorage.named(store_name)
    fired: list[bool] = []

    def now_and_its_copy(op, key):
        if not fired:
            fired.append(True)
            signal.raise_signal(signal.SIGTERM)  # "now": the release waits for this status() to return
            signal.raise_signal(signal.SIGTERM)  # its copy, milliseconds later

    store.faults.before("read", now_and_its_copy)
    lock.status()
    store.faults.clear()
    assert handlers.received[:2] == ["SIGTERM", "SIGTERM"]
    assert held_when_run, "the SIGTERM never acted"
    assert True not in held_when_run, f"the earlier handler ran with the lock still held: {held_when_run}"


@pytest.mark.parametrize("sigterm_before", ["release_on_signal", "python"])
def test_a_ctrl_c_copy_does_not_swallow_the_sigterm_now(store_name, restore_signals, monkeypatch, sigterm_before):
    """Ctrl-C asks; a SIGTERM (systemd, a kubelet) is the "now"; Ctrl-C pressed again within NOW_COPIES is a
    copy. Once the lock is let go both act. SIGTERM's earlier handler is callable: our own release-on-signal
    handler (the lock acquired before install_signal_handlers, the documented order: it ends the process by
    SIGTERM's default action) or an application's. Both sort as "callables that may raise", in arrival order,
    so the copied SIGINT's KeyboardInterrupt goes first and the SIGTERM is dropped: a loop or notebook that
    catches KeyboardInterrupt lives on, deaf to the SIGTERM it got."""
    killed = kills(monkeypatch)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if sigterm_before == "python":
        signal.signal(signal.SIGTERM, lambda s, f: killed.append(s))
    lock = new_lock(store_name, release_on_signal=True)  # the default with a real clock
    lock.acquire()  # SIGTERM's SIG_DFL becomes the release-on-signal handler
    assert (signal.getsignal(signal.SIGTERM) is os_signals._release_and_reraise) == (sigterm_before != "python")
    handlers = install_signal_handlers(lock)
    signal.raise_signal(signal.SIGINT)  # Ctrl-C: the request
    signal_as_release_goes_out(monkeypatch, lock, signal.SIGINT)  # pressed again
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGTERM)  # "now"
    assert handlers.received == ["SIGINT", "SIGTERM", "SIGINT"]
    assert lock.status().owner_id is None
    assert killed == [signal.SIGTERM], "the SIGTERM 'now' never acted: the copied Ctrl-C's interrupt went first"


def test_a_copy_landing_as_the_now_acts_is_not_dropped(store_name, restore_signals, monkeypatch):
    """Python runs a handler between any two bytecodes, so a copy can land after act() listed the copies
    remembered so far and before uninstall() put the earlier handlers back: our handler (still installed, the
    "now" still under way, within NOW_COPIES) remembers it in ``_meanwhile``, which uninstall() then empties.
    The window is made deterministic here by landing the copy in uninstall()'s first call; the SIGTERM is
    received and never acts."""
    killed = kills(monkeypatch)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    lock = new_lock(store_name)
    lock.acquire()
    handlers = install_signal_handlers(lock)
    signal.raise_signal(signal.SIGINT)  # the request
    unregister = os_signals.atexit.unregister
    landed: list[bool] = []

    def unregister_as_a_copy_lands(fn):
        if not landed:
            landed.append(True)
            signal.raise_signal(signal.SIGTERM)  # a kubelet's SIGTERM, as the "now" starts to act
        return unregister(fn)

    monkeypatch.setattr(os_signals.atexit, "unregister", unregister_as_a_copy_lands)
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)  # "now"
    assert handlers.received == ["SIGINT", "SIGINT", "SIGTERM"]
    assert lock.status().owner_id is None
    assert killed == [signal.SIGTERM], "the SIGTERM was received and never acted"


def test_the_first_signal_of_a_later_hold_is_a_request_again(store_name, restore_signals, monkeypatch):
    """An operator's SIGUSR1 asks the holder to hand the lock over (the cooperative use of a release request);
    the holder does, waits, and acquires again later, its handlers still installed (or installed again: the
    same thing happens). The next SIGUSR1, hours later, is the first of that hold and must only ask again.
    Instead it is the "now": the lock is let go at once without a checkpoint and SIGUSR1's default action
    ends the process."""
    killed = kills(monkeypatch)
    saved = signal.getsignal(signal.SIGUSR1)
    signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    try:
        lock = new_lock(store_name)
        handlers = install_signal_handlers(lock, [signal.SIGUSR1])
        lock.acquire()
        signal.raise_signal(signal.SIGUSR1)
        assert lock.release_requested
        lock.release()  # the loop saw the request, checkpointed and handed the lock over
        lock.acquire()  # its turn again, later
        handlers.install()
        signal.raise_signal(signal.SIGUSR1)  # the operator asks again
        assert killed == [], "a single signal in this hold ended the process"
        assert lock.is_held and lock.release_requested
    finally:
        signal.signal(signal.SIGUSR1, saved if saved is not None else signal.SIG_DFL)


def test_a_signal_between_holds_asks_the_next_hold_and_a_repeat_in_it_is_now(store_name, restore_signals, monkeypatch):
    """SIGTERM asks; the loop checkpoints and hands the lock over. A SIGTERM while the process does not hold the
    lock (it sleeps before acquiring again) is the first of the next hold: it asks that hold, which then stops at
    once (steps() yields nothing), as a signal during acquire() does; a second SIGTERM in that hold is the "now"."""
    killed = kills(monkeypatch)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    lock = new_lock(store_name)
    handlers = install_signal_handlers(lock, [signal.SIGTERM])
    lock.acquire()
    signal.raise_signal(signal.SIGTERM)
    lock.release()  # the hold the request was for is over, and its request with it
    assert not lock.release_requested
    signal.raise_signal(signal.SIGTERM)  # between holds
    assert killed == [], "the first signal since the asked release ended the process"
    assert lock.release_requested, "the signal between holds asks the next hold"
    lock.acquire()
    assert list(lock.steps(range(3))) == [], "the next hold was asked to stop"
    signal.raise_signal(signal.SIGTERM)  # again, in that hold: "now"
    assert killed == [signal.SIGTERM]
    assert lock.status().owner_id is None, "the 'now' let the lock go"
    assert handlers.received == ["SIGTERM"] * 3


def test_handlers_taken_back_in_the_same_hold_still_take_a_repeat_as_now(store_name, restore_signals, monkeypatch):
    """install() again only takes back a handler replaced since (a framework installed its own): it does not
    start afresh. Ctrl-C asks, a framework installs its handler over ours, ours is taken back (chaining to the
    framework's), and Ctrl-C again in the same hold (whose request still stands) is the "now": the lock is let
    go and the framework's handler acts."""
    ran: list[bool] = []
    signal.signal(signal.SIGINT, signal.default_int_handler)
    lock = new_lock(store_name)
    lock.acquire()
    handlers = install_signal_handlers(lock, [signal.SIGINT])
    signal.raise_signal(signal.SIGINT)  # the request
    signal.signal(signal.SIGINT, lambda s, f: ran.append(lock.is_held))  # a framework's, installed over ours
    handlers.install()  # ours again
    signal.raise_signal(signal.SIGINT)
    assert ran == [False], "Ctrl-C again in the same hold did not let the lock go, then act"
    assert lock.status().owner_id is None


def test_a_sigterm_copy_of_a_ranks_deferred_now_never_runs_the_frameworks_handler(monkeypatch):
    """Under torchrun, Ctrl-C twice: SIGINT, then SIGTERM ("now"); Slurm's scancel (or a second launcher) sends
    its own SIGTERM too. The "now" lands inside the holder's lock call (a status() at the step boundary) and is
    deferred; the copy lands in the same call. RankSignals promises SIGTERM's earlier handler never runs from
    ours (Lightning's runs a collective on one rank and raises), and a copy waits for the release. Instead the
    earlier handlers are back as soon as the "now" is deferred, and the copy runs Lightning's handler while
    the lock is still held."""
    import types
    import warnings

    from handofflock.core.errors import StoppedWithoutCheckpointWarning
    from handofflock.integrations.ranks import REPEAT_WINDOW, RankLock, RankSignals, local_agree

    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)}
    now = [1000.0]
    monkeypatch.setattr(os_signals, "time", types.SimpleNamespace(monotonic=lambda: now[0], time=os_signals.time.time))
    monkeypatch.setattr(os_signals.os, "kill", lambda pid, sig: None)
    name = f"ranksig-{uuid.uuid4().hex[:8]}"
    lock = new_lock(name, owner="job")
    job = RankLock(lock, local_agree, rank=0, poll=0.01)
    job.acquire()
    lightning_ran_held: list[bool] = []
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, lambda s, f: lightning_ran_held.append(lock.is_held))
        RankSignals(job).install()
        signal.raise_signal(signal.SIGINT)  # torchrun's SIGINT: the request
        now[0] += REPEAT_WINDOW
        store = MemoryStorage.named(name)
        fired: list[bool] = []

        def now_and_a_copy(op, key):
            if not fired:
                fired.append(True)
                signal.raise_signal(signal.SIGTERM)  # torchrun's SIGTERM: "now", deferred to this status()
                now[0] += 0.01
                signal.raise_signal(signal.SIGTERM)  # scancel's, 10 ms later

        store.faults.before("read", now_and_a_copy)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", StoppedWithoutCheckpointWarning)
            lock.status()
        store.faults.clear()
        assert lightning_ran_held == [], f"SIGTERM's earlier handler ran (lock held: {lightning_ran_held})"
    finally:
        for s, h in saved.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)
        if lock.is_held:
            lock.release()
        MemoryStorage.forget(name)


CHILD_INSTALLED_AT_START = r'''
import signal, sys, time
from handofflock import HandoffLock
from handofflock.os_signals import install_signal_handlers

lock = HandoffLock(sys.argv[1], ttl=30.0, owner_id="child")
install_signal_handlers(lock)  # at start-up, before the first acquire: SIGTERM's earlier action is SIG_DFL
lock.acquire()
read = lock.storage.read

def slow_read(*args, **kw):  # a status() at the step boundary, the store slow to answer
    time.sleep(0.5)
    return read(*args, **kw)

signal.raise_signal(signal.SIGTERM)  # the request
lock.storage.read = slow_read
print("polling status", flush=True)
while True:
    lock.status()
'''


@pytest.mark.timeout(60)
def test_a_sigterm_copy_of_a_deferred_now_does_not_end_the_process_with_the_lock_held(tmp_path):
    """A real process, handlers installed before the lock is acquired (SIGTERM's earlier action: SIG_DFL). The
    "now" SIGTERM and its copy 20 ms later both land in a slow status(): the "now" is deferred to that call's
    return, and the copy, which finds SIG_DFL back already, ends the process before the release is written."""
    import subprocess
    import sys
    import time

    url = (tmp_path / "locks" / "lock.json").as_uri()
    script = tmp_path / "child.py"
    script.write_text(CHILD_INSTALLED_AT_START)
    proc = subprocess.Popen([sys.executable, str(script), url], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "polling status"
        time.sleep(0.2)  # inside the slow read
        proc.send_signal(signal.SIGTERM)  # "now"
        time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)  # its copy
        assert proc.wait(timeout=20) == -signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert HandoffLock(url).status().owner_id is None, "the process ended of SIGTERM with the lock still held"


def test_a_later_ctrl_c_that_cuts_the_release_does_not_drop_the_copies(store_name, restore_signals, monkeypatch):
    """Ctrl-C asks, Ctrl-C again is the "now"; while the store does not answer, a SIGTERM comes (a kubelet: a
    copy, remembered to act after the release); two seconds on, Ctrl-C once more cuts the stuck release. The
    KeyboardInterrupt goes up through the release and the remembered SIGTERM is forgotten with our handlers:
    a loop that catches KeyboardInterrupt survives the SIGTERM it got."""
    import types

    now = [1000.0]
    monkeypatch.setattr(os_signals, "time", types.SimpleNamespace(monotonic=lambda: now[0], time=os_signals.time.time))
    killed = kills(monkeypatch)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    lock = new_lock(store_name)
    lock.acquire()
    handlers = install_signal_handlers(lock)
    signal.raise_signal(signal.SIGINT)  # the request

    def stuck_release():
        now[0] += 0.1
        signal.raise_signal(signal.SIGTERM)  # a copy: remembered
        now[0] += 2.0
        signal.raise_signal(signal.SIGINT)  # pressed again: cuts the release
        raise AssertionError("unreachable: the later Ctrl-C raises")

    monkeypatch.setattr(lock, "release", stuck_release)
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)  # "now"
    assert handlers.received == ["SIGINT", "SIGINT", "SIGTERM", "SIGINT"]
    assert killed == [signal.SIGTERM], "the SIGTERM remembered during the release never acted"
