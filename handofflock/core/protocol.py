"""What the lock writes next, and why. Pure: no I/O, no threads, no clock reads.

Every function takes what was just read (the record and its generation, or
``None`` and 0 for an absent object), who we are (one :class:`Me`), the
wall-clock ``now`` and the lock's :class:`~handofflock.core.timing.Timing`, and returns one :class:`Write`
(exactly one conditional write, preconditioned on the generation just read, or
0 to create) or a non-writing outcome. The lock
(:mod:`handofflock.lock.handoff`) performs the write; if its precondition
fails it reads again and asks again. Nothing here trusts a read on its own: every change of
state is a generation-matched write.

Two clocks disagree by up to ``max_clock_skew``. The rules lean the safe way:

* A contender treats the owner's lease as expired only after
  ``expiresAt + max_clock_skew``; everyone but the owner defers to a waiter
  until ``waiterExpiresAt + max_clock_skew``.
* The owner acts on a waiter (notice, handoff) only while the waiter's slot is
  live by the owner's own clock, so it never hands the lock to a waiter that has
  probably given up.
* The owner judges its own safety by its monotonic clock, not by ``expiresAt``
  (see :class:`handofflock.lock.handoff.Lease`): it considers itself lost
  ``renew_deadline`` after its last successful renewal, which is well before
  ``expiresAt``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import TypeGuard, TypeVar

from . import buggify
from .errors import TokensExhausted
from .record import ASKING, MAX_TOKEN, MAX_TTL, Holder, Label, LockRecord, Waiter, WaiterRequest
from .timing import Timing


@dataclass(frozen=True)
class Me:
    """Who is deciding: the lock's ``owner_id``, its ``instance`` and its ``label``, as one value.

    A party is the pair (``owner_id``, ``instance``): ``instance`` (random per
    lock object) tells apart two instances that share a stable owner id (a
    restart and its predecessor, or two jobs that derived one id), and each is
    another party to the other. ``label`` is written beside our id as owner or waiter.
    ``yields`` is False for a holder that must not be cut short: it declines
    waiters' requests, and says so in the record at each renewal
    (``declinedWaiter``).
    """

    owner_id: str
    instance: str | None = None
    label: Label | None = None
    yields: bool = True


class Kind(str, enum.Enum):
    """Why a write is made. Stable strings: they appear in logs and history."""

    CREATE = "create"  # the object is absent: create it owned by me
    TAKE = "take"  # free or expired, and no live waiter but me: take it
    RETAKE = "retake"  # the record names this very instance as owner, not held by it: take it back, new token
    BECOME_WAITER = "become_waiter"  # held by a live owner, waiter slot empty or expired
    REFRESH_WAITER = "refresh_waiter"  # I am the waiter and my slot is half used up
    GIVE_UP_WAIT = "give_up_wait"  # I was the waiter and stop waiting: clear the slot
    RENEW = "renew"  # I own it: push expiresAt forward, keep the waiter fields as read
    HANDOFF = "handoff"  # releasing with a live waiter: it becomes the owner, in one write
    FREE = "free"  # releasing with no live waiter: ownerId = null, the object stays


@dataclass(frozen=True)
class Write:
    """Make exactly this conditional write."""

    kind: Kind
    record: LockRecord
    if_generation_match: int
    #: The wall time from which this decision no longer holds if it has not been sent (None: it holds
    #: however late it goes): a write waits for the write gate, the I/O mutex and retries after it is made.
    until: float | None = None


@dataclass(frozen=True)
class Owned:
    """No write needed: the record already names me as owner (a handoff was made to me)."""

    record: LockRecord
    generation: int


@dataclass(frozen=True)
class Wait:
    """Nothing to write now; read again later. ``why`` is for logs."""

    why: str


@dataclass(frozen=True)
class Contended:
    """Held by someone else and the single waiter slot is someone else's."""

    record: LockRecord


@dataclass(frozen=True)
class Lost:
    """The lock is not mine any more (or never became mine). Write nothing."""

    why: str
    record: LockRecord | None


@dataclass(frozen=True)
class Released:
    """Evidence that an earlier release of ours already landed; write nothing more."""

    handed_off_to: str | None


Decision = Write | Owned | Wait | Contended | Lost | Released


