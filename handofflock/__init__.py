"""handofflock: a single-waiter cooperative handoff lock kept as one JSON object in GCS.

>>> from handofflock import HandoffLock
>>> with HandoffLock("gs://bucket/locks/train.json", ttl=60.0) as lock:
...     ...  # lock.release_requested turns True when a waiter asks; leaving hands off
"""

import logging as _logging

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
from .lock import logfields as _logfields

# A library configures no logging of its own: records go nowhere until the application
# configures logging (docs/observability.md lists the loggers and their fields).
_logging.getLogger("handofflock").addHandler(_logging.NullHandler())
_logfields.install()

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
