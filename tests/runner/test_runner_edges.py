"""``handofflock run``: the command never outlives its lock, with real processes.

Each test starts ``handofflock run LOCK -- CMD`` on a local lock file, finds
the command's processes through /proc, does to ``run`` what the world does
(SIGKILL, SIGQUIT, Ctrl-Z, a closed stderr), and checks that no process of
the command is left running once ``run`` is gone or the lock has moved on.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from jobsutil import CONSOLE_SCRIPT, child_env, in_process
from lockutil import eventually, raw_read

from handofflock.cli import main
from childpipes import next_line

pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc; the guarantees are Linux's"),
              pytest.mark.timeout(90)]


def stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, session) of ``pid``, or None if it is gone (or a zombie)."""
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2 :].split()
    if fields[0] == b"Z":
        return None
    return fields[0].decode(), int(fields[1]), int(fields[3])


def session_of(sid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := stat(int(entry))) is not None and st[2] == sid:
            out.append(int(entry))
    return out


def members_of(sid: int, at_least: int, what: str) -> list[int]:
    """The processes of session ``sid``, once there are ``at_least`` of them."""
    def enough() -> list[int] | None:
        members = session_of(sid)
        return members if len(members) >= at_least else None

    return eventually(enough, timeout=20, what=what)


def process_groups(pids: list[int]) -> set[int]:
    return {int(Path(f"/proc/{p}/stat").read_bytes().rsplit(b")", 1)[1].split()[2]) for p in pids}


def children(pid: int) -> list[int]:
    return [int(e) for e in os.listdir("/proc") if e.isdigit() and (st := stat(int(e))) and st[1] == pid]


def start_run(lock: Path, *cmd: str, stderr=subprocess.PIPE, extra: tuple[str, ...] = ()) -> tuple[subprocess.Popen, int]:
    """``run`` and the pid of its command (which leads a session of its own)."""
    proc = subprocess.Popen([str(CONSOLE_SCRIPT), "run", str(lock), "--grace", "3", *extra, "--", *cmd],
                            stdout=subprocess.PIPE, stderr=stderr, text=True, env=child_env())
    def command() -> int | None:
        # run's other child is its watchdog, a session leader too; and a child that has not
        # exec'd yet still shows run's own command line: wait for the command's own.
        return next((c for c in children(proc.pid) if (st := stat(c)) and st[2] == c and _argv0(c) == cmd[0]), None)

    cmd_pid = eventually(command, timeout=20, what="the command started")
    return proc, cmd_pid


def _argv0(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    except (OSError, UnicodeDecodeError):
        return None


def gone(pids: list[int], timeout: float = 10.0) -> None:
    eventually(lambda: all(stat(p) is None for p in pids), timeout=timeout, what=f"processes {pids} gone")


def reap(proc: subprocess.Popen) -> None:
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGQUIT])
def test_the_command_dies_with_run_whatever_kills_run(tmp_path, sig):
    proc, cmd = start_run(tmp_path / "lock.json", "sleep", "60")
    os.kill(proc.pid, sig)
    reap(proc)
    gone([cmd])
    if sig == signal.SIGQUIT:  # a signal run can catch: passed on, then the lock released
        record, _ = raw_read((tmp_path / "lock.json").as_uri())
        assert record.owner_id is None


def test_nothing_of_the_command_session_outlives_a_killed_run(tmp_path):
    """SIGKILL to run, whose command is a shell with children: PR_SET_PDEATHSIG kills the shell
    alone; the watchdog kills the rest of the session (the sleeps, one in a group of its own),
    at once, long before the lease (60 s) could pass to anyone else."""
    proc, cmd = start_run(tmp_path / "lock.json", "sh", "-c", "sleep 60 & timeout 60 sleep 61 & wait")

    members = members_of(cmd, 4, "sh, sleep, timeout and its sleep")
    os.kill(proc.pid, signal.SIGKILL)
    reap(proc)
    gone(members, timeout=5)
    assert session_of(cmd) == []


COUNT_SIGNALS = """
import signal, sys, time
got = []
signal.signal(signal.SIGINT, lambda s, f: got.append(s))
print("ready", flush=True)
while not got:
    time.sleep(0.01)
time.sleep(1.0)  # a second copy would arrive well within this
print("copies", len(got), flush=True)
"""


