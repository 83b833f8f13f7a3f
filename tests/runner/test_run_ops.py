"""``handofflock run`` for operators: labels, requests that go away, a checked command and
signal, and what a long wait shows, on a terminal (a real pty) and elsewhere. Real processes throughout."""

from __future__ import annotations

import fcntl
import functools
import itertools
import json
import os
import select
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
import weakref
from pathlib import Path

import pytest
from jobsutil import CONSOLE_SCRIPT, child_env, in_process, popen
from lockutil import eventually, raw_read

from handofflock import FakeClock, HandoffLock, Scheduler, runner
from handofflock._waitline import WaitLine  # private module: run's waiting line, on a faster clock here
from handofflock.cli import main
from handofflock.core.record import Label
from handofflock.exit_codes import EXIT_CANNOT_EXECUTE, EXIT_CONFIG, EXIT_NOT_FOUND
from handofflock.lock import events as lock_signals
from handofflock.runner import CommandRunner
from handofflock.storage import records
from childpipes import line_from, next_line

pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc"), pytest.mark.timeout(90)]

PY = sys.executable
JOB = Path(__file__).resolve().parents[1] / "support" / "procs" / "job.py"


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except OSError:
        return False
    return state != b"Z"


def kill_run(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()  # the command dies with run (its parent-death signal and the watchdog)
    proc.wait(20)


def holder_run(url: str, tmp_path: Path, *extra: str, job: tuple[str, ...] = ()) -> subprocess.Popen:
    proc = popen([str(CONSOLE_SCRIPT), "run", url, "--poll-interval", "0.2", "--min-hold", "0", "--owner-id", "holder-job",
                  "--label", "pod=ml/train-0", *extra, "--", PY, str(JOB), "A", str(tmp_path), *job])
    line = next_line(proc)
    assert line.startswith("A start"), line + proc.stderr.read()
    return proc


# --------------------------------------------------------------------------- the command and --signal, checked first


def test_a_typo_in_the_command_never_evicts_the_holder(tmp_path, capsys):
    url = (tmp_path / "lock.json").as_uri()
    clock = FakeClock(start=time.time())
    sched = Scheduler(clock, autostart=False)
    holder = HandoffLock(url, owner_id="holder-job", waiter_check_interval=0.2, clock=clock, scheduler=sched)
    assert holder.acquire()
    try:
        notexec = tmp_path / "train.sh"
        notexec.write_text("#!/bin/sh\n")
        for command, code, says in (("pyhton", EXIT_NOT_FOUND, "command not found: pyhton"),
                                    (str(notexec), EXIT_CANNOT_EXECUTE, "is not executable"),
                                    (str(tmp_path), EXIT_CANNOT_EXECUTE, "is a directory")):
            proc = in_process(["run", url, "--", command, "train.py"], capsys)
            assert proc.returncode == code, proc.stderr
            assert says in proc.stderr and "the lock was not asked for" in proc.stderr
        record, _ = raw_read(url)
        assert record.owner_id == "holder-job" and record.waiting_owner_id is None
        for _ in range(3):  # three of the holder's checks: nobody asked it for anything
            clock.advance(0.2)
            sched.run_pending()
        assert holder.is_held and not holder.release_requested
    finally:
        holder.release()


@pytest.mark.parametrize("value", ["KILL", "9", "STOP", "CHLD", "SEGV", "WINCH", "0", "65", "TERMINATE"])
def test_every_signal_value_is_checked_up_front_with_a_clean_exit_64(tmp_path, value, capsys):
    proc = in_process(["run", str(tmp_path / "lock.json"), "--signal", value, "--", "true"], capsys)
    assert proc.returncode == EXIT_CONFIG, proc.stderr
    assert "--signal" in proc.stderr or "signal" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "lock.json").exists(), "nothing was acquired"


# --------------------------------------------------------------------------- labels


def test_run_writes_its_label_owner_id_and_grace_for_status(tmp_path, capsys):
    url = (tmp_path / "lock.json").as_uri()
    looked = tmp_path / "looked"
    asked = []

    def status_while_held():  # `status --json` from a thread while run, in this process, holds the lock
        try:
            eventually(lambda: raw_read(url)[0] is not None, what="run acquired")
            asked.append(main(["status", url, "--json"]))
        finally:
            looked.touch()

    thread = threading.Thread(target=status_while_held)
    thread.start()
    code = main(["run", url, "--owner-id", "holder-job", "--label", "pod=ml/train-0", "--grace", "12", "--",
                 "sh", "-c", f"while [ ! -e {looked} ]; do sleep 0.01; done"])
    thread.join(30)
    out, err = capsys.readouterr()
    assert code == 0 and asked == [0], err
    doc = json.loads(out)
    assert (doc["ownerId"], doc["ownerLabel"], doc["ownerGrace"]) == ("holder-job", "pod=ml/train-0", 12.0)
    assert doc["releaseRequested"] is False


# --------------------------------------------------------------------------- requests that go away


