"""The ``handofflock`` command: look at a lock, hold it around a command, clear it, watch it.

    handofflock status URL [--json] [--timeout S]
    handofflock run URL [--ttl S] [--signal USR1] [--grace S] [-w|--timeout S] [--label TEXT] [--owner-id ID]
                    -- CMD [ARGS...]
    handofflock release URL --force [--yes]
    handofflock watch URL [--interval S] [--json]

Exit codes (also in ``docs/jobs.md``); ``run`` otherwise exits with its
command's status, ``128+N`` if the command died of signal N:

===  =====================================================================
0    success
1    nothing done: ``release --force`` was declined
2    usage error (bad arguments)
64   bad lock URL or configuration
65   the lock record is corrupt (the message says how to clear it)
69   storage unavailable: missing bucket, no or bad credentials, no access
70   the lock was lost while ``run``'s command ran (its work was unprotected)
75   contended: another process is already waiting (one waiter at a time),
     the lock is held and ``--nonblock`` was given, or the record changed
     under ``release --force``
124  ``--timeout`` passed before the lock was acquired
126  the command could not be executed; 127: it was not found
128+N  ``run`` was stopped by signal N while it waited for the lock
141  ``status`` or ``watch``: the reader of stdout went away (``| head``), as 128+SIGPIPE
===  =====================================================================
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import re
import shlex
import signal
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from ._version import __version__
from .core.clock import Clock
from .core.errors import (
    ConfigurationError,
    HandoffLockError,
    InvalidLockURL,
    LockContended,
    LockLost,
    LockRecordCorrupt,
    LockTimeout,
    PreconditionFailed,
    StorageError,
    StorageTimeout,
    TransientStorageError,
)
from .core.record import LockRecord
from .core.timefmt import iso, when
from .exit_codes import (
    EXIT_BROKEN_PIPE,
    EXIT_CODES_HELP,
    EXIT_CONFIG,
    EXIT_CONTENDED,
    EXIT_CORRUPT,
    EXIT_DECLINED,
    EXIT_LOST,
    EXIT_OK,
    EXIT_STORAGE,
    EXIT_TIMEOUT,
    EXIT_USAGE,
)
from .lock.types import LockStatus
from .repair import force_release
from .runner import SIGNAL_TARGETS, CommandRunner, exec_command, who_of
from .runner import fail as _fail
from .storage import MAX_RECORD_BYTES, open_url, records
from .storage.local import LocalStorage
from .storage.records import read_retrying

#: The exit code of each error that reaches ``main``: the first class that matches.
_EXIT_FOR: tuple[tuple[type[HandoffLockError], int], ...] = (
    (LockTimeout, EXIT_TIMEOUT),
    (LockContended, EXIT_CONTENDED),
    (LockRecordCorrupt, EXIT_CORRUPT),
    (ConfigurationError, EXIT_CONFIG),  # InvalidLockURL included
    (LockLost, EXIT_LOST),
    (StorageError, EXIT_STORAGE),  # TransientStorageError included
    (HandoffLockError, EXIT_DECLINED),
)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``handofflock`` command with ``argv`` (default ``sys.argv[1:]``); return the exit code.

    From the command line (``argv`` None) a ``memory://`` URL is refused (exit 64): that store lives
    inside one process, so two commands would never exclude each other. A caller passing ``argv``
    runs in a process that may share a memory store with other locks (the tests do).
    """
    from_command_line = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    command: list[str] | None = None
    if "--" in argv:  # everything after the first "--" is run's command, untouched
        cut = argv.index("--")
        argv, command = argv[:cut], argv[cut + 1 :]
    parser = _parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:  # with the usage of the subcommand they were given to, not the top-level one
            hint = ""
            if args.cmd == "run" and command is None:
                hint = f"; the command goes after '--': {_command_hint(argv, extra)}"
            args.parser.error(f"unrecognized arguments: {' '.join(extra)}{hint}")
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
        return int(exc.code or 0)
    if args.cmd not in ("run", "exec") and command is not None:
        return _fail("'--' and a command only go with `handofflock run` and `handofflock exec`", EXIT_USAGE)
    if args.cmd in ("run", "exec") and not command:
        return _fail(f"nothing to run: usage: {args.parser.usage}", EXIT_USAGE)
    args.command = command
    args.in_process_stores = not from_command_line
    logging.basicConfig(
        level=logging.INFO if getattr(args, "verbose", False) else logging.WARNING, format="handofflock: %(message)s"
    )
    try:
        code: int = args.func(args)
        sys.stdout.flush()  # here, where a closed pipe can still be answered, not at interpreter exit
        return code
    except BrokenPipeError:
        # The reader of our stdout went away (``handofflock status URL | head -1``): exit as ``cat`` would.
        # As Python's documentation of SIGPIPE recommends, stdout is pointed at /dev/null so that the
        # interpreter's final flush cannot fail again and print a traceback. The status is 141
        # (128 + SIGPIPE), what the shell reports for any tool that SIGPIPE ends: a pipeline under
        # ``set -o pipefail`` treats us like ``cat`` or ``git log``.
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError):  # no real stdout to replace (a test's capture)
            pass
        return EXIT_BROKEN_PIPE
    except HandoffLockError as exc:
        return _fail(error_text(exc), exit_for(exc))
    except KeyboardInterrupt:
        return 128 + signal.SIGINT