def test_a_signal_passed_on_reaches_each_process_once(tmp_path):
    """Ctrl-C to run reaches the command once. To many programs a second SIGINT means "abort
    now", and a Python program that has begun to exit dies of a second SIGUSR1 (its handlers are
    reset): signalling the command's group, then each session member again, did both."""
    proc, cmd = start_run(tmp_path / "lock.json", sys.executable, "-c", COUNT_SIGNALS)
    assert next_line(proc).strip() == "ready"
    os.kill(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert out.split() == ["copies", "1"], err
    assert proc.returncode == 0, err


def _cgroup_parent() -> str | None:
    """Where run (a child of this process, so in its cgroup) makes the command's cgroup, if it can."""
    # Private helpers, reached on purpose: the cgroup run itself would make.
    from handofflock._watchdog import kill_cgroup
    from handofflock.runner import _make_cgroup

    path = _make_cgroup()
    kill_cgroup(path)
    return None if path is None else os.path.dirname(path)


def _cgroup_v2_writable() -> bool:
    return _cgroup_parent() is not None


@pytest.mark.skipif(not _cgroup_v2_writable(), reason="needs a writable cgroup v2 hierarchy (no cgroup, or no delegation here): run falls back to the session")
def test_a_daemon_that_left_the_session_is_stopped_with_the_command_through_its_cgroup(tmp_path):
    """A command that starts a daemon (``setsid``: a session of its own) and exits: the daemon is
    not in the command's session, but it is in the command's cgroup, so it is stopped before the
    lock is released, and the cgroup is removed. Without the cgroup it ran on beside the next holder."""
    marker = tmp_path / "daemon.pid"
    script = f"setsid sh -c 'echo $$ > {marker}; exec sleep 60' & sleep 0.5; exit 0"
    proc, cmd = start_run(tmp_path / "lock.json", "sh", "-c", script)
    daemon = eventually(lambda: int(marker.read_text()) if marker.exists() and marker.read_text().strip() else None,
                        timeout=20, what="the daemon started")
    assert stat(daemon)[2] != cmd, "the daemon left the command's session"
    reap(proc)
    gone([daemon], timeout=10)
    record, _ = raw_read((tmp_path / "lock.json").as_uri())
    assert record.owner_id is None
    parent = _cgroup_parent()
    assert not [d for d in os.listdir(parent) if d.startswith(f"handofflock-run-{proc.pid}-")], "the cgroup was removed"


@pytest.mark.skipif(not _cgroup_v2_writable(), reason="needs a writable cgroup v2 hierarchy (no cgroup, or no delegation here): run falls back to the session")
def test_a_nested_run_leaves_nothing_of_its_command_when_the_outer_run_lets_go(tmp_path):
    """run A -- run B -- CMD, where CMD ignores SIGTERM and has a child. A SIGTERM to the outer run:
    after its grace it kills the inner run; the inner command's child is in the inner session, which
    the outer run never looks at, but in a cgroup below the outer one. Before, lock A was released
    with that child running, and the two cgroup directories were left behind."""
    marker = f"{os.getpid()}.5"  # a unique sleep argument
    outer = subprocess.Popen([str(CONSOLE_SCRIPT), "run", str(tmp_path / "a.json"), "--grace", "1", "--",
                              str(CONSOLE_SCRIPT), "run", str(tmp_path / "b.json"), "--grace", "5", "--",
                              "sh", "-c", f'trap "" TERM; sleep 3{marker} & wait'],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env())

    def sleeper() -> int | None:
        return next((int(e) for e in os.listdir("/proc") if e.isdigit() and _cmdline(int(e)) == f"sleep 3{marker}"), None)

    child = eventually(sleeper, timeout=20, what="the inner command's child started")
    parent = _cgroup_parent()
    os.kill(outer.pid, signal.SIGTERM)
    reap(outer)
    assert stat(child) is None, "the inner command's child outlived lock A"
    assert raw_read((tmp_path / "a.json").as_uri())[0].owner_id is None
    assert not [d for d in os.listdir(parent) if d == f"handofflock-run-{outer.pid}" or d.startswith(f"handofflock-run-{outer.pid}-")], "cgroups left behind"


def test_a_status_line_that_cannot_be_written_never_ends_run(tmp_path, monkeypatch):
    """stderr on a full disk (ENOSPC): before, run exited 1 at its first status line, leaving the
    lock held until its lease ran out and the command running unsupervised. (run in this process.)"""
    full = open("/dev/full", "w")
    monkeypatch.setattr(sys, "stderr", full)
    code = main(["run", str(tmp_path / "lock.json"), "--", "sh", "-c", "exit 3"])
    monkeypatch.undo()
    with contextlib.suppress(OSError):  # what run could not write is still in the buffer: its flush fails again
        full.close()
    assert code == 3
    assert raw_read((tmp_path / "lock.json").as_uri())[0].owner_id is None


def test_a_status_line_that_cannot_be_written_never_ends_the_real_command(tmp_path):
    """The same through the console script, its whole stderr on /dev/full: what the process says at exit
    (an unflushed stderr makes the interpreter exit 120) is part of its exit status, which run in this
    process cannot see."""
    with open("/dev/full", "w") as full:
        done = subprocess.run([str(CONSOLE_SCRIPT), "run", str(tmp_path / "lock.json"), "--", "sh", "-c", "exit 3"],
                              stderr=full, stdout=subprocess.PIPE, timeout=60, env=child_env())
    assert done.returncode == 3
    assert raw_read((tmp_path / "lock.json").as_uri())[0].owner_id is None


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def test_processes_in_their_own_process_group_are_stopped_with_the_command(tmp_path):
    """GNU timeout puts its child in a process group of its own; the handoff must not leave it running."""
    proc, cmd = start_run(tmp_path / "lock.json", "sh", "-c", "timeout 60 sleep 60; true")
    members = members_of(cmd, 3, "sh, timeout and sleep")
    assert len(process_groups(members)) >= 2, "timeout(1) made a process group of its own"
    os.kill(proc.pid, signal.SIGTERM)
    reap(proc)
    gone(members)


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash (job control without a terminal)")
def test_a_job_control_shell_leaves_nothing_behind_when_the_lock_moves_on(tmp_path):
    """A shell with job control on (bash, set -m) puts each background job in a process group of its own:
    a signal to the command's group reaches the shell alone. The jobs must still be gone before the
    lock is released."""
    proc, cmd = start_run(tmp_path / "lock.json", "bash", "-c", "set -m; sleep 61 & sleep 62 & wait")

    members = members_of(cmd, 3, "the shell and its two jobs")
    assert len(process_groups(members)) >= 3, "each job has a process group of its own"
    os.kill(proc.pid, signal.SIGTERM)
    reap(proc)
    gone(members)
    assert raw_read((tmp_path / "lock.json").as_uri())[0].owner_id is None


@pytest.mark.parametrize("stderr", ["pipe", "terminal"])
def test_a_closed_stderr_never_stops_run_from_passing_a_signal_on(tmp_path, stderr):
    """An ssh session that drops: SIGHUP, and stderr gone (a closed terminal answers EIO, a
    closed pipe EPIPE). run must pass the signal on and release, saying nothing it cannot."""
    if stderr == "pipe":
        reader, w = os.pipe()
    else:
        import pty

        reader, w = pty.openpty()
    proc, cmd = start_run(tmp_path / "lock.json", "sleep", "60", stderr=w)
    os.close(w)
    os.close(reader)  # whatever run writes to stderr now fails: EPIPE, or EIO from the hung-up terminal
    os.kill(proc.pid, signal.SIGHUP)
    reap(proc)
    assert proc.returncode == 128 + signal.SIGHUP, "the command got SIGHUP, and run exited with its status"
    gone([cmd])
    record, _ = raw_read((tmp_path / "lock.json").as_uri())
    assert record.owner_id is None, "run died before releasing"


def test_ctrl_z_stops_the_command_with_run_and_fg_continues_both(tmp_path):
    proc, cmd = start_run(tmp_path / "lock.json", "sleep", "60", extra=("--ttl", "30"))
    os.kill(proc.pid, signal.SIGTSTP)
    eventually(lambda: stat(proc.pid)[0] == "T" and stat(cmd)[0] == "T", timeout=10, what="run and the command stopped")
    os.kill(proc.pid, signal.SIGCONT)
    eventually(lambda: stat(cmd)[0] in "RS" and stat(proc.pid)[0] in "RS", timeout=10, what="both continued")
    os.kill(proc.pid, signal.SIGTERM)
    reap(proc)
    gone([cmd])


def test_a_command_stopped_past_its_lease_is_killed_not_continued(tmp_path):
    proc, cmd = start_run(tmp_path / "lock.json", "sleep", "60", extra=("--ttl", "2"))
    os.kill(proc.pid, signal.SIGTSTP)
    eventually(lambda: stat(cmd)[0] == "T", timeout=10, what="the command stopped")
    # The lease runs out while both are stopped: the expiry of run's last renewal passes (its own renew deadline is earlier).
    lease = raw_read((tmp_path / "lock.json").as_uri())[0].expires_at
    eventually(lambda: time.time() > lease + 0.1, timeout=10, interval=0.05, what="the lease ran out")
    os.kill(proc.pid, signal.SIGCONT)
    gone([cmd])
    reap(proc)
    assert proc.returncode == 70, proc.stderr.read()


@pytest.mark.parametrize("args, message", [
    (("--signal", "KILL"), "cannot ask a command to stop"),
    (("--signal", "9"), "cannot ask a command to stop"),
    (("--signal", "STOP"), "cannot ask a command to stop"),
    (("--timeout", "nan"), "--timeout must be a finite number"),
    (("--grace", "inf"), "--grace must be a number of seconds in [0, 604800]"),
    (("--grace", "nan"), "--grace must be a number of seconds in [0, 604800]"),
])
def test_nonsense_options_get_a_usage_error_not_a_traceback(tmp_path, args, message, capsys):
    proc = in_process(["run", str(tmp_path / "lock.json"), *args, "--", "true"], capsys)
    assert proc.returncode == 64, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "lock.json").exists(), "nothing was acquired"


