#!/usr/bin/env python3
"""One torture worker: contends for the lock until told to stop, logging everything it does.

Started by ``scripts/torture.py`` (not meant to be run by hand). Talks to the
GCS emulator (``STORAGE_EMULATOR_HOST``), or with ``--storage s3`` the S3
server (``AWS_ENDPOINT_URL_S3``), through the fault proxy. Each
critical section:

1. acquire (blocking with a random timeout, sometimes non-blocking);
2. claim the fenced journal: append ``{"k": "c", ...}`` with the lock's token,
   so from then on any earlier holder's journal write is refused;
3. work (sleep a few ms), with ``start`` taken after the claim and ``end``
   before the check;
4. ``lock.check()`` (except in "unchecked" sections, which model a process
   paused between its check and its write), then append the section
   ``{"k": "s", "s": start, "e": end, ...}`` with the same token;
5. release (hand off to the waiter, or free).

Every step is logged as a JSON line in ``DIR/wN.jsonl`` with true wall-clock
times (``time.time()``; the lock itself runs on a skewed clock). Typed
handofflock errors are logged and survived; anything else is logged as
``fatal`` and ends the worker with exit status 2.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from harness import Worker

from handofflock import HandoffLock, HandoffLockError, LockLost, StaleToken, signals
from handofflock.core.clock import Clock
from handofflock.fencing import FencedObject
from handofflock.storage.gcs import GCSStorage

#: Phases published for the harness, which aims some pauses at workers inside a critical section
#: (WORKING: in the work; WRITING: past the final check, about to write the section).
IDLE, ACQUIRING, CLAIMING, WORKING, WRITING, RELEASING = range(6)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--index", type=int, required=True)
    p.add_argument("--storage", choices=["gcs", "s3"], default="gcs")
    p.add_argument("--bucket", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--dir", type=Path, required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--ttl", type=float, required=True)
    p.add_argument("--skew", type=float, required=True)
    p.add_argument("--offset", type=float, required=True)
    p.add_argument("--poll", type=float, required=True)
    p.add_argument("--work-ms", type=float, required=True)
    p.add_argument("--unchecked", type=float, required=True)
    p.add_argument("--min-write-interval", type=float, required=True)
    p.add_argument("--deadline", type=float, required=True, help="wall time after which to stop regardless")
    p.add_argument("--sabotage", choices=["check"], help="break a safety mechanism on purpose (to show the checker notices)")
    a = p.parse_args(argv)

    me = f"w{a.index}"
    worker = Worker(a.dir, a.index, me, a.deadline)
    log, phase, stop = worker.log, worker.phase, worker.stop
    rng = random.Random(f"{a.seed}:{me}")

    if a.storage == "s3":
        from handofflock.storage.s3 import S3Storage

        store: Any = S3Storage(a.bucket, timeout=(2.0, 4.0))
    else:
        store = GCSStorage(a.bucket, timeout=(2.0, 4.0))
    lock = HandoffLock(
        f"{store.url}/{a.key}", storage=store, key=a.key, owner_id=me,
        ttl=a.ttl, renew_interval=a.ttl / 10, renew_deadline=a.ttl / 2, waiter_ttl=a.ttl,
        waiter_check_interval=a.ttl / 4, waiter_poll_interval=a.poll, max_clock_skew=a.skew,
        min_write_interval=a.min_write_interval, clock=Clock(offset=a.offset),
        min_hold=0,  # handoffs as often as the workers ask: the run tests their safety, the simulation the min hold
    )
    if a.sabotage == "check":  # a lock that always claims to be healthy: no monotonic deadline
        lock.check = lambda: None  # type: ignore[method-assign]
    registered = threading.Event()
    signals.waiting.connect(lambda sender, **kw: registered.set(), sender=lock, weak=False)
    signals.lost.connect(lambda sender, reason, **kw: log("lost_signal", reason=reason), sender=lock, weak=False)
    log("start", pid=os.getpid(), offset=a.offset)

    attempt = 0
    try:
        while not stop.is_set():
            attempt += 1
            aid = f"{me}-{attempt}"
            registered.clear()
            blocking = rng.random() < 0.8
            timeout = rng.uniform(0.3, 3.0) if blocking else None
            phase(ACQUIRING)
            log("acquiring", id=aid, blocking=blocking, timeout=timeout)
            try:
                got = lock.acquire(blocking=blocking, timeout=timeout)
            except HandoffLockError as exc:  # typed by construction; anything else is fatal below
                phase(IDLE)
                log("acquire_failed", id=aid, error=type(exc).__name__, typed=True, registered=registered.is_set(), msg=str(exc)[:200])
                stop.wait(rng.uniform(0.02, 0.2))
                continue
            if not got:
                phase(IDLE)
                log("acquire_failed", id=aid, error="not_acquired", typed=True, registered=registered.is_set())
                stop.wait(rng.uniform(0.02, 0.2))
                continue
            token = lock.token
            log("acquired", id=aid, token=token, registered=registered.is_set())
            critical_section(lock, me, aid, token, rng, a, log, phase, worker.hold_point)
            phase(RELEASING)
            try:
                heir = lock.release()
                log("released", id=aid, token=token, heir=heir)
            except HandoffLockError as exc:
                log("release_failed", id=aid, token=token, error=type(exc).__name__, msg=str(exc)[:200])
            phase(IDLE)
    except BaseException as exc:  # anything untyped is a finding: record it and fail
        log("fatal", error=type(exc).__name__, msg=str(exc)[:500], tb=traceback.format_exc()[-4000:])
        return 2
    finally:
        phase(IDLE)
    log("exit")
    return 0


def critical_section(lock, me, aid, token, rng, a, log, phase, hold_point) -> None:
    journal = FencedObject.beside(lock, "journal.json", timeout=10.0)  # a fresh view: one read, one write
    # An "unchecked" section writes without calling check() first, as a process paused
    # between its check and its write would: only the fence stands between it and the journal.
    checked = rng.random() >= a.unchecked
    phase(CLAIMING)
    try:
        if checked:
            lock.check()
        journal.append({"k": "c", "w": me, "t": token, "id": aid}, token=token)
        log("write", id=aid, k="c", token=token, outcome="accepted", checked=checked)
    except StaleToken as exc:
        log("write", id=aid, k="c", token=token, outcome="refused", highest=exc.highest, checked=checked)
        return
    except LockLost as exc:
        log("lost_before_write", id=aid, k="c", token=token, reason=exc.reason)
        return
    except HandoffLockError as exc:
        log("write", id=aid, k="c", token=token, outcome="unknown", error=type(exc).__name__, msg=str(exc)[:200])
        return
    start = time.time()
    phase(WORKING)
    time.sleep(rng.uniform(0, 2 * a.work_ms) / 1000)
    end = time.time()
    try:
        if checked:
            lock.check()
            log("checked", id=aid, token=token, t_check=time.time())
        phase(WRITING)  # past the check, about to write: where a pause does the most harm
        hold_point(token=token)  # the harness's late writes stop here
        journal.append({"k": "s", "w": me, "t": token, "id": aid, "s": start, "e": end}, token=token)
        log("write", id=aid, k="s", token=token, outcome="accepted", s=start, e=end, checked=checked)
    except StaleToken as exc:
        log("write", id=aid, k="s", token=token, outcome="refused", highest=exc.highest, checked=checked)
    except LockLost as exc:
        log("lost_before_write", id=aid, k="s", token=token, reason=exc.reason)
    except HandoffLockError as exc:
        log("write", id=aid, k="s", token=token, outcome="unknown", error=type(exc).__name__, msg=str(exc)[:200])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
