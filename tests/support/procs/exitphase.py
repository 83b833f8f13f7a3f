"""A child for the phase nemesis (tests/storage/test_phase_nemesis.py): ``exitphase.py KIND PHASE``.

Its acquire runs in a daemon thread; when the write of KIND reaches PHASE the main thread returns,
so the interpreter exits while the acquire is there. The last exit hook, registered before the
lock's own (so run after it), checks that nothing of the acquire's is left, and prints "ok" or why not.
"""

from __future__ import annotations

import atexit
import sys
import threading
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/support

found: list[str] = []


def check() -> None:
    try:
        # At exit a hold the acquire returned is released too: nothing may be left, whatever it returned.
        check_nothing_left(world, st, Outcome(raised=outcome.get("raised", SystemExit())))
        print("ok")
    except BaseException:  # said on stdout: the test reads it
        print(traceback.format_exc())


atexit.register(check)  # before the lock's own hook: run after it

from nemesis import Nemesis, Outcome, check_nothing_left, stage  # noqa: E402
from simworld import new_world  # noqa: E402

from handofflock.core.errors import TransientStorageError  # noqa: E402

kind, phase = sys.argv[1], sys.argv[2]
world = new_world()
st = stage(world, kind, release_at_exit=True)  # on a fake clock: said, not assumed
b = st.b
reached = threading.Event()
outcome: dict[str, BaseException] = {}


def act(point: str) -> None:
    """In the acquiring thread: the main thread exits now. A waiting acquire is cancelled by the lock's exit
    hook: the reply then never comes (or, seen, the lock goes on and sees the cancel); a hold already made
    stays here until the process is gone (the exit hook releases it)."""
    reached.set()
    if b._state.value != "waiting":
        time.sleep(60)
    end = time.monotonic() + 30
    while not b._cancel.is_set() and time.monotonic() < end:
        time.sleep(0.001)
    if point != "seen":
        raise TransientStorageError("nemesis: connection reset, no reply", ambiguous=True)


nemesis = Nemesis(world, b, st.op, st.nth, phase, act, st.before_op)
nemesis.install()


def acquire() -> None:
    try:
        b.acquire()
    except BaseException as exc:
        outcome["raised"] = exc


threading.Thread(target=acquire, daemon=True).start()
if not reached.wait(30):
    print("the acquire never reached the phase")
    sys.exit(1)
