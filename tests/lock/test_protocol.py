"""The pure decision table: given what was read, what does the lock write next?"""

from __future__ import annotations

import dataclasses

import orjson
import pytest
from lockparts import held

from handofflock.core import protocol
from handofflock.core.protocol import Contended, Kind, Lost, Me, Owned, Released, Wait, WaiterSeen, Write
from handofflock.core.record import ASKING, Holder, LockRecord, Waiter, WaiterRequest
from handofflock.core.errors import ConfigurationError
from handofflock.core.timing import Timing

NOW = 1_700_000_000.0
TIMING = Timing.build(ttl=60.0, waiter_ttl=30.0, max_clock_skew=2.0)
GEN = 42


def rec(owner=None, expires=None, waiter=None, waiter_expires=None, token=7, owner_instance=None, waiter_instance=None, **kw) -> LockRecord:
    return LockRecord(
        Holder(owner, expires, owner_instance) if owner else None,
        Waiter(waiter, waiter_expires, instance=waiter_instance) if waiter else None,
        ttl=60.0, token=token, nonce="old", **kw,
    )


# (name, record, waiting, expected outcome, expected kind or None). We are Me("me", "i1"): a place is ours only
# when it names our id and this instance ("i1"); our id with another instance, or none, is another party's.
ACQUIRE_TABLE = [
    ("absent: create it", None, False, Write, Kind.CREATE),
    ("free, no waiter: take it", rec(), False, Write, Kind.TAKE),
    ("free, my waiter slot: take it", rec(waiter="me", waiter_expires=NOW + 10, waiter_instance="i1"), True, Write, Kind.TAKE),
    ("free, another live waiter: it has priority", rec(waiter="w", waiter_expires=NOW + 10), False, Contended, None),
    ("free, another waiter expired beyond skew: take it", rec(waiter="w", waiter_expires=NOW - 3), False, Write, Kind.TAKE),
    ("free, another waiter expired within skew: still defer", rec(waiter="w", waiter_expires=NOW - 1), False, Contended, None),
    ("owner live: become the waiter", rec("a", NOW + 30), False, Write, Kind.BECOME_WAITER),
    ("owner expired within skew: still live, become waiter", rec("a", NOW - 1), False, Write, Kind.BECOME_WAITER),
    ("owner expired beyond skew: take it", rec("a", NOW - 2.5), False, Write, Kind.TAKE),
    ("owner expired, live waiter is someone else: a third party defers", rec("a", NOW - 100, "w", NOW + 5), False, Contended, None),
    ("owner expired, I am the live waiter: take it", rec("a", NOW - 100, "me", NOW + 5, waiter_instance="i1"), True, Write, Kind.TAKE),
    ("owner live, live waiter someone else: contended", rec("a", NOW + 30, "w", NOW + 20), False, Contended, None),
    ("owner live, waiter slot expired: take the slot", rec("a", NOW + 30, "w", NOW - 5), False, Write, Kind.BECOME_WAITER),
    ("owner live, my slot fresh: wait", rec("a", NOW + 30, "me", NOW + 25, waiter_instance="i1"), True, Wait, None),
    ("owner live, my slot half used: refresh it", rec("a", NOW + 30, "me", NOW + 14, waiter_instance="i1"), True, Write, Kind.REFRESH_WAITER),
    ("owner live, my slot expired but still mine: refresh it", rec("a", NOW + 30, "me", NOW - 1, waiter_instance="i1"), True, Write, Kind.REFRESH_WAITER),
    ("handed to me while I waited: owned, no write", rec("me", NOW + 60, owner_instance="i1"), True, Owned, None),
    # Our owner id with another instance (a restart's predecessor, or a second live job that derived the id) is
    # another party: its live lease is waited for, never retaken.
    ("my id, another instance, lease live, I just started: become the waiter", rec("me", NOW + 60, owner_instance="i2"), False, Write, Kind.BECOME_WAITER),
    ("my id, another instance, lease live, I was waiting: become the waiter again", rec("me", NOW + 60, owner_instance="i2"), True, Write, Kind.BECOME_WAITER),
    ("my id, no instance recorded (an older writer's), lease live: become the waiter", rec("me", NOW + 60), False, Write, Kind.BECOME_WAITER),
    ("my id, another instance, expired within skew: still live, become the waiter", rec("me", NOW - 1, owner_instance="i2"), False, Write, Kind.BECOME_WAITER),
    ("my id, another instance, expired beyond skew: take it", rec("me", NOW - 2.5, owner_instance="i2"), False, Write, Kind.TAKE),
    ("my id, another instance, lease live, its slot taken by another: contended", rec("me", NOW + 60, "w", NOW + 20, owner_instance="i2"), False, Contended, None),
    ("owner live, slot names my id but another instance, I was waiting: contended", rec("a", NOW + 30, "me", NOW + 25, waiter_instance="i2"), True, Contended, None),
    ("owner live, slot names my id, an earlier incarnation's instance, I just started: contended", rec("a", NOW + 30, "me", NOW + 25, waiter_instance="i0"), False, Contended, None),
    ("owner live, slot names my id with no instance recorded: another party's, contended", rec("a", NOW + 30, "me", NOW + 25), False, Contended, None),
    ("owner live, slot of my id and another instance expired: take the slot", rec("a", NOW + 30, "me", NOW - 5, waiter_instance="i0"), False, Write, Kind.BECOME_WAITER),
    ("free, live slot names my id, an earlier incarnation's instance: it has priority", rec(None, None, "me", NOW + 25, waiter_instance="i0"), False, Contended, None),
    ("owner expired, live slot names my id, another instance: it has priority", rec("a", NOW - 100, "me", NOW + 25, waiter_instance="i0"), False, Contended, None),
    ("free, live slot names my id, another instance took it while I waited: contended", rec(None, None, "me", NOW + 25, waiter_instance="i2"), True, Contended, None),
    ("names this instance but I was not waiting: retake with a new token", rec("me", NOW + 60, owner_instance="i1"), False, Write, Kind.RETAKE),
    ("names this instance, lease long expired, was waiting: retake", rec("me", NOW - 100, owner_instance="i1"), True, Write, Kind.RETAKE),
    ("handed to this instance but the lease ran out by my clock: retake, never assume", rec("me", NOW - 0.5, owner_instance="i1"), True, Write, Kind.RETAKE),
    ("legacy four-field record held by another: become waiter", LockRecord(Holder("a", NOW + 30), legacy=True), False, Write, Kind.BECOME_WAITER),
    ("legacy four-field record under my id: another party's, become waiter", LockRecord(Holder("me", NOW + 30), legacy=True), False, Write, Kind.BECOME_WAITER),
]


