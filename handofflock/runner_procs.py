"""The command's processes for ``handofflock run``: where they are, how they are signalled and reaped.

Owns what ``run`` does to the operating system around the command, none of
which needs the supervisor's state: the watchdog's pipe, the command's cgroup
(v2, where one can be made), the parent-death signal and the child subreaper
(Linux ``prctl``), the /proc walk of ``run``'s descendants, and
:class:`_CommandProcesses`, which finds every process of the command (its
session, its cgroup, ``run``'s tree) and signals and reaps them. The
supervisor loop that decides when to do each is :mod:`.runner`; the bookkeeping
the watchdog itself needs is :mod:`._watchdog`.
"""

from __future__ import annotations

import ctypes
import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Collection

from . import _watchdog

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37


def _tell(watchdog: int, line: str) -> None:
    try:
        os.write(watchdog, f"{line}\n".encode())
    except OSError:
        pass


def _start_watchdog() -> int | None:
    """Start the watchdog (handofflock/_watchdog.py); return the write end of its pipe, or None.

    The watchdog kills what is left of the command's session once run exits,
    whatever ends run. The write end is not inheritable, so only run holds it:
    the command and its children never keep the watchdog waiting. run closes
    it once nothing of the command is left; if run dies first, the kernel
    closes it.
    """
    try:
        read_end, write_end = os.pipe()
    except OSError:
        return None
    try:
        subprocess.Popen(
            [sys.executable, "-I", "-S", _watchdog.__file__, str(read_end)],
            pass_fds=(read_end,),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            start_new_session=True,  # out of reach of the terminal, and of an outer run stopping this one
        )
    except OSError:
        os.close(write_end)
        return None
    finally:
        os.close(read_end)
    return write_end


def _make_cgroup() -> str | None:
    """A cgroup (v2) for the command, below run's own, where the hierarchy lets us make one; else None.

    Every process the command starts stays in it, even one that leaves the
    session (``setsid``, a daemon), so nothing the command started can outlive
    the hold unseen. Where cgroup v2 is not mounted, or not writable (no
    delegation), the session is all there is (docs/jobs.md).
    """
    try:
        with open("/proc/self/cgroup") as f:
            own = next(line[3:].strip() for line in f if line.startswith("0::"))
        with open("/proc/self/mountinfo") as f:
            mount = next(
                fields[4]
                for fields in (line.split() for line in f)
                if "-" in fields and fields[fields.index("-") + 1] == "cgroup2"
            )
        # The pid alone is not unique: every run that is PID 1 of a container would be "1".
        path = os.path.join(mount, own.lstrip("/"), f"handofflock-run-{os.getpid()}-{secrets.token_hex(3)}")
        os.mkdir(path)
        return path
    except (OSError, StopIteration, ValueError, IndexError):
        return None


def _remove_cgroup(cgroup: str | None) -> None:
    """Kill what is left in the command's cgroup and remove it."""
    _watchdog.kill_cgroup(cgroup)


def _prepare_command(parent: int, cgroup: str | None) -> None:
    """In the command, before exec: into its cgroup (if any), and SIGKILLed when run dies."""
    if cgroup is not None:
        try:
            with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
                f.write("0")  # this process; its children are born in it
        except OSError:
            pass  # run sees it is not there and falls back to the session
    _die_with_parent(parent)


def _die_with_parent(parent: int) -> None:
    """In the command, before exec: SIGKILL it if ``run`` dies, whatever kills ``run`` (Linux).

    ``run`` forks from its main thread, which lives as long as ``run``, so the
    parent-death signal fires exactly when ``run`` is gone. Elsewhere this does
    nothing (see docs/jobs.md).
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # run died before prctl took effect
            os._exit(137)
    except (OSError, AttributeError):
        pass


def _set_subreaper(on: bool) -> bool | None:
    """Make ``run`` its descendants' subreaper (``on``) or not; the previous setting, or None where unavailable.

    As the child subreaper (Linux 3.4+), a process that the command's tree
    orphans (a double-forked daemon, torchrun's workers once torchrun is
    killed) is reparented to ``run`` instead of to PID 1, so it stays in the
    tree ``run`` follows, and ``run`` reaps it.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        previous = ctypes.c_int(0)
        if libc.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(previous), 0, 0, 0) != 0:
            return None
        if libc.prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) != 0:
            return None
        return bool(previous.value)
    except (OSError, AttributeError):  # not Linux
        return None


def _descendants(
    root: int, *, but: Collection[int] = (), processes: list[tuple[int, bytes, int, int, int]] | None = None
) -> dict[int, tuple[bytes, int]]:
    """``{pid: (state, process group)}`` of every descendant of ``root`` (zombies included), by parent pid.

    The processes in ``but``, and theirs, are left out. One pass over /proc (or over ``processes``).
    """
    children: dict[int, list[tuple[int, bytes, int]]] = {}
    for pid, state, ppid, group, _ in _watchdog.processes() if processes is None else processes:
        children.setdefault(ppid, []).append((pid, state, group))
    found: dict[int, tuple[bytes, int]] = {}
    todo = [root]
    while todo:
        for pid, state, group in children.get(todo.pop(), ()):
            if pid not in but and pid not in found:
                found[pid] = (state, group)
                todo.append(pid)
    return found