def _can_unshare() -> bool:
    try:
        return subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


PID1 = pytest.mark.skipif(not _can_unshare(), reason="needs `unshare --pid` (root or user namespaces); not available here")

_HOLDER = """
import sys, time
from handofflock import HandoffLock, install_signal_handlers
lock = HandoffLock(sys.argv[1], ttl=5)
lock.acquire()
install_signal_handlers(lock, grace=30)
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""


@PID1
def test_a_second_sigterm_ends_a_process_that_is_pid_1(tmp_path):
    """The kernel ignores SIG_DFL signals for PID 1 (a container's entrypoint): the second SIGTERM
    must still end it, after releasing the lock."""
    url = (tmp_path / "lock.json").as_uri()
    proc = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", _HOLDER, url],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env())
    assert next_line(proc).strip() == "ready", proc.stderr.read()
    init = children(proc.pid)[0]  # PID 1 inside its namespace
    os.kill(init, signal.SIGTERM)
    time.sleep(0.3)
    os.kill(init, signal.SIGTERM)
    reap(proc)
    gone([init])
    assert raw_read(url)[0].owner_id is None, "the lock was released before the process ended"


@PID1
def test_run_as_pid_1_reaps_the_orphans_of_its_command(tmp_path):
    """A daemon that double-forks away from the command is reparented to PID 1: run must reap it
    when it dies, or zombies pile up in the container."""
    cmd = "sh -c 'sleep 0.2 &' ; sleep 1.5; ps -eo stat,comm | grep -c '^Z' || true"
    proc = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", str(CONSOLE_SCRIPT), "run",
                           str(tmp_path / "lock.json"), "--", "sh", "-c", cmd],
                          capture_output=True, text=True, env=child_env(), timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "0", f"zombies left: {proc.stdout!r}"


def test_a_process_the_caller_starts_beside_the_command_is_never_signalled_nor_waited_for(tmp_path, capfd):
    """``run``'s code in a process that starts a child of its own while the command runs (another thread of
    the caller's, as a test worker or a service would): that child is not the command's. It gets no
    signal, is not reaped by ``run``, and ``run`` does not wait for it once the command has exited."""
    marker = tmp_path / "command-started"
    beside: list[subprocess.Popen] = []

    def start_beside():
        eventually(marker.exists, timeout=30, what="the command started")
        beside.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]))

    thread = threading.Thread(target=start_beside, daemon=True)
    thread.start()
    command = f"import pathlib, time; pathlib.Path({str(marker)!r}).touch(); time.sleep(2)"
    try:
        code = main(["run", (tmp_path / "lock.json").as_uri(), "--grace", "30", "--", sys.executable, "-c", command])
        thread.join(30)
        err = capfd.readouterr().err
        assert code == 0, err
        assert beside and beside[0].poll() is None, err  # neither killed nor reaped by run
        assert "processes it left" not in err, err
    finally:
        for process in beside:
            process.kill()
            process.wait()


def test_the_command_s_processes_are_signalled_one_by_one_never_run_s_group_or_run_itself():
    """A pid list with 0 (how cgroup.procs shows a process of another pid namespace) or this process in it:
    ``kill()`` would signal this process's whole group, or ``run`` itself. (Not -1 here: every process.)"""
    code = "import os, signal; from handofflock import _watchdog; _watchdog.signal_each([0, os.getpid()], signal.SIGTERM)"
    proc = subprocess.run([sys.executable, "-c", code + "; print('alive')"], capture_output=True, text=True,
                          timeout=60, start_new_session=True)  # a group of its own: 0 names no one else's
    assert proc.returncode == 0 and proc.stdout == "alive\n", proc
