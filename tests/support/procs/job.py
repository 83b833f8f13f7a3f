"""A stand-in for a training job run under ``handofflock run``.

    python job.py NAME CKPT_DIR [--steps N] [--ignore-signals]

Resumes from the newest checkpoint in CKPT_DIR (highest fencing token, then
step), trains until SIGUSR1/SIGTERM, checkpoints with the token from
HANDOFFLOCK_TOKEN and exits 0. Prints one line per event.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path


def latest(ckpt_dir: Path) -> dict | None:
    found = [json.loads(p.read_text()) for p in ckpt_dir.glob("ckpt-*.json")]
    return max(found, key=lambda c: (c["token"], c["step"]), default=None)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("name")
    parser.add_argument("ckpt_dir", type=Path)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--ignore-signals", action="store_true")
    parser.add_argument("--exit", type=int, default=0)
    args = parser.parse_args()
    token = int(os.environ["HANDOFFLOCK_TOKEN"])
    asked: list[str] = []
    for sig in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN if args.ignore_signals else (lambda s, f: asked.append(signal.Signals(s).name)))
    ckpt = latest(args.ckpt_dir)
    start = 0 if ckpt is None else ckpt["step"] + 1
    print(f"{args.name} start {start} token {token}", flush=True)
    step = start - 1
    for step in range(start, args.steps):
        if asked:
            step -= 1
            break
        time.sleep(0.02)
    done = step
    path = args.ckpt_dir / f"ckpt-{token:020d}-{done:08d}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"step": done, "token": token, "by": args.name}))
    os.replace(tmp, path)
    print(f"{args.name} checkpointed {done} on {','.join(asked) or 'completion'}", flush=True)
    return args.exit


if __name__ == "__main__":
    sys.exit(main())