def exit_for(exc: HandoffLockError) -> int:
    """The exit code of an error that ends a command: the first class of ``_EXIT_FOR`` it is."""
    return next(code for kind, code in _EXIT_FOR if isinstance(exc, kind))


def error_text(exc: HandoffLockError) -> str:
    """What to say of an error that ends a command: a bad URL's advice without ``memory://``, in-process only."""
    if isinstance(exc, TransientStorageError) and not isinstance(exc, NoAnswer):
        return f"{exc} (the store did not answer; try again)"
    return _MEMORY_ADVICE.sub(" or a plain path", str(exc)) if isinstance(exc, ConfigurationError) else str(exc)


#: The memory store offered among the URL forms a lock URL may take (``open_url``'s refusals).
_MEMORY_ADVICE = re.compile(r",? (?:a plain path, )?or memory://name")

#: A URL the memory store opens, or one ``open_url`` refuses as a typo of it.
_MEMORY_URL = re.compile(r"\s*mem(?:ory)?:", re.IGNORECASE)


def refuse_url(args: argparse.Namespace) -> None:
    """Refuse, before the command starts, a lock URL no command can use: ``memory://`` given on the command
    line (each process has its own memory store), or a local path that is a directory (a bad lock URL, not
    an outage a cron wrapper would retry)."""
    text = os.fspath(args.url)
    if not getattr(args, "in_process_stores", True) and _MEMORY_URL.match(text):
        raise InvalidLockURL(
            f"lock URL {text!r}: memory:// is a store inside one process, so two handofflock commands would "
            "never exclude each other; use file:///path.json or a plain path on one host, gs:// or s3:// across hosts"
        )
    if "://" in text and not text.lower().startswith("file:"):
        return  # a bucket's client is made within the command's time bound, not here
    store, key = open_url(text)  # no I/O
    path = os.path.join(store.root, key) if isinstance(store, LocalStorage) else ""
    if path and os.path.isdir(path):
        raise InvalidLockURL(
            f"local lock URL {text!r} names a directory, not a file; name a file in it, such as "
            f"{os.path.join(path, 'lock.json')!r}"
        )


def _command_hint(argv: list[str], extra: list[str]) -> str:
    """How ``run``'s command would have been written: flock's ``-c 'CMD'`` habit is ``-- sh -c 'CMD'`` here."""
    flag = next((t for t in ("-c", "--command") if t in argv), None)
    if flag is None or argv.index(flag) + 1 >= len(argv):
        return f"handofflock run URL [options] -- {shlex.join(extra)}"
    at = argv.index(flag)
    rest = argv[argv.index("run") + 1 : at] + argv[at + 2 :]
    return f"handofflock run {shlex.join(rest)} -- sh -c {shlex.quote(argv[at + 1])}"


#: The library's parameter names, as they appear in its ConfigurationError messages, said as the
#: `run` flags that set them: a shell user never typed ``waiter_check_interval``. Applied in order.
_CLI_NAMES = (
    (re.compile(r" \(waiter_ttl defaults to it\)"), ""),
    (
        re.compile(r"use a longer ttl, or pass waiter_ttl and waiter_poll_interval yourself"),
        "use a longer --ttl or a shorter --poll-interval",
    ),
    (re.compile(r" \(or pass renew_interval and renew_deadline yourself\)"), ""),
    (re.compile(r"\bwaiter_(?:check|poll)_interval\b"), "--poll-interval"),
    (re.compile(r"(?<![\w-])ttl\b"), "--ttl"),
)


