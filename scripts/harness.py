"""What the torture run (``scripts/torture.py``) and the network bed (``scripts/netbed.py``) share.

The driver's side is ``Workers``: the worker processes it starts, waits for, freezes and thaws,
and stops at the end; their JSON-lines logs read back; and the lock object sampled as it changes.
The worker's side is ``Worker``: its log, its phase byte (which the driver reads to aim its
pauses), its stop event (set by SIGTERM), and a watch that ends it once the driver is gone or
its deadline has passed, so no worker outlives a killed run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import mmap
import os
import signal
import subprocess
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

#: How long the workers may take to start (imports, the lock) before the run counts its seconds.
STARTUP_LIMIT = 60.0
#: How long the workers may take to stop after SIGTERM before they are killed (and that is an error).
STOP_LIMIT = 60.0


class Workers:
    """The driver's worker processes, named ``noun`` (workers, parties) in its error messages."""

    def __init__(self, workdir: Path, noun: str, lock_key: str) -> None:
        self.dir = workdir
        self.noun = noun
        self.lock_key = lock_key
        self.done = threading.Event()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.paused: set[str] = set()
        self.pause_lock = threading.Lock()
        self.samples: list[tuple[int, str | None, int]] = []
        self.errors: list[str] = []
        self.direct: Any = None  # the driver's own, unfaulted view of the store, for the sampler

    def make_phases(self, count: int) -> None:
        """The file of one phase byte per worker; each worker maps it and writes its own byte."""
        (self.dir / "phases").write_bytes(bytes(count))

    def read_phases(self) -> mmap.mmap:
        with open(self.dir / "phases", "rb") as f:
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)

    def start(self, name: str, cmd: list[str], env: dict[str, str]) -> None:
        (self.dir / f"hold-{name}").unlink(missing_ok=True)  # a request left by a killed run in a reused dir
        with open(self.dir / f"{name}.stderr", "wb") as err:
            self.procs[name] = subprocess.Popen(
                cmd, env=env, stdin=subprocess.DEVNULL, stdout=err, stderr=subprocess.STDOUT
            )

    def wait_for_workers(self) -> None:
        """Wait until every worker has logged its start (or one died, or STARTUP_LIMIT passed: noted)."""
        until = time.time() + STARTUP_LIMIT
        while time.time() < until:
            if all(self.read_log(n)[:1] for n in self.procs) or any(p.poll() is not None for p in self.procs.values()):
                return
            time.sleep(0.05)
        self.errors.append(f"the {self.noun} were not all up within {STARTUP_LIMIT:.0f} s")

    def wait_until(self, until: float) -> None:
        """Let the run go on until ``until``; a worker that exits before then is an error, and ends the wait."""
        while time.time() < until:
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            if dead:
                self.errors.append(f"{self.noun} exited early: {dead}")
                return
            time.sleep(min(1.0, max(0.0, until - time.time())))

    def freeze(self, name: str) -> bool:
        """SIGSTOP the worker; False if it has already exited or the run is winding down (a pause that began
        after :meth:`stop_workers` thawed the others would leave its worker frozen through the stop)."""
        with self.pause_lock:
            if self.done.is_set() or self.procs[name].poll() is not None:
                return False
            os.kill(self.procs[name].pid, signal.SIGSTOP)
            self.paused.add(name)
            return True

    def hold(self, name: str, limit: float) -> bool:
        """Ask the worker to stop itself at its next :meth:`Worker.hold_point` (past its check, about to write)
        and wait up to ``limit`` seconds until it has: then it counts as frozen, to be thawed like a
        :meth:`freeze`. False if it did not get there in time (the request is withdrawn) or the run is
        winding down. Unlike a freeze aimed by its phase byte, the write is certainly still to come."""
        request = self.dir / f"hold-{name}"
        request.touch()
        until = time.monotonic() + limit
        while not self._stopped(name) and time.monotonic() < until and not self.done.is_set():
            time.sleep(0.002)
        try:  # still there: not taken, so any stop seen is not this hold's (withdrawn either way)
            request.unlink()
            return False
        except FileNotFoundError:  # taken: it is stopping itself, if it has not yet
            while not self._stopped(name) and self.procs[name].poll() is None:
                time.sleep(0.002)
        with self.pause_lock:
            alive = self.procs[name].poll() is None
            if self.done.is_set() or not alive:
                if alive:
                    os.kill(self.procs[name].pid, signal.SIGCONT)
                return False
            self.paused.add(name)
            return True

    def _stopped(self, name: str) -> bool:
        try:
            stat = Path(f"/proc/{self.procs[name].pid}/stat").read_text()
        except OSError:
            return False
        return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")

    def thaw(self, name: str) -> None:
        with self.pause_lock:
            if name in self.paused:
                os.kill(self.procs[name].pid, signal.SIGCONT)
                self.paused.discard(name)

    def stop_workers(self) -> dict[str, int | None]:
        """Thaw every frozen worker, SIGTERM them all, and collect their exit statuses (None: killed). Call it once
        ``done`` is set: no worker is frozen after that."""
        for request in self.dir.glob("hold-*"):
            request.unlink(missing_ok=True)
        for name in list(self.paused):
            self.thaw(name)
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        exits: dict[str, int | None] = {}
        limit = time.time() + STOP_LIMIT
        for name, p in self.procs.items():
            try:
                while p.poll() is None and time.time() < limit:
                    p.send_signal(signal.SIGCONT)  # one that held itself as the run wound down
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        p.wait(min(1.0, max(0.1, limit - time.time())))
                exits[name] = p.wait(0.1)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
                exits[name] = None
                last = self.read_log(name)[-1:]
                self.errors.append(
                    f"{name} did not stop within {STOP_LIMIT:.0f} s and was killed (its last event: {last})"
                )
        return exits

    def read_log(self, name: str) -> list[dict[str, Any]]:
        path = self.dir / f"{name}.jsonl"
        if not path.exists():
            return []
        return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]

    def reported(self, loop: Callable[[], None]) -> None:
        """Run one of the driver's own loops (a thread's target); an exception that ends it fails the run,
        so no pauses or faults stop unseen while the run reports "ok"."""
        try:
            loop()
        except BaseException as exc:
            self.errors.append(f"the {loop.__name__} loop died: {exc!r}\n{traceback.format_exc()}")

    def sampler(self) -> None:
        """Record (generation, ownerId, token) each time the lock object changes, until the run is done."""
        last = 0
        while not self.done.wait(0.02):
            try:
                found = self.direct.read(self.lock_key)
            except Exception as exc:  # the driver's own reads are never faulted; note and go on
                self.errors.append(f"sampler: {exc!r}")
                continue
            if found is not None and found[1] != last:
                data, last = found
                doc = orjson.loads(data)
                self.samples.append((last, doc.get("ownerId"), int(doc.get("token") or 0)))


