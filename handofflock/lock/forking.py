"""Fork handling: in a forked child, every lock inherited from the parent holds nothing and does nothing.

The parent's lease, renewals and release are the parent's business; a child
that released or renewed them (an inherited ``release_at_exit`` hook, say)
would take the lock from under the parent, or hand it on while the parent
still works. Each lock registers here when it is made; after a fork, in the
child, each one is asked to reset itself (``_after_fork``): it replaces its
lease, its request book and its primitives (a mutex may have been held by a
parent thread that does not exist in the child) as whole objects.

A seam because ``os.register_at_fork`` is process-wide and runs once per
fork, while what a reset means is each lock's own affair.
"""

from __future__ import annotations

import os
import weakref
from typing import Protocol


class Forkable(Protocol):
    """A lock that can be told it is now in a forked child."""

    def _after_fork(self) -> None:
        """In the child: hold nothing, do nothing, refuse every operation (InheritedAcrossFork)."""
        ...


#: Every live lock, so that a forked child can disarm those it inherited.
_INSTANCES: weakref.WeakSet[Forkable] = weakref.WeakSet()


def register(lock: Forkable) -> None:
    """Disarm ``lock`` in any child forked from this process from now on."""
    _INSTANCES.add(lock)


def _disarm_inherited() -> None:
    for lock in list(_INSTANCES):
        # A private method on purpose: the lock resets itself; this module only knows when.
        lock._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_disarm_inherited)
