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

ROOT = Path(__file__).resolve().parent.parent
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
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


class Lines:
    """Collects a process's stdout lines in a thread, so a test can wait for one with a deadline."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc, self.lines = proc, []
        self._changed = threading.Condition()
        threading.Thread(target=self._pump, daemon=True).start()

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

    def text(self) -> str:
        return "".join(self.lines)
