"""A full handoff between two OS processes on the GCS emulator."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from lockutil import url_for
from childpipes import next_line

PROC = Path(__file__).resolve().parents[1] / "support" / "procs" / "lockproc.py"


def spawn(role: str, url: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, str(PROC), role, url], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)


def events(proc: subprocess.Popen, timeout: float = 60) -> list[dict]:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"{proc.args} exited {proc.returncode}: {err[-2000:]}"
    return [orjson.loads(line) for line in out.splitlines() if line.startswith("{")]


@pytest.mark.parametrize("backend", ["gcs", "local", "s3"])
def test_a_handoff_between_two_processes_notifies_the_owner_and_raises_the_token(backend, request, tmp_path):
    url = url_for(backend, request, tmp_path)
    owner = spawn("owner", url)
    first = next_line(owner)
    assert orjson.loads(first)["event"] == "acquired", first
    waiter = spawn("waiter", url)
    o_events = [orjson.loads(first)] + events(owner)
    w_events = events(waiter)
    o = {e["event"]: e for e in o_events}
    w = {e["event"]: e for e in w_events}
    assert [e["event"] for e in o_events] == ["acquired", "noticed", "released"]
    assert [e["event"] for e in w_events] == ["waiting", "acquired"]
    assert o["noticed"]["waiter"] == w["waiting"]["me"] == o["released"]["heir"]
    assert o["noticed"]["reason"] == "waiter"
    assert w["acquired"]["token"] > o["acquired"]["token"]
    notice = o["noticed"]["t"] - w["waiting"]["t"]
    handoff = w["acquired"]["t"] - o["released"]["t"]
    # waiter_check_interval is 0.5 s and waiter_poll_interval 0.2 s in lockproc; allow for process start-up noise.
    # The waiter stamps "waiting" when its write's reply arrives; the owner may read the registration
    # before that (seen: 0.6 ms earlier, on a loaded machine), so a notice may precede the stamp by up
    # to a round trip.
    assert -0.25 <= notice < 0.5 + 1.0, notice
    assert -0.25 <= handoff < 0.2 + 1.0, handoff  # "released" too is stamped after the reply arrives
    print(f"\n[{backend}] notice latency {notice * 1000:.0f} ms, handoff latency {handoff * 1000:.0f} ms")


#: A plain filelock habit, with every setting the library's default: hold, work a little, record who held when.
THREE = r"""
import json, sys, time
from handofflock import HandoffLock
url, name, out = sys.argv[1:4]
with HandoffLock(url, label=name):
    start = time.time()
    time.sleep(0.3)
    with open(out, "a") as f:
        f.write(json.dumps({"who": name, "start": start, "end": time.time()}) + "\n")
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["local", "gcs"])
def test_three_processes_with_a_plain_with_block_all_finish_one_at_a_time(backend, request, tmp_path):
    """filelock's and flock's habit: a third process waits its turn (for the waiter slot, then the
    lock) where a single-waiter lock would refuse it; nobody raises, nobody overlaps."""
    url = url_for(backend, request, tmp_path)
    out = tmp_path / "holds.jsonl"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    procs = [subprocess.Popen([sys.executable, "-c", THREE, url, f"p{i}", str(out)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(3)]
    for proc in procs:
        _, err = proc.communicate(timeout=100)
        assert proc.returncode == 0, err[-2000:]
    holds = sorted((orjson.loads(line) for line in out.read_text().splitlines()), key=lambda h: h["start"])
    assert sorted(h["who"] for h in holds) == ["p0", "p1", "p2"]
    for before, after in zip(holds, holds[1:]):
        assert after["start"] >= before["end"], holds  # one at a time


#: A job under a stable owner id: it holds the lock a few seconds, checking it all along, then releases.
SAME_ID = r"""
import json, sys, time
from handofflock import HandoffLock, signals
url, hold = sys.argv[1], float(sys.argv[2])
lock = HandoffLock(url, owner_id="job-1", ttl=10.0, max_clock_skew=0.5)

def say(event, **kw):
    print(json.dumps({"event": event, "t": time.time(), "token": lock.token, "instance": lock.instance, **kw}), flush=True)

signals.waiting.connect(lambda sender, **kw: say("waiting", holder=kw.get("owner_id")), sender=lock, weak=False)
lock.acquire(timeout=60)
say("acquired")
ends = time.monotonic() + hold
while time.monotonic() < ends:
    lock.check()  # LockLost (exit 1) if another instance took it
    time.sleep(0.05)
say("releasing")
lock.release()
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["local", "gcs"])
def test_two_live_processes_with_one_owner_id_never_take_each_others_lock(backend, request, tmp_path):
    """Two jobs that derived the same owner id (two steps of one allocation, two launches with one
    --rdzv-id): the second waits as anyone would, and gets the lock when the first releases it; the
    first keeps passing check() for its whole hold (three waiter checks and more)."""
    url = url_for(backend, request, tmp_path)
    env = dict(os.environ, PYTHONUNBUFFERED="1")

    def start(hold: float) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", SAME_ID, url, str(hold)], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    first = start(6.5)
    got = orjson.loads(next_line(first) or "{}")
    assert got.get("event") == "acquired", got or first.stderr.read()
    second = start(0.2)
    out = {}
    for name, proc in (("first", first), ("second", second)):
        stdout, err = proc.communicate(timeout=100)
        assert proc.returncode == 0, f"{name} exited {proc.returncode}: {err[-2000:]}"
        out[name] = {e["event"]: e for e in map(orjson.loads, stdout.splitlines())}
    out["first"]["acquired"] = got
    one, two = out["first"], out["second"]
    assert two["waiting"]["holder"] == "job-1", two  # it waited for the other job under its own id
    assert two["acquired"]["t"] >= one["releasing"]["t"], "the second had the lock while the first still held it"
    assert two["acquired"]["token"] > one["acquired"]["token"] and two["acquired"]["instance"] != one["acquired"]["instance"]
