"""A real S3-speaking server for tests: moto's standalone server, as a child process on 127.0.0.1.

moto (``pip install 'moto[server]'``, in the ``test`` extra) answers the S3 REST
API, and from 5.1 on honours ``If-None-Match: *`` and ``If-Match`` on
``PutObject`` (the suite proves it with a 16-thread race before trusting it;
see tests/storage/test_s3_backend.py). :class:`MotoS3Server` starts it on a free port,
waits until it answers, and :meth:`MotoS3Server.env` points boto3 at it with
throw-away credentials.

>>> with MotoS3Server() as s3, s3.env():
...     s3.create_bucket("locks")
...     lock = HandoffLock("s3://locks/train.json")
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from typing import IO

from .emulator import HOST, ServerProcess
from .faultproxy import environ

__all__ = ["MotoS3Server", "s3_env"]


def s3_env(endpoint: str) -> contextlib.AbstractContextManager[None]:
    """Point boto3 at ``endpoint`` with test credentials inside the block, then restore the environment."""
    test = "handofflock-test"
    return environ(
        AWS_ENDPOINT_URL_S3=endpoint,
        AWS_ACCESS_KEY_ID=test,
        AWS_SECRET_ACCESS_KEY=test,
        AWS_DEFAULT_REGION="us-east-1",
        AWS_SESSION_TOKEN=None,
        AWS_PROFILE=None,
    )


class MotoS3Server(ServerProcess):
    """moto's S3 server in a child process on 127.0.0.1, one request at a time (:mod:`._moto_serial`).

    It keeps everything in memory and is stopped (terminate, wait, kill) on
    :meth:`stop`, on leaving the ``with`` block, or at interpreter exit (see
    :class:`~handofflock.testing.emulator.ServerProcess`).
    """

    name = "moto server"
    probe_path = "/moto-api/data.json"  # moto's own: answers only when it is moto

    def __init__(self, *, startup_timeout: float = 60.0) -> None:
        super().__init__(startup_timeout=startup_timeout)

    @contextlib.contextmanager
    def env(self) -> Iterator[MotoS3Server]:
        """Point boto3 at this server (``AWS_ENDPOINT_URL_S3``, test credentials) inside the block."""
        with s3_env(self.url):
            yield self

    def create_bucket(self, name: str) -> None:
        """Create a bucket (a plain ``PUT /name``, as moto accepts it unsigned)."""
        self._create(name, urllib.request.Request(f"{self.url}/{name}", data=b"", method="PUT"))

    def _check_installed(self) -> None:
        try:
            import moto.server  # noqa: F401  (fail here, clearly, rather than in the child)
        except ImportError as exc:
            raise RuntimeError("MotoS3Server needs moto's server: pip install 'handofflock[test]'") from exc

    def _launch(self, log: IO[bytes]) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "handofflock.testing._moto_serial", HOST, str(self.port)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
