"""``handofflock run --yield-exit-code N``, the holder run in this process (the command it runs is a real process).

A job that yields (stops within the grace because a waiter asked for the lock)
exited with its signal's status, 143, like a crash: cron mails it, systemd
counts a failure. ``--yield-exit-code N`` maps a yield to N; without it the
command's own status passes through, as flock(1) does.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest
from jobsutil import in_process
from lockutil import eventually, raw_read

from handofflock import HandoffLock

pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc"), pytest.mark.timeout(90)]


def _yield_to_a_waiter(tmp_path: Path, capsys, *options: str, cmd: tuple[str, ...] = ("sleep", "60")) -> tuple[int, str]:
    """Hold the lock around ``cmd`` (``run`` in this process), let a waiter in a thread ask for it; return the
    holder's exit status and stderr."""
    url = (tmp_path / "lock.json").as_uri()
    handed = []

    def waiter():
        eventually(lambda: raw_read(url)[0] is not None, what="the holder acquired")
        lock = HandoffLock(url, waiter_poll_interval=0.05)
        handed.append(lock.acquire(timeout=60))
        lock.release()

    thread = threading.Thread(target=waiter, daemon=True)
    thread.start()
    done = in_process(["run", url, "--poll-interval", "0.05", "--min-hold", "0", *options, "--", *cmd], capsys)
    thread.join(60)
    assert [bool(h) for h in handed] == [True], done.stderr
    assert raw_read(url)[0].owner_id is None
    return done.returncode, done.stderr


@pytest.mark.parametrize("options, expected", [
    ((), 143),  # the command's own status: sleep died of SIGTERM
    (("--yield-exit-code", "0"), 0),  # cron, a deploy: a clean handoff is a success
    (("--yield-exit-code", "75"), 75),  # a Job to be requeued: EX_TEMPFAIL, "try again later"
])
def test_a_clean_yield_exits_with_the_yield_exit_code(tmp_path, options, expected, capsys):
    code, err = _yield_to_a_waiter(tmp_path, capsys, *options)
    assert code == expected, err
    if options:
        assert f"it yielded: exit {expected}" in err


def test_a_command_killed_after_the_grace_keeps_its_own_status(tmp_path, capsys):
    """A command that did not stop within the grace did not yield: SIGKILLed, it exits 137 whatever N is."""
    code, err = _yield_to_a_waiter(tmp_path, capsys, "--yield-exit-code", "0", "--grace", "0.2",
                                   cmd=("sh", "-c", "trap '' TERM; sleep 60 & wait"))
    assert code == 137, err


def test_a_command_that_exits_by_itself_keeps_its_status(tmp_path, capfd):
    done = in_process(["run", str(tmp_path / "lock.json"), "--yield-exit-code", "0", "--", "sh", "-c", "exit 3"], capfd)
    assert done.returncode == 3, done.stderr


@pytest.mark.parametrize("value", ["256", "-1"])
def test_a_yield_exit_code_out_of_range_is_refused(tmp_path, value, capsys):
    done = in_process(["run", str(tmp_path / "lock.json"), "--yield-exit-code", value, "--", "true"], capsys)
    assert done.returncode == 64 and "--yield-exit-code must be" in done.stderr, done.stderr
    assert not (tmp_path / "lock.json").exists()
