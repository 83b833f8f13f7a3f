"""``handofflock run``: hold the lock around a child process, flock(1)-style, for a fleet.

The main thread stays free to answer signals: the acquire runs in a helper
thread (cancelled from the main loop when a signal arrives while waiting), and
the child is supervised by polling ``wait()``. On a release request (a waiter,
or a signal to this process) the child gets the stop signal and ``grace``
seconds, then SIGKILL; the lock is released only once the child has exited,
handed to the waiter if there is one. A lost lock stops the child the same way
and makes the exit code 70.

The child runs in a process group of its own (a new session), and every signal
goes to the whole group: ``run -- sh -c 'python train.py; ...'`` stops the
trainer too, not only the shell. The lock moves on only once the group is
empty (or killed after the grace), so no process of the command is left
working on the resource while the next holder starts.

Longer than 400 lines on purpose: it is one supervisor loop (signals passed
on, job control, the lock's health, the grace and the kill) whose branches
share the child's state; split, each part would need all of it. Process-tree
bookkeeping that needs no state is in :mod:`._watchdog`.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import math
import os
import secrets
import shlex
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from . import _watchdog
from ._waitline import WaitLine
from .core.errors import AcquireCancelled, ConfigurationError, HandoffLockError
from .core.identity import detect_label
from .core.record import MAX_TTL, Label
from .core.threads import quiet
from .core.timefmt import who
from .exit_codes import EXIT_CANNOT_EXECUTE, EXIT_CONTENDED, EXIT_LOST, EXIT_NOT_FOUND
from .lock import events as lock_signals
from .lock.handoff import HandoffLock
from .lock.types import LockStatus, ReleaseRequest
from .os_signals import parse_signal

#: Signals ``run`` catches and passes on to the command's process group. The command is not
#: in the terminal's foreground group, so Ctrl-C reaches it only this way.
RUN_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)

#: Signals that cannot be passed on as a polite stop: the command could not clean up (KILL), or
#: would never end (STOP and the terminal stops).
UNUSABLE_STOP_SIGNALS = (signal.SIGKILL, signal.SIGSTOP, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU, signal.SIGCONT)

#: The signals ``--signal`` accepts: each asks a process to end and can be caught, so the command
#: can checkpoint first; none is sent by the system for another reason (CHLD, WINCH, PIPE, SEGV...),
#: which ``run`` would otherwise take for a request to stop.
STOP_SIGNALS = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGALRM,
    signal.SIGRTMIN,
    signal.SIGRTMAX,
)

_PR_SET_PDEATHSIG = 1

#: After the command's own process exits, how long the rest of its group gets before SIGKILL
#: when no grace is running yet (the command left helpers behind).
LEFTOVER_GRACE = 5.0


def fail(message: str, code: int) -> int:
    """Print ``handofflock: error: message`` to stderr and return ``code``."""
    print(f"handofflock: error: {message}", file=sys.stderr)
    return code


class CommandRunner:
    """``handofflock run``: the lock around one child process (see the module docstring)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.cgroup: str | None = None  # the command's cgroup, where run could make one
        self.stop_signal = stop_signal(args.signal)
        if args.grace is None or not 0 <= args.grace <= MAX_TTL:  # NaN fails both comparisons
            raise ConfigurationError(
                f"--grace must be a number of seconds in [0, {MAX_TTL:.0f}] (a week), got {args.grace}"
            )
        if args.timeout is not None and not (args.timeout >= 0 and math.isfinite(args.timeout)):
            raise ConfigurationError(f"--timeout must be a finite number >= 0, got {args.timeout}")
        timing: dict[str, Any] = {"ttl": args.ttl, "wait_for_slot": args.wait_for_slot}
        if args.poll_interval is not None:
            timing.update(waiter_check_interval=args.poll_interval, waiter_poll_interval=args.poll_interval)
        label = Label(args.label if args.label is not None else detect_label(), grace=args.grace)
        self.lock = HandoffLock(args.url, owner_id=args.owner_id, label=label, **timing)
        self.pending: list[int] = []  # signals received, appended by the handler (atomic)
        self.first_signal: int | None = None
        self._previous: dict[int, Any] = {}
        self._line: WaitLine | None = None  # the live waiting line, while it is up

    _stderr_broken = False

    def say(self, message: str) -> None:
        """A status line on stderr. Never fails: a closed pipe or a hung-up terminal must not end ``run``."""
        if self.args.quiet or self._stderr_broken:
            return
        if self._line is not None:
            self._line.say(f"handofflock: {message}")
            return
        try:
            print(f"handofflock: {message}", file=sys.stderr, flush=True)
        except (OSError, ValueError):  # EPIPE, EIO after SIGHUP, ENOSPC, a closed stream: never a reason to end
            self._stderr_broken = True  # say nothing more: each try would fail the same way

    # Signal handler: only appends and assigns (no I/O, no locks); the main loop acts.
    def _on_signal(self, signum: int, frame: Any) -> None:
        self.pending.append(signum)
        if self.first_signal is None:
            self.first_signal = signum
            name = signal.Signals(signum).name
            self.lock.request_release("signal", requester=name, deadline=time.time() + self.args.grace)

    def run(self) -> int:
        sig: int
        for sig in dict.fromkeys((*RUN_SIGNALS, self.stop_signal)):
            previous = signal.getsignal(sig)
            if previous is signal.SIG_IGN:  # left ignored, as whoever started us asked
                continue
            self._previous[sig] = previous
            signal.signal(sig, self._on_signal)
        try:
            code = _check_command(self.args.command)  # before the lock: never evict the holder for a typo
            if code is not None:
                return code
            code = self._acquire()
            if code is not None:
                return code
            return self._run_child()
        finally:
            for sig, previous in self._previous.items():
                signal.signal(sig, previous if previous is not None else signal.SIG_DFL)

    def _acquire(self) -> int | None:
        """Acquire in a helper thread, so this (main) thread can answer signals. None once held."""
        lock, outcome = self.lock, dict[str, Any]()

        def on_waiting(sender: Any, owner_id: str | None = None, owner_label: Any = None, **kw: Any) -> None:
            self.say(f"waiting for {lock.url}: held by {who(owner_id, getattr(owner_label, 'text', None))}")

        def acquire() -> None:
            try:
                outcome["held"] = lock.acquire(blocking=not self.args.nonblock, timeout=self.args.timeout)
            except BaseException as exc:  # handed to the main thread
                outcome["error"] = exc

        lock_signals.waiting.connect(on_waiting, sender=lock)
        line: WaitLine | None = None
        started = time.monotonic()
        try:
            worker = threading.Thread(target=quiet(acquire), name="handofflock-run-acquire", daemon=True)
            worker.start()
            while worker.is_alive():
                worker.join(0.1)
                if self.pending:
                    lock.cancel()  # from the main loop, not the handler: cancel() sets an Event
                elif line is None and not self.args.quiet and time.monotonic() - started >= 1.0:
                    # Only for a wait that lasts: an acquire that succeeds at once shows nothing.
                    line = self._line = WaitLine(lock, started=started)
                if line is not None:
                    line.tick()
        finally:
            lock_signals.waiting.disconnect(on_waiting, sender=lock)
            if line is not None:
                line.close()
                self._line = None
        error = outcome.get("error")
        if isinstance(error, AcquireCancelled) and self.first_signal is not None:
            self.say(f"stopped by {signal.Signals(self.first_signal).name} while waiting; {self._slot_left()}")
            return 128 + self.first_signal
        if error is not None:
            raise error
        if not outcome.get("held"):
            st = lock.status()
            holder = who(st.owner_id, None if st.owner_label is None else st.owner_label.text)
            return fail(f"{lock.url} is held by {holder} (--nonblock given); try again later", EXIT_CONTENDED)
        if self.first_signal is not None:  # the signal came just as we got the lock
            lock.release()
            return 128 + self.first_signal
        return None

    def _slot_left(self) -> str:
        """Say whether the waiter slot was given back (one read; the give-up write can lose races)."""
        try:
            st = self.lock.status()
        except HandoffLockError:
            return "the waiter slot was to be given back (could not check)"
        if st.waiter_id == self.lock.owner_id and st.waiter_expires_at is not None:
            return f"the waiter slot could not be given back; it expires in {st.waiter_expires_at - time.time():.0f} s"
        return "the waiter slot was given back"

    def _run_child(self) -> int:
        lock, command = self.lock, self.args.command
        self.say(f"acquired {lock.url} (token {lock.token}); running {_short(command)}")
        env = dict(
            os.environ, HANDOFFLOCK_URL=lock.url, HANDOFFLOCK_TOKEN=str(lock.token), HANDOFFLOCK_OWNER_ID=lock.owner_id
        )
        # Job control: Ctrl-Z stops run, which no longer renews. The command is not in the
        # terminal's foreground group, so run stops it too, and on `fg` continues it only if
        # the lock is still safely held; otherwise the command is killed, never continued.
        # Installed before the command starts, so a Ctrl-Z at any moment stops both.
        self.job_control: list[int] = []
        sig: int
        for sig in (signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU, signal.SIGCONT):
            if signal.getsignal(sig) is not signal.SIG_IGN:
                self._previous.setdefault(sig, signal.getsignal(sig))
                signal.signal(sig, lambda signum, frame: self.job_control.append(signum))
        watchdog = _start_watchdog()
        cgroup = _make_cgroup()
        if watchdog is not None and cgroup is not None:
            _tell(watchdog, f"cgroup {cgroup}")  # before the command exists: if run dies next, it is still found
        if not lock.healthy:  # stopped (a background write to the terminal, Ctrl-Z) since the acquire
            _remove_cgroup(cgroup)
            if watchdog is not None:
                os.close(watchdog)
            try:
                lock.release()  # a lost lock: writes nothing
            except HandoffLockError:
                pass
            return fail(
                f"the lock {lock.url} was no longer safely held when {command[0]} was to start; not started", EXIT_LOST
            )
        try:
            child = subprocess.Popen(
                command,
                env=env,
                start_new_session=True,
                preexec_fn=functools.partial(_prepare_command, os.getpid(), cgroup),
            )
        except OSError as exc:
            _remove_cgroup(cgroup)
            if watchdog is not None:
                os.close(watchdog)
            lock.release()
            if isinstance(exc, FileNotFoundError):
                return fail(f"command not found: {command[0]}", EXIT_NOT_FOUND)
            return fail(f"cannot execute {command[0]}: {exc}", EXIT_CANNOT_EXECUTE)
        if cgroup is not None and child.pid not in _watchdog.cgroup_members(cgroup):
            _remove_cgroup(cgroup)  # the command could not enter it (a hierarchy rule): the session alone, then
            cgroup = None
        self.cgroup = cgroup
        if watchdog is not None:
            _tell(watchdog, f"session {child.pid}")
        kill_at: float | None = None  # monotonic time to SIGKILL the group
        asked: ReleaseRequest | None = None  # the waiter's request the stop signal answered (None: a signal, a loss)
        declined: ReleaseRequest | None = None  # a request found withdrawn when checked again: not acted on
        declined_at = 0.0  # ... as of then: a request that still stands is read again every check interval
        killed_at: float | None = None
        last_kill = 0.0
        lost = False
        returncode: int | None = None
        while True:
            if returncode is None:
                try:
                    returncode = child.wait(timeout=0.05)
                except subprocess.TimeoutExpired:
                    pass
            else:
                time.sleep(0.05)
            now = time.monotonic()
            if os.getpid() == 1:
                _reap_orphans(but=child.pid)
            while self.job_control:
                if self.job_control.pop(0) != signal.SIGCONT:  # Ctrl-Z, or a background read or write of the terminal
                    for _ in range(10):  # again, for any child forked while the stop went round
                        self._signal(child, signal.SIGSTOP)
                        if _all_stopped(child.pid, self.cgroup):
                            break
                        time.sleep(0.01)
                    os.kill(os.getpid(), signal.SIGSTOP)  # continues here on SIGCONT (fg, bg, kill -CONT)
                elif lock.healthy:
                    self._signal(child, signal.SIGCONT)
                    self.say(f"continued; {command[0]} continues")
                else:  # stopped past the lease: the lock may be someone else's by now
                    self._signal(child, signal.SIGKILL)
                    self._signal(child, signal.SIGCONT)
                    killed_at = killed_at or now
                    self.say(f"continued after the lease ran out; killed {command[0]} instead of continuing it")
            if returncode is not None:
                if not _group_alive(child.pid, self.cgroup):
                    break
                if killed_at is not None and now >= killed_at + 2.0 and not _live_members(child.pid, self.cgroup):
                    break  # SIGKILLed and still listed: zombies whose parent does not reap them
                if kill_at is None:  # the command is done but left processes of its group running
                    self.say(
                        f"{command[0]} exited; giving the rest of its process group "
                        f"{min(self.args.grace, LEFTOVER_GRACE):g} s"
                    )
                    _signal_group(child, self.stop_signal, self.cgroup, everyone=True)
                    kill_at = now + min(self.args.grace, LEFTOVER_GRACE)
            while self.pending:
                sig = self.pending.pop(0)
                if sig == signal.SIGCONT:
                    continue
                self._send(child, sig, "passing on")
                asked = None  # a signal to run: stopping is no longer only the waiter's wish
                if kill_at is None:
                    kill_at = now + self.args.grace
            if not lost and not lock.healthy:
                lost = True
                asked = None
                self.say(f"LOST {lock.url}; stopping the command: its work is no longer protected")
                self._send(child, self.stop_signal, "sending")
                kill_at = min(kill_at or float("inf"), now + self.args.grace)
            elif (
                kill_at is None
                and returncode is None
                and lock.release_requested
                and self.first_signal is None
                and (
                    lock.release_request is not declined
                    or now >= declined_at + max(lock.waiter_check_interval, RECHECK_TIMEOUT)
                )
            ):
                # (A request made by a signal to run is answered by passing that signal on, above.)
                request = lock.release_request
                who = f"{request.requester} ({request.reason})" if request else "someone"
                if request is not None and not self._still_wanted(request):  # read again: it may have gone
                    if declined is not request:
                        self.say(
                            f"{who} asked for {lock.url} but is no longer waiting; "
                            f"{command[0]} is left alone and run keeps the lock"
                        )
                    # A read can fall in the moment a waiter re-registers (its slot briefly empty):
                    # while the lock has not withdrawn the request, it is read again each interval.
                    declined, declined_at = request, now
                else:
                    self.say(f"{who} asks for {lock.url}")
                    self._send(child, self.stop_signal, "sending")
                    kill_at, asked = now + self.args.grace, request
            if (
                kill_at is not None
                and killed_at is None
                and (now >= kill_at or (asked is not None and not lock.release_requested))
            ):
                # At the end of the grace, or as soon as the lock withdrew the waiter's request.
                if asked is not None and not self._still_wanted(asked):
                    # The waiter left (or its slot expired) during the grace: nobody needs the lock now.
                    self.say(
                        f"{asked.requester} is no longer waiting for {lock.url}; not killing {command[0]}: "
                        "it goes on, and run keeps the lock"
                    )
                    declined, declined_at, asked, kill_at = asked, now, None, None
                elif now >= kill_at:
                    self.say(f"{command[0]} did not exit within {self.args.grace:g} s; killing it")
                    self._signal(child, signal.SIGKILL)
                    killed_at = last_kill = now
            elif killed_at is not None and now >= last_kill + 1.0:
                # Still some left: a child forked while the last kill went round, or one we may not
                # signal (a setuid program). The lock is not released while any of them lives.
                self._signal(child, signal.SIGKILL)
                last_kill = now
        assert returncode is not None
        _remove_cgroup(self.cgroup)
        if watchdog is not None:
            os.close(watchdog)  # nothing of the command is left: the watchdog finds nothing, and ends
        status = returncode if returncode >= 0 else 128 - returncode
        if lost or not lock.is_held:
            try:
                lock.release()  # a lost lock: clears our state, writes nothing
            except HandoffLockError:
                pass
            return fail(f"the lock {lock.url} was lost while {command[0]} ran (it exited with {status})", EXIT_LOST)
        heir = lock.release()
        self.say(
            f"{command[0]} exited with {status}; "
            + (f"handed {lock.url} to {heir}" if heir else f"released {lock.url}")
        )
        return status

    def _still_wanted(self, request: ReleaseRequest) -> bool:
        """Whether ``request`` (or another waiter's) still stands, read afresh for a waiter's request.

        The lock withdraws a waiter's request at its next check once the waiter
        has gone; a read now settles it without waiting for that. A read that
        fails leaves the request standing: the waiter may well be there.
        """
        lock = self.lock
        if request.reason != "waiter":
            return lock.release_requested
        if not lock.release_requested:
            return False
        st = _status_within(lock, RECHECK_TIMEOUT)
        if st is None:
            return True
        return bool(st.owner_id == lock.owner_id and st.waiter_live and st.waiter_id != lock.owner_id)

    def _signal(self, child: subprocess.Popen[bytes], sig: int) -> None:
        _signal_group(child, sig, self.cgroup)

    def _send(self, child: subprocess.Popen[bytes], sig: int, verb: str) -> None:
        self._signal(child, sig)  # first: saying so can fail (a hung-up terminal), passing it on must not
        name = signal.Signals(sig).name
        what = f"passing {name} on to" if verb == "passing on" else f"{verb} {name} to"
        self.say(f"{what} {self.args.command[0]} (session {child.pid}), {self.args.grace:g} s to exit")


