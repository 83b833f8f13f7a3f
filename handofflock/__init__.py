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
    InheritedAcrossFork,
    InvalidKey,
    InvalidLockURL,
    LockContended,
    LockingUnsupported,
    LockLost,
    LockNotHeld,
    LockRecordCorrupt,
    LockTimeout,
    NotFound,
    PreconditionFailed,
    StaleToken,
    StorageError,
    TokensExhausted,
    TransientStorageError,
)
from .core.record import LockRecord
from .core.timing import Timing
from .fencing import FencedObject, FencedValue
from .lock import HandoffLock, LockStatus, ReleaseRequest, RequestReason, Scheduler, Steps
from .lock import events as signals
from .os_signals import SignalHandlers, install_signal_handlers
from .preemption import PreemptionWatcher
from .repair import ForcedRelease, force_release

__all__ = [
    "AcquireCancelled",
    "AgreementFailed",
    "Clock",
    "ConfigurationError",
    "FakeClock",
    "FencedObject",
    "FencedObjectCorrupt",
    "FencedObjectFull",
    "FencedObjectTooLarge",
    "FencedValue",
    "ForcedRelease",
    "HandoffLock",
    "HandoffLockError",
    "InheritedAcrossFork",
    "InvalidKey",
    "InvalidLockURL",
    "LockContended",
    "LockLost",
    "LockNotHeld",
    "LockRecord",
    "LockRecordCorrupt",
    "LockStatus",
    "LockTimeout",
    "LockingUnsupported",
    "NotFound",
    "PreconditionFailed",
    "PreemptionWatcher",
    "ReleaseRequest",
    "RequestReason",
    "Scheduler",
    "SignalHandlers",
    "StaleToken",
    "Steps",
    "StorageError",
    "Timing",
    "TokensExhausted",
    "TransientStorageError",
    "__version__",
    "force_release",
    "install_signal_handlers",
    "signals",
]
