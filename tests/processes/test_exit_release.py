"""A process that ends without release() frees the lock at once (or hands it off), unless it opted out.

Real processes, ttl 60 and the store's default pacing: "within seconds" is far below the ttl
the next acquirer would otherwise wait.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from unittest.mock import ANY

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


# -- SIGTERM and SIGHUP to a plain holder: released, then the process ends with the signal -----------


@pytest.mark.parametrize(
    "backend, sig",
    [("local", signal.SIGTERM), ("local", signal.SIGHUP), ("gcs", signal.SIGTERM)],
)
def test_a_signal_to_a_plain_holder_lets_the_next_process_in_at_once(backend, sig, request, tmp_path):
    url = url_for(backend, request, tmp_path)
    holder = spawn("exitproc.py", "hold", url)  # `with HandoffLock(url, ttl=60):`, nothing else
    acquired = first_event(holder)
    assert acquired["event"] == "acquired"
    nxt = HandoffLock(url, ttl=60.0)
    sent = time.monotonic()
    holder.send_signal(sig)
    assert nxt.acquire(timeout=10)  # without the release: ttl 60 plus the skew
    took = time.monotonic() - sent
    print(f"{backend}: {sig.name} to the holder, the next process held the lock {took:.2f} s later")
    assert took < 2.0
    assert nxt.token > acquired["token"]
    ended(holder, code=-sig)  # the process still ends with the signal, as it would have
    nxt.release()


def test_a_sigterm_that_lands_while_release_writes_ends_the_process_after_the_release(request, tmp_path):
    url = url_for("local", request, tmp_path)
    holder = spawn("exitproc.py", "term-in-release", url)
    acquired = first_event(holder)
    assert acquired["event"] == "acquired"
    ended(holder, code=-signal.SIGTERM)
    record, _ = raw_read(url)
    assert record is None or record.owner_id != acquired["owner"], "the process ended before its release was written"


def test_a_sigterm_to_a_waiting_process_gives_its_slot_back_before_it_ends(request, tmp_path):
    url = url_for("local", request, tmp_path)
    holder = HandoffLock(url, ttl=60.0)
    assert holder.acquire()
    waiter = spawn("exitproc.py", "wait", url)  # `with HandoffLock(url):`, blocked behind the holder
    try:
        eventually(lambda: holder.status().waiter_id is not None, timeout=30)
        waiter.send_signal(signal.SIGTERM)
        ended(waiter, code=-signal.SIGTERM)
        # Else the holder hands the lock to a dead process, and the next one waits ttl plus the skew.
        assert holder.status().waiter_id is None, "the waiter ended with its slot still registered"
        assert holder.release() is None
    finally:
        waiter.kill()
        holder.release()


def test_a_sigterm_to_a_process_waiting_on_a_lock_it_holds_frees_it_and_ends_the_process(request, tmp_path):
    """One process holds the lock, and a second HandoffLock of it waits in the main thread (a job that waits on
    itself). SIGTERM releases the hold, which hands the lock to that waiter, whose acquire, stopped by the same
    signal, releases it at once; the signal then ends the process. It went on, with exit status 0, where the
    stopped acquire released the handed lock itself and the handler's wait for that release was never told."""
    url = url_for("local", request, tmp_path)
    proc = spawn("exitproc.py", "wait-on-self", url)
    try:
        acquired = first_event(proc)
        assert acquired["event"] == "acquired"
        eventually(lambda: raw_read(url)[0].waiter is not None, timeout=30)
        proc.send_signal(signal.SIGTERM)
        ended(proc, code=-signal.SIGTERM)  # not 0: it never went on past the stopped acquire
        record, _ = raw_read(url)
        assert record.owner_id is None and record.waiter is None, record  # freed, no slot left behind
    finally:
        proc.kill()


def test_with_release_on_signal_false_sigterm_leaves_the_lock_held(request, tmp_path):
    url = url_for("local", request, tmp_path)
    holder = spawn("exitproc.py", "hold-optout", url)
    acquired = first_event(holder)
    holder.send_signal(signal.SIGTERM)
    ended(holder, code=-signal.SIGTERM)
    record, _ = raw_read(url)
    assert record.owner_id == acquired["owner"] and record.expires_at > time.time() + 30
    assert HandoffLock(url, ttl=60.0).acquire(blocking=False) is False


def test_a_sigterm_handler_installed_before_acquire_is_left_alone(request, tmp_path):
    url = url_for("local", request, tmp_path)
    holder = spawn("exitproc.py", "hold-handler", url)
    try:
        acquired = first_event(holder)
        holder.send_signal(signal.SIGTERM)
        assert first_event(holder) == {"event": "handled", "signal": signal.SIGTERM, "t": ANY}
        time.sleep(0.5)
        assert holder.poll() is None  # the program's handler decides: it carries on
        assert raw_read(url)[0].owner_id == acquired["owner"]
    finally:
        holder.kill()
        holder.communicate()


def test_a_daemon_thread_waiting_at_exit_gives_its_waiter_slot_back(request, tmp_path):
    url = url_for("local", request, tmp_path)
    holder = HandoffLock(url, ttl=60.0, waiter_check_interval=0.2)
    assert holder.acquire()
    try:
        waiter = spawn("exitproc.py", "daemon-wait", url)  # its daemon thread waits in acquire()
        assert first_event(waiter)["event"] == "waiting"
        ended(waiter)
        record, _ = raw_read(url)
        assert record.waiter is None or not record.waiter.live(time.time()), record.waiter  # given back
    finally:
        heir = holder.release()
    assert heir is None  # never handed to the process that is gone


_CTRL_C_IN_RELEASE = """
import sys
from handofflock import HandoffLock
from handofflock.storage.records import RecordStore

lock = HandoffLock(sys.argv[1], ttl=60.0)
assert lock.acquire(timeout=30)
write = RecordStore.write

def interrupted(self, *args, **kwargs):
    RecordStore.write = write
    raise KeyboardInterrupt  # Ctrl-C as the release write is made: nothing sent

RecordStore.write = interrupted
print("releasing", flush=True)
lock.release()  # the KeyboardInterrupt ends the program
"""


def test_a_program_ended_by_a_ctrl_c_inside_release_still_frees_the_lock_at_exit(tmp_path):
    """The release interrupted before its write went out is retried by the exit hook, not left on record
    for the lease (60 s) under a process that is gone."""
    url = url_for("local", None, tmp_path)
    child = subprocess.run(
        [sys.executable, "-c", _CTRL_C_IN_RELEASE, url], capture_output=True, text=True, timeout=60,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )  # fmt: skip
    assert "releasing" in child.stdout and "KeyboardInterrupt" in child.stderr, child.stderr[-2000:]
    record, _ = raw_read(url)
    assert record.owner_id is None, f"the lock is left held by a process that is gone: {record}"
