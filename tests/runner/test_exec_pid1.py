"""``handofflock exec -- CMD`` as a container's PID 1, in a PID namespace of its own.

A PID namespace's init gets no signal it has no handler for: a shell as a pod's command never
sees the SIGTERM of the pod's deletion. ``exec`` catches and passes signals on, reaps orphans,
ends what the command left, and exits with the status the job decided. Each test runs the real
console script as PID 1 under ``unshare --pid --fork --mount-proc`` (root, Linux) and skips,
saying why, where the kernel refuses a namespace; a command refused before anything starts is refused
in this process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from childpipes import next_line
from jobsutil import CONSOLE_SCRIPT, UNSHARE_PID, child_env, in_process, pid_namespace_refused

UNSHARE = UNSHARE_PID
pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif((why := pid_namespace_refused()) is not None, reason=str(why)),
]


def start_as_pid1(*command: str, **kw) -> tuple[subprocess.Popen, int]:
    """``command`` as PID 1 of a new PID namespace; the unshare process and PID 1's pid as seen from here."""
    kw.setdefault("env", child_env())
    proc = subprocess.Popen([*UNSHARE, *command], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, **kw)
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
    deadline = time.monotonic() + 20
    while not (found := children.read_text().split()):
        assert time.monotonic() < deadline and proc.poll() is None, "unshare never started PID 1"
        time.sleep(0.01)
    return proc, int(found[0])


def end(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


JOB = r"""
trap 'echo "job got TERM"; [ -n "$REPORT" ] && echo 143 > "$HANDOFFLOCK_EXIT_STATUS_FILE"; exit 1' TERM
(trap '' TERM; exec sleep 300) &  # leaves an orphan behind that ignores TERM
echo "started, orphan $!"
sleep 120 & wait
"""


@pytest.mark.parametrize("report", [True, False], ids=["job-reports-143", "job-reports-nothing"])
def test_sigterm_to_exec_as_pid1_reaches_the_job_ends_its_orphans_and_exits_with_the_jobs_status(report):
    proc, pid1 = start_as_pid1(str(CONSOLE_SCRIPT), "exec", "--grace", "1", "--", "sh", "-c", JOB,
                               **({"env": child_env(REPORT="1")} if report else {}))
    try:
        line = next_line(proc)
        assert line.startswith("started"), line
        os.kill(pid1, signal.SIGTERM)
        signalled = time.monotonic()
        out = proc.stdout.read()
        code = proc.wait(timeout=30)
        took = time.monotonic() - signalled
    finally:
        end(proc)
    assert "job got TERM" in out, out
    # With the job's word, its status; without, the command's own (sh exited 1 from its trap).
    assert code == (143 if report else 1), out
    assert took < 10, f"exec took {took:.1f} s to end after SIGTERM (grace 1 s for the orphan)"


def test_a_shell_as_pid1_never_sees_sigterm_which_is_why_pods_use_exec():
    proc, pid1 = start_as_pid1("sh", "-c", "echo started; sleep 120 & wait")
    try:
        assert next_line(proc).startswith("started")
        os.kill(pid1, signal.SIGTERM)
        time.sleep(1.0)
        assert proc.poll() is None  # the namespace's init ignored a signal it has no handler for
    finally:
        end(proc)


def test_exec_passes_the_commands_status_and_refuses_a_missing_command(capfd):
    ok = subprocess.run([*UNSHARE, str(CONSOLE_SCRIPT), "exec", "--", "sh", "-c", "exit 7"], env=child_env(),
                        capture_output=True, timeout=30)
    assert ok.returncode == 7, ok
    killed = subprocess.run([*UNSHARE, str(CONSOLE_SCRIPT), "exec", "--", "sh", "-c", "kill -USR2 $$"],
                            env=child_env(), capture_output=True, timeout=30)
    assert killed.returncode == 128 + signal.SIGUSR2, killed
    missing = in_process(["exec", "--", "no-such-command-here"], capfd)  # refused before anything is set up
    assert missing.returncode == 127 and "no-such-command-here" in missing.stderr, missing
