"""A holder that ends without release(), for the release-at-exit tests. Prints one JSON event per line.

    python exitproc.py exit URL         acquire, then sys.exit(0)
    python exitproc.py optout URL       the same with release_at_exit=False
    python exitproc.py asked URL        acquire, wait until a waiter asks, then sys.exit(0)
    python exitproc.py drop URL         acquire, drop the last reference, gc.collect(), then live on
    python exitproc.py raise URL        acquire, then die of an uncaught exception
"""

import gc
import sys
import time

import orjson

from handofflock import HandoffLock


def emit(event: str, **fields) -> None:
    print(orjson.dumps({"event": event, "t": time.time(), **fields}).decode(), flush=True)


def main() -> int:
    mode, url = sys.argv[1], sys.argv[2]
    # ttl 60 and the store's default pacing: a lock left held would block the next acquirer for a minute.
    optout = {"release_at_exit": False} if mode == "optout" else {}  # the default is what is tested
    lock = HandoffLock(url, ttl=60.0, waiter_check_interval=0.5, **optout)
    assert lock.acquire(timeout=30)
    emit("acquired", token=lock.token, owner=lock.owner_id)
    if mode == "asked":
        deadline = time.monotonic() + 60
        while not lock.release_requested and time.monotonic() < deadline:
            time.sleep(0.05)
        emit("asked", requested=lock.release_requested)
    if mode == "drop":
        del lock
        gc.collect()
        emit("dropped")
        time.sleep(120)  # alive: whatever released the lock, it was not the exit
        return 0
    if mode == "raise":
        raise RuntimeError("the job failed")
    return 0  # sys.exit(0), the lock still held


if __name__ == "__main__":
    sys.exit(main())