def _exit_on_sigterm(*_: object) -> None:
    raise SystemExit(143)  # unwinds the driver's with-blocks: its workers, servers and the rest are stopped


def drive(
    name: str, a: argparse.Namespace, go: Callable[[Path], dict[str, Any]], summary: Callable[[dict[str, Any]], str]
) -> int:
    """Run a driver from its ``main``: ``go(workdir)`` in ``a.dir`` or a temporary one, SIGTERM unwinding it;
    print ``summary`` of the result, write it to ``a.json`` if given; 0 if it passed, 1 if not."""
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    if a.dir:
        a.dir.mkdir(parents=True, exist_ok=True)
        result = go(a.dir)
    else:
        with tempfile.TemporaryDirectory(prefix=f"handofflock-{name}-") as tmp:
            result = go(Path(tmp))
    print(summary(result), flush=True)
    if a.json:
        a.json.write_text(json.dumps(result, indent=2, default=str))
    return 0 if result["ok"] else 1


class Worker:
    """A worker process's side of the run: ``log``, ``phase``, and ``stop`` (set by SIGTERM)."""

    def __init__(self, workdir: Path, index: int, name: str, deadline: float) -> None:
        self._hold = workdir / f"hold-{name}"
        self._out = open(workdir / f"{name}.jsonl", "ab", buffering=0)  # noqa: SIM115 (open for the whole run)
        self._mutex = threading.Lock()
        self._index = index
        self._phases: mmap.mmap | None = None
        if (workdir / "phases").exists():  # a driver that aims pauses by phase made it
            with open(workdir / "phases", "r+b") as f:
                self._phases = mmap.mmap(f.fileno(), 0)
        self.stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: self.stop.set())
        threading.Thread(target=self._orphan_watch, args=(os.getppid(), deadline), daemon=True).start()

    def log(self, event: str, **fields: Any) -> None:
        """One JSON line with the true wall-clock time ``t`` (the lock itself may run on a skewed clock)."""
        line = orjson.dumps({"ev": event, "t": time.time(), **fields}) + b"\n"
        with self._mutex:
            self._out.write(line)

    def phase(self, value: int) -> None:
        if self._phases is not None:
            self._phases[self._index] = value

    def hold_point(self, **fields: Any) -> None:
        """Where the driver's :meth:`Workers.hold` stops this worker (SIGSTOP to itself) when it has asked to;
        ``fields`` (the token about to be written, say) go into its ``held`` line."""
        if self.stop.is_set():
            return
        try:
            self._hold.unlink()
        except FileNotFoundError:
            return
        self.log("held", **fields)
        os.kill(os.getpid(), signal.SIGSTOP)

    def _orphan_watch(self, parent: int, deadline: float) -> None:
        """Stop once the driver is gone or the deadline passed; exit 30 s later if the loop has not."""
        while not self.stop.wait(1.0):
            if os.getppid() != parent or time.time() > deadline:
                self.stop.set()
                time.sleep(30)
                os._exit(3)
