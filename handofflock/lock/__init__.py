"""The lock: :class:`HandoffLock`, its background scheduler, its events and ``steps()``.

Built on :mod:`handofflock.storage` and :mod:`handofflock.core`; knows nothing of the
edges (runner, CLI, OS signal handlers, preemption, fencing, integrations).
"""

from .handoff import Acquired, HandoffLock, Steps
from .scheduler import Scheduler
from .types import LockStatus, ReleaseRequest, RequestReason, State, default_owner_id

__all__ = [
    "Acquired",
    "HandoffLock",
    "LockStatus",
    "ReleaseRequest",
    "RequestReason",
    "Scheduler",
    "State",
    "Steps",
    "default_owner_id",
]
