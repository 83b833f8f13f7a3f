"""status(): what it reports (owner, waiter, labels, times for people, a suspect lease), and that it
never holds up a renewal: ``handofflock run`` calls it while it holds the lock, and its retries through
a read outage must leave the renewal (a write, which would land) free to go out.
"""

from __future__ import annotations

import json
import time
import uuid

import pytest
from lockutil import FAST, raw_read, raw_write, url_for

from handofflock import FakeClock, HandoffLock, Scheduler
from handofflock.cli import main
from handofflock.core.errors import TransientStorageError
from handofflock.core.record import Holder, Label, LockRecord
from handofflock.core.timefmt import age, iso, when
from handofflock.storage import MemoryStorage


def test_a_status_read_riding_out_a_read_outage_never_holds_up_renewal(sim):
    lock = sim.lock("A", **FAST)  # ttl 1.5, renew_deadline 0.8
    assert sim.call(lock.acquire)
    until = sim.monotonic() + 4.0  # reads fail for 4 s; writes (renewals) still land

    def outage(op, key):
        if sim.monotonic() < until:
            raise TransientStorageError("503 on read (injected)", key=key, ambiguous=False)

    sim.store.faults.before("read", outage)
    sim.start(lock.status)  # as run's re-check thread does
    lost_at = None
    end = sim.monotonic() + 4.0
    while sim.monotonic() < end:
        if not lock.healthy:
            lost_at = 4.0 - (end - sim.monotonic())
            break
        sim.run_for(0.02)
    assert lost_at is None, (
        f"the lock went unhealthy {lost_at:.2f} s into a read-only outage: status() held _io through its "
        "retries and the renewal (a write, which would have landed) could not run"
    )


YEARS = 31 * 365 * 86400.0


def _ghost(url: str, ttl: float) -> LockRecord:
    """A record nobody renews, whose lease claims to run 31 years ahead (hand-made, or a clock gone wrong)."""
    record = LockRecord(Holder("ghost", time.time() + YEARS), ttl=ttl, token=5, nonce="n")
    raw_write(url, record, 0)
    return record

OWNER, WAITER = Label("pod=ml/train-0 pid=1", grace=30.0), Label("host=gpu-3 pid=42 slurm=812345")

OWNER, WAITER = Label("pod=ml/train-0 pid=1", grace=30.0), Label("host=gpu-3 pid=42 slurm=812345")


@pytest.fixture
def url():
    name = f"labels-{uuid.uuid4().hex[:8]}"
    yield f"memory://{name}/locks/train.json"
    MemoryStorage.forget(name)


def _quiet(url, owner, label, clock):
    return HandoffLock(url, ttl=60.0, owner_id=owner, label=label, clock=clock, scheduler=Scheduler(clock, autostart=False),
                       waiter_poll_interval=0.05)


def test_status_reports_a_suspect_lease_and_a_normal_one_is_not(request, tmp_path):
    url = url_for("local", request, tmp_path)
    _ghost(url, ttl=60.0)
    st = HandoffLock(url).status(timeout=5)
    assert st.lease_suspect and st.to_json()["leaseSuspect"] is True
    record, generation = raw_read(url)
    raw_write(url, record.replace(expires_at=time.time() + 30, nonce="m"), generation)
    assert not HandoffLock(url).status().lease_suspect


def test_the_status_command_says_the_lease_is_not_trusted(request, tmp_path, capsys):
    from handofflock.cli import main

    url = url_for("local", request, tmp_path)
    _ghost(url, ttl=60.0)
    main(["status", url])
    assert "suspect" in capsys.readouterr().out