def cli_names(message: str) -> str:
    """``message`` with the library's parameter names replaced by ``handofflock run``'s flags."""
    for pattern, flag in _CLI_NAMES:
        message = pattern.sub(flag, message)
    return message


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="handofflock",
        description=(
            "Look at, hold, clear and watch a handofflock lock. URL: gs://bucket/key.json, s3://bucket/key.json,"
            " file:///abs/path.json, or a path."
        ),
        epilog="Exit codes: see `handofflock run --help` and docs/jobs.md.",
    )
    parser.add_argument("-V", "--version", action="version", version=f"handofflock {__version__}")
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "status", help="who holds the lock, who waits, until when", description="Read the lock once and describe it."
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="one JSON object with stable keys, for scripts (an error too: its 'state' and 'error')",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=STATUS_TIMEOUT,
        metavar="SECONDS",
        help=f"give up after this many seconds if the store does not answer (exit 69; default {STATUS_TIMEOUT:g})",
    )
    p.set_defaults(func=cmd_status)

    p = sub.add_parser(
        "run",
        help="hold the lock around a command (like flock(1), for a fleet)",
        usage="handofflock run URL [options] -- CMD [ARGS...]",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Wait for the lock (as its single waiter), run CMD holding it, release it when CMD exits.\n"
            "When someone asks for the lock (a waiter, or a signal to this process), CMD gets --signal\n"
            "and --grace seconds to exit; then it and every process it started are killed (SIGKILL).\n"
            "CMD runs in a session of its own. The lock is released only after every process CMD\n"
            "started has exited, handed to the waiter if there is one. TERM, INT, HUP, USR1 and USR2\n"
            "sent to this process are passed on to CMD (--signal-to). CMD's environment has HANDOFFLOCK_URL,\n"
            "HANDOFFLOCK_TOKEN (the fencing token) and HANDOFFLOCK_OWNER_ID.\n"
            "CMD is looked up before the lock is asked for (exit 127/126 if it cannot run). If the\n"
            "waiter goes away before the grace ends, CMD is left alone and run keeps the lock."
        ),
        epilog=EXIT_CODES_HELP,
    )
    p.add_argument("--ttl", type=float, default=60.0, help="lease length in seconds (default 60)")
    p.add_argument(
        "--min-hold",
        type=float,
        help="seconds the lock is kept before a waiter's request is acted on (default 30; 0: at once)",
    )
    p.add_argument("--signal", default="TERM", help="signal sent to CMD when the lock is asked for (default TERM)")
    p.add_argument(
        "--signal-to",
        choices=SIGNAL_TARGETS,
        default="main",
        help="where that signal (and a signal passed on) goes: CMD's own process, which lets a trainer "
        "checkpoint while its helper processes (DataLoader workers) stay up, or CMD's whole process group "
        "(default main; what the command leaves when it exits gets it then)",
    )
    p.add_argument(
        "--yield-exit-code",
        type=int,
        metavar="N",
        help="exit N when CMD stopped within the grace because the lock was asked for (a clean handoff); "
        "default: CMD's own status, as flock(1) (143 after a SIGTERM). 0 for cron, 75 to be requeued",
    )
    p.add_argument(
        "--grace",
        type=float,
        default=30.0,
        help="seconds CMD has to exit after that signal before SIGKILL (default 30)",
    )
    p.add_argument(
        "--timeout",
        "-w",
        "--wait",  # flock(1)'s names for it
        type=float,
        help="give up waiting for the lock after this many seconds (exit 124); -w and --wait as in flock(1)",
    )
    p.add_argument("-n", "--nonblock", action="store_true", help="do not wait: exit 75 if the lock is held")
    p.add_argument(
        "--wait-for-slot",
        action="store_true",
        help="wait for the waiter slot if another process already waits (what run does anyway; kept for scripts)",
    )
    p.add_argument(
        "--no-request",
        action="store_true",
        help="wait patiently: never ask the holder to leave; it finishes on its own, then hands the lock over",
    )
    p.add_argument(
        "--no-yield",
        action="store_true",
        help="while holding, decline requests for the lock: CMD is not signalled for a waiter "
        "(`status` shows 'asked by ..., declined'); signals sent to run are still passed on",
    )
    p.add_argument(
        "--priority",
        type=int,
        default=0,
        help="rank for the single waiter slot: a higher one takes it from a lower one (default 0)",
    )
    p.add_argument(
        "--poll-interval",
        type=float,
        help="seconds between reads: the holder looks for a waiter, the waiter for the lock (default 2 and 1)",
    )
    p.add_argument(
        "--label",
        help="who this is, shown by `status` beside the owner or waiter id (default: host, pid, "
        "Kubernetes pod, Slurm job and torchrun rank, as found in the environment)",
    )
    p.add_argument(
        "--owner-id",
        help="a stable owner id (default: a fresh host:pid:random); a run restarted with the same id "
        "still waits for its predecessor's lease: at once if that released, ttl + skew after it died",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="say what run does (waiting, acquired, released) and log the lock's activity; without it a run "
        "that succeeds prints nothing, as flock(1)",
    )
    p.set_defaults(func=cmd_run)

    p = sub.add_parser(
        "exec",
        help="run a job as a container's PID 1: signals passed on, orphans reaped, the job's own status",
        usage="handofflock exec [--grace S] -- CMD [ARGS...]",
        description="Run CMD as a pod's command should be run (no lock is taken). Signals (TERM, INT, HUP, "
        "QUIT, USR1, USR2) go to CMD; orphans are reaped; when CMD exits, what it left gets TERM, then "
        "KILL after the grace. The exit status is the one a rank_lock job decided (exit 143 after SIGTERM, "
        "75 after a yield), which torchrun does not pass on, else CMD's own.",
    )
    p.add_argument("--grace", type=float, default=10.0, help="seconds CMD's leftovers get after TERM (default 10)")
    p.set_defaults(func=lambda args: exec_command(args.command, args.grace))

    p = sub.add_parser(
        "release",
        help="clear a stuck or corrupt lock (--force)",
        description="Clear the lock from outside with a generation-matched write: "
        "it becomes free and the next acquire takes it. Its holder, if any, "
        "finds out at its next renewal and stops.",
    )
    p.add_argument("--force", action="store_true", help="required: this overrides whoever holds the lock")
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    p.set_defaults(func=cmd_release)

    p = sub.add_parser(
        "watch",
        help="show changes live until Ctrl-C",
        description="Poll the lock and print a line whenever its holder, waiter or state changes.",
    )
    p.add_argument("--interval", type=float, default=1.0, help="seconds between reads (default 1)")
    p.add_argument("--json", action="store_true", help="JSON lines, the same keys as `status --json` plus 'time'")
    p.add_argument("--duration", type=float, help="stop after this many seconds (default: until Ctrl-C)")
    p.set_defaults(func=cmd_watch)
    for name, subparser in sub.choices.items():
        if name != "exec":
            subparser.add_argument("url")  # listed apart from the options, wherever it is declared
        subparser.set_defaults(parser=subparser)  # its own usage for its own errors
    return parser


