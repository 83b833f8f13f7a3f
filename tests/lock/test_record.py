"""The record as written and read by the lock: labels, requests and declines round-trip, older and newer
writers keep what they do not know, and a malformed record is corrupt, never free."""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import sys
import uuid
from pathlib import Path

import orjson
import pytest
from lockparts import held
from lockutil import make_lock

from handofflock import (
    ConfigurationError,
    FakeClock,
    HandoffLock,
    LockRecord,
    LockRecordCorrupt,
    Scheduler,
)
from handofflock.core import protocol
from handofflock.core.protocol import Kind, Me
from handofflock.core.record import ASKING, Holder, Label, WaiterRequest
from handofflock.core.timing import Timing
from handofflock.storage import MemoryStorage, open_url


@pytest.fixture
def url():
    name = f"edge-{uuid.uuid4().hex[:8]}"
    yield f"memory://{name}/locks/l.json"
    MemoryStorage.forget(name)

NOW = 1_700_000_000.0

OWNER, WAITER = Label("pod=ml/train-0 pid=1", grace=30.0), Label("host=gpu-3 pid=42 slurm=812345")

OWNER, WAITER = Label("pod=ml/train-0 pid=1", grace=30.0), Label("host=gpu-3 pid=42 slurm=812345")


def labelled(**kw) -> LockRecord:
    base = {"owner_id": "a", "expires_at": NOW + 30, "ttl": 60.0, "token": 7, "nonce": "n0", "owner_instance": "ia",
            "owner_label": OWNER}
    return LockRecord().replace(**{**base, **kw})


def waited(**kw) -> LockRecord:
    base = {"waiting_owner_id": "w", "waiter_expires_at": NOW + 20, "waiter_instance": "iw", "waiter_ttl": 60.0,
            "waiter_label": WAITER}
    return labelled(**{**base, **kw})

ROOT = Path(__file__).resolve().parents[2]


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

TIMING = Timing.build(ttl=60.0, waiter_ttl=30.0, max_clock_skew=2.0)

HIGH_PATIENT = WaiterRequest(asks=False, priority=5)


PATIENT = WaiterRequest(asks=False)


def test_a_record_with_a_duplicated_key_is_corrupt_not_free():
    data = b'{"ownerId":"X","expiresAt":4102444800,"waitingOwnerId":null,"waiterExpiresAt":null,"ownerId":null}'
    with pytest.raises(LockRecordCorrupt, match="duplicate key 'ownerId'"):
        LockRecord.decode(data)


def test_unknown_fields_with_integers_past_64_bits_are_kept_exactly():
    big = 2**70 + 1
    data = b'{"ownerId":null,"expiresAt":null,"waitingOwnerId":null,"waiterExpiresAt":null,"audit":%d}' % big
    record = LockRecord.decode(data)
    assert record.extra["audit"] == big and isinstance(record.extra["audit"], int)
    assert LockRecord.decode(record.replace(owner_id="A", expires_at=1.0).encode()).extra["audit"] == big


def test_a_writer_of_the_original_design_that_takes_the_lock_drops_the_old_label(url):
    """A writer of the original four-field design (it knows neither instances nor labels, and keeps
    unknown fields as they are) takes an expired lock: it writes ownerId/expiresAt and leaves
    ``ownerInstance`` and ``ownerLabel`` of the previous owner in place. The label names that
    instance, which the record still carries, so it "counts": ``status`` shows the new owner
    with the previous job's label (pod, pid, grace). record.py's docstring says the old label
    stops counting when such a writer takes the lock ("writing its own instance, or none").
    """
    import orjson

    old = make_lock(url, label=Label("pod=ml/old-job pid=1", grace=30.0))
    assert old.acquire()
    old._unschedule()  # it dies without releasing
    store, key = open_url(url)
    data, generation = store.read(key)
    doc = orjson.loads(data)
    # the original design: take an expired lock by setting the four fields it knows, keep the rest
    doc.update(ownerId="other-impl-job", expiresAt=doc["expiresAt"] + 100.0, waitingOwnerId=None, waiterExpiresAt=None)
    store.write(key, orjson.dumps(doc), if_generation_match=generation)

    st = make_lock(url).status()
    assert st.owner_id == "other-impl-job"
    assert st.owner_label is None, f"the new owner {st.owner_id!r} is shown with the old owner's label {st.owner_label}"


