"""A real S3-speaking server for tests: moto's standalone server, as a child process on 127.0.0.1.

moto (``pip install 'moto[server]'``, in the ``test`` extra) answers the S3 REST
API, and from 5.1 on honours ``If-None-Match: *`` and ``If-Match`` on
``PutObject`` (the suite proves it with a 16-thread race before trusting it;
see tests/storage/test_s3_backend.py). :class:`MotoS3Server` starts it on a free port,
waits until it answers, and :meth:`MotoS3Server.env` points boto3 at it with
throw-away credentials.

moto's own server (``python -m moto.server``) is threaded, and its S3 backend
checks ``If-Match`` / ``If-None-Match`` and then stores the object in two steps
with no lock between them: two racing conditional PUTs can both win (seen in
1 of 2 runs of a 16-thread race under load). Real S3 makes a conditional write
atomic, and the lock's tests rest on that. So :class:`MotoS3Server` runs this
module (``python -m handofflock.testing.s3server HOST PORT``), which serves
the same moto application, still threaded (so keep-alive connections do not
queue behind one another), but runs each request's whole application call,
body included, under one lock (:class:`OneAtATime`), so every request is
atomic as on S3.

>>> with MotoS3Server() as s3, s3.env():
...     s3.create_bucket("locks")
...     lock = HandoffLock("s3://locks/train.json")
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from typing import IO, Any

from .emulator import ServerProcess
from .faultproxy import HOST, environ

__all__ = ["MotoS3Server"]


class MotoS3Server(ServerProcess):
    """moto's S3 server in a child process on 127.0.0.1, one request at a time (:class:`OneAtATime`).

    It keeps everything in memory and is stopped (terminate, wait, kill) on
    :meth:`stop`, on leaving the ``with`` block, or at interpreter exit, and
    killed by the watchdog once the process that started it is gone, however
    it ended (see :class:`~handofflock.testing.emulator.ServerProcess`).
    """

    name = "moto server"
    probe_path = "/moto-api/data.json"  # moto's own: answers only when it is moto

    @contextlib.contextmanager
    def env(self) -> Iterator[MotoS3Server]:
        """Point boto3 at this server (``AWS_ENDPOINT_URL_S3``, test credentials) inside the block, then
        restore the environment."""
        test = "handofflock-test"
        with environ(
            AWS_ENDPOINT_URL_S3=self.url,
            AWS_ACCESS_KEY_ID=test,
            AWS_SECRET_ACCESS_KEY=test,
            AWS_DEFAULT_REGION="us-east-1",
            AWS_SESSION_TOKEN=None,
            AWS_PROFILE=None,
        ):
            yield self

    def create_bucket(self, name: str) -> None:
        """Create a bucket (a plain ``PUT /name``, as moto accepts it unsigned)."""
        self._create(name, urllib.request.Request(f"{self.url}/{name}", data=b"", method="PUT"))

    def _launch(self, log: IO[bytes]) -> subprocess.Popen[bytes]:
        # Found, not imported (a second or more of this process's time, and moto's hooks on every botocore
        # client made here): fail here, clearly, rather than in the child. A server extra that is missing
        # shows in the child's log.
        if importlib.util.find_spec("moto") is None:
            raise RuntimeError("MotoS3Server needs moto's server: pip install 'handofflock[test]'")
        return self._spawn([sys.executable, "-m", "handofflock.testing.s3server", HOST, str(self.port)], log)


class OneAtATime:
    """A WSGI application that runs ``app`` for one request at a time, body included."""

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self.app = app
        self.lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        with self.lock:
            result = self.app(environ, start_response)
            try:
                return list(result)
            finally:
                close = getattr(result, "close", None)
                if close is not None:
                    close()


def main(argv: list[str]) -> None:
    """Serve moto's S3 application on ``HOST PORT``, one request at a time."""
    host, port = argv[0], int(argv[1])
    os.environ.setdefault("MOTO_PORT", str(port))
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import run_simple

    app = DomainDispatcherApplication(create_backend_app)
    run_simple(host, port, OneAtATime(app), threaded=True, request_handler=MotoRequestHandler)


if __name__ == "__main__":
    main(sys.argv[1:])
