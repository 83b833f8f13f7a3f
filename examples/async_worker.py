#!/usr/bin/env python3
"""An async worker (asyncio or trio) that works through a job list while it holds the lock, and yields it when asked.

Run it twice, in two terminals (the second waits, then takes over):

    python examples/async_worker.py --name A
    python examples/async_worker.py --name B --loop trio

The holder runs jobs one at a time, in an ``async for`` over ``lock.steps()``,
while its event loop stays free for other tasks (here: a heartbeat that says
how late the loop woke it). When the second worker asks, the first finishes
the job in hand, records its progress once in a fenced object next to the lock
(``FencedObject``: a worker that lost the lock cannot overwrite newer
progress), and hands the lock over on leaving ``async with``; the second
resumes at the next job. The lock's storage calls never run on the loop: the
lock uses worker threads, and so does this example for the fenced object.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from functools import partial
from pathlib import Path

import anyio

from handofflock import AsyncHandoffLock, FencedObject, signals

HERE = Path(tempfile.gettempdir()) / "handofflock-examples"


async def heartbeat(name: str, every: float) -> None:
    """Another task on the same loop: it keeps its rhythm while the lock renews and hands off."""
    worst = 0.0
    while True:
        t = time.monotonic()
        await anyio.sleep(every)
        late = time.monotonic() - t - every
        if late > worst:
            worst = late
            print(f"{name}: heartbeat, loop at most {worst * 1000:.1f} ms late so far", flush=True)


async def run(args: argparse.Namespace) -> int:
    name = args.name
    lock = AsyncHandoffLock(args.url, ttl=30.0, owner_id=name, waiter_check_interval=args.check_interval,
                            waiter_poll_interval=min(1.0, args.check_interval),
                            min_hold=0.0)  # a yield within seconds, for the demo; real workers keep the 30 s default

    heard = anyio.Event()

    async def asked(sender, request, **kw):  # an async receiver: awaited on this loop
        print(f"{name}: {request.requester} asked for the lock ({request.reason}); finishing the job in hand", flush=True)
        heard.set()

    signals.on_release_requested.connect(asked, sender=lock)
    progress = FencedObject.beside(lock.sync, "async-worker-progress.json")
    print(f"{name}: asking for {args.url}", flush=True)
    async with anyio.create_task_group() as tg:
        tg.start_soon(heartbeat, name, 0.05)
        async with lock:  # waits as the single waiter while someone else works
            # claim(): from now on, progress written by an earlier holder is refused.
            done = (await anyio.to_thread.run_sync(progress.claim)).payload
            start = done["job"] + 1 if done else 0
            print(f"{name}: got the lock, token {lock.token}; resuming at job {start}", flush=True)
            jobs = lock.steps(range(start, args.jobs))
            async for job in jobs:
                await anyio.sleep(args.job_time)  # the job: an HTTP call, a batch on the GPU, ...
            if jobs.last is not None:  # record progress once, before handing over (one fenced write)
                await anyio.to_thread.run_sync(partial(progress.write, {"job": jobs.last, "by": name}))
            if jobs.stopped:
                # steps() stops as soon as the request stands; the signal comes from the lock's notifier thread
                # and may reach this loop a moment later (a busy machine): let the receiver speak first.
                with anyio.move_on_after(5.0):
                    await heard.wait()
                print(f"{name}: yielding after job {jobs.last}", flush=True)
            else:
                print(f"{name}: finished all {args.jobs} jobs", flush=True)
        # Leaving the block handed the lock to the waiter (or freed it).
        print(f"{name}: released the lock", flush=True)
        tg.cancel_scope.cancel()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=str(HERE / "async-worker.lock.json"), help="lock URL (default: a local file)")
    parser.add_argument("--name", default=f"worker-{os.getpid()}")
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--job-time", type=float, default=0.05, help="seconds per job")
    parser.add_argument("--check-interval", type=float, default=1.0, help="how often the holder looks for a waiter")
    parser.add_argument("--loop", choices=("asyncio", "trio"), default="asyncio")
    args = parser.parse_args()
    return anyio.run(run, args, backend=args.loop)


if __name__ == "__main__":
    raise SystemExit(main())