def test_labels_round_trip_bound_to_the_instance_they_belong_to():
    r = waited()
    doc = orjson.loads(r.encode())
    assert doc["ownerLabel"] == {"text": OWNER.text, "instance": "ia", "id": "a", "grace": 30.0}
    assert doc["waiterLabel"] == {"text": WAITER.text, "instance": "iw", "id": "w"}
    back = LockRecord.decode(r.encode())
    assert (back.owner_label, back.waiter_label) == (OWNER, WAITER)


def test_a_record_without_labels_is_written_as_before():
    doc = orjson.loads(LockRecord(Holder("a", NOW), token=1).encode())
    assert "ownerLabel" not in doc and "waiterLabel" not in doc


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


def test_every_write_path_carries_or_clears_the_labels():
    mine_label = Label("me-label")
    # create / take: my label as owner
    d = protocol.decide_acquire(None, 0, me=Me("me", "im", mine_label), now=NOW, timing=TIMING, nonce="n", waiting=False)
    assert d.kind is Kind.CREATE and d.record.owner_label == mine_label
    d = protocol.decide_acquire(labelled(expires_at=NOW - 100), 3, me=Me("me", "im", mine_label), now=NOW, timing=TIMING, nonce="n", waiting=False)
    assert d.kind is Kind.TAKE and d.record.owner_label == mine_label and d.record.waiter_label is None
    # become the waiter: my label in the waiter's place, the owner's kept
    d = protocol.decide_acquire(labelled(), 3, me=Me("me", "im", mine_label), now=NOW, timing=TIMING, nonce="n", waiting=False)
    assert d.kind is Kind.BECOME_WAITER and (d.record.owner_label, d.record.waiter_label) == (OWNER, mine_label)
    # refresh the slot: both kept
    mine = waited(waiting_owner_id="me", waiter_instance="im", waiter_label=mine_label, waiter_expires_at=NOW + 1)
    d = protocol.decide_acquire(mine, 3, me=Me("me", "im", mine_label), now=NOW, timing=TIMING, nonce="n", waiting=True)
    assert d.kind is Kind.REFRESH_WAITER and (d.record.owner_label, d.record.waiter_label) == (OWNER, mine_label)
    # give up the slot: the waiter's label goes with it
    d = protocol.decide_give_up_wait(mine, 3, me=Me("me", "im"), now=NOW, timing=TIMING, nonce="n")
    assert d.kind is Kind.GIVE_UP_WAIT and d.record.waiter_label is None and d.record.owner_label == OWNER
    # renew: both kept as read
    d = protocol.decide_renew(waited(), 3, me=Me("a", "ia"), token=7, now=NOW, timing=TIMING, nonce="n")
    assert d.kind is Kind.RENEW and (d.record.owner_label, d.record.waiter_label) == (OWNER, WAITER)
    # hand off: the waiter's label becomes the owner's, the waiter's place is empty
    d = protocol.decide_release(waited(), 3, me=Me("a", "ia"), token=7, now=NOW, timing=TIMING, nonce="n")
    assert d.kind is Kind.HANDOFF and (d.record.owner_label, d.record.waiter_label) == (WAITER, None)
    assert LockRecord.decode(d.record.encode()).owner_label == WAITER, "and it counts: bound to the heir's instance"
    # free: the owner's label goes; a waiter within the skew keeps its own
    d = protocol.decide_release(labelled(), 3, me=Me("a", "ia"), token=7, now=NOW, timing=TIMING, nonce="n")
    assert d.kind is Kind.FREE and d.record.owner_label is None
    d = protocol.decide_release(waited(waiter_expires_at=NOW - 1), 3, me=Me("a", "ia"), token=7, now=NOW, timing=TIMING, nonce="n")
    assert d.kind is Kind.FREE and d.record.owner_label is None and d.record.waiter_label == WAITER
    d = protocol.decide_release(waited(waiter_expires_at=NOW - 10), 3, me=Me("a", "ia"), token=7, now=NOW, timing=TIMING, nonce="n")
    assert d.kind is Kind.FREE and d.record.waiter_label is None
    # retake of a record naming this very instance (a same-id record of another instance is another party's,
    # never retaken): my label, a live waiter keeps its own
    d = protocol.decide_acquire(waited(owner_id="me", owner_instance="im"), 3, me=Me("me", "im", mine_label), now=NOW, timing=TIMING, nonce="n", waiting=False)
    assert d.kind is Kind.RETAKE and (d.record.owner_label, d.record.waiter_label) == (mine_label, WAITER)