def next_token(record: LockRecord | None, now: float) -> int:
    """The fencing token for a new owner.

    Strictly greater than the record's token. Creation (no record to continue
    from) starts at the creator's wall clock in milliseconds, so a lock object
    deleted and recreated still continues ahead of the old sequence unless that
    happens within the clock skew; see docs/design.md.
    """
    floor = 0 if record is None else record.token
    if floor >= MAX_TOKEN:
        raise TokensExhausted(
            f"the lock's fencing token is {floor}, the largest a fenced resource can store (2**63-1): no new owner "
            "can be given a higher one. Somebody wrote this token by hand; fenced resources must be reset with the lock"
        )
    return min(MAX_TOKEN, max(floor + 1, int(now * 1000)))


def _owned_by(
    record: LockRecord, owner: Holder, now: float, ttl: float, token: int, nonce: str, min_hold: float | None
) -> LockRecord:
    """``record`` with ``owner`` in the owner's place (a hold beginning ``now``, a lease of ``ttl``), no waiter."""
    return record.replace(
        owner=owner, waiter=None, ttl=ttl, token=token, nonce=nonce, declined=False, held_since=now, min_hold=min_hold
    )


def _taken(record: LockRecord | None, me: Me, now: float, timing: Timing, nonce: str) -> LockRecord:
    """``record`` (or a new one) with ``me`` as its new owner, a lease of ``ttl`` from ``now``, the next token."""
    mine = Holder(me.owner_id, now + timing.ttl, instance=me.instance, label=me.label)
    return _owned_by(
        record or LockRecord(), mine, now, timing.ttl, next_token(record, now), nonce, timing.min_hold or None
    )


def _takes_slot(request: WaiterRequest, since: float | None, waiter: Waiter) -> bool:
    """Whether a request of ``request``'s rank, waiting since ``since``, takes the slot from the live ``waiter``.

    A higher rank takes it; at equal rank the waiter that began waiting earlier (by its own wall
    clock, so in true order up to the skew between the two) takes it from a later one. A waiter
    that does not say when it began (an older version's) keeps the slot against an equal rank.
    """
    if request.rank != waiter.request.rank:
        return request.rank > waiter.request.rank
    return since is not None and waiter.since is not None and since < waiter.since


_Place = TypeVar("_Place", Holder, Waiter)


def _is(place: _Place | None, me: Me) -> TypeGuard[_Place]:
    """Whether ``place`` in a record names ``me``: the same owner id and the same instance.

    A place with our owner id but another instance, or none (a record written
    by an implementation that does not write instances), is another party's:
    a restarted job's predecessor, or a second live job that derived the same
    id. Only its lease running out, or a handoff, gives it to us.
    """
    return place is not None and place.id == me.owner_id and place.instance == me.instance


def restamp(write: Write, *, now: float, nonce: str, timing: Timing) -> Write | None:
    """The same write, its lease or slot counted from ``now`` (the moment it is sent), with a new nonce;
    None if at ``now`` the decision no longer holds (:attr:`Write.until`): read and decide again.

    A write that waited for the store's write spacing, or is retried after a
    transient error, goes out later than it was decided: its ``expiresAt`` (or
    ``waiterExpiresAt``) must date from the send, so the lease others see and
    the one the writer counts on start together. And what it decided must
    still be true then: a handoff goes only to a slot still live as it is
    sent, and a registration only under an owner whose lease has not ended
    (the lock is to be taken then). Every other kind holds however late it goes: a take or a
    create only becomes more right as time passes, a renewal or a free keeps what it read.
    """
    if write.until is not None and now >= write.until:
        return None
    r = write.record.replace(nonce=nonce)
    if write.kind in (Kind.CREATE, Kind.TAKE, Kind.RETAKE, Kind.RENEW, Kind.HANDOFF):
        assert r.owner is not None and r.ttl is not None
        since = r.held_since if write.kind is Kind.RENEW else now  # a new hold begins as its write is sent
        r = r.replace(owner=replace(r.owner, expires_at=now + r.ttl), held_since=since)
    elif write.kind in (Kind.BECOME_WAITER, Kind.REFRESH_WAITER):
        assert r.waiter is not None
        r = r.replace(waiter=replace(r.waiter, expires_at=now + timing.waiter_ttl))
    return Write(write.kind, r, write.if_generation_match, write.until)


def suspect_lease(record: LockRecord | None, observed_at: float, timing: Timing) -> bool:
    """Whether the owner's ``expiresAt`` lies further ahead of ``observed_at`` than its ttl and the skew allow.

    No owner writes that (a lease is ``now + ttl`` when sent); a hand-made
    record, a host whose clock was years ahead, or a bug did. Such a lease is
    not trusted for its length: see :func:`lease_end`.
    """
    if record is None or record.owner is None:
        return False
    return record.owner.expires_at > observed_at + _writers_ttl(record) + timing.max_clock_skew