class _CommandProcesses:
    """Where the command's processes are: its session, its cgroup where run made one, and run's tree.

    The session (and process group) is the command's pid. The cgroup, where
    there is one, holds everything the command starts. The tree is every
    descendant of ``run`` but ``others`` (the watchdog, and any child ``run``
    had before the command): with ``run`` as the subreaper, a process that
    leaves the session and is orphaned (``setsid``, a daemon, torchrun's
    workers) comes back to ``run`` and stays in the tree, which is what
    accounts for it where no cgroup could be made.
    """

    def __init__(self, pid: int, cgroup: str | None, others: Collection[int]) -> None:
        self.pid = pid
        self.cgroup = cgroup
        self.root = os.getpid()
        self.others = frozenset(others)

    def states(self) -> dict[int, tuple[bytes, int]]:
        """``{pid: (state, process group)}`` of every process of the command: its session, cgroup and
        tree, zombies included, from one pass over /proc."""
        processes = _watchdog.processes()
        found = _descendants(self.root, but=self.others, processes=processes)
        for pid, state, _, group, session in processes:
            if session == self.pid and pid not in found:  # a session member that is not ours (rare)
                found[pid] = (state, group)
        if self.cgroup is not None:
            where = {pid: (state, group) for pid, state, _, group, _ in processes}
            for pid in _watchdog.cgroup_members(self.cgroup):
                found.setdefault(pid, where.get(pid, (b"?", 0)))  # born since the pass: alive
        return found

    def outside_group(self) -> list[int]:
        """Every live process of the command not in its process group (one signalled with ``killpg``
        gets the signal that way): session, cgroup and tree."""
        return [pid for pid, (state, group) in self.states().items() if group != self.pid and state != b"Z"]

    def signal(self, sig: int, *, everyone: bool | None = None, main_only: bool = False) -> None:
        """Send ``sig`` to the command's process group (or, ``main_only``, to the command's own process),
        and with ``everyone`` to every other process of it too.

        A polite signal (the stop signal, a signal passed on) goes to the
        command's process group, as a terminal would send it: a supervisor
        inside (GNU ``timeout``, a job-control shell) relays it to the groups
        it made, and a second copy sent to them directly would be one too many
        (to many programs a second SIGINT means "abort now"). KILL, STOP and
        CONT (``everyone``, the default for them) go to every process: the rest
        of the session, the cgroup where there is one, and every descendant of
        ``run`` (a daemon that left the session and was orphaned came back to
        ``run``, the subreaper). Each process gets one copy. Nothing of the
        command outlives the hold either way: what the polite signal did not
        end is killed after the grace, and the lock moves on only once none is left.
        """
        if everyone is None:
            everyone = sig in TO_EVERYONE
        try:
            if main_only and not everyone:
                os.kill(self.pid, sig)
            else:
                os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        if everyone:
            _watchdog.signal_each(self.outside_group(), sig)

    def orphans(self) -> list[int]:
        """The command's live processes that are ``run``'s children but the command itself: orphaned
        by its tree, and come back to ``run`` (the subreaper)."""
        me = os.getpid()
        return [
            pid
            for pid, state, ppid, _, _ in _watchdog.processes()
            if ppid == me and state != b"Z" and pid != self.pid and pid not in self.others
        ]

    def live(self) -> bool:
        """Whether a live (not zombie) process of the command is left."""
        return any(state != b"Z" for state, _ in self.states().values())

    def all_stopped(self) -> bool:
        """Whether every live process of the command is stopped (a stopped one cannot fork)."""
        return all(state in (b"T", b"t", b"Z") for state, _ in self.states().values())

    def alive(self) -> bool:
        """Whether any process of the command is left, zombies included, after reaping our own children.

        Answered "none" only by two passes in a row: one pass over /proc can miss
        a process whose parent exits and is reaped while the pass reads the
        rest (the orphan comes back to ``run``, so the second pass finds it).
        """
        self.reap(everything=True)
        try:
            os.killpg(self.pid, 0)
            return True
        except ProcessLookupError:
            pass
        except PermissionError:  # a member changed its credentials: it exists
            return True
        return bool(self.states() or self.states())

    def reap(self, *, everything: bool = False) -> None:
        """Collect the orphans that came back to ``run`` and died: never the command itself (``Popen``
        collects it) unless ``everything``, nor the ``others``.

        ``waitid(WNOWAIT)`` names a dead child without collecting it, at no cost
        while there is none; /proc is read only when the one it names is not
        ours to collect.
        """
        while hasattr(os, "waitid"):
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if info is None:
                return
            if info.si_pid in self.others or (info.si_pid == self.pid and not everything):
                break
            try:
                os.waitpid(info.si_pid, os.WNOHANG)
            except ChildProcessError:
                return
        me = os.getpid()
        for pid, state, ppid, _, _ in _watchdog.processes():
            if ppid == me and state == b"Z" and pid not in self.others and (everything or pid != self.pid):
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass


#: Signals that go to every process of the command, not only to its process group.
TO_EVERYONE = (signal.SIGKILL, signal.SIGSTOP, signal.SIGCONT)
