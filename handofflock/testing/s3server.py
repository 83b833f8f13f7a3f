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

import atexit
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

__all__ = ["MotoS3Server", "s3_env"]

_HOST = "127.0.0.1"
#: What :meth:`MotoS3Server.env` sets: the endpoint, throw-away credentials and a region.
_ENV_NAMES = (
    "AWS_ENDPOINT_URL_S3",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_DEFAULT_REGION",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
)
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@contextlib.contextmanager
def s3_env(endpoint: str) -> Iterator[None]:
    """Point boto3 at ``endpoint`` with test credentials inside the block, then restore the environment."""
    previous = {name: os.environ.get(name) for name in _ENV_NAMES}
    os.environ.update(
        AWS_ENDPOINT_URL_S3=endpoint,
        AWS_ACCESS_KEY_ID="handofflock-test",
        AWS_SECRET_ACCESS_KEY="handofflock-test",
        AWS_DEFAULT_REGION="us-east-1",
    )
    os.environ.pop("AWS_SESSION_TOKEN", None)
    os.environ.pop("AWS_PROFILE", None)
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class MotoS3Server:
    """moto's S3 server in a child process on 127.0.0.1, one request at a time (:mod:`._moto_serial`).

    It keeps everything in memory and is stopped (terminate, wait, kill) on
    :meth:`stop`, on leaving the ``with`` block, or at interpreter exit.
    Starting waits at most ``startup_timeout`` seconds, then fails with the
    server's log.
    """

    def __init__(self, *, startup_timeout: float = 60.0) -> None:
        self.startup_timeout = startup_timeout
        self.port: int | None = None
        self.log_path: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._tmpdir: tempfile.TemporaryDirectory[str] | None = None

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("the moto server is not started")
        return f"http://{_HOST}:{self.port}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> MotoS3Server:
        """Start the server and wait until it answers. Returns ``self``."""
        if self._process is not None:
            raise RuntimeError("this moto server is already started")
        try:
            import moto.server  # noqa: F401  (fail here, clearly, rather than in the child)
        except ImportError as exc:
            raise RuntimeError("MotoS3Server needs moto's server: pip install 'handofflock[test]'") from exc
        self._tmpdir = tempfile.TemporaryDirectory(prefix="handofflock-moto-")
        self.log_path = Path(self._tmpdir.name) / "moto.log"
        atexit.register(self.stop)
        try:
            for attempt in range(3):  # a port picked free can be taken before the server binds it
                self.port = _free_port()
                with open(self.log_path, "ab") as log:
                    log.write(f"--- attempt {attempt + 1}: port {self.port}\n".encode())
                    log.flush()
                    self._process = subprocess.Popen(
                        [sys.executable, "-m", "handofflock.testing._moto_serial", _HOST, str(self.port)],
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                if self._wait_until_ready():
                    return self
                self._terminate()
            raise RuntimeError(f"moto's server did not start on {_HOST}; last lines of its log:\n{self.log_tail()}")
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop the server and remove its temporary directory. Idempotent."""
        atexit.unregister(self.stop)
        self._terminate()
        if self._tmpdir is not None:
            self._tmpdir.cleanup()
            self._tmpdir = None
            self.log_path = None
        self.port = None

    def __enter__(self) -> MotoS3Server:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @contextlib.contextmanager
    def env(self) -> Iterator[MotoS3Server]:
        """Point boto3 at this server (``AWS_ENDPOINT_URL_S3``, test credentials) inside the block."""
        with s3_env(self.url):
            yield self

    def create_bucket(self, name: str) -> None:
        """Create a bucket (a plain ``PUT /name``, as moto accepts it unsigned)."""
        request = urllib.request.Request(f"{self.url}/{name}", data=b"", method="PUT")
        try:
            with _DIRECT.open(request, timeout=10) as response:
                response.read()
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"moto refused to create bucket {name!r}: {exc.code} {exc.read()[:200]!r}") from exc

    def log_tail(self, lines: int = 40) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "(no log)"
        text = self.log_path.read_bytes()[-64 * 1024 :].decode("utf-8", "replace")
        return "\n".join(text.splitlines()[-lines:]) or "(empty log)"

    def _wait_until_ready(self) -> bool:
        deadline = time.monotonic() + self.startup_timeout
        assert self._process is not None
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                return False
            try:
                # moto's own endpoint: answers only when it is moto (not another process on the port).
                with _DIRECT.open(f"{self.url}/moto-api/data.json", timeout=1) as response:
                    response.read()
                if self._process.poll() is None:
                    return True
            except (OSError, ValueError):
                pass
            time.sleep(0.05)
        return False

    def _terminate(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)

    def __repr__(self) -> str:
        return f"MotoS3Server({self.url if self.running else 'stopped'})"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((_HOST, 0))
        return int(sock.getsockname()[1])
