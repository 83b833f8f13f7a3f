"""The lock: :class:`HandoffLock`, its background scheduler, its events and ``steps()``.

Built on :mod:`handofflock.storage` and :mod:`handofflock.core`; knows nothing of the
edges (runner, CLI, OS signal handlers, preemption, fencing, integrations).
"""

from .handoff import HandoffLock, LockStatus, ReleaseRequest, RequestReason, default_owner_id
from .scheduler import Scheduler
from .steps import Steps

__all__ = ["HandoffLock", "LockStatus", "ReleaseRequest", "RequestReason", "Scheduler", "Steps", "default_owner_id"]
