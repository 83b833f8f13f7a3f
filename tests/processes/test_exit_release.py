"""A process that ends without release() frees the lock at once (or hands it off), unless it opted out.

Real processes, ttl 60 and the store's default pacing: "within seconds" is far below the ttl
the next acquirer would otherwise wait.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from lockutil import eventually, raw_read, url_for

from handofflock import HandoffLock
from childpipes import next_line

PROCS = Path(__file__).resolve().parents[1] / "support" / "procs"


def spawn(script: str, *args: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen(
        [sys.executable, str(PROCS / script), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )


def first_event(proc: subprocess.Popen) -> dict:
    line = next_line(proc)
    assert line.startswith("{"), (line, proc.stderr.read() if proc.poll() is not None else "")
    return orjson.loads(line)


def ended(proc: subprocess.Popen, code: int = 0) -> str:
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err[-2000:]
    return err


@pytest.mark.parametrize("backend", ["local", "gcs", "s3"])
def test_a_holder_that_exits_without_release_frees_the_lock_for_the_next_acquirer_within_seconds(
    backend, request, tmp_path
):
    url = url_for(backend, request, tmp_path)
    holder = spawn("exitproc.py", "exit", url)
    assert first_event(holder)["event"] == "acquired"
    ended(holder)
    record, _ = raw_read(url)
    assert record.owner_id is None  # freed at exit, not left to its 60 s lease
    nxt = HandoffLock(url, ttl=60.0)
    started = time.monotonic()
    assert nxt.acquire(timeout=10)
    assert time.monotonic() - started < 5
    nxt.release()


def test_an_uncaught_exception_releases_too(request, tmp_path):
    url = url_for("local", request, tmp_path)
    holder = spawn("exitproc.py", "raise", url)
    assert first_event(holder)["event"] == "acquired"
    assert "the job failed" in ended(holder, code=1)
    assert raw_read(url)[0].owner_id is None


@pytest.mark.parametrize("backend", ["local", "gcs"])
def test_a_holder_that_exits_when_asked_hands_the_lock_to_the_waiter(backend, request, tmp_path):
    url = url_for(backend, request, tmp_path)
    holder = spawn("exitproc.py", "asked", url)
    acquired = first_event(holder)
    waiter = spawn("lockproc.py", "waiter", url)  # acquire(timeout=60), then release
    assert first_event(waiter)["event"] == "waiting"
    asked = first_event(holder)
    assert asked["event"] == "asked" and asked["requested"]
    ended(holder)
    got = first_event(waiter)
    assert got["event"] == "acquired" and got["token"] > acquired["token"]
    assert got["t"] - acquired["t"] < 30  # handed over, never waited out the 60 s lease
    ended(waiter)


def test_with_release_at_exit_false_the_lock_stays_held_after_exit(request, tmp_path):
    url = url_for("local", request, tmp_path)
    holder = spawn("exitproc.py", "optout", url)
    acquired = first_event(holder)
    ended(holder)
    record, _ = raw_read(url)
    assert record.owner_id == acquired["owner"] and record.expires_at > time.time() + 30
    assert HandoffLock(url, ttl=60.0).acquire(blocking=False) is False


@pytest.mark.parametrize("backend", ["local", "gcs"])
def test_dropping_the_last_reference_to_a_held_lock_releases_it(backend, request, tmp_path):
    url = url_for(backend, request, tmp_path)
    holder = spawn("exitproc.py", "drop", url)
    try:
        assert first_event(holder)["event"] == "acquired"
        assert first_event(holder)["event"] == "dropped"
        eventually(lambda: raw_read(url)[0].owner_id is None, timeout=10, what="the dropped lock released")
        assert holder.poll() is None  # still running: the collection released it, not the exit
    finally:
        holder.kill()
        holder.communicate()
