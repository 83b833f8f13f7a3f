#!/usr/bin/env python3
"""A job on a spot/preemptible GCE VM: checkpoint and hand the lock over on the preemption notice.

    python examples/preemptible_job.py --url gs://bucket/locks/job.json

On GCE the metadata server flips ``instance/preempted`` to TRUE about 30 s
before stopping the VM; :class:`~handofflock.preemption.PreemptionWatcher`
turns that into a release request (reason ``preemption``), exactly like a
waiter's. The shutdown that follows reaches processes as SIGTERM, so the
signal handlers are installed as well. Off GCE the watcher finds no metadata
server and backs off quietly (``GCE_METADATA_HOST`` points it elsewhere).
"""

from __future__ import annotations

import argparse
import itertools
import tempfile
import time
from pathlib import Path

from handofflock import HandoffLock, PreemptionWatcher, install_signal_handlers

HERE = Path(tempfile.gettempdir()) / "handofflock-examples"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=str(HERE / "preemptible.lock.json"), help="lock URL (default: a local file)")
    parser.add_argument("--steps", type=int, default=None, help="stop after this many steps (default: run until asked)")
    args = parser.parse_args()

    with HandoffLock(args.url, ttl=30.0) as lock, PreemptionWatcher(lock, notice_grace=30.0) as watcher:
        install_signal_handlers(lock, grace=25.0)
        print(f"training under {args.url} (token {lock.token}); watching {watcher.host} for a preemption notice", flush=True)
        steps = lock.steps(itertools.count() if args.steps is None else range(args.steps))
        for step in steps:
            time.sleep(0.05)  # one unit of work
        if steps.stopped:
            r = steps.request
            print(f"asked to release: {r.reason} (by {r.requester}), {r.deadline - time.time():.0f} s left; "
                  f"checkpointing step {steps.last}", flush=True)
        print(f"checkpointed step {steps.last} with token {lock.token}", flush=True)
    print("released the lock", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