def test_a_waiter_stopped_with_ctrl_c_leaves_the_holders_command_alone(tmp_path, capfd):
    """The issue's story: the waiter's run is stopped with Ctrl-C during the holder's grace. The holder
    checks again before SIGKILL, finds nobody waiting, and lets its command run on as the owner."""
    url = (tmp_path / "lock.json").as_uri()
    holder = holder_run(url, tmp_path, "--grace", "3", job=("--ignore-signals",))
    try:
        cmd = next(int(p) for p in os.listdir("/proc") if p.isdigit() and _is_job(int(p), tmp_path))
        waiter = popen([str(CONSOLE_SCRIPT), "run", url, "--poll-interval", "0.2", "--min-hold", "0", "--label", "eval-job", "--", "true"])
        eventually(lambda: (raw_read(url)[0]).waiting_owner_id is not None, timeout=20, what="the waiter registered")
        asked = wait_for_line(holder, "asks for")
        assert "eval-job (" in asked, asked  # named by its label, as status names it
        grace_ends = time.monotonic() + 3.0
        waiter.send_signal(signal.SIGINT)
        assert waiter.wait(20) == 128 + signal.SIGINT, waiter.stderr.read()
        err = wait_for_line(holder, "is no longer waiting")
        assert "not killing" in err and "run keeps the lock" in err
        time.sleep(max(0.0, grace_ends + 1.0 - time.monotonic()))  # past the end of the grace it was given
        assert alive(cmd) and holder.poll() is None, "the command runs on"
        record, _ = raw_read(url)
        assert record.owner_id == "holder-job" and record.waiting_owner_id is None
        assert HandoffLock(url).status().owner_live
        # A new waiter is a new request: the command is asked again, and killed after a fresh grace. The
        # new waiter is a run in this process: it returns once it has the lock; the holder's words are kept.
        second = in_process(["run", url, "--poll-interval", "0.2", "--min-hold", "0", "--timeout", "60", "--", "true"],
                            capfd)
        wait_for_line(holder, "asks for")
        assert holder.wait(30) == 128 + signal.SIGKILL
        assert "did not exit within 3 s; killing it" in holder.stderr.read()
        assert second.returncode == 0, second.stderr
    finally:
        kill_run(holder)


def _is_job(pid: int, tmp_path: Path) -> bool:
    """``pid`` runs this test's job (its own ``tmp_path``: other tests of this file may run their jobs at the same time)."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        return str(JOB) in args and str(tmp_path) in args
    except OSError:
        return False


def wait_for_line(proc: subprocess.Popen, text: str, timeout: float = 30.0) -> str:
    """Read ``proc``'s stderr until a line holds ``text``; return what was read."""
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stderr], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        line = line_from(proc.stderr)  # a buffered readline would hide the next line from select()
        if not line:
            break
        seen.append(line)
        if text in line:
            return "".join(seen)
    raise AssertionError(f"no line with {text!r} within {timeout} s; saw:\n{''.join(seen)}")


def test_run_checks_again_before_it_signals_and_leaves_a_command_alone_when_nobody_waits(
    tmp_path, capfd, monkeypatch
):
    """A request that is gone by the time run would act on it (the holder's flag said yes, a fresh read
    says nobody waits) is not passed on: the command runs to its end, untouched (it ends once run has said
    so, or after 10 s; a SIGTERM would end it with 9)."""
    url = (tmp_path / "lock.json").as_uri()
    flag = tmp_path / "left-alone"
    said = CommandRunner.say

    def say(self, message):
        said(self, message)
        if "is no longer waiting" in message:
            flag.touch()

    monkeypatch.setattr(CommandRunner, "say", say)

    def ghost(sender, **kw):  # a waiter's request whose waiter is already gone
        sender.request_release("waiter", requester="ghost-waiter", deadline=time.time() + 30)

    lock_signals.acquired.connect(ghost)
    try:
        code = main(["run", "-v", url, "--grace", "0.5", "--", "sh", "-c",
                     f"trap 'exit 9' TERM; i=0; while [ ! -e '{flag}' ] && [ $i -lt 500 ]; do "
                     "sleep 0.02; i=$((i+1)); done"])
    finally:
        lock_signals.acquired.disconnect(ghost)
    err = capfd.readouterr().err
    assert code == 0, err
    assert "ghost-waiter (waiter) asked for" in err and "is no longer waiting" in err and "sending" not in err


# --------------------------------------------------------------------------- feedback on long waits


def held_by_a_labelled_holder(url: str) -> HandoffLock:
    holder = HandoffLock(url, ttl=6.0, renew_interval=0.4, renew_deadline=3.0, waiter_check_interval=0.2,
                         owner_id="holder", label=Label("pod=ml/train-0", grace=7.0))
    holder.acquire()
    return holder


