"""Test tooling for code that uses handofflock (needs the ``[test]`` extra); not part of the runtime.

- :class:`FakeGCSServer` (:mod:`handofflock.testing.emulator`) runs the bundled GCS emulator on 127.0.0.1;
  :class:`ExternalEmulator` wraps one named by ``STORAGE_EMULATOR_HOST``.
- :class:`FaultProxy` (:mod:`handofflock.testing.faultproxy`) goes between a client and the emulator
  and injects faults (worded as GCS's or, with ``dialect="s3"``, as S3's errors).
- :class:`MotoS3Server` (:mod:`handofflock.testing.s3server`) runs moto's S3 server on 127.0.0.1.
- :class:`FakeClock` (:mod:`handofflock.testing.clock`) is the clock for deterministic tests.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .clock import FakeClock

if TYPE_CHECKING:
    from .emulator import ExternalEmulator, FakeGCSServer
    from .faultproxy import FaultProxy, emulator_env
    from .s3server import MotoS3Server

__all__ = ["ExternalEmulator", "FakeClock", "FakeGCSServer", "FaultProxy", "MotoS3Server", "emulator_env"]

# Imported on first use, so that ``python -m handofflock.testing.emulator`` runs the
# module once, as __main__, instead of after a first import by this package.
_LAZY = {
    "ExternalEmulator": "emulator",
    "FakeGCSServer": "emulator",
    "FaultProxy": "faultproxy",
    "emulator_env": "faultproxy",
    "MotoS3Server": "s3server",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
