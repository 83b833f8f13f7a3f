"""The watchdog: once its starter is gone, nothing of the session it was told of is left running.

``handofflock run`` starts this script with :func:`start` (by path, stdlib
only, so it starts in a few milliseconds and imports nothing of the package)
before the command, in a session of its own: the terminal's signals and a
kill of ``run``'s group or session pass it by, and the signals ``run`` sends
to the command never reach it. It holds the read end of a pipe whose write
end only ``run`` holds. ``run`` writes (:func:`tell`) the command's cgroup on
it before starting the command, and the command's session id right after;
the watchdog then reads until end of file, which comes when ``run`` exits,
however it ends (SIGKILL and an out-of-memory kill included). It then SIGKILLs every
process of the command's cgroup, if ``run`` made one (that includes processes
that left the session), and of that session, again until none is left (a
member may fork while it is being killed), removes the cgroup, and exits.

``PR_SET_PDEATHSIG`` alone kills only the command's own process: the children
of a shell, or of ``timeout(1)``, would live on beside the next holder. On an
ordinary exit ``run`` has already emptied the session and there is nothing to
kill. A process that leaves the session (``setsid``, a daemon) escapes the
session's kill, but not the cgroup's; without a cgroup it escapes (docs/jobs.md).

The watchdog has a session of its own: a signal or SIGKILL to the session it
was started from (an outer ``run`` stopping this one, say) passes it by, so it
is there to clean up when its ``run`` dies.

:class:`~handofflock.testing.FakeGCSServer` uses it the same way for the
emulator's session. Usage (by :func:`start` only): ``python -I -S _watchdog.py FD``.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable

#: How long the watchdog keeps killing a session that keeps forking.
KILL_FOR = 5.0


def processes() -> list[tuple[int, bytes, int, int, int]]:
    """``(pid, state, ppid, process group, session)`` of every process (Linux, from /proc; elsewhere none)."""
    found: list[tuple[int, bytes, int, int, int]] = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # pid (comm) state ppid pgrp session ...: comm may hold spaces and parentheses
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 3:
            found.append((int(entry), fields[0], int(fields[1]), int(fields[2]), int(fields[3])))
    return found


def cgroup_members(cgroup: str | None) -> list[int]:
    """The processes in cgroup ``cgroup`` (a cgroup v2 directory) and in the cgroups below it, or none.

    Below it: a ``run`` inside the command (nested) puts its own command in a
    cgroup of its own, inside ours.
    """
    if not cgroup:
        return []
    members = []
    for path, _, _ in os.walk(cgroup):
        try:
            with open(os.path.join(path, "cgroup.procs")) as f:
                members += [int(line) for line in f if line.strip()]
        except (OSError, ValueError):
            continue
    return members


def _remove_tree(cgroup: str) -> bool:
    """Remove ``cgroup`` and the (empty) cgroups below it, deepest first; True once it is gone."""
    for path, _, _ in sorted(os.walk(cgroup), key=lambda entry: -entry[0].count(os.sep)):
        try:
            os.rmdir(path)  # a cgroup directory goes with rmdir once it holds no process
        except FileNotFoundError:
            pass
        except OSError:
            return False
    return not os.path.exists(cgroup)


def signal_each(pids: list[int], sig: int) -> None:
    """Send ``sig`` to each of ``pids``; one that is gone, or not ours to signal, is passed over.

    So is this process, and a pid that is not a process's: ``kill()`` reads 0 as this process's
    group and -1 as every process, and cgroup.procs shows a member of another pid namespace as 0.
    """
    me = os.getpid()
    for pid in pids:
        if pid <= 0 or pid == me:
            continue
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _until_done(kill_round: Callable[[], bool]) -> None:
    """Repeat ``kill_round`` (True once nothing is left) every 20 ms, for at most ``KILL_FOR``:
    a member may fork while it is being killed."""
    until = time.monotonic() + KILL_FOR
    while not kill_round() and time.monotonic() < until:
        time.sleep(0.02)


def kill_cgroup(cgroup: str | None) -> None:
    """SIGKILL every process in ``cgroup`` until it is empty (or ``KILL_FOR`` passes), then remove it."""
    if not cgroup:
        return

    def kill_round() -> bool:
        try:
            with open(os.path.join(cgroup, "cgroup.kill"), "w") as f:  # Linux 5.14+: the kernel does it all
                f.write("1")
        except OSError:
            pass
        signal_each(cgroup_members(cgroup), signal.SIGKILL)
        return _remove_tree(cgroup)  # only once empty (EBUSY before)

    _until_done(kill_round)


def kill_session(sid: int) -> None:
    """SIGKILL the process group ``sid`` and every process of session ``sid`` until none is left."""

    def kill_round() -> bool:
        try:
            os.killpg(sid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        # Live members of the session, including those in process groups of their own.
        members = [pid for pid, state, _, _, session in processes() if session == sid and state != b"Z"]
        signal_each(members, signal.SIGKILL)
        return not members

    _until_done(kill_round)


def start() -> int | None:
    """Start the watchdog (this script); return the write end of its pipe, or None where it cannot start.

    The watchdog kills what it is told of once the starter exits, whatever
    ends it. The write end is not inheritable, so only the starter holds it:
    the processes it starts never keep the watchdog waiting. The starter
    closes it once nothing is left to kill; if the starter dies first, the
    kernel closes it.
    """
    import subprocess  # here, not at the top: the watchdog itself never needs it

    try:
        read_end, write_end = os.pipe()
    except OSError:
        return None
    try:
        subprocess.Popen(
            [sys.executable, "-I", "-S", os.path.abspath(__file__), str(read_end)],
            pass_fds=(read_end,),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            start_new_session=True,  # out of reach of the terminal, and of whatever stops the starter's session
        )
    except OSError:
        os.close(write_end)
        return None
    finally:
        os.close(read_end)
    return write_end


def tell(watchdog: int | None, line: str) -> None:
    """Write ``line`` to the watchdog (if it could be started)."""
    try:
        if watchdog is not None:
            os.write(watchdog, f"{line}\n".encode())
    except OSError:
        pass


def main(argv: list[str]) -> int:
    ignored = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGTSTP, signal.SIGTTIN)
    for sig in (*ignored, signal.SIGTTOU, signal.SIGUSR1, signal.SIGUSR2, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)
    fd = int(argv[1])
    data = b""
    while chunk := os.read(fd, 4096):  # until run is gone, however it ends
        data += chunk
    # Lines run wrote: "cgroup PATH" before the command starts, "session SID" once it has.
    # If run died in between, the cgroup alone says where the command is.
    for line in data.decode(errors="replace").splitlines():
        what, _, value = line.partition(" ")
        if what == "cgroup" and value:
            kill_cgroup(value)
        elif what == "session" and value.isdigit():
            kill_session(int(value))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
