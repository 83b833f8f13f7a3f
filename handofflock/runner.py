"""``handofflock run``: hold the lock around a child process, flock(1)-style, for a fleet.

The main thread stays free to answer signals: the acquire runs in a helper
thread (cancelled from the main loop when a signal arrives while waiting), and
the child is supervised by polling ``wait()``. On a release request (a waiter,
or a signal to this process) the child gets the stop signal and ``grace``
seconds, then SIGKILL; the lock is released only once the child has exited,
handed to the waiter if there is one. A lost lock stops the child the same way
and makes the exit code 70.

The child runs in a session of its own. The polite signal goes to the
command's own process (``--signal-to main``, the default: a trainer's helper
processes stay up while it checkpoints) or to its process group (``group``);
SIGKILL goes to every process of the command: its session, its cgroup where
``run`` could make one, and every descendant of ``run``, which is the child
subreaper, so processes that left the session come back to it. The lock moves
on only once none is left, so no process of the command is left working on
the resource while the next holder starts.

Here are the supervisor loop (signals passed on, job control, the lock's
health, the grace and the kill), whose branches share the child's state, and
what it does to the operating system around the command: the watchdog's pipe,
the command's cgroup (v2, where one can be made), the parent-death signal and
the child subreaper (Linux ``prctl``), and :class:`_CommandProcesses`, which
finds every process of the command and signals and reaps them. The watchdog
itself is the stdlib-only script :mod:`._watchdog`.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import functools
import math
import os
import re
import secrets
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Collection
from typing import Any

from . import _watchdog
from ._waitline import WaitLine, is_terminal
from .core.errors import AcquireCancelled, ConfigurationError, HandoffLockError, LockTimeout, TransientStorageError
from .core.identity import detect_label
from .core.record import MAX_TTL, Label
from .core.threads import quiet
from .core.timefmt import who
from .exit_codes import EXIT_CANNOT_EXECUTE, EXIT_CONTENDED, EXIT_LOST, EXIT_NOT_FOUND, EXIT_STATUS_FILE, EXIT_STORAGE
from .lock import events as lock_signals
from .lock.handoff import HandoffLock
from .lock.types import LockStatus, ReleaseRequest
from .os_signals import parse_signal, restore, take_over

#: Signals ``run`` catches and passes on to the command's process group. The command is not
#: in the terminal's foreground group, so Ctrl-C reaches it only this way.
RUN_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)

#: Signals that cannot be passed on as a polite stop: the command could not clean up (KILL), or
#: would never end (STOP and the terminal stops).
UNUSABLE_STOP_SIGNALS = (signal.SIGKILL, signal.SIGSTOP, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU, signal.SIGCONT)

#: The signals ``--signal`` accepts: each asks a process to end and can be caught, so the command
#: can checkpoint first; none is sent by the system for another reason (CHLD, WINCH, PIPE, SEGV...),
#: which ``run`` would otherwise take for a request to stop.
STOP_SIGNALS = (*RUN_SIGNALS, signal.SIGALRM, signal.SIGRTMIN, signal.SIGRTMAX)

#: After the command's own process exits, how long the rest of its group gets before SIGKILL
#: when no grace is running yet (the command left helpers behind).
LEFTOVER_GRACE = 5.0


def who_of(ident: str | None, label: Label | None) -> str:
    """``label (id)``, or the id alone when there is no label (:func:`~handofflock.core.timefmt.who`)."""
    return who(ident, None if label is None else label.text)


def fail(message: str, code: int) -> int:
    """Print ``handofflock: error: message`` to stderr and return ``code``.

    In plain words: without the library's parameter names ("within request_timeout (11.25s)": "within 11.25 s").
    """
    plain = re.sub(r"\brequest_timeout \(([\d.]+)s\)", r"\1 s", message)
    print(f"handofflock: error: {plain}", file=sys.stderr)
    return code


def ended(name: str, returncode: int) -> str:
    """How a command ended: ``false exited with 1``, or ``sleep was killed by SIGTERM (exit status 143)``."""
    if returncode >= 0:
        return f"{name} exited with {returncode}"
    try:
        how = signal.Signals(-returncode).name
    except ValueError:  # a real-time signal: no name
        how = f"signal {-returncode}"
    return f"{name} was killed by {how} (exit status {128 - returncode})"


class CommandRunner:
    """``handofflock run``: the lock around one child process (see the module docstring)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self._subreaper_was: bool | None = None  # run's subreaper setting before the command (None: unchanged)
        self.stop_signal = stop_signal(args.signal)
        self._labels: dict[str, str] = {}  # waiter id -> its label, as read by _still_wanted
        self.signals_passed = 0  # signals to run passed on to the command: a second one kills it now
        self._rest_owed: int | None = None  # a polite signal sent to the command's process alone, owed to the rest
        self._told: set[int] = set()  # ... and the processes the command left that have had it since
        if args.yield_exit_code is not None and not 0 <= args.yield_exit_code <= 255:
            raise ConfigurationError(
                f"--yield-exit-code must be an exit status from 0 to 255, got {args.yield_exit_code}"
            )
        if args.grace is None or not 0 <= args.grace <= MAX_TTL:  # NaN fails both comparisons
            raise ConfigurationError(
                f"--grace must be a number of seconds in [0, {MAX_TTL:.0f}] (a week), got {args.grace}"
            )
        if args.timeout is not None and not (args.timeout >= 0 and math.isfinite(args.timeout)):
            raise ConfigurationError(f"--timeout must be a finite number >= 0, got {args.timeout}")
        poll = args.poll_interval
        options: dict[str, Any] = {} if poll is None else {"waiter_check_interval": poll, "waiter_poll_interval": poll}
        if args.wait_for_slot:  # else the lock's own default: run waits as a blocking acquire in Python does
            options["wait_for_slot"] = True
        self.lock = HandoffLock(
            args.url,
            owner_id=args.owner_id,
            label=Label(args.label if args.label is not None else detect_label(), grace=args.grace),
            ttl=args.ttl,
            min_hold=args.min_hold,
            yield_to_requests=not args.no_yield,
            **options,
        )
        self.pending: list[int] = []  # signals received, appended by the handler (atomic)
        self.first_signal: int | None = None
        self._previous: dict[int, Any] = {}
        self._line: WaitLine | None = None  # the live waiting line, while it is up

    _stderr_broken = False

    def note(self, message: str) -> None:
        """A routine line (waiting, acquired, released), said only with ``-v``: like flock(1), a ``run``
        that succeeds prints nothing, and cron mails every line a job prints."""
        if self.args.verbose:
            self.say(message)

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
        take_over(dict.fromkeys((*RUN_SIGNALS, self.stop_signal)), self._on_signal, self._previous)
        try:
            # The command is looked up before the lock: never evict the holder for a typo. Each step
            # returns None to go on, or the exit code (never 0: a step that ends the run has failed).
            return _check_command(self.args.command) or self._acquire() or self._run_child()
        finally:
            if self._subreaper_was is not None:
                _set_subreaper(on=self._subreaper_was)
            restore(self._previous)

    def _acquire(self) -> int | None:
        """Acquire in a helper thread, so this (main) thread can answer signals. None once held."""
        lock, outcome = self.lock, dict[str, Any]()

        def on_waiting(sender: Any, owner_id: str | None = None, owner_label: Label | None = None, **kw: Any) -> None:
            outcome["was_waiter"] = True
            self.note(f"waiting for {lock.url}: held by {who_of(owner_id, owner_label)}")

        def acquire() -> None:
            try:
                outcome["held"] = lock.acquire(
                    blocking=not self.args.nonblock,
                    timeout=None if self.args.nonblock else self.args.timeout,  # -n never waits, as flock's
                    request_release=not self.args.no_request,
                    priority=self.args.priority,
                )
            except BaseException as exc:  # handed to the main thread
                outcome["error"] = exc

        lock_signals.waiting.connect(on_waiting, sender=lock)
        started = time.monotonic()
        # The waiting line: live on a terminal (and gone once acquired); elsewhere (cron, a log) only with -v.
        shown = not self.args.quiet and (self.args.verbose or is_terminal(sys.stderr))
        try:
            worker = threading.Thread(target=quiet(acquire), name="handofflock-run-acquire", daemon=True)
            worker.start()
            while worker.is_alive():
                worker.join(0.1)
                if self.pending:
                    lock.cancel()  # from the main loop, not the handler: cancel() sets an Event
                elif self._line is None and shown and time.monotonic() - started >= 1.0:
                    # Only for a wait that lasts: an acquire that succeeds at once shows nothing.
                    self._line = WaitLine(lock, started=started, asks=not self.args.no_request)
                if self._line is not None:
                    self._line.tick()
        finally:
            lock_signals.waiting.disconnect(on_waiting, sender=lock)
            if self._line is not None:
                self._line.close()
                self._line = None
        error = outcome.get("error")
        if isinstance(error, AcquireCancelled) and self.first_signal is not None:
            # A run that never became the waiter (the store never answered) has no slot to speak of.
            slot = f"; {self._slot_left()}" if outcome.get("was_waiter") else ""
            self.say(f"stopped by {signal.Signals(self.first_signal).name} while waiting{slot}")
            return 128 + self.first_signal
        # The timeout passed in the store (acquire says LockTimeout, from the store's error): not contention.
        unanswered = error.__cause__ if isinstance(error, LockTimeout) else error
        if isinstance(unanswered, TransientStorageError) and self.args.timeout is not None:
            return fail(
                f"gave up on {lock.url} after {time.monotonic() - started:.1f} s (--timeout {self.args.timeout:g}): "
                f"the store did not answer: {unanswered}",
                EXIT_STORAGE,
            )
        if error is not None:
            raise error
        if not outcome.get("held"):
            # As flock -n: the lock being held is an answer, not an error, and cron mails every line a job
            # prints, so only -v says who holds it. The exit status (75) tells scripts.
            if self.args.verbose:
                st = lock.status()
                self.say(
                    f"{lock.url} is held by {who_of(st.owner_id, st.owner_label)} (--nonblock given); try again later"
                )
            return EXIT_CONTENDED
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
        if st.waiter_instance == self.lock.instance and st.waiter_expires_at is not None:
            return f"the waiter slot could not be given back; it expires in {st.waiter_expires_at - time.time():.0f} s"
        return "the waiter slot was given back"

    def _run_child(self) -> int:
        lock, command = self.lock, self.args.command
        self.note(f"acquired {lock.url} (token {lock.token}); running {_short(command)}")
        env = dict(
            os.environ, HANDOFFLOCK_URL=lock.url, HANDOFFLOCK_TOKEN=str(lock.token), HANDOFFLOCK_OWNER_ID=lock.owner_id
        )
        # Job control: Ctrl-Z stops run, which no longer renews. The command is not in the
        # terminal's foreground group, so run stops it too, and on `fg` continues it only if
        # the lock is still safely held; otherwise the command is killed, never continued.
        # Installed before the command starts, so a Ctrl-Z at any moment stops both.
        self.job_control: list[int] = []
        job_control_signals = (signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU, signal.SIGCONT)
        take_over(job_control_signals, lambda signum, frame: self.job_control.append(signum), self._previous)
        watchdog = _watchdog.start()
        cgroup = _make_cgroup()
        if cgroup is not None:  # told before the command exists: if run dies next, it is still found
            _watchdog.tell(watchdog, f"cgroup {cgroup}")
        if not lock.healthy:  # stopped (a background write to the terminal, Ctrl-Z) since the acquire
            _stand_down(watchdog, cgroup)
            with contextlib.suppress(HandoffLockError):
                lock.release()  # a lost lock: writes nothing
            return fail(
                f"the lock {lock.url} was no longer safely held when {command[0]} was to start; not started", EXIT_LOST
            )
        # Orphans of the command's tree come back to run (the subreaper), which follows them.
        # Every child run has now (the watchdog) is not the command's: left out of that tree.
        others = [pid for pid, _ in _children()]
        self._subreaper_was = _set_subreaper(on=True)
        try:
            child = subprocess.Popen(
                command,
                env=env,
                start_new_session=True,
                preexec_fn=functools.partial(_prepare_command, os.getpid(), cgroup),
            )
        except OSError as exc:
            _stand_down(watchdog, cgroup)
            lock.release()
            if isinstance(exc, FileNotFoundError):
                return fail(f"command not found: {command[0]}", EXIT_NOT_FOUND)
            return fail(f"cannot execute {command[0]}: {exc}", EXIT_CANNOT_EXECUTE)
        if cgroup is not None and child.pid not in _watchdog.cgroup_members(cgroup):
            _watchdog.kill_cgroup(cgroup)  # the command could not enter it (a hierarchy rule): the session alone, then
            cgroup = None
        procs = _CommandProcesses(child.pid, cgroup, others)
        _watchdog.tell(watchdog, f"session {child.pid}")
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
            procs.reap()  # orphans that came back to run and died
            while self.job_control:
                if self.job_control.pop(0) != signal.SIGCONT:  # Ctrl-Z, or a background read or write of the terminal
                    for _ in range(10):  # again, for any child forked while the stop went round
                        procs.signal(signal.SIGSTOP)
                        if procs.all_stopped():
                            break
                        time.sleep(0.01)
                    os.kill(os.getpid(), signal.SIGSTOP)  # continues here on SIGCONT (fg, bg, kill -CONT)
                elif lock.healthy:
                    procs.signal(signal.SIGCONT)
                    self.say(f"continued; {command[0]} continues")
                else:  # stopped past the lease: the lock may be someone else's by now
                    procs.signal(signal.SIGKILL)
                    procs.signal(signal.SIGCONT)
                    killed_at = killed_at or now
                    self.say(f"continued after the lease ran out; killed {command[0]} instead of continuing it")
            if returncode is not None:
                if not procs.alive():
                    break
                if killed_at is not None and now >= killed_at + 2.0 and not procs.live():
                    break  # SIGKILLed and still listed: zombies whose parent does not reap them
                if kill_at is None:  # the command is done but left processes of its group running
                    self.say(
                        f"{command[0]} exited; giving the processes it left {min(self.args.grace, LEFTOVER_GRACE):g} s"
                    )
                    procs.signal(self.stop_signal, everyone=True)
                    kill_at = now + min(self.args.grace, LEFTOVER_GRACE)
                elif self._rest_owed is not None and killed_at is None:
                    # Stopping, and the signal went to the command's own process alone, which has
                    # exited (a shell around the trainer, say): the processes it left, now run's
                    # children (the subreaper), get it in the rest of the grace, each once, and
                    # again not their own helpers. (Without a subreaper, SIGKILL at the grace's end.)
                    fresh = [pid for pid in procs.orphans() if pid not in self._told]
                    if fresh:
                        name = signal.Signals(self._rest_owed).name
                        self.say(f"{command[0]} exited; passing {name} on to the processes it left ({len(fresh)})")
                        _watchdog.signal_each(fresh, self._rest_owed)
                        self._told.update(fresh)
            while self.pending:
                sig = self.pending.pop(0)
                if sig == signal.SIGCONT:
                    continue
                asked = None  # a signal to run: stopping is no longer only the waiter's wish
                self.signals_passed += 1
                if self.signals_passed > 1:  # a second Ctrl-C (or any second signal): stop it now
                    if killed_at is None:
                        self.say(f"second {signal.Signals(sig).name}: killing {command[0]} now")
                        procs.signal(signal.SIGKILL)
                        killed_at = last_kill = now
                    continue
                if kill_at is None:
                    kill_at = now + self.args.grace
                self._send(procs, sig, passed_on_with=kill_at - now)
            if not lost and not lock.healthy:
                lost = True
                asked = None
                self.say(f"LOST {lock.url}; stopping the command: its work is no longer protected")
                self._send(procs, self.stop_signal)
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
                if request is not None and request.label:
                    self._labels[request.requester] = request.label  # the heir, named as status names it
                wanted = request is None or self._still_wanted(request)  # read again: it may have gone
                who = f"{self._named(request)} ({request.reason})" if request else "someone"
                if not wanted:
                    if declined is not request:  # the command was left alone: routine
                        self.note(
                            f"{who} asked for {lock.url} but is no longer waiting; "
                            f"{command[0]} is left alone and run keeps the lock"
                        )
                    # A read can fall in the moment a waiter re-registers (its slot briefly empty):
                    # while the lock has not withdrawn the request, it is read again each interval.
                    declined, declined_at = request, now
                else:
                    self.say(f"{who} asks for {lock.url}")
                    self._send(procs, self.stop_signal)
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
                        f"{self._named(asked)} is no longer waiting for {lock.url}; not killing {command[0]}: "
                        "it goes on, and run keeps the lock"
                    )
                    declined, declined_at, asked, kill_at = asked, now, None, None
                elif now >= kill_at:
                    self.say(f"{command[0]} did not exit within {self.args.grace:g} s; killing it")
                    procs.signal(signal.SIGKILL)
                    killed_at = last_kill = now
            elif killed_at is not None and now >= last_kill + 1.0:
                # Still some left: a child forked while the last kill went round, or one we may not
                # signal (a setuid program). The lock is not released while any of them lives.
                procs.signal(signal.SIGKILL)
                last_kill = now
        assert returncode is not None
        _stand_down(watchdog, procs.cgroup)  # nothing of the command is left: the watchdog finds nothing, and ends
        status = returncode if returncode >= 0 else 128 - returncode
        if lost or not lock.is_held:
            with contextlib.suppress(HandoffLockError):
                lock.release()  # a lost lock: clears our state, writes nothing
            return fail(f"the lock {lock.url} was lost while {command[0]} ran ({ended('it', returncode)})", EXIT_LOST)
        heir = lock.release()
        # A yield: the command stopped, within the grace, because someone asked for the lock.
        yielded = asked is not None and killed_at is None
        code = self.args.yield_exit_code if yielded and self.args.yield_exit_code is not None else status
        # Said when the run did not simply succeed: it failed, or the command was signalled (its story ends here).
        (self.say if code != 0 or kill_at is not None else self.note)(
            f"{ended(command[0], returncode)}; "
            + (f"handed {lock.url} to {self._named(heir)}" if heir else f"released {lock.url}")
            + (f"; it yielded: exit {code} (--yield-exit-code)" if code != status else "")
        )
        return code

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
        # Read in a helper thread: the main loop supervises the command and must not hang on a store
        # that does not answer. A read that fails or takes longer than RECHECK_TIMEOUT settles nothing.
        found: dict[str, LockStatus] = {}

        def read() -> None:
            try:
                found["status"] = lock.status()
            except HandoffLockError:
                pass

        reader = threading.Thread(target=quiet(read), name="handofflock-run-recheck", daemon=True)
        reader.start()
        reader.join(RECHECK_TIMEOUT)
        st = found.get("status")
        if st is None:
            return True
        if st.waiter_id is not None and st.waiter_label is not None:
            self._labels[st.waiter_id] = st.waiter_label.text  # named as status names it
        # By instance: a waiter with our owner id (a second job that derived it) is another party.
        return bool(st.owner_instance == lock.instance and st.waiter_live and st.waiter_instance != lock.instance)

    def _named(self, party: str | ReleaseRequest) -> str:
        """``label (id)`` for a requester (its request's label) or a waiter whose label a read showed, as
        ``status`` names it; else the id."""
        if isinstance(party, ReleaseRequest):
            return who(party.requester, party.label or self._labels.get(party.requester))
        return who(party, self._labels.get(party))

    def _send(self, procs: _CommandProcesses, sig: int, *, passed_on_with: float | None = None) -> None:
        """Send the polite ``sig``; ``passed_on_with``: a signal to run passed on, with that much grace left."""
        main_only = self.args.signal_to == "main"
        procs.signal(sig, main_only=main_only)  # first: saying so can fail (a hung-up terminal), passing it on must not
        if main_only:
            self._rest_owed = sig
        name, command = signal.Signals(sig).name, self.args.command[0]
        where = f"pid {procs.pid}" if main_only else f"process group {procs.pid}"
        if passed_on_with is None:
            self.say(f"sending {name} to {command} ({where}), {self.args.grace:g} s to exit")
        else:  # the grace does not restart: say what is left of it, and how to cut it short
            self.say(
                f"passing {name} on to {command} ({where}), {max(0.0, passed_on_with):.3g} s to exit; "
                f"{'Ctrl-C' if sig == signal.SIGINT else 'a signal'} again kills it now"
            )


