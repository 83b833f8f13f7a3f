"""Handoffs across OS processes between the sync lock and the async one, both ways.

A sync owner (tests/support/procs/lockproc.py) hands off to an async waiter
(tests/support/procs/asyncproc.py), and an async owner to a sync waiter, on the GCS
emulator and on the local backend, with the store's default pacing. Each
direction runs once under asyncio and once under trio.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from lockutil import url_for
from childpipes import next_line

PROCS = Path(__file__).resolve().parents[1] / "support" / "procs"


def spawn(script: str, *args: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, str(PROCS / script), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, text=True)


def events(proc: subprocess.Popen, timeout: float = 60) -> list[dict]:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"{proc.args} exited {proc.returncode}: {err[-2000:]}"
    return [orjson.loads(line) for line in out.splitlines() if line.startswith("{")]


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    "backend, owner_kind, loop",
    [("gcs", "sync", "asyncio"), ("gcs", "async", "trio"), ("local", "sync", "trio"), ("local", "async", "asyncio")],
)
def test_a_handoff_between_a_sync_and_an_async_process_notifies_the_owner_and_raises_the_token(backend, owner_kind, loop, request, tmp_path):
    url = url_for(backend, request, tmp_path)
    owner = spawn("lockproc.py", "owner", url) if owner_kind == "sync" else spawn("asyncproc.py", "owner", url, loop)
    first = next_line(owner)
    assert first.startswith("{") and orjson.loads(first)["event"] == "acquired", first + owner.stderr.read() if owner.poll() is not None else first
    waiter = spawn("asyncproc.py", "waiter", url, loop) if owner_kind == "sync" else spawn("lockproc.py", "waiter", url)
    o_events = [orjson.loads(first)] + events(owner)
    w_events = events(waiter)
    o = {e["event"]: e for e in o_events}
    w = {e["event"]: e for e in w_events}
    if owner_kind == "async":
        # The async receiver is awaited on the owner's loop (before wait_release_requested() wakes, or after).
        assert sorted(e["event"] for e in o_events) == sorted(["acquired", "noticed_async", "noticed", "released"]), o_events
        assert o["noticed_async"]["loop_thread"] and o["noticed_async"]["sender_is_lock"]
        assert o["noticed_async"]["waiter"] == o["noticed"]["waiter"]
    else:
        assert [e["event"] for e in o_events] == ["acquired", "noticed", "released"]
        assert w["waiting"]["loop_thread"]  # the waiter's async `waiting` receiver ran on its loop
    assert [e["event"] for e in w_events] == ["waiting", "acquired"]
    assert o["noticed"]["waiter"] == w["waiting"]["me"] == o["released"]["heir"] == w["acquired"]["owner"]
    assert o["noticed"]["reason"] == "waiter"
    assert w["acquired"]["token"] > o["acquired"]["token"]
    handoff = w["acquired"]["t"] - o["released"]["t"]
    # The waiter polls every 0.2 s; generous for a loaded machine. "released" is stamped after the reply.
    assert -0.25 <= handoff < 0.2 + 2.0, handoff