def _writers_ttl(record: LockRecord) -> float:
    """The ttl the owner's lease was written with: the record's, or for a record of the original design
    (no ``ttl`` field) the longest any writer may use (``MAX_TTL``, a week), never the reader's own: a
    writer with a longer ttl than ours renews less often, and its lease is live all the same."""
    return record.ttl if record.ttl is not None else MAX_TTL


def lease_end(record: LockRecord, observed_at: float, timing: Timing) -> float | None:
    """When the owner's lease ends, for a contender that first saw it (owner, token, expiresAt) at ``observed_at``.

    ``expiresAt``, unless it is suspect (:func:`suspect_lease`): then the
    reader's own observation bounds it, as client-go's ``observedTime`` does,
    at ``observed_at + ttl`` (and contenders add the skew, as for any lease).
    A live owner renews, which moves ``expiresAt`` and starts a new
    observation, so only a lease nobody renews runs out this way. Nothing is rewritten: the
    lease is taken only by the usual conditional write once it has ended.
    """
    if suspect_lease(record, observed_at, timing):
        return observed_at + _writers_ttl(record)
    return record.expires_at


def decide_acquire(
    record: LockRecord | None,
    generation: int,
    *,
    me: Me,
    now: float,
    timing: Timing,
    nonce: str,
    waiting: bool,
    request: WaiterRequest = ASKING,
    observed_at: float | None = None,
    since: float | None = None,
) -> Decision:
    """The next step of ``acquire()``. ``me.label`` goes into the record beside our id (as owner or waiter).

    ``waiting`` says whether we registered as the waiter during this acquire
    (a record naming us, this very instance, as owner then means the owner
    handed the lock to us). ``request`` is what we want as waiter: whether
    the holder is asked, and our rank for the slot. A request that outranks
    the live waiter's (higher priority; at equal priority, asking over
    patient) takes the slot from it while the owner is live, a lower one
    never does, and at equal rank an older request (``since``: when this
    acquire began waiting, by our wall clock) takes it from a younger one (see
    docs/design.md, *Sharing the slot* and *Waiting your turn*).
    ``observed_at`` is when this acquire first read the owner's lease as it
    stands (owner, token, ``expiresAt``; a waiter's writes do not change it),
    ``now`` if not given: it bounds a suspect lease (:func:`lease_end`).
    """
    skew = timing.max_clock_skew
    if record is None:
        return Write(Kind.CREATE, _taken(None, me, now, timing, nonce), 0)

    owner, waiter = record.owner, record.waiter
    if _is(owner, me):
        if waiting and (now < owner.expires_at or buggify.on(buggify.EXPIRED_HANDOFF_ACCEPTED)):
            # Handed to this instance, and the lease the old owner wrote is still running by our clock.
            return Owned(record, generation)
        # The record names this very instance as owner, a hold it does not count on: a handoff whose
        # lease ran out while we were paused, or an earlier hold of this lock object that it stopped
        # counting on. Nobody else holds it: take it back with a new token, keeping a live waiter's slot.
        taken = _taken(record, me, now, timing, nonce)
        if record.waiter_live(now, skew) and not _is(waiter, me):
            taken = taken.replace(waiter=waiter)
        return Write(Kind.RETAKE, taken, generation)

    # An owner or a waiter with our owner id but another instance is another party: a restarted job's
    # predecessor, alive or not, or a second job that derived the same id. Its lease and its slot are
    # waited for as anyone's; we cannot tell a paused process from a dead one.
    mine = _is(waiter, me)
    other_waiter_live = record.waiter_live(now, skew) and not mine

    end = lease_end(record, now if observed_at is None else observed_at, timing)
    if owner is None or end is None or now > end + skew:
        # Free, or the owner's lease is over (even allowing for skew).
        if other_waiter_live:
            return Contended(record)  # the live waiter has priority; only it may take the lock
        return Write(Kind.TAKE, _taken(record, me, now, timing, nonce), generation)

    # A live owner holds it. Our slot with another request is an earlier acquire's, left behind: written anew below.
    if _is(waiter, me) and waiter.request == request:
        if now >= waiter.expires_at - timing.waiter_ttl / 2:
            refreshed = replace(waiter, expires_at=now + timing.waiter_ttl)
            return Write(Kind.REFRESH_WAITER, record.replace(waiter=refreshed, nonce=nonce), generation, end + skew)
        return Wait(f"waiting for {owner.id} to release or hand off")
    if other_waiter_live and waiter is not None and not _takes_slot(request, since, waiter):
        return Contended(record)
    # The slot is empty or expired, or ours outranks the live waiter's request (or is as high and older):
    # write ourselves, our request and a fresh slot into it. A displaced waiter finds the slot taken at
    # its next poll and waits for it again.
    slot = Waiter(
        me.owner_id,
        now + timing.waiter_ttl,
        ttl=timing.ttl,
        instance=me.instance,
        label=me.label,
        request=request,
        since=since,
    )
    # Sent once the owner's lease has ended, it would wait for nobody: the lock is to be taken then.
    return Write(Kind.BECOME_WAITER, record.replace(waiter=slot, nonce=nonce, declined=False), generation, end + skew)


