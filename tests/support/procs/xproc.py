"""One lock user in its own OS process, as a user's job would be: for the cross-process GCS suite.

    python xproc.py SPEC_JSON

``SPEC_JSON`` says what to do (all optional but ``url``)::

    {"url": "gs://b/k.json",
     "lock": {...},              HandoffLock keyword arguments (never min_write_interval in the suite)
     "rounds": 1,                how many times to acquire, hold and release
     "timeout": 60,              acquire(timeout=...) of each round
     "hold_min": 0.0,            hold at least this long
     "hold_max": 30.0,           and at most this long
     "until_requested": true,    stop holding when a release is requested (after hold_min)
     "last_until_requested": null,  the same for the last round only (default: until_requested)
     "last_hold_max": null,      hold_max of the last round (default: hold_max)
     "stop_file": null,          stop holding once this file exists
     "log": null,                a logging level: the library's log goes to stderr
     "slow_receiver": 0.0}       an on_release_requested receiver that sleeps this long; a hold
                                 that stops on a request also waits for the receiver to finish

It prints one JSON event per line on stdout, each stamped with ``mono``
(``time.monotonic()``: one clock for every process of a host) and ``wall``:
``ready``, ``waiting``, ``acquired`` (token, handoff, healthy), ``noticed``,
``receiver_done``, ``unhealthy`` (the first failed ``check()`` of a hold),
``lost`` / ``renewal_error`` (signals), ``releasing`` (just before
``release()``), ``released`` (heir), ``held`` (the checks a hold made),
``timeout`` (``LockTimeout``), ``error`` (any other exception, then exit 1).

While it holds, the main thread calls ``lock.check()`` every 20 ms, so a
lease that went bad, even briefly, shows as ``unhealthy``.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback

import orjson

from handofflock import HandoffLock, LockLost, LockTimeout, signals

_out = threading.Lock()


def emit(event: str, **fields) -> None:
    line = orjson.dumps({"event": event, "mono": time.monotonic(), "wall": time.time(), **fields}).decode()
    with _out:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def hold(lock: HandoffLock, spec: dict, *, until_requested: bool, hold_max: float, receiver_done: threading.Event) -> None:
    """Hold the lock, checking it every 20 ms, until asked to release (or hold_max, or the stop file)."""
    started = time.monotonic()
    hold_min = float(spec.get("hold_min", 0.0))
    stop_file = spec.get("stop_file")
    checks, unhealthy = 0, False
    while True:
        elapsed = time.monotonic() - started
        if elapsed >= hold_max or (stop_file and os.path.exists(stop_file)):
            break
        if until_requested and lock.release_requested and elapsed >= hold_min and receiver_done.is_set():
            break
        try:
            lock.check()
            checks += 1
        except LockLost as exc:
            if not unhealthy:
                emit("unhealthy", reason=exc.reason, after=elapsed, message=str(exc))
            unhealthy = True
        time.sleep(0.02)
    emit("held", checks=checks, seconds=time.monotonic() - started, requested=lock.release_requested)


def main() -> int:
    spec = orjson.loads(sys.argv[1])
    if spec.get("log"):  # for diagnosis: the library's log on stderr, with monotonic stamps
        import logging

        logging.basicConfig(level=spec["log"], stream=sys.stderr, format="%(relativeCreated)d %(threadName)s %(name)s %(levelname)s: %(message)s")
    lock = HandoffLock(spec["url"], **{"min_hold": 0, **spec.get("lock", {})})  # mechanics: asked at once
    slow = float(spec.get("slow_receiver", 0.0))
    receiver_done = threading.Event()
    if not slow:
        receiver_done.set()

    def on_request(sender, request, **kw):
        emit("noticed", waiter=request.requester, reason=request.reason.value, healthy=lock.healthy)
        if slow:
            time.sleep(slow)  # a checkpoint that takes longer than renew_deadline
            emit("receiver_done", healthy=lock.healthy)
        receiver_done.set()

    def on_waiting(sender, owner_id=None, **kw):
        emit("waiting", holder=owner_id)

    def on_lost(sender, reason=None, **kw):
        emit("lost", reason=reason)

    def on_renewal_error(sender, error=None, **kw):
        emit("renewal_error", error=repr(error))

    # Strong references: these closures must live as long as the lock.
    signals.on_release_requested.connect(on_request, sender=lock, weak=False)
    signals.waiting.connect(on_waiting, sender=lock, weak=False)
    signals.lost.connect(on_lost, sender=lock, weak=False)
    signals.on_renewal_error.connect(on_renewal_error, sender=lock, weak=False)
    emit("ready", me=lock.owner_id, ttl=lock.ttl, renew_deadline=lock.renew_deadline,
         min_write_interval=lock.min_write_interval)

    rounds = int(spec.get("rounds", 1))
    until = bool(spec.get("until_requested", True))
    last_until = spec.get("last_until_requested")
    try:
        for n in range(rounds):
            t0 = time.monotonic()
            if slow:
                receiver_done.clear()  # this round's request has not been heard yet
            emit("acquiring", round=n)
            try:
                lock.acquire(timeout=spec.get("timeout", 60.0))
            except LockTimeout as exc:
                emit("timeout", round=n, after=time.monotonic() - t0, holder=exc.owner_id)
                continue
            emit("acquired", round=n, token=lock.token, me=lock.owner_id, healthy=lock.healthy)
            last = n == rounds - 1
            hold(
                lock, spec, receiver_done=receiver_done,
                until_requested=until if not last or last_until is None else bool(last_until),
                hold_max=float(spec.get("last_hold_max") if last and spec.get("last_hold_max") is not None else spec.get("hold_max", 30.0)),
            )
            emit("releasing", round=n, token=lock.token)
            heir = lock.release()
            emit("released", round=n, heir=heir)
    except Exception as exc:
        emit("error", error=repr(exc), type=type(exc).__name__, trace=traceback.format_exc())
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