#: How long ``run`` waits for the read that checks a waiter is still there before it signals or
#: kills the command; past it (a slow or unreachable store) the request is taken to stand.
RECHECK_TIMEOUT = 2.0


def _status_within(lock: HandoffLock, timeout: float) -> LockStatus | None:
    """``lock.status()`` read in a helper thread, or None if it failed or took longer than ``timeout``.

    The main loop must not hang on a store that does not answer: it supervises the command.
    """
    found: dict[str, LockStatus] = {}

    def read() -> None:
        try:
            found["status"] = lock.status()
        except HandoffLockError:
            pass

    reader = threading.Thread(target=quiet(read), name="handofflock-run-recheck", daemon=True)
    reader.start()
    reader.join(timeout)
    return found.get("status")


def stop_signal(value: Any) -> signal.Signals:
    """``--signal``'s value, checked before anything is done: :class:`ConfigurationError` (exit 64) if unusable."""
    sig = parse_signal(value)  # unknown names, numbers out of range
    if sig in UNUSABLE_STOP_SIGNALS:
        raise ConfigurationError(
            f"--signal {sig.name} cannot ask a command to stop and clean up; use TERM, INT, "
            "HUP or USR1 (after --grace the command is killed anyway)"
        )
    if sig not in STOP_SIGNALS:
        raise ConfigurationError(
            f"--signal {sig.name} is not a request to stop: the system sends it for other reasons, or a process "
            f"cannot handle it safely; use one of {', '.join(s.name.removeprefix('SIG') for s in STOP_SIGNALS)}"
        )
    return sig


