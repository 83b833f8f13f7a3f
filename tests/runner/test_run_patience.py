"""``handofflock run --no-request`` and ``--no-yield``, and ``--timeout`` behind another waiter: the runs under
test through the cli in this process, the patient waiter a real ``run`` process."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest
from jobsutil import CONSOLE_SCRIPT, in_process, popen, runner_logic, shared_url  # noqa: F401
from lockparts import acquire_in_thread
from lockutil import eventually, raw_read

from handofflock import FakeClock, HandoffLock, Scheduler
from handofflock.cli import read_status, status_text
from handofflock.exit_codes import EXIT_CONTENDED, EXIT_TIMEOUT

PY = sys.executable
pytestmark = pytest.mark.timeout(120)


def run(url, *extra, cmd=("-c", "pass")):
    return [str(CONSOLE_SCRIPT), "run", url, "--ttl", "16", "--poll-interval", "0.2", "--min-hold", "0", *extra, "--", PY, *cmd]


def waiter(url):
    r = raw_read(url)[0]
    return r.waiting_owner_id if r is not None and r.waiter_live(time.time()) else None


@runner_logic
def test_run_no_request_waits_for_the_holder_to_finish_without_signalling_it(shared_url, tmp_path, capsys):
    """The holder's run in this process, its command ended on a cue a few of its checks after the patient
    run (a real process) is seen waiting."""
    flag = tmp_path / "done"
    patient = popen(run(shared_url, "--no-request", "--owner-id", "patient"))

    def told():
        try:
            eventually(lambda: waiter(shared_url) == "patient", timeout=30, what="the patient registered")
            time.sleep(0.3)  # six of the holder's checks: it was never asked
        finally:
            flag.touch()

    thread = threading.Thread(target=told, daemon=True)
    try:
        thread.start()
        holder = in_process(["run", "-v", shared_url, "--ttl", "16", "--poll-interval", "0.05", "--min-hold", "0", "--", *until_told(flag)],
                            capsys)
        thread.join(60)
    except BaseException:
        patient.kill()
        raise
    err = holder.stderr
    assert holder.returncode == 0, err  # ran until told: never signalled
    assert "asks for" not in err and "SIGTERM" not in err, err
    assert "handed" in err and "patient" in err, err
    assert patient.wait(timeout=30) == 0, patient.stderr.read()


def until_told(flag: Path) -> tuple[str, ...]:
    """A command that runs until the test makes ``flag``: the holder's run in this process lets go on a cue."""
    return ("sh", "-c", f"while [ ! -e '{flag}' ]; do sleep 0.02; done")


@runner_logic
def test_run_no_yield_declines_and_status_says_so(shared_url, tmp_path, capsys):
    """The holder's run in this process, the asker a lock in a thread; `status` is read there as the cli
    prints it, until it shows the decline, and then the holder's command ends."""
    flag, shown, got = tmp_path / "done", {}, []

    def asker():
        eventually(lambda: raw_read(shared_url)[0] is not None, timeout=20, what="the holder acquired")
        lock = HandoffLock(shared_url, owner_id="asker", waiter_poll_interval=0.05)
        got.append(lock.acquire(timeout=60))
        lock.release()

    def declined():
        shown["out"] = status_text(read_status(shared_url))  # what `handofflock status` prints
        return "(asker), declined" in shown["out"]

    def told():
        try:
            eventually(lambda: waiter(shared_url) == "asker", timeout=20, what="the asker registered")
            eventually(declined, timeout=20, interval=0.05, what="status shows the decline")
        finally:
            flag.touch()

    threads = [threading.Thread(target=f, daemon=True) for f in (asker, told)]
    for t in threads:
        t.start()
    # The decline is written by the next renewal; ttl 4, not 2, on file:// as well: run's renewals run in this
    # (test) process, and a 1 s renew deadline was missed once on a loaded machine.
    ttl = "4"
    holder = in_process(["run", shared_url, "--ttl", ttl, "--poll-interval", "0.05", "--min-hold", "0", "--no-yield", "--",
                         *until_told(flag)], capsys)
    for t in threads:
        t.join(60)
    assert "(asker), declined" in shown.get("out", ""), shown
    err = holder.stderr
    assert holder.returncode == 0, err
    assert "SIGTERM" not in err and "asks for" not in err, err
    assert [bool(g) for g in got] == [True], err


@runner_logic
def test_run_behind_another_waiter_waits_its_turn_until_its_timeout_and_nonblock_says_contended(shared_url, capfd):
    """Every party in this process: the holder a lock that never looks at its waiter (asked, and not cut
    short), the first waiter a lock in a thread, the later runs through the cli."""
    clock = FakeClock(start=time.time())
    holder = HandoffLock(shared_url, ttl=60.0, owner_id="holder", clock=clock,
                         scheduler=Scheduler(clock, autostart=False))
    assert holder.acquire()
    first = HandoffLock(shared_url, owner_id="first", waiter_poll_interval=0.05, waiter_ttl=60.0)
    thread = acquire_in_thread(first, timeout=60)  # asking: a later asking run cannot take its slot
    try:
        eventually(lambda: waiter(shared_url) == "first", timeout=20, what="the first waiter registered")
        # The later runs in this process: their exit and (-v: a plain -n is silent, as flock -n) their words.
        now = in_process(run(shared_url, "-n", "-v")[1:], capfd)
        assert now.returncode == EXIT_CONTENDED, now.stderr
        assert "--nonblock" in now.stderr, now.stderr
        started = time.monotonic()
        later = in_process(run(shared_url, "--timeout", "0.3")[1:], capfd)
        assert later.returncode == EXIT_TIMEOUT, later.stderr
        assert time.monotonic() - started >= 0.3
    finally:
        first.cancel()
        thread.join(30)
        holder.release()