@pytest.mark.parametrize("name,record,waiting,outcome,kind", ACQUIRE_TABLE, ids=[r[0] for r in ACQUIRE_TABLE])
def test_acquire_decision_table(name, record, waiting, outcome, kind):
    d = protocol.decide_acquire(record, GEN if record else 0, me=Me("me", "i1"), now=NOW, timing=TIMING, nonce="n1", waiting=waiting)
    assert isinstance(d, outcome), d
    if kind is not None:
        assert d.kind is kind
        assert d.if_generation_match == (GEN if record else 0)
        assert d.record.nonce == "n1"


YEARS = 31 * 365 * 86400.0
MAX_TTL = 7 * 24 * 3600.0  # core.record.MAX_TTL: the longest ttl a record may carry

# A lease further ahead than ttl + skew is suspect: it ends ttl after the reader first saw that version.
# (name, record, observed_at, expected outcome, expected kind or None)
SUSPECT_TABLE = [
    ("31 years ahead, first seen now: still live (ends now + ttl), become the waiter", rec("a", NOW + YEARS), NOW, Write, Kind.BECOME_WAITER),
    ("31 years ahead, first seen ttl ago: within the skew, still live", rec("a", NOW + YEARS), NOW - 61, Write, Kind.BECOME_WAITER),
    ("31 years ahead, first seen ttl + skew ago: over, take it", rec("a", NOW + YEARS), NOW - 62.5, Write, Kind.TAKE),
    ("31 years ahead, a live other waiter: over, but the waiter has priority", rec("a", NOW + YEARS, "w", NOW + 10), NOW - 100, Contended, None),
    ("exactly ttl + skew ahead of first sight: trusted, live", rec("a", NOW + 62), NOW, Write, Kind.BECOME_WAITER),
    ("a lease renewed a moment ago, first seen now: trusted, live", rec("a", NOW + 59), NOW, Write, Kind.BECOME_WAITER),
    ("unchanged for 1000 s yet still 30 s ahead: no live owner writes that; over, take it", rec("a", NOW + 30), NOW - 1000, Write, Kind.TAKE),
    ("suspect by the record's own ttl (5 s), first seen 8 s ago: over", LockRecord(Holder("a", NOW + 3600), ttl=5.0, token=7, nonce="old"), NOW - 8, Write, Kind.TAKE),
    # A record of the original design has no ttl: its writer's ttl is unknown (perhaps longer than ours, renewed
    # less often), so only the longest ttl any writer may use (MAX_TTL) bounds it, never the reader's own.
    ("original design (no ttl), a 300 s lease first seen 63 s ago: live (the writer's ttl is not ours)", LockRecord(Holder("a", NOW + 237), token=7, nonce="old"), NOW - 63, Write, Kind.BECOME_WAITER),
    ("original design, 31 years ahead, first seen MAX_TTL + skew ago: over", LockRecord(Holder("a", NOW + YEARS), token=7, nonce="old"), NOW - MAX_TTL - 3, Write, Kind.TAKE),
]