#: How long ``run`` waits for the read that checks a waiter is still there before it signals or
#: kills the command; past it (a slow or unreachable store) the request is taken to stand.
RECHECK_TIMEOUT = 2.0


#: Where ``--signal-to`` may send the polite signal: the command's own process (the default: a
#: PyTorch trainer's helpers, DataLoader workers, stay up while it checkpoints), or its process group.
SIGNAL_TARGETS = ("main", "group")


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


_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37


def _stand_down(watchdog: int | None, cgroup: str | None) -> None:
    """Kill what is left in the command's cgroup, remove it, and let the watchdog go (it finds nothing left)."""
    _watchdog.kill_cgroup(cgroup)
    if watchdog is not None:
        os.close(watchdog)


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


def _prepare_command(parent: int, cgroup: str | None) -> None:
    """In the command, before exec: into its cgroup (if any), and SIGKILLed if ``run`` dies (Linux).

    ``run`` forks from its main thread, which lives as long as ``run``, so the
    parent-death signal fires exactly when ``run`` is gone, whatever kills it.
    Elsewhere there is no such signal (see docs/jobs.md).
    """
    if cgroup is not None:
        try:
            with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
                f.write("0")  # this process; its children are born in it
        except OSError:
            pass  # run sees it is not there and falls back to the session
    if _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL) is not None and os.getppid() != parent:
        os._exit(137)  # run died before prctl took effect


