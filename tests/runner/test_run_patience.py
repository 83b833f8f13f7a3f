"""``handofflock run --no-request`` and ``--no-yield``, and ``--timeout`` behind another waiter, through the real
command (``status``, and the runs that only wait and refuse, through the cli in this process)."""

from __future__ import annotations

import sys
import time

import pytest
from jobsutil import CONSOLE_SCRIPT, in_process, popen, shared_url  # noqa: F401
from lockutil import eventually, raw_read

from handofflock.exit_codes import EXIT_CONTENDED, EXIT_TIMEOUT

PY = sys.executable
pytestmark = pytest.mark.timeout(120)


def run(url, *extra, cmd=("-c", "pass")):
    return [str(CONSOLE_SCRIPT), "run", url, "--ttl", "16", "--poll-interval", "0.2", *extra, "--", PY, *cmd]


def waiter(url):
    r = raw_read(url)[0]
    return r.waiting_owner_id if r is not None and r.waiter_live(time.time()) else None


def holding(url, *extra, seconds=4):
    holder = popen(run(url, *extra, cmd=("-c", f"import time; print('start', flush=True); time.sleep({seconds})")))
    assert holder.stdout.readline().strip() == "start", holder.stderr.read()
    return holder


def test_run_no_request_waits_for_the_holder_to_finish_without_signalling_it(shared_url):
    holder = holding(shared_url)
    patient = popen(run(shared_url, "--no-request", "--owner-id", "patient"))
    out, err = holder.communicate(timeout=60)
    assert holder.returncode == 0, err  # slept its 4 s out: never signalled
    assert "asks for" not in err and "SIGTERM" not in err, err
    assert "handed" in err and "patient" in err, err
    assert patient.wait(timeout=30) == 0, patient.stderr.read()


def test_run_no_yield_declines_and_status_says_so(shared_url, capsys):
    holder = holding(shared_url, "--no-yield", seconds=6)
    asking = popen(run(shared_url, "--timeout", "60", "--owner-id", "asker"))
    eventually(lambda: waiter(shared_url) == "asker", timeout=20, what="the asker registered")
    shown = {}

    def declined():  # `status` in this process: a read a poll, not an interpreter's start
        shown["out"] = in_process(["status", shared_url], capsys).stdout
        return "(asker), declined" in shown["out"]

    eventually(declined, timeout=20, interval=0.3, what="status shows the decline")
    out, err = holder.communicate(timeout=60)
    assert holder.returncode == 0, err
    assert "SIGTERM" not in err and "asks for" not in err, err
    assert asking.wait(timeout=30) == 0, asking.stderr.read()


def test_run_with_a_timeout_behind_another_waiter_waits_and_without_one_names_the_option(shared_url, capfd):
    holder = holding(shared_url, "--no-yield", seconds=30)  # asked, and not cut short
    first = popen(run(shared_url, "--owner-id", "first"))  # asking: a later asking run cannot take its slot
    try:
        eventually(lambda: waiter(shared_url) == "first", timeout=20, what="the first waiter registered")
        now = in_process(run(shared_url)[1:], capfd)  # the later runs in this process: their exit and words
        assert now.returncode == EXIT_CONTENDED, now.stderr
        assert "--wait-for-slot" in now.stderr and "--timeout" in now.stderr, now.stderr
        started = time.monotonic()
        later = in_process(run(shared_url, "--timeout", "2")[1:], capfd)
        assert later.returncode == EXIT_TIMEOUT, later.stderr
        assert time.monotonic() - started >= 2
    finally:
        for p in (first, holder):
            p.terminate()
            p.communicate(timeout=60)