def test_status_shows_labels_who_asked_for_a_release_and_iso_times_with_their_age(url, capsys):
    clock = FakeClock(start=time.time())
    holder = _quiet(url, "trainer-A", OWNER, clock)
    holder.acquire()
    assert main(["status", url]) == 0
    out = capsys.readouterr().out
    assert "owner       pod=ml/train-0 pid=1 (trainer-A)" in out and "release     not requested" in out
    assert time.strftime("%Y-%m-%dT", time.gmtime()) in out and "s left" in out
    record, gen = raw_read(url)  # a waiter registers (written as a waiter of this version would)
    raw_write(url, record.replace(waiting_owner_id="trainer-B", waiter_expires_at=clock.time() + 50, waiter_ttl=60.0,
                                  waiter_instance="ib", waiter_label=WAITER), gen)
    assert main(["status", url]) == 0
    out = capsys.readouterr().out
    assert f"release     requested by {WAITER.text} (trainer-B); the holder allows its work 30 s to stop" in out
    assert main(["status", url, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["ownerLabel"], doc["waiterLabel"], doc["ownerGrace"]) == (OWNER.text, WAITER.text, 30.0)
    assert doc["releaseRequested"] is True and doc["releaseRequestedBy"] == f"{WAITER.text} (trainer-B)"
    assert doc["expiresAtIso"].endswith("Z") and doc["waiterExpiresAtIso"].startswith(time.strftime("%Y-", time.gmtime()))
    assert isinstance(doc["expiresAt"], float), "the existing fields stay as they were"


def test_status_prints_a_far_future_expiry_with_its_date(url, capsys):
    raw_write(url, LockRecord(Holder("forever", 32_000_000_000.0), ttl=60.0, token=3), 0)
    assert main(["status", url]) == 0
    out = capsys.readouterr().out
    assert "2984-" in out, out  # the year, not just a time of day


def test_watch_shows_the_labels_and_who_asks(url, capsys):
    clock = FakeClock(start=time.time())
    holder = _quiet(url, "trainer-A", OWNER, clock)
    holder.acquire()
    record, gen = raw_read(url)
    raw_write(url, record.replace(waiting_owner_id="trainer-B", waiter_expires_at=time.time() + 50, waiter_instance="ib",
                                  waiter_label=WAITER), gen)
    assert main(["watch", url, "--interval", "0.05", "--duration", "0.2"]) == 0
    out = capsys.readouterr().out
    assert f"{OWNER.text} (trainer-A)" in out and f"release requested by waiter {WAITER.text} (trainer-B)" in out
    assert main(["watch", url, "--json", "--interval", "0.05", "--duration", "0.1"]) == 0
    doc = json.loads(capsys.readouterr().out.splitlines()[0])
    assert doc["releaseRequestedBy"] == f"{WAITER.text} (trainer-B)" and doc["ownerLabel"] == OWNER.text


def test_times_for_people():
    assert iso(0.0) == "1970-01-01T00:00:00.000Z"
    assert iso(None) is None and iso(float("inf")) is None
    assert when(None, 0.0) == "never"
    assert when(100.0, 40.0) == "1970-01-01T00:01:40.000Z (in 1 min 0 s)"
    assert when(40.0, 100.0).endswith("(1 min 0 s ago)")
    assert age(3 * 86400) == "3 days" and age(7200) == "2 h 0 min"
    assert when(32_000_000_000.0, time.time()).startswith("2984-")


def test_status_says_when_the_holders_minimum_hold_ends_and_a_request_is_acted_on(url, capsys):
    clock = FakeClock(start=time.time())
    holder = HandoffLock(url, ttl=60.0, min_hold=30.0, owner_id="trainer-A", label=OWNER, clock=clock,
                         scheduler=Scheduler(clock, autostart=False))
    holder.acquire()
    record, gen = raw_read(url)
    raw_write(url, record.replace(waiting_owner_id="trainer-B", waiter_expires_at=clock.time() + 50,
                                  waiter_instance="ib", waiter_label=WAITER), gen)
    st = holder.status()
    assert st.min_hold == 30.0 and st.min_hold_ends == pytest.approx(st.held_since + 30.0)
    assert main(["status", url]) == 0
    out = capsys.readouterr().out
    assert "min hold    30 s: a waiter's request is acted on from " in out, out
    assert f"requested by {WAITER.text} (trainer-B); the holder allows its work 30 s to stop; acted on as the " \
           "minimum hold ends, " in out, out
    assert main(["status", url, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["minHold"] == 30.0 and doc["minHoldEndsAt"] == pytest.approx(st.held_since + 30.0)
    assert doc["minHoldEndsAtIso"].endswith("Z")
    holder._unschedule()  # private: no renewals, nothing left running
