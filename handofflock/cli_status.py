"""How the CLI shows a lock's status: ``status`` as text or JSON, one ``watch`` line's parts.

Pure functions of a :class:`~handofflock.lock.types.LockStatus` and a time: no I/O, so
``cli.py`` (which reads) and tests (which compare) share one rendering.
"""

from __future__ import annotations

from typing import Any

from .core.timefmt import iso, when
from .lock.types import LockStatus


def status_json(st: LockStatus, now: float | None = None) -> dict[str, Any]:
    """``LockStatus.to_json()`` plus ``state``, seconds left and ISO times: the stable shape of ``status --json``.

    ``releaseRequested`` is True while a live waiter that asks is registered
    (the holder is told within its waiter check interval; a patient waiter,
    ``waiterAsks`` false, does not ask); ``releaseRequestedBy`` names it (its
    label, else its id); ``releaseDeclined`` is True once the holder has
    declined it (``run --no-yield``).
    """
    now = st.read_at if now is None else now
    doc = st.to_json()
    doc["state"] = state_of(st, now)
    doc["expiresIn"] = None if st.expires_at is None else round(st.expires_at - now, 3)
    doc["waiterExpiresIn"] = None if st.waiter_expires_at is None else round(st.waiter_expires_at - now, 3)
    doc["expiresAtIso"] = iso(st.expires_at)
    doc["waiterExpiresAtIso"] = iso(st.waiter_expires_at)
    doc["readAtIso"] = iso(st.read_at)
    requested = release_requested(st, now)
    doc["releaseRequested"] = requested
    doc["releaseRequestedBy"] = who_of(st.waiter_id, st.waiter_label) if requested else None
    return doc


def release_requested(st: LockStatus, now: float) -> bool:
    return (
        state_of(st, now) == "held"
        and st.waiter_id is not None
        and st.waiter_expires_at is not None
        and now <= st.waiter_expires_at
        and st.waiter_asks
    )


def who_of(ident: str | None, label: Any) -> str:
    """``label (id)``, or the id alone when there is no label."""
    if ident is None:
        return "-"
    return f"{label.text} ({ident})" if label is not None else ident


def state_of(st: LockStatus, now: float) -> str:
    if not st.exists:
        return "absent"
    if st.owner_id is None:
        return "free"
    return "held" if st.expires_at is not None and now <= st.expires_at else "expired"


def time_left(ts: float | None, now: float) -> str:
    if ts is None:
        return "-"
    left = ts - now
    return f"{left:.1f} s left, until {iso(ts)}" if left >= 0 else f"ran out {-left:.1f} s ago, at {iso(ts)}"


def status_text(st: LockStatus, now: float | None = None) -> str:
    now = st.read_at if now is None else now
    state = state_of(st, now)
    lines = [st.url]
    if state == "absent":
        lines.append("  state       absent: no lock object yet (the first acquire creates it)")
        return "\n".join(lines)
    owner = {
        "free": "free: nobody holds it",
        "held": f"held, lease live ({time_left(st.expires_at, now)})",
        "expired": f"expired: the lease {time_left(st.expires_at, now)}; the next acquire takes it",
    }[state]
    lines.append(f"  state       {owner}")
    lines.append(f"  owner       {who_of(st.owner_id, st.owner_label) if st.owner_id else '-'}")
    if st.expires_at is not None:
        lines.append(f"  expires     {when(st.expires_at, now)}")
    if st.lease_suspect:
        lines.append(
            "  suspect     the lease claims more than its ttl plus the skew allowance: not trusted; "
            "an acquirer counts it as ending ttl after it first reads this record, unless the owner renews"
        )
    waiter = who_of(st.waiter_id, st.waiter_label)
    if st.waiter_id is None:
        lines.append("  waiter      none")
    else:
        live = "live" if st.waiter_live else "gone"
        kind = ("" if st.waiter_asks else "patient, ") + (
            f"priority {st.waiter_priority}, " if st.waiter_priority else ""
        )
        lines.append(f"  waiter      {waiter} ({kind}{live}, {time_left(st.waiter_expires_at, now)})")
    if release_requested(st, now) and st.declined:
        lines.append(f"  release     asked by {waiter}, declined (the holder does not yield)")
    elif release_requested(st, now):
        grace = st.owner_label.grace if st.owner_label is not None else None
        lines.append(
            f"  release     requested by {waiter}"
            + (f"; the holder allows its work {grace:g} s to stop" if grace is not None else "")
        )
    elif state == "held" and st.waiter_live and not st.waiter_asks:
        lines.append("  release     not requested: the waiter waits for the holder to finish")
    elif state == "held":
        lines.append("  release     not requested")
    lines.append(f"  token       {st.token}")
    lines.append(f"  generation  {st.generation}")
    if st.ttl is not None:
        lines.append(f"  ttl         {st.ttl:g} s")
    lines.append(f"  read at     {iso(st.read_at)}")
    return "\n".join(lines)
