"""A lock-holding OS process for cross-process tests. Prints one JSON event per line.

    python lockproc.py owner URL     acquire, wait for a release request, release (hand off)
    python lockproc.py waiter URL    acquire as the waiter, report, release
"""

from __future__ import annotations

import sys
import threading
import time

import orjson

from handofflock import HandoffLock, signals


def emit(event: str, **fields) -> None:
    sys.stdout.write(orjson.dumps({"event": event, "t": time.time(), **fields}).decode() + "\n")
    sys.stdout.flush()


def main() -> int:
    role, url = sys.argv[1], sys.argv[2]
    check = float(sys.argv[3]) if len(sys.argv) > 3 else 0.5
    poll = float(sys.argv[4]) if len(sys.argv) > 4 else 0.2
    lock = HandoffLock(url, ttl=10.0, waiter_check_interval=check, waiter_poll_interval=poll, max_clock_skew=0.5,
                       min_hold=0)  # handoff mechanics: asked at once
    if role == "owner":
        asked = threading.Event()

        @signals.on_release_requested.connect_via(lock)
        def noticed(sender, request, **kw):
            emit("noticed", waiter=request.requester, deadline=request.deadline, reason=request.reason.value)
            asked.set()

        lock.acquire()
        emit("acquired", token=lock.token, owner=lock.owner_id)
        if not asked.wait(60):
            emit("no_request")
            return 3
        time.sleep(0.2)  # "checkpoint"
        heir = lock.release()
        emit("released", heir=heir, token=lock.token)
        return 0

    @signals.waiting.connect_via(lock)
    def registered(sender, owner_id, **kw):
        emit("waiting", holder=owner_id, me=lock.owner_id)

    lock.acquire(timeout=60)
    emit("acquired", token=lock.token, owner=lock.owner_id)
    lock.release()
    return 0


if __name__ == "__main__":
    sys.exit(main())