# --------------------------------------------------------------------------- status


#: How long ``status`` (and each read of ``watch``) may take, retries and all, before it says the store
#: did not answer: a person is waiting at the terminal (``status --timeout``). ``HandoffLock.status()``
#: rides out a 30 s outage instead.
STATUS_TIMEOUT = 10.0


class NoAnswer(TransientStorageError):
    """The store did not answer a status read in the time given."""


def read_status(url: str, *, within: float = STATUS_TIMEOUT) -> LockStatus:
    """Read the lock at ``url`` once, as ``HandoffLock.status()`` does, in at most ``within`` s in all.

    A store that fails by then raises its last :class:`TransientStorageError`,
    and one that accepts the request and never answers raises one saying so
    after ``within`` s (exit 69): the read runs in a helper thread, given up
    on then. A lock object that is not there is looked for once more by
    listing its key: a listing fails on a missing bucket, where a read of the
    emulator (or of S3 without ``s3:ListBucket``) cannot tell a missing bucket
    from a missing object, and ``run`` would then fail on it with exit 69
    while ``status`` said "absent".
    """
    if not (within > 0 and math.isfinite(within)):
        raise ConfigurationError(f"--timeout must be a number of seconds > 0, got {within}")
    found: dict[str, Any] = {}

    def read() -> None:
        try:  # the store's SDK is imported and its client made in here too: within the bound
            found["status"] = _read_status(url, within, found)
        except BaseException as exc:  # handed to the caller's thread
            found["error"] = exc

    reader = threading.Thread(target=read, name="handofflock-status", daemon=True)
    reader.start()
    reader.join(within)
    error = found.get("error")
    if error is not None and not isinstance(error, StorageTimeout):
        raise error
    if "status" not in found:  # no answer by the deadline: the thread still waits, or the store's bound said so
        why = records.down().get(found.get("store", ""))  # refused, reset...: what its retries met, if anything
        said = f"{url}: the store did not answer within {within:g} s" + (f" ({why})" if why else "")
        said += "; a read changes nothing"
        raise NoAnswer(said, url=os.fspath(url)) from error
    status: LockStatus = found["status"]
    return status


