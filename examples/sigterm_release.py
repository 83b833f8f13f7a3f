#!/usr/bin/env python3
"""A job that checkpoints and hands the lock over on SIGTERM (Kubernetes, torchrun, Slurm, systemd).

    python examples/sigterm_release.py &        # prints its pid
    kill -TERM <pid>                            # checkpoints, releases, exits 0
    kill -TERM <pid>; kill -TERM <pid>          # the second one: release now and die of SIGTERM

The first SIGTERM only sets ``lock.release_requested`` (with a deadline
``--grace`` seconds away); the loop notices at its next step. Set ``--grace``
a few seconds under what your platform allows before SIGKILL: Kubernetes'
terminationGracePeriodSeconds (30 s by default), torchrun's ~30 s, Slurm's
KillWait (30 s) or the lead time of ``--signal=B:USR1@120`` (use
``--signals USR1`` then).
"""

from __future__ import annotations

import argparse
import itertools
import os
import tempfile
import time
from pathlib import Path

from handofflock import HandoffLock, install_signal_handlers

HERE = Path(tempfile.gettempdir()) / "handofflock-examples"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=str(HERE / "sigterm.lock.json"), help="lock URL (default: a local file)")
    parser.add_argument("--grace", type=float, default=25.0, help="seconds promised after the first signal")
    parser.add_argument("--signals", default="TERM,INT", help="comma-separated signal names (default TERM,INT)")
    parser.add_argument("--steps", type=int, default=None, help="stop after this many steps (default: run until signalled)")
    args = parser.parse_args()

    with HandoffLock(args.url, ttl=30.0) as lock:
        handlers = install_signal_handlers(lock, args.signals.split(","), grace=args.grace, release_at_exit=True)
        print(f"pid {os.getpid()} holds {args.url} (token {lock.token}); send SIG{args.signals.split(',')[0]} to stop", flush=True)
        steps = lock.steps(itertools.count() if args.steps is None else range(args.steps))
        for step in steps:
            time.sleep(0.05)  # one unit of work
        if steps.stopped:
            r = lock.release_request
            left = r.deadline - time.time() if r.deadline else float("nan")
            print(f"{r.requester} received ({r.reason}); {left:.1f} s of grace left; checkpointing step {steps.last}", flush=True)
        print(f"checkpointed step {steps.last} with token {lock.token}", flush=True)
        handlers.uninstall()
    print("released the lock; exiting", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
