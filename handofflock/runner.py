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
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from . import signals as lock_signals
from .errors import AcquireCancelled, ConfigurationError, HandoffLockError
from .exit_codes import EXIT_CANNOT_EXECUTE, EXIT_CONTENDED, EXIT_LOST, EXIT_NOT_FOUND
from .lock import HandoffLock
from .signal_handlers import parse_signal

#: Signals ``run`` catches and passes on to the command's process group. The command is not
#: in the terminal's foreground group, so Ctrl-C reaches it only this way.
RUN_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)

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
        self.stop_signal = parse_signal(args.signal)
        if args.grace is None or not args.grace >= 0:
            raise ConfigurationError(f"--grace must be >= 0, got {args.grace}")
        timing: dict[str, Any] = {"ttl": args.ttl, "wait_for_slot": args.wait_for_slot}
        if args.poll_interval is not None:
            timing.update(waiter_check_interval=args.poll_interval, waiter_poll_interval=args.poll_interval)
        self.lock = HandoffLock(args.url, **timing)
        self.pending: list[int] = []  # signals received, appended by the handler (atomic)
        self.first_signal: int | None = None
        self._previous: dict[int, Any] = {}

    def say(self, message: str) -> None:
        if not self.args.quiet:
            print(f"handofflock: {message}", file=sys.stderr, flush=True)

    # Signal handler: only appends and assigns (no I/O, no locks); the main loop acts.
    def _on_signal(self, signum: int, frame: Any) -> None:
        self.pending.append(signum)
        if self.first_signal is None:
            self.first_signal = signum
            name = signal.Signals(signum).name
            self.lock.request_release("signal", requester=name, deadline=time.time() + self.args.grace)

    def run(self) -> int:
        for sig in dict.fromkeys(RUN_SIGNALS + (self.stop_signal,)):
            previous = signal.getsignal(sig)
            if previous is signal.SIG_IGN:  # left ignored, as whoever started us asked
                continue
            self._previous[sig] = previous
            signal.signal(sig, self._on_signal)
        try:
            code = self._acquire()
            if code is not None:
                return code
            return self._run_child()
        finally:
            for sig, previous in self._previous.items():
                signal.signal(sig, previous if previous is not None else signal.SIG_DFL)

    def _acquire(self) -> int | None:
        """Acquire in a helper thread, so this (main) thread can answer signals. None once held."""
        lock, outcome = self.lock, {}

        def on_waiting(sender: Any, owner_id: str | None = None, **kw: Any) -> None:
            self.say(f"waiting for {lock.url}: held by {owner_id}")

        def acquire() -> None:
            try:
                outcome["held"] = lock.acquire(blocking=not self.args.nonblock, timeout=self.args.timeout)
            except BaseException as exc:  # handed to the main thread
                outcome["error"] = exc

        lock_signals.waiting.connect(on_waiting, sender=lock)
        try:
            worker = threading.Thread(target=acquire, name="handofflock-run-acquire", daemon=True)
            worker.start()
            while worker.is_alive():
                worker.join(0.1)
                if self.pending:
                    lock.cancel()  # from the main loop, not the handler: cancel() sets an Event
        finally:
            lock_signals.waiting.disconnect(on_waiting, sender=lock)
        error = outcome.get("error")
        if isinstance(error, AcquireCancelled) and self.first_signal is not None:
            self.say(f"stopped by {signal.Signals(self.first_signal).name} while waiting; {self._slot_left()}")
            return 128 + self.first_signal
        if error is not None:
            raise error
        if not outcome.get("held"):
            st = lock.status()
            return fail(f"{lock.url} is held by {st.owner_id} (--nonblock given); try again later", EXIT_CONTENDED)
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
        env = dict(os.environ, HANDOFFLOCK_URL=lock.url, HANDOFFLOCK_TOKEN=str(lock.token), HANDOFFLOCK_OWNER_ID=lock.owner_id)
        try:
            child = subprocess.Popen(command, env=env, start_new_session=True)
        except FileNotFoundError:
            lock.release()
            return fail(f"command not found: {command[0]}", EXIT_NOT_FOUND)
        except OSError as exc:
            lock.release()
            return fail(f"cannot execute {command[0]}: {exc}", EXIT_CANNOT_EXECUTE)
        kill_at: float | None = None  # monotonic time to SIGKILL the group
        killed_at: float | None = None
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
            if returncode is not None:
                if not _group_alive(child.pid):
                    break
                if killed_at is not None and now >= killed_at + 2.0:
                    break  # SIGKILLed and still listed: zombies whose parent does not reap them
                if kill_at is None:  # the command is done but left processes of its group running
                    self.say(f"{command[0]} exited; giving the rest of its process group {min(self.args.grace, LEFTOVER_GRACE):g} s")
                    _signal_group(child, self.stop_signal)
                    kill_at = now + min(self.args.grace, LEFTOVER_GRACE)
            while self.pending:
                sig = self.pending.pop(0)
                self._send(child, sig, f"passing {signal.Signals(sig).name} on to")
                if kill_at is None:
                    kill_at = now + self.args.grace
            if not lost and not lock.healthy:
                lost = True
                self.say(f"LOST {lock.url}; stopping the command: its work is no longer protected")
                self._send(child, self.stop_signal, "sending")
                kill_at = min(kill_at or float("inf"), now + self.args.grace)
            elif kill_at is None and lock.release_requested:
                request = lock.release_request
                who = f"{request.requester} ({request.reason})" if request else "someone"
                self.say(f"{who} asks for {lock.url}")
                self._send(child, self.stop_signal, "sending")
                kill_at = now + self.args.grace
            if kill_at is not None and killed_at is None and now >= kill_at:
                self.say(f"{command[0]} did not exit within {self.args.grace:g} s; killing it")
                _signal_group(child, signal.SIGKILL)
                killed_at = now
        assert returncode is not None
        status = returncode if returncode >= 0 else 128 - returncode
        if lost or not lock.is_held:
            try:
                lock.release()  # a lost lock: clears our state, writes nothing
            except HandoffLockError:
                pass
            return fail(f"the lock {lock.url} was lost while {command[0]} ran (it exited with {status})", EXIT_LOST)
        heir = lock.release()
        self.say(f"{command[0]} exited with {status}; " + (f"handed {lock.url} to {heir}" if heir else f"released {lock.url}"))
        return status

    def _send(self, child: subprocess.Popen, sig: int, verb: str) -> None:
        self.say(f"{verb} {signal.Signals(sig).name} to {self.args.command[0]} (process group {child.pid}), {self.args.grace:g} s to exit")
        _signal_group(child, sig)


def _signal_group(child: subprocess.Popen, sig: int) -> None:
    """Send ``sig`` to the child's process group (its pid: it leads a session of its own)."""
    try:
        os.killpg(child.pid, sig)
    except ProcessLookupError:
        pass


def _group_alive(pgid: int) -> bool:
    """Whether any process of the group is left, after reaping those that are our children."""
    try:
        while os.waitpid(-pgid, os.WNOHANG)[0] > 0:  # members reparented to us (we may be PID 1)
            pass
    except ChildProcessError:
        pass
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:  # a member changed its credentials: it exists
        return True


def _short(command: list[str], limit: int = 100) -> str:
    text = " ".join(shlex.join(command).split())  # one line, whatever the arguments hold
    return text if len(text) <= limit else text[: limit - 3] + "..."