def _read_status(url: str, within: float, seen: dict[str, Any]) -> LockStatus:
    store, key = open_url(url)
    seen["store"] = store.url  # as records.down() names it
    text, clock = os.fspath(url), Clock()
    # Each request may take a little longer than the whole: the caller's wait for this thread says it first.
    found = read_retrying(
        store, key, clock=clock, deadline=clock.monotonic() + within, max_bytes=MAX_RECORD_BYTES, timeout=within + 1.0
    )
    now = clock.time()
    if found is None:
        store.list(key)  # raises on a missing bucket, with what to do
        return LockStatus(text, read_at=now)
    data, generation = found
    record = LockRecord.decode(data, key=key, generation=generation, url=text)
    return LockStatus.of(text, record, generation, now)  # the lock's own snapshot, every field included


def status_json(st: LockStatus, now: float | None = None) -> dict[str, Any]:
    """``LockStatus.to_json()`` plus ``state``, seconds left and ISO times: the stable shape of ``status --json``.

    ``releaseRequested`` is True while a live waiter that asks is registered
    (the holder is told within its waiter check interval; a patient waiter,
    ``waiterAsks`` false, does not ask); ``releaseRequestedBy`` names it (its
    label, else its id); ``releaseDeclined`` is True once the holder has
    declined it (``run --no-yield``).
    """
    now = st.read_at if now is None else now
    doc = st.to_json()
    doc["state"] = state_of(st, now)
    doc["expiresIn"] = None if st.expires_at is None else round(st.expires_at - now, 3)
    doc["waiterExpiresIn"] = None if st.waiter_expires_at is None else round(st.waiter_expires_at - now, 3)
    doc["expiresAtIso"] = iso(st.expires_at)
    doc["heldSinceIso"] = iso(st.held_since)
    doc["waiterExpiresAtIso"] = iso(st.waiter_expires_at)
    doc["readAtIso"] = iso(st.read_at)
    doc["minHoldEndsAtIso"] = iso(st.min_hold_ends)
    requested = release_requested(st, now)
    doc["releaseRequested"] = requested
    doc["releaseRequestedBy"] = who_of(st.waiter_id, st.waiter_label) if requested else None
    return doc


def release_requested(st: LockStatus, now: float) -> bool:
    """Whether a live waiter that asks is registered on a held lock, judged at ``now``."""
    waiter_until = st.waiter_expires_at  # set exactly when a waiter is
    return state_of(st, now) == "held" and waiter_until is not None and now <= waiter_until and st.waiter_asks


def state_of(st: LockStatus, now: float) -> str:
    if not st.exists:
        return "absent"
    if st.owner_id is None:
        return "free"
    return "held" if st.expires_at is not None and now <= st.expires_at else "expired"


def time_left(ts: float | None, now: float) -> str:
    if ts is None:
        return "-"
    left = ts - now
    return f"{left:.1f} s left, until {iso(ts)}" if left >= 0 else f"ran out {-left:.1f} s ago, at {iso(ts)}"


def lease_text(st: LockStatus, now: float) -> str:
    """A held lease's length: its time left, or for a suspect lease what bounds it instead of its stated end."""
    if st.lease_suspect:
        ttl = "its ttl" if st.ttl is None else f"its ttl ({st.ttl:g} s)"
        return f"lease suspect: bounded by {ttl} from an acquirer's first read, not by its stated end"
    return f"lease live ({time_left(st.expires_at, now)})"