@pytest.mark.parametrize("name,record,observed_at,outcome,kind", SUSPECT_TABLE, ids=[r[0] for r in SUSPECT_TABLE])
def test_a_lease_further_ahead_than_its_ttl_ends_ttl_after_it_was_first_seen(name, record, observed_at, outcome, kind):
    d = protocol.decide_acquire(
        record, GEN, me=Me("me", "i1"), now=NOW, timing=TIMING, nonce="n1", waiting=False, observed_at=observed_at
    )
    assert isinstance(d, outcome), d
    if kind is not None:
        assert d.kind is kind and d.if_generation_match == GEN
    if kind is Kind.BECOME_WAITER:
        assert d.record.owner.expires_at == record.owner.expires_at  # the owner's lease is never rewritten by a reader


def test_suspect_lease_and_lease_end():
    far = rec("a", NOW + YEARS)
    assert protocol.suspect_lease(far, NOW, TIMING) and protocol.lease_end(far, NOW, TIMING) == NOW + 60
    assert not protocol.suspect_lease(rec("a", NOW + 60), NOW, TIMING)
    assert not protocol.suspect_lease(rec(), NOW, TIMING)  # free: no lease at all


@pytest.mark.parametrize("kind_row", [r for r in ACQUIRE_TABLE if r[4] in (Kind.CREATE, Kind.TAKE, Kind.RETAKE)], ids=lambda r: r[0])
def test_every_change_of_owner_raises_the_token_and_sets_a_full_lease(kind_row):
    _, record, waiting, _, _ = kind_row
    d = protocol.decide_acquire(record, GEN if record else 0, me=Me("me", "i1"), now=NOW, timing=TIMING, nonce="n", waiting=waiting)
    assert (d.record.owner.id, d.record.owner.instance) == ("me", "i1")
    assert d.record.owner.expires_at == NOW + TIMING.ttl
    assert d.record.token > (record.token if record else 0)
    assert d.record.ttl == TIMING.ttl


def test_taking_the_lock_clears_the_waiter_slot_it_consumed():
    d = protocol.decide_acquire(rec("a", NOW - 100, "me", NOW + 5), GEN, me=Me("me"), now=NOW, timing=TIMING, nonce="n", waiting=True)
    assert d.record.waiter is None


def test_a_retake_keeps_another_live_waiter_in_its_slot():
    d = protocol.decide_acquire(rec("me", NOW + 60, "w", NOW + 20), GEN, me=Me("me"), now=NOW, timing=TIMING, nonce="n", waiting=False)
    assert d.kind is Kind.RETAKE and d.record.waiter.id == "w" and d.record.token > 7


def test_a_restarted_job_waits_for_its_earlier_incarnations_slot_as_for_anyones():
    # An earlier version reclaimed the slot at once and the earlier instance deferred to it; the slot
    # of another instance under our id is another party's, which may be alive: only its expiry frees it.
    r = rec("a", NOW + 30, "me", NOW + 2, waiter_instance="i0", token=9)
    d = protocol.decide_acquire(r, GEN, me=Me("me", "i1"), now=NOW, timing=TIMING, nonce="n", waiting=False)
    assert isinstance(d, Contended)
    later = NOW + 2 + TIMING.max_clock_skew + 0.5  # the slot has ended, even allowing for skew
    d = protocol.decide_acquire(r, GEN, me=Me("me", "i1"), now=later, timing=TIMING, nonce="n", waiting=False)
    assert d.kind is Kind.BECOME_WAITER and d.if_generation_match == GEN
    assert (d.record.waiter.id, d.record.waiter.instance) == ("me", "i1")
    assert d.record.waiter.expires_at == later + TIMING.waiter_ttl  # a fresh slot, not the dead one's remainder
    assert (d.record.owner.id, d.record.owner.expires_at, d.record.token) == ("a", NOW + 30, 9)  # the owner untouched
    # once registered, the same record (now naming i1) is simply ours: no write while it is fresh
    again = protocol.decide_acquire(d.record, GEN + 1, me=Me("me", "i1"), now=later, timing=TIMING, nonce="n2", waiting=True)
    assert isinstance(again, Wait)
    # the earlier incarnation, if it still lives and polls, is another party: it waits its turn for the slot
    old = protocol.decide_acquire(d.record, GEN + 1, me=Me("me", "i0"), now=later, timing=TIMING, nonce="n3", waiting=True)
    assert isinstance(old, Contended)
    # ... and takes it by the rank rules only, as anyone would (a higher priority outranks the slot)
    old = protocol.decide_acquire(
        d.record, GEN + 1, me=Me("me", "i0"), now=later, timing=TIMING, nonce="n3", waiting=True, request=WaiterRequest(True, 5)
    )
    assert old.kind is Kind.BECOME_WAITER and old.record.waiter.instance == "i0"
    # and the owner hands the lock to the instance in the slot, with a higher token
    h = protocol.decide_release(d.record, GEN + 1, me=Me("a"), token=9, now=later, timing=TIMING, nonce="n4")
    assert h.kind is Kind.HANDOFF and h.record.owner.instance == "i1" and h.record.token > 9


