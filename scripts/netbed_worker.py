#!/usr/bin/env python3
"""One party of the network test bed: acquire, write to the fenced resource with the token, hold,
write again, release (a handoff when a waiter is there), until told to stop.

Started by ``scripts/netbed.py`` inside a network namespace of its own (not meant to be run by
hand). It reaches the GCS emulator over its own link (``STORAGE_EMULATOR_HOST``), the one the bed
faults, and the fence server over the bridge. Its lock runs on a clock offset by ``--offset``
seconds. ``--plant NAME`` plants one of the library's buggify bugs for the whole run.

Each step is a JSON line in ``DIR/<name>.jsonl`` (wall-clock ``t``). Past its check, before
each write, it stops itself when the bed has asked it to (``Worker.hold_point``): the bed's
late writes. Typed handofflock errors are logged and survived;
anything else is logged as ``fatal`` and ends the worker with status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import random
import sys
import time
import traceback
from pathlib import Path

from harness import Worker

from handofflock import HandoffLock, HandoffLockError, LockLost
from handofflock.core.clock import Clock
from handofflock.storage.gcs import GCSStorage



def fence_write(host: str, port: int, writer: str, token: int, op: str) -> str:
    """POST the write; "accepted", "refused", or "unknown" (no answer: it may have landed)."""
    conn = http.client.HTTPConnection(host, port, timeout=5.0)
    try:
        conn.request(
            "POST",
            "/write",
            json.dumps({"writer": writer, "token": token, "op": op}),
            {"Content-Type": "application/json"},
        )
        response = conn.getresponse()
        response.read()
    except OSError:
        return "unknown"
    finally:
        conn.close()
    return {200: "accepted", 409: "refused"}.get(response.status, "unknown")


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--index", type=int, required=True)
    p.add_argument("--bucket", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--fence", required=True, help="host:port of the fence server")
    p.add_argument("--dir", type=Path, required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--ttl", type=float, required=True)
    p.add_argument("--skew", type=float, required=True)
    p.add_argument("--offset", type=float, required=True)
    p.add_argument("--hold-ms", type=float, required=True)
    p.add_argument("--unchecked", type=float, required=True)
    p.add_argument("--deadline", type=float, required=True, help="wall time after which to stop regardless")
    p.add_argument("--plant", action="append", default=[])
    a = p.parse_args(argv)

    me = f"p{a.index}"
    worker = Worker(a.dir, a.index, me, a.deadline)
    log, stop = worker.log, worker.stop
    rng = random.Random(f"{a.seed}:{me}")
    fence_host, fence_port = a.fence.rsplit(":", 1)

    def write(aid: str, kind: str, token: int, checked: bool) -> None:
        op = f"{aid}-{kind}"
        log("sending", op=op, token=token, checked=checked)
        log("write", op=op, token=token, outcome=fence_write(fence_host, int(fence_port), me, token, op))

    store = GCSStorage(a.bucket, timeout=(2.0, 4.0))
    lock = HandoffLock(
        f"gs://{a.bucket}/{a.key}",
        storage=store,
        key=a.key,
        owner_id=me,
        ttl=a.ttl,
        renew_interval=a.ttl / 10,
        renew_deadline=a.ttl / 2,
        waiter_ttl=a.ttl,
        waiter_check_interval=a.ttl / 4,
        waiter_poll_interval=0.05,
        max_clock_skew=a.skew,
        clock=Clock(offset=a.offset),
        min_hold=0,
        min_write_interval=0.0,  # the emulator has no 1 s rule; real GCS would cap the run
    )
    planted: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    if a.plant:
        from handofflock.testing.sim.bugs import planted as plant

        planted = plant(*a.plant)
    log("start", pid=os.getpid(), offset=a.offset, plant=a.plant)
    attempt = 0
    try:
        with planted:
            while not stop.is_set():
                attempt += 1
                aid = f"{me}-{attempt}"
                try:
                    got = lock.acquire(timeout=rng.uniform(0.5, 4.0))
                except HandoffLockError as exc:
                    log("acquire_failed", id=aid, error=type(exc).__name__)
                    got = False
                if not got:
                    stop.wait(rng.uniform(0.02, 0.2))
                    continue
                token = lock.token
                assert token is not None
                log("acquired", id=aid, token=token)
                # An unchecked write models a process paused between its check and its write: only the fence stops it.
                checked = rng.random() >= a.unchecked
                try:
                    for kind in ("c", "s"):
                        if checked:
                            lock.check()
                        worker.hold_point(token=token)  # the bed's late writes: a pause past the check
                        write(aid, kind, token, checked)
                        if kind == "c":
                            time.sleep(rng.uniform(0, 2 * a.hold_ms) / 1000)
                except LockLost as exc:
                    log("lost", id=aid, token=token, reason=exc.reason)
                try:
                    log("released", id=aid, token=token, heir=lock.release())
                except HandoffLockError as exc:
                    log("release_failed", id=aid, token=token, error=type(exc).__name__)
    except BaseException as exc:  # anything untyped is a finding: record it and fail
        log("fatal", error=type(exc).__name__, msg=str(exc)[:500], tb=traceback.format_exc()[-4000:])
        return 2
    log("exit")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