def _set_subreaper(*, on: bool) -> bool | None:
    """Make ``run`` its descendants' subreaper (``on``) or not; the previous setting, or None where unavailable.

    As the child subreaper (Linux 3.4+), a process that the command's tree
    orphans (a double-forked daemon, torchrun's workers once torchrun is
    killed) is reparented to ``run`` instead of to PID 1, so it stays in the
    tree ``run`` follows, and ``run`` reaps it.
    """
    previous = ctypes.c_int(0)
    if _prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(previous)) != 0 or _prctl(_PR_SET_CHILD_SUBREAPER, int(on)) != 0:
        return None
    return bool(previous.value)


def _prctl(option: int, arg: Any = 0) -> int | None:
    """Linux's ``prctl(option, arg)``: its result (0 on success), or None where there is none (not Linux)."""
    try:
        return int(ctypes.CDLL(None, use_errno=True).prctl(option, arg, 0, 0, 0))
    except (OSError, AttributeError):
        return None


def _children() -> list[tuple[int, bytes]]:
    """``(pid, state)`` of each child of ``run``, zombies included, from one pass over /proc."""
    me = os.getpid()
    return [(pid, state) for pid, state, ppid, _, _ in _watchdog.processes() if ppid == me]


class _CommandProcesses:
    """Where the command's processes are: its session, its cgroup where run made one, and run's tree.

    The session (and process group) is the command's pid. The cgroup, where
    there is one, holds everything the command starts. The tree is every
    descendant of ``run`` but ``others`` (the watchdog, and any child ``run``
    had before the command): with ``run`` as the subreaper, a process that
    leaves the session and is orphaned (``setsid``, a daemon, torchrun's
    workers) comes back to ``run`` and stays in the tree, which is what
    accounts for it where no cgroup could be made.

    Nothing else is the command's, and nothing else is signalled or reaped: not a
    process of ``run``'s own session (the command runs in a session of its own, which
    none of its processes can leave for ``run``'s: a child another thread of the caller
    starts beside the command is in it), nor what the others started, seen in their
    tree once, when it is orphaned and comes back to ``run`` too.
    """

    def __init__(self, pid: int, cgroup: str | None, others: Collection[int]) -> None:
        self.pid = pid
        self.cgroup = cgroup
        self.root = os.getpid()
        self.others = set(others)  # grows with what the others start, as states() sees it
        self.home = os.getsid(0)  # run's own session

    def _foreign(self, pid: int, session: int) -> bool:
        """Whether ``pid`` (of session ``session``) is not the command's: see the class docstring."""
        return pid in self.others or session == self.home

    def states(self) -> dict[int, tuple[bytes, int]]:
        """``{pid: (state, process group)}`` of every process of the command: its session, cgroup and
        tree, zombies included, from one pass over /proc."""
        processes = _watchdog.processes()
        children: dict[int, list[tuple[int, bytes, int, int]]] = {}
        for pid, state, ppid, group, session in processes:
            children.setdefault(ppid, []).append((pid, state, group, session))
        todo = list(self.others)  # what the others started is theirs, even once it comes back to run
        while todo:
            for pid, *_ in children.get(todo.pop(), ()):
                if pid not in self.others:
                    self.others.add(pid)
                    todo.append(pid)
        found: dict[int, tuple[bytes, int]] = {}
        todo = [self.root]  # run's descendants, but the others and theirs, by parent pid
        while todo:
            for pid, state, group, session in children.get(todo.pop(), ()):
                if not self._foreign(pid, session) and pid not in found:
                    found[pid] = (state, group)
                    todo.append(pid)
        for pid, state, _, group, session in processes:
            if session == self.pid and pid not in found:  # a session member that is not ours (rare)
                found[pid] = (state, group)
        if self.cgroup is not None:
            where = {pid: (state, group) for pid, state, _, group, _ in processes}
            for pid in _watchdog.cgroup_members(self.cgroup):
                found.setdefault(pid, where.get(pid, (b"?", 0)))  # born since the pass: alive
        return found

    def signal(self, sig: int, *, everyone: bool = False, main_only: bool = False) -> None:
        """Send ``sig`` to the command's process group (or, ``main_only``, to the command's own process),
        and with ``everyone`` to every other process of it too.

        A polite signal (the stop signal, a signal passed on) goes to the
        command's process group, as a terminal would send it: a supervisor
        inside (GNU ``timeout``, a job-control shell) relays it to the groups
        it made, and a second copy sent to them directly would be one too many
        (to many programs a second SIGINT means "abort now"). KILL, STOP and
        CONT go to every process (so does any signal with ``everyone``): the rest
        of the session, the cgroup where there is one, and every descendant of
        ``run`` (a daemon that left the session and was orphaned came back to
        ``run``, the subreaper). Each process gets one copy. Nothing of the
        command outlives the hold either way: what the polite signal did not
        end is killed after the grace, and the lock moves on only once none is left.
        """
        everyone = everyone or sig in TO_EVERYONE
        try:
            if main_only and not everyone:
                os.kill(self.pid, sig)
            else:
                os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        if everyone:  # each live process not in the group (killpg reached those): session, cgroup and tree
            outside = [pid for pid, (state, group) in self.states().items() if group != self.pid and state != b"Z"]
            _watchdog.signal_each(outside, sig)

    def orphans(self) -> list[int]:
        """The command's live processes that are ``run``'s children but the command itself: orphaned
        by its tree, and come back to ``run`` (the subreaper)."""
        return [
            pid
            for pid, state, ppid, _, session in _watchdog.processes()
            if ppid == self.root and state != b"Z" and pid != self.pid and not self._foreign(pid, session)
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
        collects it) unless ``everything``, nor a process that is not the command's (its parent
        collects it).

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
            if (info.si_pid == self.pid and not everything) or self._foreign(info.si_pid, _session(info.si_pid)):
                break
            try:
                os.waitpid(info.si_pid, os.WNOHANG)
            except ChildProcessError:
                return
        for pid, state, ppid, _, session in _watchdog.processes():
            if ppid != self.root or state != b"Z" or self._foreign(pid, session):
                continue
            if everything or pid != self.pid:
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass


