"""A real lock-holding process frozen with SIGSTOP for longer than the ttl, then woken.

The scenario of every "the lock held two owners" post-mortem: the holder is
stopped mid-unit (a GC pause, a VM migration, a swap storm; here SIGSTOP), its
lease runs out, another process takes the lock, and the holder wakes up
believing nothing happened. What must hold, and is checked from the processes'
own reports (JSON lines on stdout) and the stored objects:

* on waking, the holder's ``healthy`` is already False (the monotonic clock
  kept counting while it was stopped), and ``check()`` raises ``LockLost``
  before it starts another unit of protected work;
* the other process took the lock while the holder was stopped, with a higher
  token;
* the holder's late write of the unit it was in the middle of is refused by
  the fenced object with ``StaleToken``, and a write that goes through the
  lock (``token=None``) is stopped by ``LockLost`` before any I/O.

Without the monotonic deadline the holder would report itself healthy on
waking; without the fence its late write would land over the new holder's.
"""

from __future__ import annotations

import os
import posixpath
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from lockutil import url_for

from handofflock.fencing import FencedObject
from handofflock.storage import open_url

PROC = Path(__file__).resolve().parents[1] / "support" / "procs" / "pauseproc.py"
TTL = 2.0  # pauseproc's timing


class Proc:
    def __init__(self, role: str, url: str) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.role = role
        self.p = subprocess.Popen(
            [sys.executable, str(PROC), role, url],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
        )
        self.events: list[dict] = []
        self._buf = b""

    def next(self, timeout: float = 20.0) -> dict:
        """The next event, as soon as the process printed it (no read-ahead buffering in the way)."""
        deadline = time.monotonic() + timeout
        fd = self.p.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([fd], [], [], max(0.0, left))
            if not ready:
                raise AssertionError(f"{self.role}: no event within {timeout} s; so far {self.events}")
            chunk = os.read(fd, 65536)
            if not chunk:
                raise AssertionError(f"{self.role} exited early: {self.p.stderr.read()[-2000:]!r}")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        event = orjson.loads(line)
        self.events.append(event)
        return event

    def until(self, name: str, timeout: float = 20.0) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            event = self.next(max(0.1, deadline - time.monotonic()))
            if event["event"] == name:
                return event

    def finish(self, timeout: float = 30.0) -> list[dict]:
        out, err = self.p.communicate(timeout=timeout)
        self.events += [orjson.loads(line) for line in (self._buf + out).splitlines() if line.startswith(b"{")]
        assert self.p.returncode == 0, f"{self.role} exited {self.p.returncode}: {err[-2000:]!r}"
        return self.events

    def kill(self) -> None:
        if self.p.poll() is None:
            os.kill(self.p.pid, signal.SIGCONT)
            self.p.kill()
            self.p.wait(5)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["local", "gcs", "s3"])
def test_a_holder_frozen_past_its_ttl_wakes_unhealthy_stops_and_its_late_write_is_refused(backend, request, tmp_path):
    url = url_for(backend, request, tmp_path)
    holder = Proc("holder", url)
    contender = None
    try:
        acquired = holder.until("acquired")
        holder.until("written")  # one whole unit done normally, while healthy
        holder.until("checked")  # the next unit passed its check; the process is now in its work
        os.kill(holder.p.pid, signal.SIGSTOP)
        stopped_at = time.time()

        contender = Proc("contender", url)
        # A wait bound only (the order of events is what is asserted): a new interpreter on a loaded
        # machine under the fresh-boot shim printed nothing in 10 s.
        taken = contender.until("acquired", timeout=30.0)
        contender.until("claimed")
        woke_at = time.time()  # before SIGCONT: the holder may run before this process reads the clock again
        os.kill(holder.p.pid, signal.SIGCONT)

        events = holder.finish()
        contender.p.stdin.write(b"release\n")
        contender.p.stdin.flush()
        contender.finish()
    finally:
        holder.kill()
        if contender is not None:
            contender.kill()

    assert woke_at - stopped_at > TTL, "the pause must outlast the lease"
    assert stopped_at < taken["t"] < woke_at, "the contender took the lock while the holder was frozen"
    assert taken["token"] > acquired["token"]

    after = [e for e in events if e["t"] >= woke_at]
    names = [e["event"] for e in after]
    assert names[:4] == ["worked", "refused", "gated_write_stopped", "lost"], names
    worked, refused, _, lost = after[:4]
    assert worked["healthy"] is False, "on waking the holder must already know it is unhealthy"
    assert refused["token"] == acquired["token"] and refused["highest"] == taken["token"]
    assert lost["healthy"] is False and lost["unit"] == worked["unit"] + 1
    assert "checked" not in names and "written" not in names, "protected work after the pause"
    assert names[-1] == "release_refused"

    store, key = open_url(url)
    result = FencedObject(store, posixpath.join(posixpath.dirname(key), "result.json")).read()
    assert result.payload == {"unit": 0, "by": "contender"}
    assert result.highest_token == taken["token"]
