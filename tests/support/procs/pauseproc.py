"""A lock holder that the test freezes with SIGSTOP, and the contender that replaces it.

Prints one JSON event per line (``{"event": ..., "t": wall time, ...}``).

    python pauseproc.py holder URL       acquire, claim the fenced result, then do units of work:
                                         check(), work 0.5 s, write the unit's result with its token
    python pauseproc.py contender URL    acquire (waiting as long as it takes), claim, wait for
                                         "release" on stdin, release

Timing (seconds): ttl 2, renew_deadline 1, renew every 0.25, max_clock_skew 0.2.
"""

from __future__ import annotations

import sys
import time

import orjson

from handofflock import HandoffLock, LockLost, StaleToken
from handofflock.fencing import FencedObject

TIMING = dict(
    ttl=2.0,
    renew_interval=0.25,
    renew_deadline=1.0,
    waiter_ttl=2.0,
    waiter_check_interval=0.2,
    waiter_poll_interval=0.1,
    max_clock_skew=0.2,
    min_hold=0.0,  # handoff mechanics: asked at once
    min_write_interval=0.0,  # ttl 2: the pause tests need leases short enough to outlive; GCS serves 5 s and up
)
UNIT_SECONDS = 0.5


def emit(event: str, **fields) -> None:
    sys.stdout.write(orjson.dumps({"event": event, "t": time.time(), **fields}).decode() + "\n")
    sys.stdout.flush()


def holder(url: str) -> int:
    lock = HandoffLock(url, owner_id="holder", **TIMING)
    lock.acquire(timeout=10)
    result = FencedObject.beside(lock, "result.json")
    result.claim()
    token = lock.token
    emit("acquired", token=token)
    for unit in range(1000):
        try:
            lock.check()  # before each unit of protected work
        except LockLost as exc:
            emit("lost", unit=unit, reason=exc.reason, healthy=lock.healthy)
            break
        emit("checked", unit=unit)
        time.sleep(UNIT_SECONDS)  # the work; the test stops the process in here
        emit("worked", unit=unit, healthy=lock.healthy)
        try:
            # The unit's result goes out with the token it was started under, as a write
            # already under way would: the fence, not the lock, decides whether it lands.
            result.write({"unit": unit, "by": "holder"}, token=token)
            emit("written", unit=unit)
        except StaleToken as exc:
            emit("refused", unit=unit, token=exc.token, highest=exc.highest)
        try:
            result.write({"unit": unit, "by": "holder", "gated": True})  # token=None: the lock is checked first
            emit("gated_write_passed", unit=unit)
        except LockLost:
            emit("gated_write_stopped", unit=unit)
    try:
        lock.release()
        emit("released")
    except LockLost as exc:
        emit("release_refused", reason=exc.reason)
    return 0


def contender(url: str) -> int:
    lock = HandoffLock(url, owner_id="contender", **TIMING)
    lock.acquire(timeout=30)
    emit("acquired", token=lock.token)
    result = FencedObject.beside(lock, "result.json")
    result.claim()
    result.write({"unit": 0, "by": "contender"})
    emit("claimed", token=lock.token)
    sys.stdin.readline()
    lock.release()
    emit("released")
    return 0


if __name__ == "__main__":
    role, url = sys.argv[1], sys.argv[2]
    sys.exit(holder(url) if role == "holder" else contender(url))
