"""handofflock: a single-waiter cooperative handoff lock kept as one JSON object in GCS.

>>> from handofflock import HandoffLock
>>> with HandoffLock("gs://bucket/locks/train.json", ttl=60.0) as lock:
...     ...  # lock.release_requested turns True when a waiter asks; leaving hands off
"""

from typing import TYPE_CHECKING

from ._version import __version__
from .core.clock import Clock, FakeClock
from .core.errors import (
    AcquireCancelled,
    ConfigurationError,
    FencedObjectCorrupt,
    FencedObjectFull,
    FencedObjectTooLarge,
    HandoffLockError,
    InvalidKey,
    InvalidLockURL,
    LockContended,
    TokensExhausted,
    LockingUnsupported,
    LockLost,
    LockNotHeld,
    InheritedAcrossFork,
    LockRecordCorrupt,
    LockTimeout,
    NotFound,
    PreconditionFailed,
    StaleToken,
    StorageError,
    TransientStorageError,
)
from .fencing import FencedObject, FencedValue
from .lock import HandoffLock, LockStatus, ReleaseRequest, Scheduler, Steps
from .lock import events as signals
from .preemption import PreemptionWatcher
from .core.record import LockRecord
from .repair import ForcedRelease, force_release
from .os_signals import SignalHandlers, install_signal_handlers
from .core.timing import Timing

if TYPE_CHECKING:
    from .aio import AsyncHandoffLock, AsyncSteps

__all__ = [
    "Clock",
    "FakeClock",
    "FencedObject",
    "FencedValue",
    "ForcedRelease",
    "HandoffLock",
    "LockRecord",
    "LockStatus",
    "PreemptionWatcher",
    "ReleaseRequest",
    "Scheduler",
    "SignalHandlers",
    "Steps",
    "force_release",
    "install_signal_handlers",
    "signals",
    "AcquireCancelled",
    "ConfigurationError",
    "FencedObjectCorrupt",
    "FencedObjectFull",
    "FencedObjectTooLarge",
    "HandoffLockError",
    "InvalidKey",
    "InvalidLockURL",
    "LockContended",
    "TokensExhausted",
    "Timing",
    "LockingUnsupported",
    "LockLost",
    "LockNotHeld",
    "InheritedAcrossFork",
    "LockRecordCorrupt",
    "LockTimeout",
    "NotFound",
    "PreconditionFailed",
    "StaleToken",
    "StorageError",
    "TransientStorageError",
    "__version__",
]

# The async lock needs anyio (the ``async`` extra): imported on first use, so that the
# package itself never does; listed in __all__ where anyio is installed.
_LAZY = {"AsyncHandoffLock": "aio", "AsyncSteps": "aio"}

if __import__("importlib.util").util.find_spec("anyio") is not None:
    __all__ += list(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        from importlib import import_module

        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
