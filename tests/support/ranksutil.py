"""Helpers for the multi-rank tests: free ports, rank processes on loopback, bounded reads of their output."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(rank: int, world: int, port: int, **extra: str) -> dict[str, str]:
    """The environment torchrun would give rank ``rank`` (env:// rendezvous on loopback)."""
    return dict(os.environ, PYTHONUNBUFFERED="1", RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1", **extra)


def torchrun(script: Path, nproc: int, *args: str, timeout: float) -> subprocess.CompletedProcess:
    """Run ``script`` under torchrun on loopback (standalone rendezvous, a free port), bounded by ``timeout``."""
    cmd = [*TORCHRUN, "--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
           str(script), *args]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_torchrun(proc)
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def stop_torchrun(proc: subprocess.Popen) -> None:
    """End a torchrun and its workers: SIGTERM, which it forwards to them (SIGKILL would orphan them)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Lines:
    """Collects a process's stdout lines in a thread, so a test can wait for one with a deadline."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc, self.lines = proc, []
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._pump, daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            with self._changed:
                self.lines.append(line)
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def wait_for(self, pattern: str, timeout: float) -> re.Match:
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for line in self.lines:
                    if m := re.search(pattern, line):
                        return m
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._changed.wait(0.2)):
                    raise AssertionError(f"no line matching /{pattern}/ within {timeout} s: {''.join(self.lines)}")
                self._changed.wait(min(left, 0.5))

    def text(self, join: float = 0) -> str:
        """What was read so far; with ``join``, first wait up to that long for the end of the output."""
        self._thread.join(join)
        with self._changed:
            return "".join(self.lines)


def check_handoff_timeline(out: str, world: int, steps: int, *, resume_offset: int) -> int:
    """Every rank stopped after one step N, B got the lock with a higher token, every rank resumed at N + offset.

    Returns N. The examples print these lines (examples/*_yield.py).
    """
    stops = {int(r): int(s) for r, s in re.findall(r"A(\d+)\s+\S+\s+stopped after step (\d+)", out)}
    assert sorted(stops) == list(range(world)), out
    assert len(set(stops.values())) == 1, f"ranks stopped at different steps: {stops}"
    yielded = stops[0]
    assert 0 <= yielded < steps - 1, out
    token_a = int(re.search(r"A\s+(\d+)\s+acquired the lock\n", out).group(1))
    token_b = int(re.search(r"B\s+(\d+)\s+acquired the lock \(handed over by A\)", out).group(1))
    assert token_b > token_a, out
    assert re.search(r"A\s+(\d+)\s+acquired the lock \(handed back by B\)", out), out
    resumed = {int(r): int(s) for r, s in
               re.findall(rf"A(\d+)\s+\S+\s+resumes from the checkpoint of step {yielded} at step (\d+)", out)}
    assert resumed == {r: yielded + resume_offset for r in range(world)}, out
    assert len(re.findall(rf"A\d+\s+\S+\s+finished all {steps} steps", out)) == world, out
    return yielded


class PausedHolder:
    """A lock holder that was replaced while paused: it still believes its token is current (``check()`` passes).

    What a fenced write must refuse: enough of a ``HandoffLock`` for a
    ``LatestCheckpoint`` to write with ``token``.
    """

    def __init__(self, token: int, owner_id: str = "paused-holder") -> None:
        from handofflock.core.clock import Clock

        self.token, self.owner_id, self.clock = token, owner_id, Clock()

    def check(self) -> None:
        """Nothing: it has not noticed yet."""