def test_the_longest_valid_owner_id_round_trips_through_the_record():
    name = f"id-{uuid.uuid4().hex[:8]}"
    owner = "host.example:1234:" + "x" * (512 - 18)
    lock = HandoffLock(f"memory://{name}/x.json", owner_id=owner, scheduler=Scheduler(FakeClock(), autostart=False), clock=FakeClock())
    assert lock.acquire()
    assert lock.status().owner_id == owner
    lock.release()


def test_the_request_and_the_decline_round_trip_and_an_asking_waiter_writes_nothing_new():
    r = held(HIGH_PATIENT, declined=True)
    doc = r.to_json()
    assert doc["waiterRequest"] == {"asks": False, "priority": 5, "id": "w", "instance": "iw"}
    assert doc["declinedWaiter"] == {"id": "w", "instance": "iw", "owner": "a", "ownerInstance": "ia"}
    back = LockRecord.decode(r.encode())
    assert back.request == HIGH_PATIENT and back.declined
    assert "waiterRequest" not in held().to_json() and "declinedWaiter" not in held().to_json()


def test_a_request_left_behind_by_an_older_writer_does_not_make_its_new_waiter_patient():
    # An older handofflock keeps both fields as unknown ones and writes them back unchanged while it
    # puts its own waiter (and owner) in place: they must not speak for the new ones.
    doc = held(PATIENT, declined=True).to_json()
    doc.update(waitingOwnerId="old", waiterInstance=None, ownerInstance=None)

    back = LockRecord.decode(json.dumps(doc).encode())
    assert back.request == ASKING and not back.declined


@pytest.mark.parametrize(
    "field,value",
    [
        ("waiterRequest", {"asks": "no", "priority": 0, "id": "w", "instance": "iw"}),
        ("waiterRequest", {"asks": False, "priority": 1.5, "id": "w", "instance": "iw"}),
        ("waiterRequest", {"asks": False, "priority": 2**40, "id": "w", "instance": "iw"}),
        ("waiterRequest", {"asks": False}),
        ("waiterRequest", "patient"),
        ("declinedWaiter", {"id": "w"}),
        ("declinedWaiter", {"id": "w", "instance": "i w", "owner": "a", "ownerInstance": "ia"}),
    ],
)
def test_a_malformed_request_or_decline_is_corrupt_never_dropped(field, value):

    doc = held().to_json()
    doc[field] = value
    with pytest.raises(LockRecordCorrupt, match=field):
        LockRecord.decode(json.dumps(doc).encode())


_BASE = {"version": 1, "ownerId": "a", "expiresAt": 100.0, "ownerInstance": "ia", "waitingOwnerId": "w",
         "waiterExpiresAt": 100.0, "waiterInstance": "iw", "ttl": 30.0, "token": 3, "nonce": "n"}


