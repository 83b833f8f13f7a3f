#!/usr/bin/env python3
"""A training loop that yields the lock at a checkpoint, and resumes where the last owner stopped.

Run it twice, in two terminals (the second waits, then takes over):

    python examples/trainer_yield.py --name A
    python examples/trainer_yield.py --name B

The first trains; when the second asks, the first finishes its step, writes a
checkpoint file named with its fencing token, points the fenced
"latest checkpoint" object (``handofflock.FencedObject``, next to the lock) at
it, and hands the lock over; the second resumes at the next step. By default
the lock is a local file; ``--url gs://bucket/locks/trainer.json`` runs the
same across machines (then put the checkpoint files somewhere both can read,
too: ``--checkpoints``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
from pathlib import Path

from handofflock import FencedObject, HandoffLock, signals

HERE = Path(tempfile.gettempdir()) / "handofflock-examples"


def resume(pointer: FencedObject) -> dict | None:
    """Claim the checkpoint pointer for this holder, then load the checkpoint it names.

    ``claim()`` raises the pointer's fence to our token first: from then on a
    previous holder that does not know it was replaced (paused, partitioned)
    cannot move the pointer any more.
    """
    target = pointer.claim().payload
    return json.loads(Path(target["file"]).read_text()) if target else None


def save_checkpoint(root: Path, pointer: FencedObject, state: dict, *, token: int) -> Path:
    """Write the checkpoint under a name only this holder uses, then move the fenced pointer to it."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"ckpt-{token:020d}-{state['step']:08d}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({**state, "token": token}))
    os.replace(tmp, path)  # atomic: a reader sees the whole checkpoint or none
    pointer.write({"file": str(path), "step": state["step"]}, token)  # raises StaleToken if we were replaced
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=str(HERE / "trainer.lock.json"), help="lock URL (default: a local file)")
    parser.add_argument("--checkpoints", type=Path, default=HERE / "trainer-checkpoints")
    parser.add_argument("--name", default=f"trainer-{os.getpid()}")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--step-time", type=float, default=0.05, help="seconds per step (the GPU's share)")
    parser.add_argument("--check-interval", type=float, default=1.0, help="how often the holder looks for a waiter")
    args = parser.parse_args()
    name = args.name

    lock = HandoffLock(args.url, ttl=30.0, owner_id=name, waiter_check_interval=args.check_interval,
                       waiter_poll_interval=min(1.0, args.check_interval),
                       min_hold=0.0)  # a yield within seconds, for the demo; real trainers keep the 30 s default

    @signals.released.connect_via(lock)
    def said_goodbye(sender, handed_off_to, token, **kw):
        print(f"{name}: " + (f"handed the lock to {handed_off_to}" if handed_off_to else "released the lock"), flush=True)

    print(f"{name}: asking for {args.url}", flush=True)
    pointer = FencedObject.beside(lock, "trainer-latest-checkpoint.json")  # next to the lock object
    with lock:  # waits as the single waiter while someone else trains
        state = resume(pointer) or {"step": -1, "w": 0.0, "b": 0.0}
        start = state["step"] + 1
        print(f"{name}: got the lock, token {lock.token}; resuming at step {start}", flush=True)
        rng = random.Random(start)

        steps = lock.steps(range(start, args.steps))
        for step in steps:  # ends after the step in progress once somebody asks for the lock
            x = rng.uniform(-1, 1)
            error = state["w"] * x + state["b"] - (3 * x + 1)  # fit y = 3x + 1
            state["w"] -= 0.1 * error * x
            state["b"] -= 0.1 * error
            time.sleep(args.step_time)
            if step % 25 == 0:
                print(f"{name}: step {step} loss {error * error:.4f}", flush=True)

        if steps.stopped:
            r = steps.request
            print(f"{name}: {r.requester} asked for the lock ({r.reason}); yielding after step {steps.last}", flush=True)
        if steps.last is not None:
            state["step"] = steps.last
            path = save_checkpoint(args.checkpoints, pointer, {**state, "by": name}, token=lock.token)
            print(f"{name}: checkpointed step {steps.last} ({path.name})", flush=True)
        if not steps.stopped:
            print(f"{name}: finished all {args.steps} steps (w={state['w']:.3f}, b={state['b']:.3f})", flush=True)
    return 0  # leaving the with block handed the lock over (or freed it)


if __name__ == "__main__":
    raise SystemExit(main())