def test_an_owner_hands_off_to_a_waiter_with_its_own_id_and_another_instance():
    """Two live jobs that derived one id: the holder asks nothing of itself, it sees a waiter and hands on."""
    held_by_i1 = rec("me", NOW + 5, "me", NOW + 9, owner_instance="i1", waiter_instance="i2")
    assert protocol.observe_as_owner(held_by_i1, me=Me("me", "i1"), token=7, now=NOW) == WaiterSeen("me", NOW + 9)
    h = protocol.decide_release(held_by_i1, GEN, me=Me("me", "i1"), token=7, now=NOW, timing=TIMING, nonce="n")
    assert h.kind is Kind.HANDOFF and (h.record.owner.id, h.record.owner.instance) == ("me", "i2") and h.record.token > 7
    # the heir finds the lock handed to it, as any waiter; the first instance, reading it, has lost it
    assert isinstance(protocol.decide_acquire(h.record, GEN + 1, me=Me("me", "i2"), now=NOW, timing=TIMING, nonce="n2", waiting=True), Owned)
    assert isinstance(protocol.observe_as_owner(h.record, me=Me("me", "i1"), token=7, now=NOW), Lost)
    assert protocol.registered(held_by_i1, Me("me", "i2")) and not protocol.registered(held_by_i1, Me("me", "i1"))


def test_the_token_rises_when_a_restart_takes_its_dead_predecessors_lease():
    dead = rec("me", NOW - 2.5, owner_instance="i0", token=int(NOW * 1000) + 50)
    d = protocol.decide_acquire(dead, GEN, me=Me("me", "i1"), now=NOW, timing=TIMING, nonce="n", waiting=False)
    assert d.kind is Kind.TAKE and d.record.owner.instance == "i1" and d.record.token == dead.token + 1
    # the predecessor, should it wake, finds the lock another instance's and stops
    assert isinstance(protocol.decide_renew(d.record, GEN + 1, me=Me("me", "i0"), token=dead.token, now=NOW, timing=TIMING, nonce="n2"), Lost)


def test_a_restarted_job_writes_its_own_request_into_a_slot_it_takes():
    # The slot of an earlier instance under our id, expired: free for anyone (live, it would be waited for).
    patient = WaiterRequest(False, 3)
    r = rec("a", NOW + 30, "me", NOW - 5, waiter_instance="i0", token=9, declined=True)
    d = protocol.decide_acquire(
        r, GEN, me=Me("me", "i1"), now=NOW, timing=TIMING, nonce="n", waiting=False, request=patient
    )
    assert d.kind is Kind.BECOME_WAITER and d.record.waiter.instance == "i1"
    assert d.record.request == patient and not d.record.declined  # the holder declines anew, if it does


def test_becoming_the_waiter_keeps_the_owner_and_its_lease():
    r = rec("a", NOW + 30)
    d = protocol.decide_acquire(r, GEN, me=Me("me"), now=NOW, timing=TIMING, nonce="n", waiting=False)
    assert (d.record.owner.id, d.record.owner.expires_at, d.record.token) == ("a", NOW + 30, 7)
    assert (d.record.waiter.id, d.record.waiter.expires_at) == ("me", NOW + TIMING.waiter_ttl)


def test_unknown_fields_survive_every_write():
    r = rec("a", NOW + 30, extra={"team": "vision"})
    d = protocol.decide_acquire(r, GEN, me=Me("me"), now=NOW, timing=TIMING, nonce="n", waiting=False)
    assert d.record.extra == {"team": "vision"}
    assert b'"team":"vision"' in d.record.encode()


def test_next_token_strictly_increases_and_starts_from_the_clock_when_absent():
    assert protocol.next_token(None, NOW) == int(NOW * 1000)
    assert protocol.next_token(rec(token=5), NOW) == int(NOW * 1000)
    big = int(NOW * 1000) + 50
    assert protocol.next_token(rec(token=big), NOW) == big + 1


# -- renew ---------------------------------------------------------------------

RENEW_TABLE = [
    ("mine: push expiry, keep waiter as read", rec("me", NOW + 5, "w", NOW + 9), Write),
    ("deleted: lost", None, Lost),
    ("someone else owns it: lost", rec("x", NOW + 60), Lost),
    ("freed by someone: lost", rec(None, None), Lost),
    ("my id but another token (a retake): lost", rec("me", NOW + 60, token=8), Lost),
]


@pytest.mark.parametrize("name,record,outcome", RENEW_TABLE, ids=[r[0] for r in RENEW_TABLE])
def test_renew_decision_table(name, record, outcome):
    d = protocol.decide_renew(record, GEN, me=Me("me"), token=7, now=NOW, timing=TIMING, nonce="n")
    assert isinstance(d, outcome)
    if isinstance(d, Write):
        assert d.kind is Kind.RENEW and d.if_generation_match == GEN
        assert d.record.owner.expires_at == NOW + TIMING.ttl and d.record.token == 7
        assert d.record.waiter == record.waiter