def _session(pid: int) -> int:
    """The session of ``pid`` (a zombie's too), or -1 if it is gone."""
    try:
        return os.getsid(pid)
    except OSError:
        return -1


#: Signals that go to every process of the command, not only to its process group.
TO_EVERYONE = (signal.SIGKILL, signal.SIGSTOP, signal.SIGCONT)


def _check_command(command: list[str]) -> int | None:
    """Exit 127 (not found) or 126 (not executable) for a command that cannot run, None if it can.

    Looked up as ``execvp`` will (``PATH`` unless the name has a slash), before
    the lock is asked for: a typo must not evict the holder. (``Popen`` still
    reports a command that vanishes in between.)
    """
    name = command[0]
    search = os.environ.get("PATH", os.defpath).split(os.pathsep)
    candidates = [name] if "/" in name else [os.path.join(d or ".", name) for d in search]
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


def _short(command: list[str], limit: int = 100) -> str:
    text = " ".join(shlex.join(command).split())  # one line, whatever the arguments hold
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --------------------------------------------------------------------------- exec: a job's PID 1


def exec_command(command: list[str], grace: float) -> int:
    """Run ``command`` as a container's PID 1 would need: signals passed on, orphans reaped, the job's status.

    A PID namespace's init gets no signal it has no handler for, so a shell as
    a pod's command (``sh -c 'torchrun ...; ...'``) never sees the SIGTERM of a
    pod's deletion and is killed 30 s later with nothing saved. Here every
    signal of :data:`RUN_SIGNALS` is caught and passed on to the command's own
    process, as ``tini`` and ``dumb-init`` do; every process orphaned in the
    namespace (or, off PID 1, under this process as the child subreaper) is
    reaped. When the command exits, what it left behind gets SIGTERM, and
    SIGKILL after ``grace`` seconds. The exit status is what the job decided
    (the ranks' agreed stop, written through :data:`EXIT_STATUS_FILE`, since
    torchrun exits 1 whatever its workers did), else the command's own
    (128+N for signal N).
    """
    if (bad := _check_command(command)) is not None:
        return bad
    fd, status_file = tempfile.mkstemp(prefix="handofflock-exit-")
    os.close(fd)
    os.unlink(status_file)
    child: subprocess.Popen[bytes] | None = None
    pending: list[int] = []

    def passed_on(signum: int, frame: Any) -> None:
        if child is None:
            pending.append(signum)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signum)

    previous = {sig: signal.signal(sig, passed_on) for sig in RUN_SIGNALS}
    subreaper_was = None if os.getpid() == 1 else _set_subreaper(on=True)
    try:
        child = subprocess.Popen(command, env={**os.environ, EXIT_STATUS_FILE: status_file})
        for signum in pending:
            os.kill(child.pid, signum)
        code = None
        while code is None:  # reap everything that dies, until the command itself has
            pid, status = os.waitpid(-1, 0)
            if pid == child.pid:
                child.returncode = code = os.waitstatus_to_exitcode(status)
        _end_orphans(grace)
        decided = _read_status(status_file)
        return decided if decided is not None else (128 - code if code < 0 else code)
    finally:
        restore(previous)
        if subreaper_was is not None:
            _set_subreaper(on=subreaper_was)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(status_file)


def _end_orphans(grace: float) -> None:
    """SIGTERM to the processes the command left behind (our children now), SIGKILL after ``grace``, all reaped."""
    deadline = time.monotonic() + grace
    sent: set[int] = set()
    while True:
        with contextlib.suppress(ChildProcessError):
            while (pid := os.waitpid(-1, os.WNOHANG)[0]) != 0:
                pass
        left = [pid for pid, state in _children() if state != b"Z"]
        if not left:
            return
        late = time.monotonic() >= deadline
        for pid in left:
            if late or pid not in sent:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL if late else signal.SIGTERM)
                sent.add(pid)
        time.sleep(0.05)


def _read_status(path: str) -> int | None:
    """The status a job wrote to ``path`` (a number 0-255), or None if it wrote none or garbage."""
    try:
        with open(path, encoding="ascii") as f:
            text = f.read().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() and int(text) <= 255 else None
