"""handofflock: a single-waiter cooperative handoff lock kept as one JSON object in GCS."""

from .errors import (
    AcquireCancelled,
    ConfigurationError,
    HandoffLockError,
    InvalidKey,
    InvalidLockURL,
    LockContended,
    LockLost,
    LockNotHeld,
    LockRecordCorrupt,
    LockTimeout,
    NotFound,
    PreconditionFailed,
    StaleToken,
    StorageError,
    TransientStorageError,
)

__version__ = "0.1.0"

__all__ = [
    "AcquireCancelled",
    "ConfigurationError",
    "HandoffLockError",
    "InvalidKey",
    "InvalidLockURL",
    "LockContended",
    "LockLost",
    "LockNotHeld",
    "LockRecordCorrupt",
    "LockTimeout",
    "NotFound",
    "PreconditionFailed",
    "StaleToken",
    "StorageError",
    "TransientStorageError",
    "__version__",
]
