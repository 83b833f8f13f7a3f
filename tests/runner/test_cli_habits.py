"""The shell user's habits: flock(1)'s -w, run's own usage, flag names in errors, a closed pipe.

Through the real ``handofflock`` command; its refusals, which end before any I/O, through ``cli.main``.
"""

from __future__ import annotations

import subprocess

import pytest

from handofflock.exit_codes import EXIT_CONFIG, EXIT_USAGE

EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, as the shells report cat
from jobsutil import CONSOLE_SCRIPT, child_env, in_process


@pytest.mark.parametrize("flag", ["-w", "--wait", "--timeout"])
def test_run_takes_flocks_w_and_wait_for_its_timeout(flag, tmp_path, capfd):
    done = in_process(["run", flag, "5", "-q", str(tmp_path / "lock.json"), "--", "touch", str(tmp_path / "ran")], capfd)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "ran").exists()


def test_a_command_without_the_double_dash_gets_runs_usage_and_says_where_the_command_goes(tmp_path, capsys):
    done = in_process(["run", "-w", "5", str(tmp_path / "lock.json"), "touch", "x"], capsys, cwd=tmp_path)
    assert done.returncode == EXIT_USAGE
    assert "usage: handofflock run URL [options] -- CMD [ARGS...]" in done.stderr
    assert "COMMAND ..." not in done.stderr  # not the top-level usage
    assert "-- touch x" in done.stderr
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--poll-interval", "0"], "--poll-interval must be"),
        (["--ttl", "1"], "--ttl"),
        (["--ttl", "30", "--poll-interval", "60"], "shorter --poll-interval"),
    ],
)
def test_configuration_errors_name_the_flags_of_the_command(flags, says, tmp_path, capsys):
    done = in_process(["run", *flags, str(tmp_path / "lock.json"), "--", "true"], capsys)
    assert done.returncode == EXIT_CONFIG, done.stderr
    assert says in done.stderr
    for python_name in ("waiter_check_interval", "waiter_poll_interval", "waiter_ttl", " ttl="):
        assert python_name not in done.stderr, done.stderr


def test_status_into_a_pipe_closed_early_exits_141_without_a_traceback(tmp_path):
    proc = subprocess.Popen([str(CONSOLE_SCRIPT), "status", str(tmp_path / "lock.json")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=child_env())
    proc.stdout.close()  # as `| true` does, long before the interpreter has started
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == EXIT_BROKEN_PIPE, err
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


def test_help_lists_every_url_form(capsys):
    done = in_process(["--help"], capsys)
    assert done.returncode == 0
    for form in ("gs://", "s3://", "file://"):
        assert form in done.stdout, done.stdout


def test_flocks_dash_c_habit_is_told_the_command_as_sh_dash_c_after_the_double_dash(tmp_path, capsys):
    lock = str(tmp_path / "lock.json")
    done = in_process(["run", "-w", "5", lock, "-c", "make && touch x"], capsys, cwd=tmp_path)
    assert done.returncode == EXIT_USAGE, done.stderr
    assert f"handofflock run -w 5 {lock} -- sh -c 'make && touch x'" in done.stderr, done.stderr
    assert "-- -c" not in done.stderr
    assert not (tmp_path / "x").exists()


def test_status_of_a_far_future_lease_says_what_bounds_it_not_its_years_left(tmp_path, capsys):
    import time

    from lockutil import raw_write

    from handofflock.core.record import Holder, LockRecord

    url = str(tmp_path / "lock.json")
    raw_write(url, LockRecord(Holder("ghost", time.time() + 977615999), ttl=60.0, token=5, nonce="n"), 0)
    done = in_process(["status", url], capsys)
    assert done.returncode == 0, done.stderr
    state = next(line for line in done.stdout.splitlines() if line.strip().startswith("state"))
    assert "lease suspect: bounded by its ttl (60 s)" in state, done.stdout
    assert "s left" not in done.stdout and "lease live" not in done.stdout, done.stdout
    assert "suspect" in done.stdout.split("state", 1)[1].split("\n", 2)[-1]  # the warning still follows