# -- release -------------------------------------------------------------------


def test_release_with_a_live_waiter_hands_off_in_one_write():
    d = protocol.decide_release(rec("me", NOW + 5, "w", NOW + 9), GEN, me=Me("me"), token=7, now=NOW, timing=TIMING, nonce="n")
    assert d.kind is Kind.HANDOFF and d.if_generation_match == GEN
    assert (d.record.owner.id, d.record.owner.expires_at) == ("w", NOW + TIMING.ttl)
    assert d.record.waiter is None
    assert d.record.token > 7


def test_release_without_a_waiter_marks_it_free_and_keeps_the_object_and_token():
    d = protocol.decide_release(rec("me", NOW + 5), GEN, me=Me("me"), token=7, now=NOW, timing=TIMING, nonce="n")
    assert d.kind is Kind.FREE
    assert d.record.owner is None and d.record.token == 7


def test_release_does_not_hand_to_a_waiter_whose_slot_expired_by_the_owners_clock():
    d = protocol.decide_release(rec("me", NOW + 5, "w", NOW - 1), GEN, me=Me("me"), token=7, now=NOW, timing=TIMING, nonce="n")
    assert d.kind is Kind.FREE
    # ...but the slot is kept while others would still defer to it (within skew), so the waiter can still take it.
    assert d.record.waiter.id == "w"


def test_release_clears_a_waiter_slot_long_expired():
    d = protocol.decide_release(rec("me", NOW + 5, "w", NOW - 10), GEN, me=Me("me"), token=7, now=NOW, timing=TIMING, nonce="n")
    assert d.kind is Kind.FREE and d.record.waiter is None


@pytest.mark.parametrize("record", [None, rec("x", NOW + 60), rec(None, None), rec("me", NOW + 60, token=9)])
def test_a_stale_release_never_touches_a_record_that_is_not_ours(record):
    d = protocol.decide_release(record, GEN, me=Me("me"), token=7, now=NOW, timing=TIMING, nonce="n")
    assert isinstance(d, Lost)


def test_a_handoff_whose_reply_was_lost_is_recognised_even_after_the_heir_renewed():
    attempted = protocol.decide_release(rec("me", NOW + 5, "w", NOW + 9), GEN, me=Me("me"), token=7, now=NOW, timing=TIMING, nonce="n")
    heir_renewed = attempted.record.replace(owner=dataclasses.replace(attempted.record.owner, expires_at=NOW + 70), nonce="heir")
    d = protocol.decide_release(heir_renewed, GEN + 2, me=Me("me"), token=7, now=NOW, timing=TIMING, nonce="n2", attempted=attempted)
    assert d == Released(handed_off_to="w")


def test_a_free_whose_reply_was_lost_is_recognised():
    attempted = protocol.decide_release(rec("me", NOW + 5), GEN, me=Me("me"), token=7, now=NOW, timing=TIMING, nonce="n")
    someone_waits = attempted.record.replace(waiter=Waiter("w", NOW + 30), nonce="w")
    d = protocol.decide_release(someone_waits, GEN + 2, me=Me("me"), token=7, now=NOW, timing=TIMING, nonce="n2", attempted=attempted)
    assert d == Released(handed_off_to=None)


# -- give up, observe -----------------------------------------------------------


def test_giving_up_the_wait_clears_only_our_slot():
    d = protocol.decide_give_up_wait(rec("a", NOW + 30, "me", NOW + 20), GEN, me=Me("me"), now=NOW, timing=TIMING, nonce="n")
    assert d.kind is Kind.GIVE_UP_WAIT and d.record.waiter is None and d.record.owner.id == "a"
    assert isinstance(protocol.decide_give_up_wait(rec("a", NOW + 30, "w", NOW + 20), GEN, me=Me("me"), now=NOW, timing=TIMING, nonce="n"), Wait)
    assert isinstance(protocol.decide_give_up_wait(None, 0, me=Me("me"), now=NOW, timing=TIMING, nonce="n"), Wait)


def test_giving_up_after_a_handoff_reports_that_we_own_it():
    assert isinstance(protocol.decide_give_up_wait(rec("me", NOW + 60), GEN, me=Me("me"), now=NOW, timing=TIMING, nonce="n"), Owned)


def test_giving_up_after_a_handoff_whose_lease_ran_out_releases_it_instead_of_keeping_it():
    """A waiter paused past the lease it was handed must not return a lock it cannot safely hold."""
    handed = rec("me", NOW - 1)
    d = protocol.decide_give_up_wait(handed, GEN, me=Me("me"), now=NOW, timing=TIMING, nonce="n")
    assert isinstance(d, Write) and d.kind is Kind.FREE and d.record.owner is None and d.if_generation_match == GEN
    with_waiter = handed.replace(waiter=Waiter("w", NOW + 20))
    d = protocol.decide_give_up_wait(with_waiter, GEN, me=Me("me"), now=NOW, timing=TIMING, nonce="n")
    assert isinstance(d, Write) and d.kind is Kind.HANDOFF and d.record.owner.id == "w"