def _check_command(command: list[str]) -> int | None:
    """Exit 127 (not found) or 126 (not executable) for a command that cannot run, None if it can.

    Looked up as ``execvp`` will (``PATH`` unless the name has a slash), before
    the lock is asked for: a typo must not evict the holder. (``Popen`` still
    reports a command that vanishes in between.)
    """
    name = command[0]
    if "/" in name:
        candidates = [name]
    else:
        candidates = [os.path.join(d or ".", name) for d in os.environ.get("PATH", os.defpath).split(os.pathsep)]
    found_unusable = None
    for path in candidates:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return None
        if os.path.exists(path):
            found_unusable = path
    if found_unusable is None:
        return fail(f"command not found: {name}; the lock was not asked for", EXIT_NOT_FOUND)
    why = "is a directory" if os.path.isdir(found_unusable) else "is not executable"
    return fail(f"cannot execute {name}: {found_unusable} {why}; the lock was not asked for", EXIT_CANNOT_EXECUTE)


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


def _reap_orphans(*, but: int) -> None:
    """As PID 1 (a container's entrypoint) every orphan is ours to reap: collect the dead ones, never ``but``."""
    for pid in _session_members(0, children_of=os.getpid(), zombies=True):
        if pid != but:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass


def _session_members(sid: int, *, children_of: int | None = None, zombies: bool = False) -> list[int]:
    """Every live process of session ``sid``, including those in process groups of their own.

    With ``children_of``, instead the children of that process; with ``zombies``, only dead ones.
    """
    if children_of is None:
        return _watchdog.session_members(sid)
    return [
        pid for pid, state, ppid, _, _ in _watchdog.processes() if ppid == children_of and (state == b"Z") == zombies
    ]


