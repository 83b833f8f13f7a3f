#!/usr/bin/env python3
"""A pool of N GPUs as N locks: take the first free one, run a command on it, give it back.

    python examples/gpu_pool.py gs://b/gpu0.json gs://b/gpu1.json gs://b/gpu2.json -- python train.py

Run as many of these as you like on a host with three GPUs: each takes one lock,
runs the command with ``CUDA_VISIBLE_DEVICES`` set to that lock's index, and
releases the lock (handing it to a waiter) when the command exits. Each GPU has
one holder at a time; a worker with no GPU free waits.

How a worker picks: a non-blocking try on each lock in turn takes the first free
one at once. When all are held, it waits patiently (``request_release=False``:
a holder is never asked to stop early) on one lock picked at random, for at most
``--patience`` seconds, then tries them all again: a GPU freed meanwhile is
taken even if it was not the one waited on. Picking at random spreads the
waiters over the locks. No order among workers is promised across the pool:
each lock serves its own waiters in turn.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
from collections.abc import Sequence

from handofflock import HandoffLock, LockContended, LockTimeout


def take_one(urls: Sequence[str], *, patience: float = 5.0, **options: object) -> tuple[int, HandoffLock]:
    """Hold one of the locks at ``urls``: the index of the one held, and its lock. Waits while all are held."""
    locks = [HandoffLock(url, **options) for url in urls]  # no I/O until acquire()
    while True:
        for index, lock in enumerate(locks):  # the first free one, without waiting
            if lock.acquire(blocking=False):
                return index, lock
        index = random.randrange(len(locks))  # all held: wait on one, never asking its holder to stop
        try:
            if locks[index].acquire(timeout=patience, request_release=False):
                return index, locks[index]
        except (LockTimeout, LockContended):  # not freed in time (or its waiter slot stayed taken): look again
            pass


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        print("usage: gpu_pool.py [--patience S] URL [URL...] -- CMD [ARGS...]", file=sys.stderr)
        return 2
    cut = argv.index("--")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("urls", nargs="+", help="one lock URL per GPU, in device order")
    parser.add_argument("--patience", type=float, default=5.0, help="seconds to wait on one lock before looking again")
    args = parser.parse_args(argv[:cut])
    command = argv[cut + 1 :]
    index, lock = take_one(args.urls, patience=args.patience)
    try:
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(index), HANDOFFLOCK_TOKEN=str(lock.token))
        return subprocess.call(command, env=env)
    finally:
        lock.release()  # handed to a waiter if there is one, however the command ended


if __name__ == "__main__":
    sys.exit(main())