def status_text(st: LockStatus, now: float | None = None) -> str:
    now = st.read_at if now is None else now
    state = state_of(st, now)
    if state == "absent":
        return f"{st.url}\n  state       absent: no lock object yet (the first acquire creates it)"
    owner = {
        "free": "free: nobody holds it",
        "held": f"held, {lease_text(st, now)}",
        "expired": f"expired: the lease {time_left(st.expires_at, now)}; the next acquire takes it",
    }[state]
    lines = [st.url, f"  state       {owner}"]
    lines.append(f"  owner       {who_of(st.owner_id, st.owner_label) if st.owner_id else '-'}")
    if st.held_since is not None:
        lines.append(f"  held since  {when(st.held_since, now)}")
    hold_ends = st.min_hold_ends if state == "held" else None
    if hold_ends is not None and st.min_hold is not None:
        lines.append(f"  min hold    {st.min_hold:g} s: a waiter's request is acted on from {when(hold_ends, now)}")
    if st.expires_at is not None:
        claimed = ", as claimed: not trusted" if st.lease_suspect else ""
        lines.append(f"  expires     {when(st.expires_at, now)}{claimed}")
    if st.lease_suspect:
        lines.append(
            "  suspect     the lease claims more than its ttl plus the skew allowance: not trusted; "
            "an acquirer counts it as ending ttl after it first reads this record, unless the owner renews"
        )
    waiter = who_of(st.waiter_id, st.waiter_label)
    if st.waiter_id is None:
        lines.append("  waiter      none")
    else:
        live = "live" if st.waiter_live else "gone"
        kind = ("" if st.waiter_asks else "patient, ") + (
            f"priority {st.waiter_priority}, " if st.waiter_priority else ""
        )
        lines.append(f"  waiter      {waiter} ({kind}{live}, {time_left(st.waiter_expires_at, now)})")
    if release_requested(st, now) and st.declined:
        lines.append(f"  release     asked by {waiter}, declined (the holder does not yield)")
    elif release_requested(st, now):
        grace = st.owner_label.grace if st.owner_label is not None else None
        lines.append(
            f"  release     requested by {waiter}"
            + (f"; the holder allows its work {grace:g} s to stop" if grace is not None else "")
            + (f"; acted on as the minimum hold ends, {when(hold_ends, now)}" if hold_ends and now < hold_ends else "")
        )
    elif state == "held" and st.waiter_live and not st.waiter_asks:
        lines.append("  release     not requested: the waiter waits for the holder to finish")
    elif state == "held":
        lines.append("  release     not requested")
    lines += [f"  token       {st.token}", f"  generation  {st.generation}"]
    if st.ttl is not None:
        lines.append(f"  ttl         {st.ttl:g} s")
    lines.append(f"  read at     {iso(st.read_at)}")
    return "\n".join(lines)


def cmd_status(args: argparse.Namespace) -> int:
    """Describe the lock; an error is said on stderr and, with ``--json``, as a JSON object on stdout."""
    try:
        refuse_url(args)
        st = read_status(args.url, within=args.timeout)
    except HandoffLockError as exc:
        said, code = error_text(exc), exit_for(exc)
        if isinstance(exc, NoAnswer):
            said += f" (try again, or give a longer --timeout than {args.timeout:g})"
        if args.json:
            state = "unreadable" if code == EXIT_STORAGE else "error"
            state = "corrupt" if isinstance(exc, LockRecordCorrupt) else state
            print(json.dumps({"url": args.url, "state": state, "error": said, "exitCode": code}))
        return _fail(said, code)
    print(json.dumps(status_json(st)) if args.json else status_text(st))
    return EXIT_OK


# --------------------------------------------------------------------------- run


def cmd_run(args: argparse.Namespace) -> int:
    refuse_url(args)
    try:
        runner = CommandRunner(args)
    except ConfigurationError as exc:
        raise ConfigurationError(cli_names(str(exc))) from exc
    return runner.run()


# --------------------------------------------------------------------------- release --force


