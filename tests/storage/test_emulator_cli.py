"""``python -m handofflock.testing.emulator``, FakeGCSServer and MotoS3Server never leave their server behind."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from jobsutil import CONSOLE_SCRIPT, child_env
from childpipes import next_line

#: How long the binary may outlive its parent: the guard polls its pipe every 0.2 s, then
#: terminates the binary (SIGKILL after 5 s). Generous for a loaded 2-core machine.
GONE_WITHIN = 15.0



def started(script: str, *, fields: int) -> tuple[subprocess.Popen, list[str]]:
    """Run ``script`` in a child Python; return it and the fields of the first line it prints (``fields`` of
    them, or the child is killed and its stderr shown)."""
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=child_env())
    line = next_line(proc).split()
    if len(line) != fields:
        proc.kill()
        raise AssertionError(f"the script printed {line!r}; stderr: {proc.communicate()[1]}")
    return proc, line

def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"  # a zombie is dead for our purposes
    except (FileNotFoundError, ProcessLookupError):  # gone between the kill(0) and the read (ESRCH)
        return False


def is_fake_gcs_server(pid: int) -> bool:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return b"fake-gcs-server" in f.read()


def assert_gone(pid: int, what: str) -> None:
    deadline = time.monotonic() + GONE_WITHIN
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if alive(pid):
        os.kill(pid, signal.SIGKILL)  # do not leave it running because the test failed
        raise AssertionError(f"the server (pid {pid}) still ran {GONE_WITHIN} s after {what}")


def start_emulator(*args: str) -> tuple[subprocess.Popen, str, int]:
    proc = subprocess.Popen([sys.executable, "-m", "handofflock.testing.emulator", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env())
    first, second = next_line(proc), next_line(proc)
    match = re.fullmatch(r"STORAGE_EMULATOR_HOST=(http://127\.0\.0\.1:\d+)\n", first)
    pid = re.search(r"\(pid (\d+)\)", second)
    if not (match and pid):
        proc.kill()
        raise AssertionError(f"unexpected output {first!r} {second!r}; stderr: {proc.communicate()[1]}")
    assert is_fake_gcs_server(int(pid.group(1)))
    return proc, match.group(1), int(pid.group(1))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_the_emulator_command_stops_the_binary_on_sigint_and_sigterm(sig, tmp_path):
    proc, url, pid = start_emulator("--bucket", "trial")
    try:
        rest = [next_line(proc) for _ in range(5)]
        assert "export STORAGE_EMULATOR_HOST=" + url + "\n" in rest
        if sig == signal.SIGINT:  # the printed instructions work: the bucket is there
            status = subprocess.run([str(CONSOLE_SCRIPT), "status", "gs://trial/locks/trial.json"], capture_output=True,
                                    text=True, timeout=60, env={**child_env(), "STORAGE_EMULATOR_HOST": url})
            assert status.returncode == 0 and "absent" in status.stdout, status
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert "fake-gcs-server stopped" in out
    finally:
        if proc.poll() is None:
            proc.kill()
    assert_gone(pid, f"{sig.name} to the emulator command")


def test_the_binary_goes_when_the_emulator_command_is_killed():
    proc, _, pid = start_emulator()
    proc.kill()
    proc.wait(30)
    assert_gone(pid, "SIGKILL of the emulator command")


def start_script_with_a_server() -> tuple[subprocess.Popen, int, int]:
    """A plain script that starts a FakeGCSServer and then just sleeps: (script, guard pid, binary pid)."""
    script = textwrap.dedent(
        """
        import threading, time
        from handofflock.testing import FakeGCSServer
        # Started in a thread that ends at once: the binary must live on with the process.
        servers = []
        t = threading.Thread(target=lambda: servers.append(FakeGCSServer().start())); t.start(); t.join()
        time.sleep(0.5)
        # private: _process is the guard that FakeGCSServer starts (pid is the binary's), and it has no public name
        print(servers[0]._process.pid, servers[0].pid, servers[0].running, flush=True)
        time.sleep(300)
        """
    )
    proc, line = started(script, fields=3)
    assert line[2] == "True", "the server died with the thread that started it"
    return proc, int(line[0]), int(line[1])


def test_a_script_that_started_a_server_and_is_sigkilled_leaves_no_binary_behind():
    proc, _, pid = start_script_with_a_server()
    assert is_fake_gcs_server(pid)
    proc.kill()
    proc.wait(30)
    assert_gone(pid, "SIGKILL of the script that started it")


def test_the_binary_dies_with_its_guard_even_if_the_guard_is_sigkilled():
    proc, guard, pid = start_script_with_a_server()
    try:
        os.kill(guard, signal.SIGKILL)
        assert_gone(pid, "SIGKILL of its guard process (PR_SET_PDEATHSIG)")
    finally:
        proc.kill()
        proc.wait(30)


def test_a_script_that_started_a_moto_server_and_is_sigkilled_leaves_no_server_behind():
    """The moto server (a Python child) goes with the process that started it, as fake-gcs-server does: a
    pytest worker that pytest-timeout ends leaves no server behind."""
    script = textwrap.dedent(
        """
        import time
        from handofflock.testing.s3server import MotoS3Server
        server = MotoS3Server().start()
        print(server.pid, flush=True)
        time.sleep(300)
        """
    )
    proc, line = started(script, fields=1)
    pid = int(line[0])
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        assert b"handofflock.testing.s3server" in f.read()
    proc.kill()
    proc.wait(30)
    assert_gone(pid, "SIGKILL of the script that started it")
