"""Sharing the single waiter slot: patient and asking waiters, priorities, and a holder that declines.

The pure decisions as a table (issue 24, item 1), and the record fields that carry them
(``waiterRequest``, ``declinedWaiter``), which count only while the waiter (and owner) they
name are still in place, as labels do.
"""

from __future__ import annotations

import pytest

from handofflock.core import protocol
from handofflock.core.errors import LockRecordCorrupt
from handofflock.core.protocol import Contended, Kind, Me, Policy, Wait, WaiterSeen, Write
from handofflock.core.record import ASKING, LockRecord, WaiterRequest

NOW = 1_700_000_000.0
POLICY = Policy(ttl=60.0, waiter_ttl=30.0, max_clock_skew=2.0)
GEN = 42
PATIENT = WaiterRequest(asks=False)
HIGH, LOW = WaiterRequest(priority=5), WaiterRequest(priority=-5)
HIGH_PATIENT = WaiterRequest(asks=False, priority=5)


def held(waiter_request=None, waiter="w", waiter_expires=NOW + 20, owner_expires=NOW + 30, **kw) -> LockRecord:
    return LockRecord(
        "a", owner_expires, waiter, waiter_expires, ttl=60.0, token=7, nonce="old",
        owner_instance="ia", waiter_instance="iw", waiter_request=waiter_request, **kw,
    )


# (name, record, our request, expected outcome, expected kind)
SLOT_TABLE = [
    ("an asking request takes the slot from a patient waiter", held(PATIENT), ASKING, Write, Kind.BECOME_WAITER),
    ("a patient request never takes the slot from an asking waiter", held(), PATIENT, Contended, None),
    ("patient after patient: first come keeps the slot", held(PATIENT), PATIENT, Contended, None),
    ("asking after asking: first come keeps the slot", held(), ASKING, Contended, None),
    ("a higher priority takes the slot from a lower one", held(LOW), ASKING, Write, Kind.BECOME_WAITER),
    ("a higher priority takes it even from an asking waiter", held(), HIGH, Write, Kind.BECOME_WAITER),
    ("a lower priority waits behind a higher one", held(HIGH), ASKING, Contended, None),
    ("priority comes before asking: a patient high one keeps it from an asking one", held(HIGH_PATIENT), ASKING, Contended, None),
    ("a patient high one takes it from an asking low one", held(LOW), HIGH_PATIENT, Write, Kind.BECOME_WAITER),
    ("the lease is over: the live waiter takes the lock, whatever we rank", held(PATIENT, owner_expires=NOW - 100), HIGH, Contended, None),
    ("a patient waiter on a free slot becomes the waiter", held(None, waiter=None, waiter_expires=None), PATIENT, Write, Kind.BECOME_WAITER),
    ("a patient waiter whose slot is fresh waits", held(PATIENT, waiter="me", waiter_expires=NOW + 25), PATIENT, Wait, None),
]


@pytest.mark.parametrize("name,record,request_,outcome,kind", SLOT_TABLE, ids=[r[0] for r in SLOT_TABLE])
def test_slot_sharing_decision_table(name, record, request_, outcome, kind):
    me = Me("me", "iw" if record.waiting_owner_id == "me" else "im")
    d = protocol.decide_acquire(record, GEN, me=me, now=NOW, policy=POLICY, nonce="n", waiting=False, request=request_)
    assert isinstance(d, outcome), d
    if kind is not None:
        assert d.kind is kind and d.if_generation_match == GEN
        assert d.record.waiting_owner_id == "me" and d.record.request == request_
        assert d.record.owner_id == "a" and d.record.expires_at == NOW + 30  # the owner and its lease stay


def test_the_owner_is_not_told_of_a_patient_waiter_but_is_of_an_asking_one():
    me = Me("a", "ia")
    assert protocol.observe_as_owner(held(PATIENT), me=me, token=7, now=NOW) is None
    assert protocol.observe_as_owner(held(), me=me, token=7, now=NOW) == WaiterSeen("w", NOW + 20)


def test_the_release_hands_the_lock_to_a_patient_waiter():
    d = protocol.decide_release(held(PATIENT), GEN, me=Me("a", "ia"), token=7, now=NOW, policy=POLICY, nonce="n")
    assert isinstance(d, Write) and d.kind is Kind.HANDOFF and d.record.owner_id == "w"
    assert d.record.waiter_request is None and not d.record.declined


# (name, record, yields, declined written)
DECLINE_TABLE = [
    ("a holder that does not yield declines an asking waiter", held(), False, True),
    ("a holder that does not yield has nothing to decline of a patient waiter", held(PATIENT), False, False),
    ("nor of an expired one", held(waiter_expires=NOW - 1), False, False),
    ("a holder that yields never claims a decline", held(declined=True), True, False),
]


@pytest.mark.parametrize("name,record,yields,declined", DECLINE_TABLE, ids=[r[0] for r in DECLINE_TABLE])
def test_renew_writes_the_decline_table(name, record, yields, declined):
    d = protocol.decide_renew(record, GEN, me=Me("a", "ia", yields=yields), token=7, now=NOW, policy=POLICY, nonce="n")
    assert isinstance(d, Write) and d.kind is Kind.RENEW
    assert d.record.declined is declined
    assert LockRecord.decode(d.record.encode()).declined is declined  # and it survives the wire


def test_giving_up_the_slot_clears_the_request_and_the_decline():
    d = protocol.decide_give_up_wait(held(PATIENT, waiter="me", declined=True), GEN, me=Me("me", "iw"), now=NOW, policy=POLICY, nonce="n")
    assert isinstance(d, Write) and d.record.waiter_request is None and not d.record.declined


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
    import json

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
    import json

    doc = held().to_json()
    doc[field] = value
    with pytest.raises(LockRecordCorrupt, match=field):
        LockRecord.decode(json.dumps(doc).encode())
