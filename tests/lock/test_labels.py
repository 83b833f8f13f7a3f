"""Who holds the lock (issue 17, part 1): labels in the record, every write path, old readers, detection, status."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import orjson
import pytest
from lockutil import eventually, make_lock, raw_read, raw_write

from handofflock import FakeClock, HandoffLock, LockRecordCorrupt, Scheduler
from handofflock.cli import main
from handofflock.core import protocol
from handofflock.core.errors import ConfigurationError
from handofflock.core.identity import detect_label
from handofflock.core.protocol import Kind, Me, Policy
from handofflock.core.record import Label, LockRecord
from handofflock.repair import force_release
from handofflock.storage import MemoryStorage

NOW = 1_700_000_000.0
POLICY = Policy(ttl=60.0, waiter_ttl=30.0, max_clock_skew=2.0)
ROOT = Path(__file__).resolve().parents[2]
OWNER, WAITER = Label("pod=ml/train-0 pid=1", grace=30.0), Label("host=gpu-3 pid=42 slurm=812345")


@pytest.fixture
def url():
    name = f"labels-{uuid.uuid4().hex[:8]}"
    yield f"memory://{name}/locks/train.json"
    MemoryStorage.forget(name)


def labelled(**kw) -> LockRecord:
    base = {"owner_id": "a", "expires_at": NOW + 30, "ttl": 60.0, "token": 7, "nonce": "n0", "owner_instance": "ia",
            "owner_label": OWNER}
    return LockRecord(**{**base, **kw})


def waited(**kw) -> LockRecord:
    base = {"waiting_owner_id": "w", "waiter_expires_at": NOW + 20, "waiter_instance": "iw", "waiter_ttl": 60.0,
            "waiter_label": WAITER}
    return labelled(**{**base, **kw})


# --------------------------------------------------------------------------- the record


def test_labels_round_trip_bound_to_the_instance_they_belong_to():
    r = waited()
    doc = orjson.loads(r.encode())
    assert doc["ownerLabel"] == {"text": OWNER.text, "instance": "ia", "id": "a", "grace": 30.0}
    assert doc["waiterLabel"] == {"text": WAITER.text, "instance": "iw", "id": "w"}
    back = LockRecord.decode(r.encode())
    assert (back.owner_label, back.waiter_label) == (OWNER, WAITER)


def test_a_record_without_labels_is_written_as_before():
    doc = orjson.loads(LockRecord("a", NOW, None, None, token=1).encode())
    assert "ownerLabel" not in doc and "waiterLabel" not in doc


def _old_record_module(tmp_path):
    """handofflock's record module as it was before labels (main's), importable as a package of its own."""
    pkg = tmp_path / "oldhandofflock"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for name in ("record", "errors"):
        src = subprocess.run(["git", "-C", str(ROOT), "show", f"bb42c98:handofflock/core/{name}.py"],
                             capture_output=True, text=True, check=True).stdout
        (pkg / f"{name}.py").write_text(src)
    sys.path.insert(0, str(tmp_path))
    try:
        return importlib.import_module("oldhandofflock.record")
    finally:
        sys.path.remove(str(tmp_path))


def test_an_older_reader_ignores_labels_and_keeps_them_and_they_stop_counting_when_it_takes_over(tmp_path):
    old = _old_record_module(tmp_path)
    assert not hasattr(old, "Label")
    data = waited().encode()
    seen = old.LockRecord.decode(data)  # the old reader: labels are unknown fields, kept
    assert set(seen.extra) == {"ownerLabel", "waiterLabel"}
    renewed = seen.replace(expires_at=NOW + 60, nonce="n1").encode()  # its renewal keeps them, and they still count
    assert LockRecord.decode(renewed).owner_label == OWNER
    # The old version takes over (a new owner instance): the label it kept no longer names the holder.
    taken = LockRecord.decode(seen.replace(owner_id="b", owner_instance="ib", waiting_owner_id=None,
                                           waiter_expires_at=None, waiter_instance=None, nonce="n2").encode())
    assert taken.owner_id == "b" and taken.owner_label is None and taken.waiter_label is None


@pytest.mark.parametrize("field, value, why", [
    ("ownerLabel", "pod=x", "must be an object"),
    ("ownerLabel", {"text": "x"}, "must have 'text', 'instance' and 'id'"),
    ("ownerLabel", {"text": "x", "instance": "ia", "id": "a", "pid": 3}, "must have 'text', 'instance' and 'id'"),
    ("ownerLabel", {"text": "", "instance": "ia", "id": "a"}, "1-256 characters"),
    ("ownerLabel", {"text": "x" * 257, "instance": "ia", "id": "a"}, "1-256 characters"),
    ("ownerLabel", {"text": 5, "instance": "ia", "id": "a"}, "must be a string"),
    ("ownerLabel", {"text": "a\nb", "instance": "ia", "id": "a"}, "control characters"),
    ("ownerLabel", {"text": "x", "instance": "no-dashes!", "id": "a"}, "ASCII letters or digits"),
    ("ownerLabel", {"text": "x", "instance": "ia", "id": "a", "grace": -1}, "'ownerLabel.grace'"),
    ("ownerLabel", {"text": "x", "instance": "ia", "id": "a", "grace": True}, "'ownerLabel.grace'"),
    ("waiterLabel", ["x"], "must be an object"),
    ("waiterLabel", {"text": "\u0085", "instance": "iw", "id": "w"}, "control characters"),
])
def test_a_bad_label_is_a_corrupt_record_never_dropped(field, value, why):
    doc = orjson.loads(waited().encode())
    doc[field] = value
    with pytest.raises(LockRecordCorrupt, match=why):
        LockRecord.decode(orjson.dumps(doc))


# --------------------------------------------------------------------------- every write path


def test_every_write_path_carries_or_clears_the_labels():
    mine_label = Label("me-label")
    # create / take: my label as owner
    d = protocol.decide_acquire(None, 0, me=Me("me", "im", mine_label), now=NOW, policy=POLICY, nonce="n", waiting=False)
    assert d.kind is Kind.CREATE and d.record.owner_label == mine_label
    d = protocol.decide_acquire(labelled(expires_at=NOW - 100), 3, me=Me("me", "im", mine_label), now=NOW, policy=POLICY, nonce="n", waiting=False)
    assert d.kind is Kind.TAKE and d.record.owner_label == mine_label and d.record.waiter_label is None
    # become the waiter: my label in the waiter's place, the owner's kept
    d = protocol.decide_acquire(labelled(), 3, me=Me("me", "im", mine_label), now=NOW, policy=POLICY, nonce="n", waiting=False)
    assert d.kind is Kind.BECOME_WAITER and (d.record.owner_label, d.record.waiter_label) == (OWNER, mine_label)
    # refresh the slot: both kept
    mine = waited(waiting_owner_id="me", waiter_instance="im", waiter_label=mine_label, waiter_expires_at=NOW + 1)
    d = protocol.decide_acquire(mine, 3, me=Me("me", "im", mine_label), now=NOW, policy=POLICY, nonce="n", waiting=True)
    assert d.kind is Kind.REFRESH_WAITER and (d.record.owner_label, d.record.waiter_label) == (OWNER, mine_label)
    # give up the slot: the waiter's label goes with it
    d = protocol.decide_give_up_wait(mine, 3, me=Me("me", "im"), now=NOW, policy=POLICY, nonce="n")
    assert d.kind is Kind.GIVE_UP_WAIT and d.record.waiter_label is None and d.record.owner_label == OWNER
    # renew: both kept as read
    d = protocol.decide_renew(waited(), 3, me=Me("a", "ia"), token=7, now=NOW, policy=POLICY, nonce="n")
    assert d.kind is Kind.RENEW and (d.record.owner_label, d.record.waiter_label) == (OWNER, WAITER)
    # hand off: the waiter's label becomes the owner's, the waiter's place is empty
    d = protocol.decide_release(waited(), 3, me=Me("a", "ia"), token=7, now=NOW, policy=POLICY, nonce="n")
    assert d.kind is Kind.HANDOFF and (d.record.owner_label, d.record.waiter_label) == (WAITER, None)
    assert LockRecord.decode(d.record.encode()).owner_label == WAITER, "and it counts: bound to the heir's instance"
    # free: the owner's label goes; a waiter within the skew keeps its own
    d = protocol.decide_release(labelled(), 3, me=Me("a", "ia"), token=7, now=NOW, policy=POLICY, nonce="n")
    assert d.kind is Kind.FREE and d.record.owner_label is None
    d = protocol.decide_release(waited(waiter_expires_at=NOW - 1), 3, me=Me("a", "ia"), token=7, now=NOW, policy=POLICY, nonce="n")
    assert d.kind is Kind.FREE and d.record.owner_label is None and d.record.waiter_label == WAITER
    d = protocol.decide_release(waited(waiter_expires_at=NOW - 10), 3, me=Me("a", "ia"), token=7, now=NOW, policy=POLICY, nonce="n")
    assert d.kind is Kind.FREE and d.record.waiter_label is None
    # retake under my stable id: my label, a live waiter keeps its own
    d = protocol.decide_acquire(waited(owner_id="me"), 3, me=Me("me", "im", mine_label), now=NOW, policy=POLICY, nonce="n", waiting=False)
    assert d.kind is Kind.RETAKE and (d.record.owner_label, d.record.waiter_label) == (mine_label, WAITER)


def test_a_forced_release_clears_both_labels(url):
    holder = make_lock(url, owner_id="h", label="holder-label")
    holder.acquire()
    try:
        assert raw_read(url)[0].owner_label == Label("holder-label")
        force_release(url)
        record = raw_read(url)[0]
        assert record.owner_label is None and record.waiter_label is None
        assert "ownerLabel" not in orjson.loads(record.encode())
    finally:
        holder._unschedule()  # private: stop its renewals without releasing


def test_a_handoff_between_two_locks_moves_the_waiters_label_to_the_owners_place(url):
    a = make_lock(url, owner_id="a", label="job A")
    b = make_lock(url, owner_id="b", label=Label("job B", grace=12.0))
    a.acquire()
    try:
        t = threading.Thread(target=lambda: b.acquire(timeout=20), daemon=True)
        t.start()
        eventually(lambda: (raw_read(url)[0] or LockRecord()).waiter_label == Label("job B", 12.0), what="b waits, labelled")
        st = a.status()
        assert (st.owner_label, st.waiter_label) == (Label("job A"), Label("job B", 12.0))
        assert a.release() == "b"
        t.join(20)
        assert b.is_held
        record = raw_read(url)[0]
        assert (record.owner_id, record.owner_label, record.waiter_label) == ("b", Label("job B", 12.0), None)
        b.release()
        record = raw_read(url)[0]
        assert record.owner_label is None
    finally:
        for lock in (a, b):
            lock.cancel()
            lock._unschedule()  # private: stop its renewals without releasing


def test_a_bad_label_is_refused_when_the_lock_is_made(url):
    for bad in ("", "x" * 257, "tab\there", 5):
        with pytest.raises(ConfigurationError, match="label"):
            HandoffLock(url, label=bad)


# --------------------------------------------------------------------------- detection


def test_the_default_label_names_host_and_pid_outside_any_scheduler():
    assert detect_label({}, pid=4242, host="gpu-3", namespace_file="/nonexistent") == "host=gpu-3 pid=4242"


def test_kubernetes_pod_and_namespace_from_the_downward_api_names():
    env = {"POD_NAME": "train-0", "POD_NAMESPACE": "ml", "KUBERNETES_SERVICE_HOST": "10.0.0.1", "HOSTNAME": "train-0"}
    assert detect_label(env, pid=1, host="train-0", namespace_file="/nonexistent") == "pod=ml/train-0 pid=1"


def test_kubernetes_without_the_downward_api_uses_hostname_and_the_service_account_namespace(tmp_path):
    ns = tmp_path / "namespace"
    ns.write_text("research\n")
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "HOSTNAME": "train-7f9c"}
    assert detect_label(env, pid=1, host="train-7f9c", namespace_file=str(ns)) == "pod=research/train-7f9c pid=1"


def test_slurm_array_tasks_and_torchrun_ranks_are_named():
    env = {"SLURM_JOB_ID": "812346", "SLURM_ARRAY_JOB_ID": "812345", "SLURM_ARRAY_TASK_ID": "3",
           "RANK": "2", "LOCAL_RANK": "0", "TORCHELASTIC_RUN_ID": "abc"}
    assert detect_label(env, pid=9, host="node12", namespace_file="/nonexistent") == "host=node12 pid=9 slurm=812345_3 rank=2"
    assert "rank" not in detect_label({"RANK": "2"}, pid=9, host="h"), "RANK alone is not torchrun's"


def test_a_hostile_environment_still_makes_a_valid_label():
    label = detect_label({"POD_NAME": "x\n" * 300}, pid=1, host="h")
    HandoffLock("memory://detect/l.json", label=label)  # accepted: cleaned and cut to fit


# --------------------------------------------------------------------------- status and watch


def _quiet(url, owner, label, clock):
    return HandoffLock(url, ttl=60.0, owner_id=owner, label=label, clock=clock, scheduler=Scheduler(clock, autostart=False),
                       waiter_poll_interval=0.05)


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
    raw_write(url, LockRecord("forever", 32_000_000_000.0, None, None, ttl=60.0, token=3), 0)
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