def registered(record: LockRecord | None, me: Me) -> TypeGuard[LockRecord]:
    """Whether ``record``, owned by someone else, names this very instance (``me``) as its waiter.

    An acquire that has not yet seen its registration asks this of each read:
    a registration whose reply was lost, after which the record moved on
    before we read it back, landed all the same, and we are the waiter.
    """
    return record is not None and not _is(record.owner, me) and _is(record.waiter, me)


def decide_give_up_wait(
    record: LockRecord | None,
    generation: int,
    *,
    me: Me,
    now: float,
    timing: Timing,
    nonce: str,
    pending: int | None = None,
) -> Decision:
    """Stop waiting: clear our waiter slot if it is still ours.

    If the owner handed the lock to us in the meantime we own it: the caller
    decides whether to keep it (a timeout that raced a handoff) or release it.
    If the lease it handed over has already run out (we were paused), there is
    nothing safe to keep: release it, as its owner, at once.

    ``pending``: the generation an unanswered write of ours (a registration, a
    take) was conditioned on. A store may apply a request after its client cut
    it off, so while the object is still at that generation the write may yet
    land, after we have left: we write the record again as it stands (a free
    one in place of an absent object), which changes nothing but the
    generation, and the late write fails its precondition.
    """
    ours = record is not None and (_is(record.owner, me) or _is(record.waiter, me))
    if pending is not None and pending == generation and not ours:
        same = LockRecord() if record is None else record
        return Write(Kind.GIVE_UP_WAIT, same.replace(nonce=nonce), generation)
    if record is None:
        return Wait("the lock object is gone; no slot to give back")
    if _is(record.owner, me):
        if now < record.owner.expires_at:
            return Owned(record, generation)
        return decide_release(record, generation, me=me, token=record.token, now=now, timing=timing, nonce=nonce)
    if not _is(record.waiter, me):
        return Wait("the waiter slot is not ours; nothing to give back")
    return Write(
        Kind.GIVE_UP_WAIT,
        record.replace(waiter=None, declined=False, nonce=nonce),
        buggify.match(buggify.GIVE_UP_WITHOUT_MATCH, generation),
    )


def decide_renew(
    record: LockRecord | None, generation: int, *, me: Me, token: int, now: float, timing: Timing, nonce: str
) -> Decision:
    """Push our lease forward, keeping the waiter as read.

    A holder that does not yield (``me.yields`` False) writes that it declines
    the live asking waiter's request (``declinedWaiter``), so ``status`` can
    say so; one that yields never claims a decline. The holder's minimum hold
    (``minHold``) is written with each renewal: a hold handed to us carries
    none until our first one.
    """
    if (lost := _check_still_mine(record, me, token)) is not None:
        return lost
    assert record is not None and record.owner is not None
    declined = not me.yields and _asking_waiter(record, me, now) is not None
    owner = replace(record.owner, expires_at=now + timing.ttl)
    renewed = record.replace(
        owner=owner, ttl=timing.ttl, nonce=nonce, declined=declined, min_hold=timing.min_hold or None
    )
    renewed = renewed.replace(waiter=None) if buggify.on(buggify.RENEWAL_DROPS_WAITER) else renewed
    return Write(Kind.RENEW, renewed, buggify.match(buggify.UNCONDITIONAL_RENEWAL, generation))