def test_the_owner_sees_a_live_waiter_with_its_deadline():
    seen = protocol.observe_as_owner(rec("me", NOW + 5, "w", NOW + 9), me=Me("me"), token=7, now=NOW)
    assert seen == WaiterSeen("w", NOW + 9)


def test_the_owner_ignores_an_expired_waiter_and_notices_loss():
    assert protocol.observe_as_owner(rec("me", NOW + 5, "w", NOW - 1), me=Me("me"), token=7, now=NOW) is None
    assert isinstance(protocol.observe_as_owner(rec("x", NOW + 5), me=Me("me"), token=7, now=NOW), Lost)


@pytest.mark.parametrize("kind_of_release", ["handoff", "free"])
def test_a_release_whose_reply_was_lost_and_then_moved_on_is_not_reported_as_lost_within_the_lease(kind_of_release):
    waiter = ("w", NOW + 9) if kind_of_release == "handoff" else (None, None)
    attempted = protocol.decide_release(rec("me", NOW + 5, *waiter), GEN, me=Me("me"), token=7, now=NOW, timing=TIMING, nonce="n")
    # After our release landed, a third party took the lock (or the heir freed it and someone else took it).
    moved_on = rec("third", NOW + 60, token=attempted.record.token + 1)
    inside = protocol.decide_release(moved_on, GEN + 3, me=Me("me"), token=7, now=NOW, timing=TIMING, nonce="n2", attempted=attempted, within_lease=True)
    assert inside == Released(handed_off_to=waiter[0])
    # Past our safety window the same record could mean our lease expired and was taken: that is a loss.
    outside = protocol.decide_release(moved_on, GEN + 3, me=Me("me"), token=7, now=NOW, timing=TIMING, nonce="n2", attempted=attempted, within_lease=False)
    assert isinstance(outside, Lost)
    # Without a write of ours in doubt, a record that moved on is always a loss.
    assert isinstance(protocol.decide_release(moved_on, GEN + 3, me=Me("me"), token=7, now=NOW, timing=TIMING, nonce="n2", within_lease=True), Lost)


PATIENT = WaiterRequest(asks=False)

HIGH, LOW = WaiterRequest(priority=5), WaiterRequest(priority=-5)

HIGH_PATIENT = WaiterRequest(asks=False, priority=5)


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

# (name, record, yields, declined written)
DECLINE_TABLE = [
    ("a holder that does not yield declines an asking waiter", held(), False, True),
    ("a holder that does not yield has nothing to decline of a patient waiter", held(PATIENT), False, False),
    ("nor of an expired one", held(waiter_expires=NOW - 1), False, False),
    ("a holder that yields never claims a decline", held(declined=True), True, False),
]


@pytest.mark.parametrize("name,record,request_,outcome,kind", SLOT_TABLE, ids=[r[0] for r in SLOT_TABLE])
def test_slot_sharing_decision_table(name, record, request_, outcome, kind):
    me = Me("me", "iw" if record.waiting_owner_id == "me" else "im")
    d = protocol.decide_acquire(record, GEN, me=me, now=NOW, timing=TIMING, nonce="n", waiting=False, request=request_)
    assert isinstance(d, outcome), d
    if kind is not None:
        assert d.kind is kind and d.if_generation_match == GEN
        assert d.record.waiting_owner_id == "me" and d.record.request == request_
        assert d.record.owner_id == "a" and d.record.expires_at == NOW + 30  # the owner and its lease stay


@pytest.mark.parametrize("name,record,yields,declined", DECLINE_TABLE, ids=[r[0] for r in DECLINE_TABLE])
def test_renew_writes_the_decline_table(name, record, yields, declined):
    d = protocol.decide_renew(record, GEN, me=Me("a", "ia", yields=yields), token=7, now=NOW, timing=TIMING, nonce="n")
    assert isinstance(d, Write) and d.kind is Kind.RENEW
    assert d.record.declined is declined
    assert LockRecord.decode(d.record.encode()).declined is declined  # and it survives the wire