def run_on_a_pty(url: str, *, without_rich: bool) -> tuple[int, str]:
    """``run`` waiting behind a holder, its stderr a real terminal; the holder lets go once the line says
    it was notified. Returns run's exit code and everything the terminal received."""
    holder = held_by_a_labelled_holder(url)
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 200, 0, 0))  # 200 columns, as a wide terminal
    args = ([PY, "-c", "import sys; sys.modules['rich'] = None; from handofflock.cli import main; sys.exit(main(sys.argv[1:]))"]
            if without_rich else [str(CONSOLE_SCRIPT)])
    proc = subprocess.Popen([*args, "run", url, "--poll-interval", "0.2", "--min-hold", "0", "--", "true"],
                            stdout=subprocess.DEVNULL, stderr=slave, stdin=subprocess.DEVNULL,
                            env=child_env(TERM="xterm-256color", COLUMNS="200"))
    os.close(slave)
    out = b""
    deadline = time.monotonic() + 40
    released = False
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the other end is closed, run is done
                    break
                if not chunk:
                    break
                out += chunk
            if not released and b"notified yes" in out:
                holder.release()
                released = True
            if proc.poll() is not None and not ready:
                break
        if proc.poll() is None and not released:
            proc.kill()  # never told: fail below with what the terminal showed
        code = proc.wait(20)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
        if holder.is_held:
            holder.release()
    return code, out.decode(errors="replace")


def test_on_a_terminal_run_shows_one_live_line_drawn_by_rich(tmp_path):
    code, screen = run_on_a_pty((tmp_path / "lock.json").as_uri(), without_rich=False)
    assert code == 0, screen
    assert "\x1b[?25l" in screen, "rich's live display (it hides the cursor) drew the line"
    assert "held by pod=ml/train-0" in screen and "notified no" in screen and "notified yes" in screen
    assert "grace ends by 20" in screen and "waiting 1." in screen
    live = screen[screen.index("\x1b[?25l"):screen.index("\x1b[?25h")].rstrip("\r\n")
    assert live.count("waiting ") >= 3 and "\n" not in live, "one line, redrawn in place"
    assert "acquired" not in screen.split("\x1b[?25h", 1)[1], "then run, which succeeds, says nothing (as flock)"


def test_on_a_terminal_without_rich_run_redraws_a_plain_line(tmp_path):
    code, screen = run_on_a_pty((tmp_path / "lock.json").as_uri(), without_rich=True)
    assert code == 0, screen
    assert "\x1b[?25l" not in screen, "rich is not there"
    assert "\r\x1b[Khandofflock: waiting" not in screen and "\r\x1b[Kwaiting" in screen
    assert "held by pod=ml/train-0" in screen and "notified yes" in screen and "grace ends by 20" in screen
    redraws = screen.count("\r\x1b[Kwaiting")
    assert redraws >= 3, "redrawn in place, about every 0.1 s"
    assert screen.count("\nhandofflock: waiting") == 0, "never a new line per update"


class TenfoldStderr:
    """Run's waiting line, its clock ten times as fast as the real one: each line noted with that clock."""

    def __init__(self):
        self.began = time.monotonic()
        self.lines: list[tuple[float, str]] = []

    def clock(self) -> float:
        return self.began + (time.monotonic() - self.began) * 10

    def write(self, text: str) -> int:
        self.lines += [(self.clock(), ln) for ln in text.splitlines(keepends=True)]
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def test_elsewhere_run_prints_a_waiting_line_now_and_then_not_a_flood(tmp_path, capfd, monkeypatch):
    """``run`` in this process, its waiting line on a clock ten times as fast (a line every 5 s of it is
    one every 0.5 s here), the labelled holder a lock in this process."""
    url = (tmp_path / "lock.json").as_uri()
    stderr = TenfoldStderr()
    monkeypatch.setattr(runner, "WaitLine", functools.partial(WaitLine, clock=stderr.clock, stream=stderr))
    monkeypatch.setattr(records, "_down", weakref.WeakKeyDictionary())  # other tests' stores are none of run's
    holder = held_by_a_labelled_holder(url)

    def let_go_once_told():
        try:
            eventually(lambda: any("notified yes" in ln for _, ln in stderr.lines), timeout=40,
                       what="a line saying the holder was told")
        finally:
            holder.release()

    thread = threading.Thread(target=let_go_once_told, daemon=True)
    thread.start()
    try:
        assert main(["run", "-v", url, "--poll-interval", "0.2", "--min-hold", "0", "--", "true"]) == 0
        thread.join(10)
    finally:
        if holder.is_held:
            holder.release()
    lines = [*stderr.lines, *((0.0, ln) for ln in capfd.readouterr().err.splitlines(keepends=True))]
    waiting = [(t, ln) for t, ln in lines if "handofflock: waiting " in ln and "notified" in ln]
    assert waiting and "held by pod=ml/train-0; notified no" in waiting[0][1]
    assert "grace ends by 20" in waiting[-1][1]
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(waiting)]
    assert all(gap >= 4.0 for gap in gaps), f"at most one line every 5 s: {gaps}"
    assert not any("\r" in ln for _, ln in lines)
