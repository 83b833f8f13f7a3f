"""handofflock: a single-waiter cooperative handoff lock kept as one JSON object in GCS.

>>> from handofflock import HandoffLock
>>> with HandoffLock("gs://bucket/locks/train.json", ttl=60.0) as lock:
...     ...  # lock.release_requested turns True when a waiter asks; leaving hands off
"""

from ._version import __version__
from .core.clock import Clock, FakeClock
from .core.errors import (
    AcquireCancelled,
    AgreementFailed,
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
    "AgreementFailed",
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
