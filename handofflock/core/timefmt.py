"""Times for people: an ISO 8601 date-time (UTC) and an age, the way ``status``, ``watch`` and errors print them."""

from __future__ import annotations

import datetime
import math


def iso(ts: float | None) -> str | None:
    """``ts`` (Unix time) as ``2026-11-23T09:43:57.123Z``; None for None (and for no finite time)."""
    if ts is None or not math.isfinite(ts):
        return None
    try:
        when = datetime.datetime.fromtimestamp(ts, tz=datetime.timezone.utc)
    except (OverflowError, OSError, ValueError):
        return None
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"


def age(seconds: float) -> str:
    """A duration for people: ``4.2 s``, ``12 min 5 s``, ``3 h 20 min``, ``41 days``."""
    seconds = abs(seconds)
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {int(seconds % 60)} s"
    if seconds < 2 * 86400:
        return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60)} min"
    return f"{seconds / 86400:.0f} days"


def when(ts: float | None, now: float) -> str:
    """``ts`` with its age: ``2026-11-23T09:44:41.000Z (in 44.0 s)`` or ``... (3.0 s ago)``; ``never`` for None."""
    stamp = iso(ts)
    if ts is None or stamp is None:
        return "never"
    return f"{stamp} ({'in ' + age(ts - now) if ts >= now else age(now - ts) + ' ago'})"


def who(ident: str | None, label: str | None) -> str:
    """A party as people know it: ``label (id)``, the id alone without a label, ``nobody`` for None.

    What ``handofflock status`` shows; errors and ``run``'s messages say the same.
    """
    if ident is None:
        return "nobody"
    return f"{label} ({ident})" if label else ident
