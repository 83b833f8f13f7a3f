"""Ctrl-C at ``handofflock run`` on a real terminal, through the real command.

The first Ctrl-C is passed on to CMD and starts the grace; each further one
printed "N s to exit" again, although the grace does not restart, and did
nothing else. A second Ctrl-C now kills CMD at once, and ``run`` then
releases the lock, as ``install_signal_handlers``' second signal does.
"""

from __future__ import annotations

import os
import pty
import select
import signal
import sys
import time
from pathlib import Path

import pytest
from jobsutil import CONSOLE_SCRIPT, child_env
from lockutil import eventually, raw_read

pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc"), pytest.mark.timeout(60)]


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


class Terminal:
    """``argv`` on a fresh pty as its controlling terminal (as a shell runs a foreground job); what it prints."""

    def __init__(self, argv: list[str]) -> None:
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: run, in the terminal's foreground process group
            try:
                os.execve(argv[0], argv, child_env())
            finally:
                os._exit(127)
        self.output = b""
        self.status: int | None = None

    def read_until(self, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while text.encode() not in self.output:
            if time.monotonic() > deadline:
                raise AssertionError(f"{text!r} not printed within {timeout} s: {self.output.decode(errors='replace')}")
            if select.select([self.fd], [], [], 0.1)[0]:
                try:
                    self.output += os.read(self.fd, 4096)
                except OSError:  # EIO: the terminal's other end is closed
                    break

    def type(self, keys: bytes) -> None:
        os.write(self.fd, keys)

    def wait(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while self.status is None:
            if select.select([self.fd], [], [], 0.05)[0]:
                try:
                    self.output += os.read(self.fd, 4096)
                except OSError:
                    pass
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = os.waitstatus_to_exitcode(status)
            elif time.monotonic() > deadline:
                raise AssertionError(f"still running after {timeout} s: {self.output.decode(errors='replace')}")
        return self.status

    def close(self) -> None:
        if self.status is None:
            os.kill(self.pid, signal.SIGKILL)  # its command dies with it (parent-death signal, watchdog)
            os.waitpid(self.pid, 0)
        os.close(self.fd)


def test_a_second_ctrl_c_kills_the_command_now_and_releases_the_lock(tmp_path):
    url = (tmp_path / "lock.json").as_uri()
    marker = tmp_path / "cmd.pid"
    # CMD takes its time over Ctrl-C: far longer than the test waits.
    script = f"trap 'sleep 50; exit 1' INT; echo $$ > {marker}; sleep 60 & wait; wait"
    term = Terminal([str(CONSOLE_SCRIPT), "run", "-v", url, "--grace", "40", "--", "sh", "-c", script])
    try:
        cmd = eventually(lambda: marker.exists() and marker.read_text().strip(), timeout=20, what="the command started")
        term.read_until("acquired", 20)
        term.type(b"\x03")  # Ctrl-C: SIGINT to the terminal's foreground group, run
        term.read_until("Ctrl-C again kills it now", 10)
        time.sleep(0.5)
        assert _alive(int(cmd)), "the first Ctrl-C only asks"
        started = time.monotonic()
        term.type(b"\x03")
        status = term.wait(20)
        took = time.monotonic() - started
        out = term.output.decode(errors="replace")
        assert "second SIGINT: killing sh now" in out, out
        assert took < 10, f"{took:.1f} s after the second Ctrl-C (the grace was 40 s): {out}"
        assert status == 137, out
        assert not _alive(int(cmd))
        assert raw_read(url)[0].owner_id is None, "the lock was released"
    finally:
        term.close()


def test_the_command_has_no_controlling_terminal_but_reads_answers_from_the_terminal_on_stdin(tmp_path):
    """What docs/jobs.md promises a deploy script that prompts: CMD runs in a session of its own, so
    /dev/tty cannot be opened (``sudo``, ``ssh`` and ``git`` prompts that insist on it fail), but its
    stdin is still the terminal, and a prompt that reads stdin (``sudo -S``, ``read``) gets the answer."""
    script = ("if (exec </dev/tty) 2>/dev/null; then echo has-dev-tty; else echo no-dev-tty; fi; "
              "test -t 0 && echo stdin-is-a-terminal; printf 'password: '; read answer; echo \"got $answer\"")
    term = Terminal([str(CONSOLE_SCRIPT), "run", (tmp_path / "lock.json").as_uri(), "--", "sh", "-c", script])
    try:
        term.read_until("password: ", 20)
        term.type(b"hunter2\n")
        assert term.wait(20) == 0, term.output
        out = term.output.decode(errors="replace")
        assert "no-dev-tty" in out and "stdin-is-a-terminal" in out and "got hunter2" in out, out
    finally:
        term.close()