#: Signals that go to every process of the command, not only to its process group.
TO_EVERYONE = (signal.SIGKILL, signal.SIGSTOP, signal.SIGCONT)


def _signal_group(
    child: subprocess.Popen[bytes], sig: int, cgroup: str | None = None, *, everyone: bool | None = None
) -> None:
    """Send ``sig`` to the command's process group, and with ``everyone`` to the rest of it too.

    A polite signal (the stop signal, a signal passed on) goes to the command's
    process group, as a terminal would send it: a supervisor inside (GNU
    ``timeout``, a job-control shell) relays it to the groups it made, and a
    second copy sent to them directly would be one too many (to many programs
    a second SIGINT means "abort now"). KILL, STOP and CONT (``everyone``, the
    default for them) go to every process: the rest of the session, and the
    command's cgroup where there is one (a daemon that left the session is
    still in it). Each process gets one copy. Nothing of the command outlives
    the hold either way: what the polite signal did not end is killed after
    the grace, and the lock moves on only once none is left.
    """
    if everyone is None:
        everyone = sig in TO_EVERYONE
    try:
        os.killpg(child.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
    if not everyone:
        return
    members = _watchdog.session_members(child.pid, outside_group=child.pid)
    if cgroup is not None:  # the cgroup's processes outside the command's group (found in one pass)
        groups = {pid: group for pid, _, _, group, _ in _watchdog.processes()}
        # One born since the group was signalled is signalled too: it did not get that copy.
        members += [
            pid for pid in _watchdog.cgroup_members(cgroup) if groups.get(pid) != child.pid and pid not in members
        ]
    _watchdog.signal_each(members, sig)


def _live_members(pgid: int, cgroup: str | None) -> bool:
    """Whether a live (not zombie) process of the command's session or cgroup is left."""
    if _session_members(pgid):
        return True
    zombies = {pid for pid, state, _, _, _ in _watchdog.processes() if state == b"Z"}
    return any(pid not in zombies for pid in _watchdog.cgroup_members(cgroup))


def _all_stopped(pgid: int, cgroup: str | None) -> bool:
    """Whether every live process of the command's session and cgroup is stopped (a stopped one cannot fork)."""
    states = {pid: state for pid, state, _, _, _ in _watchdog.processes()}
    members = set(_session_members(pgid)) | set(_watchdog.cgroup_members(cgroup))
    return all(states.get(pid, b"Z") in (b"T", b"t", b"Z") for pid in members)


def _group_alive(pgid: int, cgroup: str | None = None) -> bool:
    """Whether any process of the command's session or cgroup is left, after reaping those that are our children."""
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:  # the command and processes reparented to us (we may be PID 1)
            pass
    except ChildProcessError:
        pass
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        pass
    except PermissionError:  # a member changed its credentials: it exists
        return True
    return bool(_session_members(pgid) or _watchdog.cgroup_members(cgroup))


def _short(command: list[str], limit: int = 100) -> str:
    text = " ".join(shlex.join(command).split())  # one line, whatever the arguments hold
    return text if len(text) <= limit else text[: limit - 3] + "..."
