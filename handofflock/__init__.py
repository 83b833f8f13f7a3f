"""handofflock: a single-waiter cooperative handoff lock kept as one JSON object in GCS.

>>> from handofflock import HandoffLock
>>> with HandoffLock("gs://bucket/locks/train.json", ttl=60.0) as lock:
...     ...  # lock.release_requested turns True when a waiter asks; leaving hands off
"""

import importlib as _importlib
import importlib.util as _importlib_util
import logging as _logging
from typing import TYPE_CHECKING, Any

from . import metrics  # noqa: F401  (installs the OpenTelemetry hooks where the API is installed)
from ._version import __version__
from .core.clock import Clock
from .core.errors import (
    AcquireCancelled,
    AgreementFailed,
    AlreadyAcquired,
    ConfigurationError,
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
    StorageError,
    TokensExhausted,
    TransientStorageError,
)
from .core.record import Label, LockRecord
from .core.timing import Timing
from .fencing import FencedObject, FencedObjectCorrupt, FencedObjectFull, FencedObjectTooLarge, FencedValue, StaleToken
from .lock import HandoffLock, LockStatus, ReleaseRequest, RequestReason, Scheduler, Steps
from .lock import events as signals
from .os_signals import SignalHandlers, install_signal_handlers
from .preemption import PreemptionWatcher
from .repair import ForcedRelease, force_release
from .testing.clock import FakeClock

# A library configures no logging of its own: records go nowhere until the application
# configures logging (docs/observability.md lists the loggers and their fields).
_logging.getLogger("handofflock").addHandler(_logging.NullHandler())

if TYPE_CHECKING:
    from .aio import AsyncHandoffLock as AsyncHandoffLock
    from .aio import AsyncSteps as AsyncSteps

__all__ = [
    "AcquireCancelled",
    "AgreementFailed",
    "AlreadyAcquired",
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
    "Label",
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

# The async lock needs anyio (the ``async`` extra): imported on first use, so that the
# package itself never does; listed in __all__ where anyio is installed.
_LAZY = {"AsyncHandoffLock": "aio", "AsyncSteps": "aio"}

if _importlib_util.find_spec("anyio") is not None:
    __all__ += list(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(_importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