def decide_release(
    record: LockRecord | None,
    generation: int,
    *,
    me: Me,
    token: int,
    now: float,
    timing: Timing,
    nonce: str,
    attempted: Write | None = None,
    within_lease: bool = False,
) -> Decision:
    """Release: hand off to a live waiter in one write, or mark the lock free.

    ``attempted`` is our previous release write whose outcome is unknown (its
    reply was lost, or its retry failed its precondition). If the record shows
    that write's effect, it landed and there is nothing left to do. If the
    record has moved on to another owner while we were still ``within_lease``
    (inside our own safety window, so nobody could have taken the lock from
    us), only our release can have let them in: it landed too. Otherwise a
    record that is no longer ours is never touched.
    """
    if attempted is not None and record is not None:
        # The heir named by a handoff, None for a free: the owner the record shows if that write landed.
        landed, heir, owner_now = attempted.record, attempted.record.owner_id, record.owner_id
        if (owner_now == heir and record.token == landed.token) or (
            within_lease and not _is(record.owner, me) and record.token >= landed.token
        ):
            return Released(handed_off_to=heir)
    if (lost := _check_still_mine(record, me, token)) is not None:
        return lost
    assert record is not None
    waiter = record.waiter
    live = record.waiter_live(now) or buggify.on(buggify.HANDOFF_TO_EXPIRED_SLOT)
    if live and waiter is not None and not _is(waiter, me):
        # The heir's lease is the one it asked for (waiterTtl), never ours: an heir with a longer
        # ttl than ours must not start with a lease it would count as already half gone.
        ttl = timing.ttl if buggify.on(buggify.HEIR_GETS_OWNER_TTL) else waiter.ttl or timing.ttl
        heir_holder = Holder(waiter.id, now + ttl, instance=waiter.instance, label=waiter.label)
        token = record.token if buggify.on(buggify.HEIR_KEEPS_OLD_TOKEN) else next_token(record, now)
        handed = _owned_by(record, heir_holder, now, ttl, token, nonce, None)  # the heir writes its own minHold
        # Only to a slot live as the write is sent (the planted bug hands to one that had ended already).
        until = waiter.expires_at if record.waiter_live(now) else None
        return Write(Kind.HANDOFF, handed, buggify.match(buggify.UNCONDITIONAL_HANDOFF, generation), until)
    kept = waiter if record.waiter_live(now, timing.max_clock_skew) else None
    freed = record.replace(owner=None, waiter=kept, declined=False, nonce=nonce, held_since=None, min_hold=None)
    return Write(Kind.FREE, freed, buggify.match(buggify.UNCONDITIONAL_HANDOFF, generation))


@dataclass(frozen=True)
class WaiterSeen:
    """A live waiter other than us, as the owner's check loop sees it.

    ``acts_at``: the end of our minimum hold (wall clock), when it lies ahead:
    the request is in the record but is acted on only then (None: now).
    ``write_decline``: we do not yield and the record does not say so yet:
    write the decline now (a renewal), not at the next one.
    """

    waiter_id: str
    deadline: float
    acts_at: float | None = None
    write_decline: bool = False


def observe_as_owner(
    record: LockRecord | None, *, me: Me, token: int, now: float, min_hold: float = 0.0
) -> Lost | WaiterSeen | None:
    """The owner's read-only check: still mine? Is someone waiting and asking?

    A patient waiter (``waiterRequest.asks`` false) is not a request: it is
    seen as no waiter here, so the holder is never told of it (the release
    still hands the lock to it, being the waiter). A request that comes within
    ``min_hold`` of the hold's start (``heldSince``) waits until then
    (:attr:`WaiterSeen.acts_at`); a holder that does not yield declines it at once.
    """
    if (lost := _check_still_mine(record, me, token)) is not None and not buggify.on(buggify.OWNER_MISSES_TAKE):
        return lost
    assert record is not None
    seen = _asking_waiter(record, me, now)
    if seen is None:
        return None
    if not me.yields:
        return replace(seen, write_decline=not record.declined)
    if record.held_since is not None and now < record.held_since + min_hold:
        return replace(seen, acts_at=record.held_since + min_hold)
    return seen


def _asking_waiter(record: LockRecord, me: Me, now: float) -> WaiterSeen | None:
    """The live waiter other than us, by the owner's clock, if it asks for the lock."""
    waiter = record.waiter
    if waiter is not None and not _is(waiter, me) and waiter.live(now) and waiter.request.asks:
        return WaiterSeen(waiter.id, waiter.expires_at)
    return None


def _check_still_mine(record: LockRecord | None, me: Me, token: int) -> Lost | None:
    if buggify.on(buggify.TRUST_A_READ) and record is not None:
        return None
    if record is None:
        return Lost("the lock object was deleted", None)
    owner = record.owner
    if owner is None or owner.id != me.owner_id:
        who = "nobody" if owner is None else repr(owner.id)
        return Lost(f"the lock is now owned by {who}", record)
    if buggify.on(buggify.STILL_MINE_BY_ID):
        return None
    if not _is(owner, me):
        return Lost(f"the lock was taken by another instance with our id ({owner.instance})", record)
    if record.token != token:
        return Lost(f"the lock was retaken by this instance with token {record.token} (ours is {token})", record)
    return None
