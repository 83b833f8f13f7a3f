"""A holder that ends without release(), for the release-at-exit tests. Prints one JSON event per line.

    python exitproc.py exit URL         acquire, then sys.exit(0)
    python exitproc.py optout URL       the same with release_at_exit=False
    python exitproc.py asked URL        acquire, wait until a waiter asks, then sys.exit(0)
    python exitproc.py drop URL         acquire, drop the last reference, gc.collect(), then live on
    python exitproc.py raise URL        acquire, then die of an uncaught exception
    python exitproc.py hold URL         `with HandoffLock(url):` and wait there (for a signal)
    python exitproc.py hold-optout URL  the same with release_on_signal=False
    python exitproc.py hold-handler URL the same, with a SIGTERM handler of its own installed first
    python exitproc.py daemon-wait URL  a daemon thread waits in acquire(); the main thread exits
    python exitproc.py wait URL         `with HandoffLock(url):` behind a holder, waiting (for a signal)
    python exitproc.py wait-on-self URL `with HandoffLock(url):`, then a second HandoffLock of the same URL waits
                                        behind it in the main thread (a job that waits on its own lock)
    python exitproc.py term-in-release URL  `with HandoffLock(url):`; SIGTERM lands while release() writes
"""

import gc
import os
import signal
import sys
import threading
import time

import orjson

from handofflock import HandoffLock


def emit(event: str, **fields) -> None:
    print(orjson.dumps({"event": event, "t": time.time(), **fields}).decode(), flush=True)


def hold(url: str, mode: str) -> int:
    if mode == "hold-handler":
        signal.signal(signal.SIGTERM, lambda signum, frame: emit("handled", signal=signum))
    optout = {"release_on_signal": False} if mode == "hold-optout" else {}
    with HandoffLock(url, ttl=60.0, **optout) as lock:
        emit("acquired", token=lock.token, owner=lock.owner_id)
        time.sleep(120)
    return 0


def term_in_release(url: str) -> int:
    """SIGTERM arrives while the main thread's release() is sending its write (a slow store, GCS's spacing)."""
    from handofflock.storage import open_url
    from handofflock.storage.local import LocalStorage

    storage, key = open_url(url)
    assert isinstance(storage, LocalStorage)

    class Slow(LocalStorage):
        releasing = False

        def write(self, key, data, **kw):
            if self.releasing:
                os.kill(os.getpid(), signal.SIGTERM)  # lands now, in the middle of the release write
                time.sleep(0.2)
            return super().write(key, data, **kw)

    slow = Slow.__new__(Slow)
    slow.__dict__.update(storage.__dict__)
    with HandoffLock(url, storage=slow, key=key, ttl=60.0) as lock:
        emit("acquired", token=lock.token, owner=lock.owner_id)
        slow.releasing = True
    emit("released")  # never: the signal ends the process once the release is written
    return 0


def daemon_wait(url: str) -> int:
    lock = HandoffLock(url, ttl=60.0, waiter_check_interval=0.5, min_hold=0)

    def wait() -> None:
        lock.acquire()
        emit("acquired-in-daemon")  # never: the test's holder keeps the lock

    threading.Thread(target=wait, daemon=True).start()
    deadline = time.monotonic() + 30
    while not lock.status().waiter_id == lock.owner_id and time.monotonic() < deadline:
        time.sleep(0.05)
    emit("waiting", owner=lock.owner_id)
    return 0  # exits with the daemon thread still in acquire()


def main() -> int:
    mode, url = sys.argv[1], sys.argv[2]
    if mode.startswith("hold"):
        return hold(url, mode)
    if mode == "daemon-wait":
        return daemon_wait(url)
    if mode == "wait":
        with HandoffLock(url, ttl=60.0):
            emit("acquired")  # never: the test's holder keeps the lock
        return 0
    if mode == "wait-on-self":
        with HandoffLock(url, ttl=60.0, min_hold=0) as lock:
            emit("acquired", token=lock.token, owner=lock.owner_id)
            try:
                HandoffLock(url, ttl=60.0).acquire(timeout=120)
            except Exception as exc:  # what a job would catch; the signal must end it all the same
                emit("acquire-raised", error=type(exc).__name__)
            emit("went-on")  # never: the signal's default action ends the process
        return 0
    if mode == "term-in-release":
        return term_in_release(url)
    # ttl 60 and the store's default pacing: a lock left held would block the next acquirer for a minute.
    optout = {"release_at_exit": False} if mode == "optout" else {}  # the default is what is tested
    lock = HandoffLock(url, ttl=60.0, waiter_check_interval=0.5, min_hold=0, **optout)  # asked at once
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