def test_a_write_sent_after_its_decision_stopped_holding_is_not_sent():
    """Decided again at the send: a handoff only to a slot still live then, a registration only under a live lease
    (once it has ended, the lock is to be taken). A take, a renewal and a free hold however late they go."""
    me = Me("me", "im")
    slot = rec("me", NOW + 30, "w", NOW + 5, owner_instance="im")
    handoff = protocol.decide_release(slot, GEN, me=me, token=7, now=NOW, timing=TIMING, nonce="n")
    assert isinstance(handoff, Write) and handoff.kind is Kind.HANDOFF
    assert protocol.restamp(handoff, now=NOW + 4.9, nonce="n2", timing=TIMING) is not None
    assert protocol.restamp(handoff, now=NOW + 5, nonce="n2", timing=TIMING) is None
    register = protocol.decide_acquire(rec("a", NOW + 3), GEN, me=me, now=NOW, timing=TIMING, nonce="n", waiting=False)
    assert isinstance(register, Write) and register.kind is Kind.BECOME_WAITER
    assert protocol.restamp(register, now=NOW + 4.9, nonce="n2", timing=TIMING) is not None  # within the skew
    assert protocol.restamp(register, now=NOW + 5, nonce="n2", timing=TIMING) is None
    held = rec("me", NOW + 30, owner_instance="im")
    for later in (
        protocol.decide_acquire(rec(), GEN, me=me, now=NOW, timing=TIMING, nonce="n", waiting=False),
        protocol.decide_renew(held, GEN, me=me, token=7, now=NOW, timing=TIMING, nonce="n"),
        protocol.decide_release(held, GEN, me=me, token=7, now=NOW, timing=TIMING, nonce="n"),
    ):
        assert isinstance(later, Write) and protocol.restamp(later, now=NOW + 1e6, nonce="n2", timing=TIMING)


def test_a_hold_records_when_it_began_and_renewals_keep_it():
    """``heldSince``: set to the send time by every write that starts a hold, kept by renewals, bound to its token."""
    taken = protocol.decide_acquire(rec(), GEN, me=Me("me"), now=NOW, timing=TIMING, nonce="n", waiting=False)
    assert isinstance(taken, Write) and taken.kind is Kind.TAKE and taken.record.held_since == NOW
    sent = protocol.restamp(taken, now=NOW + 3, nonce="n2", timing=TIMING)
    assert sent.record.held_since == NOW + 3  # the hold begins as its write is sent
    held = LockRecord.decode(sent.record.encode())
    assert held.held_since == NOW + 3
    assert orjson.loads(sent.record.encode())["heldSince"] == {"at": NOW + 3, "token": held.token}
    renewed = protocol.decide_renew(held, GEN, me=Me("me"), token=held.token, now=NOW + 40, timing=TIMING, nonce="n3")
    assert isinstance(renewed, Write) and renewed.record.held_since == NOW + 3
    assert protocol.restamp(renewed, now=NOW + 41, nonce="n4", timing=TIMING).record.held_since == NOW + 3
    waited = held.replace(waiter=Waiter("w", NOW + 70))
    handed = protocol.decide_release(waited, GEN, me=Me("me"), token=held.token, now=NOW + 60, timing=TIMING, nonce="n5")
    assert isinstance(handed, Write) and handed.kind is Kind.HANDOFF
    assert handed.record.owner.id == "w" and handed.record.held_since == NOW + 60  # the heir's hold is new
    freed = protocol.decide_release(held, GEN, me=Me("me"), token=held.token, now=NOW + 60, timing=TIMING, nonce="n6")
    assert isinstance(freed, Write) and freed.kind is Kind.FREE and "heldSince" not in freed.record.to_json()


def test_a_held_since_left_by_a_writer_that_did_not_know_it_names_no_hold():
    """An older writer keeps ``heldSince`` as an unknown field when it takes the lock (a new token): not its hold."""
    doc = orjson.loads(rec("old-writer", NOW + 30, token=9).encode())
    doc["heldSince"] = {"at": NOW - 500, "token": 7}  # the earlier holder's
    assert LockRecord.decode(orjson.dumps(doc)).held_since is None
    doc["heldSince"]["token"] = 9
    assert LockRecord.decode(orjson.dumps(doc)).held_since == NOW - 500


# -- waiting your turn: at equal rank, the older waiter has the slot --


def _slot(since, request=ASKING):
    return rec("a", NOW + 30).replace(waiter=Waiter("w", NOW + 10, instance="w1", request=request, since=since))


@pytest.mark.parametrize(
    ("name", "record", "ours", "since", "takes"),
    [
        ("older, equal rank: takes it", _slot(NOW - 5), ASKING, NOW - 9, True),
        ("younger, equal rank: waits outside", _slot(NOW - 5), ASKING, NOW - 1, False),
        ("as old: waits outside (no ping-pong)", _slot(NOW - 5), ASKING, NOW - 5, False),
        ("the waiter does not say when it began: keeps it", _slot(None), ASKING, NOW - 9, False),
        ("we do not say when we began: wait outside", _slot(NOW - 5), ASKING, None, False),
        ("younger but higher priority: takes it", _slot(NOW - 5), WaiterRequest(priority=1), NOW, True),
        ("older but lower priority: waits outside", _slot(NOW - 5), WaiterRequest(priority=-1), NOW - 9, False),
        ("older but patient against asking: waits outside", _slot(NOW - 5), WaiterRequest(asks=False), NOW - 9, False),
    ],
)
def test_the_slot_goes_to_the_higher_rank_then_the_older_waiter(name, record, ours, since, takes):
    d = protocol.decide_acquire(
        record, GEN, me=Me("me", "m1"), now=NOW, timing=TIMING, nonce="n", waiting=False, request=ours, since=since
    )
    if takes:
        assert isinstance(d, Write) and d.kind is Kind.BECOME_WAITER, name
        assert d.record.waiter.since == since and d.record.waiter.id == "me"
    else:
        assert isinstance(d, Contended), name


