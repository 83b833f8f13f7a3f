"""Test tooling for code that uses handofflock (needs the ``[test]`` extra); not part of the runtime.

- :class:`FakeGCSServer` (:mod:`handofflock.testing.emulator`) runs the bundled GCS emulator on 127.0.0.1;
  :class:`ExternalEmulator` wraps one named by ``STORAGE_EMULATOR_HOST``.
- :class:`FaultProxy` (:mod:`handofflock.testing.faultproxy`) goes between a client and the emulator
  and injects faults.
- :class:`~handofflock.core.clock.FakeClock` is the clock for deterministic tests.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ..core.clock import FakeClock

if TYPE_CHECKING:
    from .emulator import ExternalEmulator, FakeGCSServer
    from .faultproxy import FaultProxy, emulator_env

__all__ = ["ExternalEmulator", "FakeClock", "FakeGCSServer", "FaultProxy", "emulator_env"]

# Imported on first use, so that ``python -m handofflock.testing.emulator`` runs the
# module once, as __main__, instead of after a first import by this package.
_LAZY = {
    "ExternalEmulator": "emulator",
    "FakeGCSServer": "emulator",
    "FaultProxy": "faultproxy",
    "emulator_env": "faultproxy",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