def cmd_release(args: argparse.Namespace) -> int:
    """Describe the lock, ask for confirmation, then :func:`~handofflock.force_release` it; the exit code.

    The write is matched to the generation that was described, so a lock that
    moved on while the operator read the description is left alone (exit 75).
    """
    url = args.url
    if not args.force:
        return _fail(
            "`release` only clears a lock from outside, overriding its holder: add --force. "
            "(A holder releases by calling release() or leaving its `with` block.)",
            EXIT_USAGE,
        )
    refuse_url(args)
    store, key = open_url(url)
    found = store.read(key, max_bytes=MAX_RECORD_BYTES)
    if found is None:
        print(f"{url}: no lock object; nothing to clear")
        return EXIT_OK
    data, generation = found
    now = time.time()
    try:
        record = LockRecord.decode(data, key=key, generation=generation, url=url)
    except LockRecordCorrupt as exc:
        what = f"{url} (generation {generation}) is corrupt: {exc.reason}; it will be replaced by a free record"
    else:
        owner, waiter = record.owner, record.waiter
        if owner is None and waiter is None:
            print(f"{url}: already free; nothing to clear")
            return EXIT_OK
        what = f"{url} (generation {generation}) is held by {who_of(owner.id, owner.label) if owner else None}"
        if owner is not None and owner.live(now):
            what += (
                f", whose lease is LIVE for {owner.expires_at - now:.0f} s more: that process will go on working"
                " until its next renewal finds the lock gone; only writes fenced with the token are safe"
            )
        elif owner is not None:
            what += ", whose lease has expired"
        if waiter is not None:
            what += f"; waiter {who_of(waiter.id, waiter.label)} will be dropped too"
    print(what, file=sys.stderr)
    if not args.yes and not _confirmed():
        print("nothing done")
        return EXIT_DECLINED
    try:
        result = force_release(url, expected_generation=generation)
    except PreconditionFailed:
        return _fail(
            f"{url} changed while you looked; nothing was written. Run `handofflock status {url}` and try again",
            EXIT_CONTENDED,
        )
    if result is None:
        print(f"{url}: the lock object is gone; nothing to clear")
    else:
        print(f"{url}: cleared; the next acquire takes it (the next token is above {result.token})")
    return EXIT_OK


def _confirmed() -> bool:
    """Ask at the terminal whether to clear the lock; never guess "yes" where nobody can answer."""
    if not sys.stdin or not sys.stdin.isatty():
        print("handofflock: not a terminal, so not asking: add --yes to clear it", file=sys.stderr)
        return False
    try:
        return input("Clear it? [y/N] ").strip().lower() in ("y", "yes")
    except EOFError:
        return False


# --------------------------------------------------------------------------- watch


def cmd_watch(args: argparse.Namespace) -> int:
    if not args.interval > 0:
        raise ConfigurationError(f"--interval must be > 0, got {args.interval}")
    url = args.url
    refuse_url(args)
    open_url(url)  # a bad URL is refused before the first line
    stop_at = None if args.duration is None else time.monotonic() + args.duration
    last: Any = None
    if not args.json:
        print(f"watching {url} every {args.interval:g} s (Ctrl-C to stop)", flush=True)
    try:
        while True:
            now = time.time()
            try:
                st = read_status(url)
                doc = status_json(st, now)
                waiter = (st.waiter_id, st.waiter_label) if st.waiter_live else None
                seen: tuple[object, ...] = (doc["state"], st.owner_id, st.owner_label, waiter, st.token)
                line = _watch_line(st, doc, now)
            except LockRecordCorrupt as exc:
                doc = {"url": url, "state": "corrupt", "error": str(exc)}
                seen, line = ("corrupt", str(exc)), f"CORRUPT: {exc}"
            except TransientStorageError as exc:
                doc = {"url": url, "state": "unreadable", "error": str(exc)}
                seen, line = ("unreadable",), f"read failed ({exc}); retrying"
            if seen != last:
                last = seen
                print(json.dumps({"time": now, **doc}) if args.json else f"{iso(now)}  {line}", flush=True)
            if stop_at is not None and time.monotonic() >= stop_at:
                return EXIT_OK
            time.sleep(args.interval if stop_at is None else max(0.0, min(args.interval, stop_at - time.monotonic())))
    except KeyboardInterrupt:
        return EXIT_OK


def _watch_line(st: LockStatus, doc: dict[str, Any], now: float) -> str:
    state = doc["state"]
    if state == "absent":
        return "absent (no lock object)"
    if state == "free":
        return f"free (token {st.token})"
    lease = "suspect, bounded by its ttl" if st.lease_suspect else time_left(st.expires_at, now)
    line = f"{state}: {who_of(st.owner_id, st.owner_label)} (token {st.token}, lease {lease})"
    if release_requested(st, now):
        verb = "asked for by waiter {}, declined" if st.declined else "release requested by waiter {}"
        line += "; " + verb.format(who_of(st.waiter_id, st.waiter_label))
    elif st.waiter_live:
        line += f"; waiter {who_of(st.waiter_id, st.waiter_label)} waits without asking"
    return line


if __name__ == "__main__":
    sys.exit(main())