@pytest.mark.parametrize("field, value, reason", [
    ("nonce", 5, "'nonce' must be a string of 1-128 characters"),
    ("ownerInstance", 5, "'ownerInstance' must be 1-128 ASCII letters or digits, or null"),
    ("ownerLabel", {"text": "t", "grace": -1, "id": "a", "instance": "ia"},
     "'ownerLabel.grace' must be a number of seconds in [0, 604800] (a week), got the integer -1"),
    ("ownerLabel", {"text": "t", "id": 5, "instance": 5},
     "'ownerLabel.id' must be a string or null, got the integer 5"),
    ("waiterRequest", {"asks": True, "priority": 2**40, "id": "w", "instance": "iw"},
     "'waiterRequest.priority' must be an integer in [-2**31, 2**31-1], got the integer 1099511627776"),
    ("waiterRequest", {"asks": True},
     "'waiterRequest' must have 'asks', 'priority', 'id' and 'instance', got keys ['asks']"),
    ("waiterRequest", {"asks": True, "priority": 0, "id": 3, "instance": 4},
     "'waiterRequest.id' must be a string or null, got the integer 3"),
    ("heldSince", {"at": None, "token": "x"}, "'heldSince.token' must be an integer, got a string"),
])
def test_a_corrupt_record_says_exactly_what_is_wrong(field, value, reason):
    """The reason of each corrupt field, word for word (an operator greps logs for them)."""
    doc = {**_BASE, field: value}
    with pytest.raises(LockRecordCorrupt) as caught:
        LockRecord.decode(json.dumps(doc).encode())
    assert f"is corrupt: {reason}. Nothing was overwritten" in str(caught.value)


def test_a_label_read_back_keeps_its_grace_a_float_and_writes_it_as_before():
    doc = {**_BASE, "ownerLabel": {"text": "t", "grace": 5, "id": "a", "instance": "ia"}}
    label = LockRecord.decode(json.dumps(doc).encode()).owner.label
    assert label == Label("t", 5.0) and isinstance(label.grace, float)
    written = LockRecord.decode(json.dumps(doc).encode()).encode()
    assert b'"ownerLabel":{"text":"t","instance":"ia","id":"a","grace":5.0}' in written


@pytest.mark.parametrize("grace, got", [(-1, "the integer -1"), (float("nan"), "the number nan"), ("x", "a string")])
def test_a_bad_label_grace_is_named_as_the_caller_knows_it(grace, got):
    with pytest.raises(ConfigurationError) as caught:
        Label("t", grace)
    assert str(caught.value) == f"a label's grace must be a number of seconds in [0, 604800] (a week), got {got}"


# -- waitingSince and minHold: optional, bound to their place, decoded strictly --


def test_when_the_waiter_began_and_the_minimum_hold_round_trip_bound_to_their_place():
    record = waited(waiting_since=NOW - 12.5, held_since=NOW - 3, min_hold=30.0)
    doc = record.to_json()
    assert doc["waitingSince"] == {"at": NOW - 12.5, "id": "w", "instance": "iw"}
    assert doc["minHold"] == {"seconds": 30.0, "token": 7}
    back = LockRecord.decode(record.encode())
    assert (back.waiting_since, back.min_hold) == (NOW - 12.5, 30.0)
    # Another waiter, or another hold (a new token), written by a writer that kept them as unknown fields.
    doc["waitingOwnerId"], doc["token"] = "other", 8
    other = LockRecord.decode(json.dumps(doc).encode())
    assert (other.waiting_since, other.min_hold) == (None, None)
    # A record without them (every older writer's) reads as before.
    plain = waited().to_json()
    assert "waitingSince" not in plain and "minHold" not in plain
    assert LockRecord.decode(json.dumps(plain).encode()) == waited()


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        ("waitingSince", 5, "'waitingSince' must be an object or null"),
        ("waitingSince", {"at": None, "id": "w", "instance": "iw"}, "'waitingSince.at' must be a number"),
        ("waitingSince", {"at": "x", "id": "w", "instance": "iw"}, "'waitingSince.at' must be a number"),
        ("waitingSince", {"at": 1.0, "id": "w"}, "'waitingSince' must have"),
        ("minHold", {"seconds": -1, "token": 7}, "'minHold.seconds' must be a number of seconds"),
        ("minHold", {"seconds": None, "token": 7}, "'minHold.seconds' must be a number"),
        ("minHold", {"seconds": 3, "token": 7, "more": 1}, "'minHold' must have"),
    ],
)
def test_a_malformed_waiting_since_or_minimum_hold_is_corrupt(key, value, why):
    doc = waited().to_json()
    doc[key] = value
    with pytest.raises(LockRecordCorrupt, match=re.escape(why)):
        LockRecord.decode(json.dumps(doc).encode())
