"""Test tooling for code that uses handofflock (needs the ``[test]`` extra); not part of the runtime.

- :class:`FakeGCSServer` (:mod:`handofflock.testing.emulator`) runs the bundled GCS emulator on 127.0.0.1;
  :class:`ExternalEmulator` wraps one named by ``STORAGE_EMULATOR_HOST``.
- :class:`FaultProxy` (:mod:`handofflock.testing.faultproxy`) goes between a client and the emulator
  and injects faults (worded as GCS's or, with ``dialect="s3"``, as S3's errors).
- :class:`MotoS3Server` (:mod:`handofflock.testing.s3server`) runs moto's S3 server on 127.0.0.1.
- :class:`~handofflock.core.clock.FakeClock` is the clock for deterministic tests.
"""

from ..core.clock import FakeClock
from .emulator import ExternalEmulator, FakeGCSServer
from .faultproxy import FaultProxy, emulator_env
from .s3server import MotoS3Server

__all__ = ["ExternalEmulator", "FakeClock", "FakeGCSServer", "FaultProxy", "MotoS3Server", "emulator_env"]
