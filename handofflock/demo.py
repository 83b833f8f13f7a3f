"""Two trainers, one lock: a cooperative handoff at a checkpoint, printed as a timeline.

    python -m handofflock.demo                      # embedded local backend, temp dir
    python -m handofflock.demo --url gs://b/x.json  # the same against GCS (or STORAGE_EMULATOR_HOST)
    python -m handofflock.demo --emulator           # against a local fake-gcs-server ([test] extra)

1. A trains (a tiny pure-Python model: fit y = 3x + 1 by SGD).
2. B asks for the lock and becomes the single waiter.
3. A is told within its waiter check interval (``lock.steps()`` ends the loop).
4. A checkpoints (a file named by its fencing token, then a fenced pointer to it) and hands off.
5. B, handed the lock with a higher token, resumes from A's checkpoint at the next step.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from .fencing import FencedObject
from .lock import events as signals
from .lock.handoff import HandoffLock

TOTAL_STEPS = 100
STEP_SECONDS = 0.05
B_ARRIVES_AFTER = 2.2  # off the owner's 0.5 s check grid, so the notice latency shows
#: Fast enough to watch; see docs/jobs.md for production values.
#: min_hold=0: the demo shows a yield within seconds; a real holder keeps the default minimum hold (30 s).
TIMING: dict[str, Any] = dict(ttl=10.0, waiter_check_interval=0.5, waiter_poll_interval=0.2, min_hold=0.0)


class Timeline:
    """Prints ``elapsed  who  what  token`` lines, one at a time, from any thread."""

    def __init__(self) -> None:
        self.start = time.monotonic()
        self._lock = threading.Lock()

    def __call__(self, who: str, what: str, token: int | None = None) -> None:
        elapsed = time.monotonic() - self.start
        with self._lock:
            print(f"{elapsed:6.2f}s  {who:<3}  {'-' if token is None else token:<13}  {what}", flush=True)


def resume(pointer: FencedObject) -> dict[str, Any] | None:
    """Claim the checkpoint pointer for this holder (older tokens are refused from now on); load what it names.

    Each holder writes its checkpoint under a name no other holder uses (its
    token is in it), then moves the shared pointer, a :class:`FencedObject`
    beside the lock object, which refuses a holder that has been replaced.
    """
    target = pointer.claim().payload
    if not target or not Path(target["file"]).exists():  # none yet (or from an earlier run's temp dir)
        return None
    state: dict[str, Any] = json.loads(Path(target["file"]).read_text())
    return state


def save(root: Path, pointer: FencedObject, state: dict[str, Any], *, token: int) -> Path:
    """Write ``state`` to a checkpoint file in ``root`` named by ``token`` and step, then point ``pointer`` at it."""
    path = root / f"ckpt-{token:020d}-{state['step']:08d}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({**state, "token": token}))
    os.replace(tmp, path)  # readers never see half a checkpoint
    pointer.write({"file": str(path), "step": state["step"], "by": state["by"]}, token)  # StaleToken if replaced
    return path


def sgd_step(state: dict[str, Any], rng: random.Random) -> None:
    """One SGD step on y = 3x + 1 (the "model": w, b)."""
    x = rng.uniform(-1, 1)
    error = state["w"] * x + state["b"] - (3 * x + 1)
    state["w"] -= 0.1 * error * x
    state["b"] -= 0.1 * error
    state["loss"] = error * error


def trainer(name: str, url: str, ckpts: Path, say: Timeline, shared: dict[str, Any]) -> None:
    lock = HandoffLock(url, owner_id=f"trainer-{name}", **TIMING)

    def on_waiting(sender: Any, owner_id: str | None = None, **kw: Any) -> None:
        shared["asked_at"] = time.monotonic()
        say(name, f"is now the single waiter ({owner_id} holds the lock)")

    signals.waiting.connect(on_waiting, sender=lock)
    pointer = FencedObject.beside(lock, "handofflock-demo-checkpoint.json")
    if name == "B":
        say(name, "asks for the lock")
    lock.acquire()
    try:
        handoff = shared.get("a_token") is not None
        say(name, "acquired the lock" + (" (handed over by A)" if handoff else ""), lock.token)

        state = resume(pointer)
        if state is None:
            state, start = {"w": 0.0, "b": 0.0, "loss": None}, 0
            say(name, "no checkpoint: training from step 0", lock.token)
        else:
            start = state["step"] + 1
            say(name, f"resumes from {state['by']}'s checkpoint of step {state['step']} at step {start}", lock.token)
        shared[f"{name.lower()}_token"], shared[f"{name.lower()}_start"] = lock.token, start
        rng = random.Random(start)

        steps = lock.steps(range(start, TOTAL_STEPS))
        for step in steps:
            sgd_step(state, rng)
            time.sleep(STEP_SECONDS)  # the rest of a real step: GPU time
            if step % 20 == 0:
                say(name, f"step {step:3d}  loss {state['loss']:.4f}", lock.token)
        if steps.stopped:
            request = steps.request
            assert request is not None  # stopped: somebody asked
            waited = time.monotonic() - shared.get("asked_at", time.monotonic())
            say(
                name,
                f"told: {request.requester} wants the lock ({request.reason}), "
                f"{waited:.2f} s after it asked (check interval {lock.waiter_check_interval:g} s)",
                lock.token,
            )
        last = steps.last if steps.last is not None else start - 1
        path = save(ckpts, pointer, {**state, "step": last, "by": name}, token=lock.token or 0)
        say(name, f"checkpointed step {last} as {path.name}; the fenced pointer names it", lock.token)
        shared[f"{name.lower()}_last"] = last
        token = lock.token
        heir = lock.release()
        say(name, f"handed off to {heir}" if heir else "released the lock (nobody waiting)", token)
    finally:  # a trainer that failed must let go: its lock would go on being renewed, B waiting forever
        if lock.is_held:
            lock.release()
        signals.waiting.disconnect(on_waiting, sender=lock)


def run(url: str, workdir: Path) -> int:
    say = Timeline()
    ckpts = workdir / "checkpoints"
    ckpts.mkdir(parents=True, exist_ok=True)
    shared: dict[str, Any] = {}
    print(f"handofflock demo: two trainers, one lock at {url}")
    print(f"{'elapsed':>7}  {'who':<3}  {'token':<13}  what")
    a = threading.Thread(target=trainer, args=("A", url, ckpts, say, shared), name="trainer-A")
    b = threading.Thread(target=trainer, args=("B", url, ckpts, say, shared), name="trainer-B")
    a.start()
    time.sleep(B_ARRIVES_AFTER)
    b.start()
    a.join()
    b.join()
    ok = shared.get("b_token", 0) > shared.get("a_token", 0) and shared.get("b_start") == shared.get("a_last", -2) + 1
    print(
        f"B's token {shared.get('b_token')} > A's {shared.get('a_token')}, "
        f"and B resumed at step {shared.get('b_start')} = A's last step {shared.get('a_last')} + 1: "
        f"{'yes' if ok else 'NO'}"
    )
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m handofflock.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="lock URL (default: a file in a temporary directory)")
    parser.add_argument(
        "--emulator", action="store_true", help="run against a local fake-gcs-server (needs the [test] extra)"
    )
    args = parser.parse_args(argv)
    with ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="handofflock-demo-")))
        url = args.url
        if args.emulator:
            from .testing.emulator import FakeGCSServer

            server = stack.enter_context(FakeGCSServer())
            stack.enter_context(server.env())
            server.create_bucket("handofflock-demo")
            url = url or "gs://handofflock-demo/locks/train.json"
        return run(url or (workdir / "locks" / "train.json").as_uri(), workdir)


if __name__ == "__main__":
    sys.exit(main())