def test_a_refreshed_slot_keeps_when_its_waiter_began():
    record = rec("a", NOW + 30).replace(waiter=Waiter("me", NOW + 1, instance="m1", since=NOW - 40))
    d = protocol.decide_acquire(record, GEN, me=Me("me", "m1"), now=NOW, timing=TIMING, nonce="n", waiting=True)
    assert isinstance(d, Write) and d.kind is Kind.REFRESH_WAITER and d.record.waiter.since == NOW - 40


# -- the minimum hold: the owner's check acts on a waiter's request only once it is up --


def _held_since(at, **kw):
    return rec("me", NOW + 30, "w", NOW + 20, held_since=at, **kw)


def test_a_request_within_the_minimum_hold_is_acted_on_when_it_ends():
    seen = protocol.observe_as_owner(_held_since(NOW - 10), me=Me("me"), token=7, now=NOW, min_hold=30.0)
    assert seen == WaiterSeen("w", NOW + 20, acts_at=NOW + 20)
    after = protocol.observe_as_owner(_held_since(NOW - 30), me=Me("me"), token=7, now=NOW, min_hold=30.0)
    assert after == WaiterSeen("w", NOW + 20)


def test_a_holder_that_does_not_yield_declines_at_once_whatever_its_minimum_hold():
    me = Me("me", yields=False)
    seen = protocol.observe_as_owner(_held_since(NOW - 1), me=me, token=7, now=NOW, min_hold=30.0)
    assert seen == WaiterSeen("w", NOW + 20, write_decline=True)
    again = protocol.observe_as_owner(_held_since(NOW - 1, declined=True), me=me, token=7, now=NOW, min_hold=30.0)
    assert again == WaiterSeen("w", NOW + 20), "already written: no write for it"


def test_taking_and_renewing_write_the_minimum_hold_and_a_handoff_and_a_free_clear_it():
    timing = Timing.build(ttl=60.0, min_hold=12.0)
    taken = protocol.decide_acquire(rec(), GEN, me=Me("me"), now=NOW, timing=timing, nonce="n", waiting=False)
    assert isinstance(taken, Write) and taken.record.min_hold == 12.0
    mine = rec("me", NOW + 30, held_since=NOW - 5)
    renewed = protocol.decide_renew(mine, GEN, me=Me("me"), token=7, now=NOW, timing=timing, nonce="n")
    assert isinstance(renewed, Write) and (renewed.record.min_hold, renewed.record.held_since) == (12.0, NOW - 5)
    handed = protocol.decide_release(
        _held_since(NOW - 40, min_hold=12.0), GEN, me=Me("me"), token=7, now=NOW, timing=timing, nonce="n"
    )
    assert isinstance(handed, Write) and handed.kind is Kind.HANDOFF and handed.record.min_hold is None
    freed = protocol.decide_release(mine.replace(min_hold=12.0), GEN, me=Me("me"), token=7, now=NOW, timing=timing, nonce="n")
    assert isinstance(freed, Write) and freed.kind is Kind.FREE and freed.record.min_hold is None
    assert Timing.build(ttl=60.0, min_hold=0).min_hold == 0.0
    with pytest.raises(ConfigurationError, match="min_hold"):
        Timing.build(ttl=60.0, min_hold=-1)
    with pytest.raises(ConfigurationError, match="min_hold"):
        Timing.build(ttl=60.0, min_hold=8 * 24 * 3600.0)


@pytest.mark.parametrize("left", [WaiterRequest(priority=1, asks=False), WaiterRequest(asks=False), ASKING])
def test_our_slot_left_behind_by_an_earlier_acquire_is_written_anew_with_this_acquires_request(left):
    """An acquire that ended without giving its slot back (a timeout the store cut short) leaves it behind; the
    next acquire of the same instance finds it. It waits with what it asks for (the holder asked or not, its
    rank), not with the earlier acquire's request: it writes its own request and when it began."""
    ours = WaiterRequest(priority=0, asks=left.asks is False)
    record = rec("a", NOW + 30).replace(waiter=Waiter("me", NOW + 25, instance="m1", request=left, since=NOW - 40))
    d = protocol.decide_acquire(
        record, GEN, me=Me("me", "m1"), now=NOW, timing=TIMING, nonce="n", waiting=True, request=ours, since=NOW - 2
    )
    assert isinstance(d, Write) and d.kind is Kind.BECOME_WAITER
    assert (d.record.waiter.request, d.record.waiter.since, d.record.waiter.instance) == (ours, NOW - 2, "m1")
    same = protocol.decide_acquire(
        record, GEN, me=Me("me", "m1"), now=NOW, timing=TIMING, nonce="n", waiting=True, request=left, since=NOW - 2
    )
    assert isinstance(same, Wait), "a slot with our own request is ours: wait (or refresh it), as before"
