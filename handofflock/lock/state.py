"""The states of a :class:`~handofflock.lock.handoff.HandoffLock`, as an Enum (as ``protocol.Kind`` is).

A ``str``: ``State.HELD == "held"``, and ``repr(lock)`` shows the value.

======================  =============================================================
``IDLE``                holds nothing, acquires nothing
``WAITING``             an ``acquire()`` runs (reading, waiting as the single waiter)
``HELD``                holds the lock: renewed and checked in the background
``RELEASING``           a release whose write failed transiently: retried in the
                        background (and by ``release()``) until it lands or the
                        lease runs out; not renewed, not held for the user
``LOST``                the hold was lost; ``release()`` or ``acquire()`` ends it
``FORKED``              inherited across ``fork()``: in the child it holds nothing
                        and does nothing
======================  =============================================================
"""

from __future__ import annotations

import enum


class State(str, enum.Enum):
    """Where a lock instance is in its life. Stable strings: they appear in ``repr`` and logs."""

    IDLE = "idle"
    WAITING = "waiting"
    HELD = "held"
    RELEASING = "releasing"
    LOST = "lost"
    FORKED = "forked"
