"""install_signal_handlers(): real signals, sent to this process and to child processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from jobsutil import runner_logic, shared_url  # noqa: F401

from handofflock import ConfigurationError, HandoffLock
from handofflock.os_signals import DEFAULT_GRACE, install_signal_handlers, parse_signal
from handofflock.storage import MemoryStorage
from childpipes import next_line
from signalsutil import held_lock, restore_signals, store_name  # noqa: F401

pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX signals")


def send(sig):
    """Send ``sig`` to this process and let Python run its handler."""
    signal.raise_signal(sig)


def test_the_first_signal_only_records_who_asked_and_by_when(store_name, restore_signals):
    lock = held_lock(store_name)
    store = MemoryStorage.named(store_name)
    handlers = install_signal_handlers(lock, [signal.SIGUSR1], grace=12.5)
    calls_before = dict(store.calls)
    before = time.time()
    send(signal.SIGUSR1)
    assert lock.release_requested
    request = lock.release_request
    assert (request.reason, request.requester) == ("signal", "SIGUSR1")
    assert before + 12.5 <= request.deadline <= time.time() + 12.5
    assert lock.is_held, "the first signal must not release"
    assert dict(store.calls) == calls_before, "the handler must do no storage I/O"
    assert handlers.received == ["SIGUSR1"]
    handlers.uninstall()
    lock.release()


def test_the_previous_python_handler_runs_after_the_request_is_recorded(store_name, restore_signals):
    lock = held_lock(store_name)
    seen = []
    signal.signal(signal.SIGUSR1, lambda signum, frame: seen.append((signum, lock.release_requested)))
    handlers = install_signal_handlers(lock, ["USR1"])
    send(signal.SIGUSR1)
    assert seen == [(signal.SIGUSR1, True)]
    handlers.uninstall()
    lock.release()


def test_uninstall_puts_the_previous_handlers_back(store_name, restore_signals):
    lock = held_lock(store_name)
    mine = lambda signum, frame: None  # noqa: E731
    signal.signal(signal.SIGUSR1, mine)
    before_int = signal.getsignal(signal.SIGINT)
    with install_signal_handlers(lock, ["USR1", "INT"]) as handlers:
        # private: the handler installed is this bound method; no public name to compare with
        assert signal.getsignal(signal.SIGUSR1) == handlers._handle
        assert signal.getsignal(signal.SIGINT) == handlers._handle
    assert signal.getsignal(signal.SIGUSR1) is mine
    assert signal.getsignal(signal.SIGINT) is before_int
    handlers.uninstall()  # idempotent
    lock.release()


def test_an_ignored_signal_stays_ignored(store_name, restore_signals):
    lock = held_lock(store_name)
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    handlers = install_signal_handlers(lock, ["USR2", "USR1"])
    assert handlers.skipped == (signal.SIGUSR2,) and handlers.signals == (signal.SIGUSR1,)
    send(signal.SIGUSR2)
    assert not lock.release_requested
    assert signal.getsignal(signal.SIGUSR2) is signal.SIG_IGN
    handlers.uninstall()
    lock.release()


def test_a_second_sigint_hands_the_lock_over_and_raises_keyboard_interrupt(store_name, restore_signals):
    lock = held_lock(store_name)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    handlers = install_signal_handlers(lock)
    send(signal.SIGINT)  # first: a request, no KeyboardInterrupt
    assert lock.is_held and lock.release_requested
    with pytest.raises(KeyboardInterrupt):
        send(signal.SIGINT)
    assert not lock.is_held
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert handlers.received == ["SIGINT", "SIGINT"]
    assert lock.status().owner_id is None, "released: the record names no owner"


def test_ctrl_c_pressed_a_third_time_while_the_second_releases_does_not_cut_the_release(
    store_name, restore_signals, monkeypatch
):
    lock = held_lock(store_name)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    handlers = install_signal_handlers(lock)
    send(signal.SIGINT)
    release = lock.release

    def release_meanwhile_interrupted():
        send(signal.SIGINT)  # the third Ctrl-C, before the store has answered
        return release()

    monkeypatch.setattr(lock, "release", release_meanwhile_interrupted)
    with pytest.raises(KeyboardInterrupt):
        send(signal.SIGINT)
    assert lock.status().owner_id is None, "the release went through: a KeyboardInterrupt did not cut it"
    assert handlers.received == ["SIGINT", "SIGINT", "SIGINT"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_second_signal_of_another_kind_also_escalates_and_chains(store_name, restore_signals):
    lock = held_lock(store_name)
    seen = []
    signal.signal(signal.SIGUSR1, lambda s, f: seen.append(("usr1", lock.is_held)))
    signal.signal(signal.SIGUSR2, lambda s, f: seen.append(("usr2", lock.is_held)))
    install_signal_handlers(lock, ["USR1", "USR2"])
    send(signal.SIGUSR1)
    send(signal.SIGUSR2)
    assert seen == [("usr1", True), ("usr2", False)], "the previous handler runs after the release"
    assert not lock.is_held


def test_arguments_are_checked_before_anything_is_installed(store_name, restore_signals):
    lock = held_lock(store_name)
    with pytest.raises(ConfigurationError, match="grace"):
        install_signal_handlers(lock, grace=-1)
    with pytest.raises(ConfigurationError, match="cannot be caught"):
        install_signal_handlers(lock, ["KILL"])
    with pytest.raises(ConfigurationError, match="unknown signal"):
        install_signal_handlers(lock, ["NOPE"])
    errors = []
    t = threading.Thread(target=lambda: _capture(errors, lambda: install_signal_handlers(lock)))
    t.start()
    t.join()
    assert errors and "main thread" in str(errors[0])
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL or callable(signal.getsignal(signal.SIGTERM))
    lock.release()


def _capture(errors, fn):
    try:
        fn()
    except ConfigurationError as exc:
        errors.append(exc)


def test_parse_signal_accepts_names_numbers_and_members():
    assert parse_signal("TERM") is signal.SIGTERM
    assert parse_signal("sigusr1") is signal.SIGUSR1
    assert parse_signal(15) is signal.SIGTERM
    assert parse_signal("2") is signal.SIGINT
    assert parse_signal(signal.SIGHUP) is signal.SIGHUP
    assert 0 < DEFAULT_GRACE < 30


# --------------------------------------------------------------------------- child processes

CHILD = textwrap.dedent(
    """
    import itertools, signal, sys, time
    from handofflock import HandoffLock, signals
    from handofflock.os_signals import install_signal_handlers

    url, mode = sys.argv[1], sys.argv[2]
    lock = HandoffLock(url, ttl=30.0, owner_id="child")
    signals.released.connect(lambda sender, **kw: print("released token", kw["token"], flush=True), weak=False)
    lock.acquire()
    install_signal_handlers(lock, grace=7.0, release_at_exit=(mode == "atexit"))
    print("holding token", lock.token, flush=True)
    if mode == "atexit":
        sys.exit(3)                       # leaves without releasing; the atexit hook does it
    steps = lock.steps(itertools.count())
    for step in steps:
        time.sleep(0.02)
    r = lock.release_request
    print("asked by", r.requester, "grace", round(r.deadline - r.requested_at, 1), "after step", steps.last, flush=True)
    if mode == "checkpoint":
        print("checkpointed step", steps.last, flush=True)
        lock.release()
        sys.exit(0)
    if mode == "busy":                    # inside the library (a slow status()) when the second signal comes
        read = lock.storage.read
        def slow_read(*args, **kw):
            time.sleep(0.3)
            return read(*args, **kw)
        lock.storage.read = slow_read
        print("polling status", flush=True)
        while True:
            lock.status()
    time.sleep(60)                        # a slow checkpoint: the second signal must end it
    """
)


# The handlers' logic is the same on every store: it runs on a local file (``runner_logic``). A release by
# signal over GCS keeps its row in the first test; the thread masks keep theirs (GCS adds its deadline thread).


def run_child(tmp_path, url, mode):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    proc = subprocess.Popen([sys.executable, str(script), url, mode], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = next_line(proc)
    assert first.startswith("holding token"), first + proc.stderr.read()
    return proc


@pytest.mark.timeout(60)
def test_sigterm_to_a_child_makes_it_checkpoint_release_and_exit_cleanly(tmp_path, shared_url):
    proc = run_child(tmp_path, shared_url, "checkpoint")
    time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "asked by SIGTERM grace 7.0" in out
    assert out.index("checkpointed step") < out.index("released token")
    assert HandoffLock(shared_url).status().owner_id is None


@runner_logic
@pytest.mark.timeout(60)
def test_a_second_sigterm_releases_then_dies_of_sigterm(tmp_path, shared_url):
    proc = run_child(tmp_path, shared_url, "slow")
    time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    assert next_line(proc).startswith("asked by SIGTERM")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGTERM, err
    assert "released token" in out, err
    assert HandoffLock(shared_url).status().owner_id is None


@runner_logic
@pytest.mark.timeout(60)
def test_a_second_sigterm_inside_a_library_call_releases_when_it_returns_then_dies(tmp_path, shared_url):
    """The release cannot run inside the interrupted call (it holds the lock's I/O mutex), so it is
    deferred to the call's end; the process must not die of the signal before that."""
    proc = run_child(tmp_path, shared_url, "busy")
    time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    assert next_line(proc).startswith("asked by SIGTERM")
    assert next_line(proc).startswith("polling status")
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGTERM, err
    assert "released token" in out, err
    assert HandoffLock(shared_url).status().owner_id is None


@runner_logic
@pytest.mark.timeout(60)
def test_release_at_exit_releases_a_lock_left_held(tmp_path, shared_url):
    proc = run_child(tmp_path, shared_url, "atexit")
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 3, err
    assert "released token" in out, err
    assert HandoffLock(shared_url).status().owner_id is None


THREADS_CHILD = textwrap.dedent(
    """
    import json, signal, sys, threading, time
    from handofflock import HandoffLock

    lock = HandoffLock(sys.argv[1], ttl=10.0, owner_id="threads")
    lock.acquire()
    deadline = time.monotonic() + 20  # until the scheduler loop and an I/O worker (a renewal) are running
    while time.monotonic() < deadline:
        names = [thread.name for thread in threading.enumerate()]
        running = all(thread.native_id is not None for thread in threading.enumerate())  # none still starting
        if running and any(n.endswith("-scheduler") for n in names) and any("-io" in n for n in names):
            break
        time.sleep(0.05)
    blocked = {}
    for thread in threading.enumerate():
        try:
            with open(f"/proc/self/task/{thread.native_id}/status") as status:
                mask = int(next(l for l in status if l.startswith("SigBlk:")).split()[1], 16)
        except FileNotFoundError:  # it ended since: nothing left to take a signal
            continue
        blocked[thread.name] = bool(mask & (1 << (signal.SIGTERM - 1)))
    lock.release()
    print(json.dumps(blocked))
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads thread signal masks from /proc")
@pytest.mark.timeout(60)
def test_library_threads_leave_sigterm_to_the_main_thread(tmp_path, shared_url):
    """The kernel gives a process-directed SIGTERM to any thread that does not block it; CPython runs the
    handler only in the main thread, between bytecodes. Had a library thread taken it while the main thread
    slept in a slow checkpoint, the second SIGTERM would wait out the checkpoint (seen: 1 run in 10 under load)."""
    script = tmp_path / "threads.py"
    script.write_text(THREADS_CHILD)
    out = subprocess.run([sys.executable, str(script), shared_url], capture_output=True, text=True, timeout=45)
    assert out.returncode == 0, out.stderr
    blocked = json.loads(out.stdout)
    assert blocked.pop("MainThread") is False
    library = {name: b for name, b in blocked.items() if name.startswith("handofflock")}
    assert any(name.endswith("-scheduler") for name in library) and any("-io" in name for name in library), blocked
    assert all(library.values()), f"library threads that would take SIGTERM: {library}"


def test_what_was_skipped_at_install_is_still_said_after_uninstall(store_name, restore_signals):
    lock = held_lock(store_name)
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    handlers = install_signal_handlers(lock, ["USR2", "USR1"], grace=7.0)
    assert repr(handlers) == "<SignalHandlers SIGUSR1 grace=7.0 received=[]>"
    handlers.uninstall()
    assert handlers.skipped == (signal.SIGUSR2,)
    lock.release()


def test_install_off_the_main_thread_is_refused_first_in_its_own_words(store_name):
    lock = held_lock(store_name)
    from handofflock.integrations.ranks import RankLock, RankSignals, local_agree

    ranks = RankLock(lock, local_agree, rank=0)
    caught: list[BaseException] = []

    def install_both() -> None:
        for install in (lambda: install_signal_handlers(lock, ["USR1"], grace=-1),
                        lambda: RankSignals(ranks, ["USR1"]).install()):
            try:
                install()
            except ConfigurationError as exc:
                caught.append(exc)

    thread = threading.Thread(target=install_both)
    thread.start()
    thread.join(10)
    assert [str(e) for e in caught] == [
        "install_signal_handlers() must be called from the main thread (Python runs signal handlers only there)",
        "RankSignals.install() must be called from the main thread",
    ]
    with pytest.raises(ConfigurationError) as refused:
        RankSignals(ranks, ["KILL"])
    assert str(refused.value) == "SIGKILL cannot be caught"
    lock.release()
