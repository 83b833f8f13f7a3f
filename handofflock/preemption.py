"""Spot and preemptible VMs: hear the preemption notice and turn it into a release request.

GCE tells a VM it is about to be stopped by flipping the metadata value
``instance/preempted`` to ``TRUE``, about 30 seconds before the stop.
:class:`PreemptionWatcher` long-polls that value from one daemon thread and,
on ``TRUE``, calls ``lock.request_release("preemption", requester="preemption",
deadline=now + notice_grace)``: the training loop sees ``release_requested``
at its next step, exactly as for a waiter.

A preemption is not a failure: the watcher never touches the lock's renewal,
never sends ``on_renewal_error``, and its own trouble (no metadata server,
timeouts) is logged and retried with backoff, nothing more.

The metadata server is ``$GCE_METADATA_HOST`` (``host`` or ``host:port``, as
google-auth reads it) or ``metadata.google.internal``. Requests carry
``Metadata-Flavor: Google``, go direct (never through a proxy), and only
replies that carry the same header are believed.
"""

from __future__ import annotations

import http.client
import logging
import math
import os
import socket
import threading
import time
from typing import Any, Protocol
from urllib.parse import quote

from .core.backoff import Backoff
from .core.errors import ConfigurationError
from .core.threads import quiet

_log = logging.getLogger("handofflock.preemption")

DEFAULT_METADATA_HOST = "metadata.google.internal"
PREEMPTED_PATH = "/computeMetadata/v1/instance/preempted"
#: GCE gives about 30 s between the notice and the stop.
DEFAULT_NOTICE_GRACE = 30.0


class ReleaseTarget(Protocol):
    """What a notice is delivered to: a :class:`~handofflock.HandoffLock`, a ``RankLock``, or your own."""

    def request_release(self, reason: str, *, requester: str | None = None, deadline: float | None = None) -> None:
        """Ask for the lock to be released by ``deadline`` (Unix time). Called from the watcher's thread."""


class _NotMetadata(Exception):
    """A reply we do not believe (wrong status, or not from a metadata server)."""


class PreemptionWatcher:
    """Long-polls GCE's ``instance/preempted`` and asks ``lock`` to release on a notice.

    >>> watcher = PreemptionWatcher(lock).start()
    >>> for step in lock.steps(range(start, total)):   # stops on the notice
    ...     train(step)
    >>> watcher.stop()

    ``notice_grace``: seconds from the notice to the deadline put in the
    request. ``poll_timeout``: how long the server may hold one long poll
    (``timeout_sec``, whole seconds); the socket gives up ``request_timeout``
    seconds after that, and plain requests after ``request_timeout``. When
    the server cannot be reached, retries back off from ``backoff_initial`` to
    ``backoff_max`` seconds (with jitter), so a laptop with no metadata server
    costs one failed attempt a minute, not a flood.

    After the notice: ``preempted`` is True, ``noticed_at`` is the Unix time,
    :meth:`wait` returns True, and the thread ends. ``attempts`` counts the
    requests made.
    """

    def __init__(
        self,
        lock: ReleaseTarget,
        *,
        notice_grace: float = DEFAULT_NOTICE_GRACE,
        host: str | None = None,
        poll_timeout: int = 60,
        request_timeout: float = 5.0,
        backoff_initial: float = 1.0,
        backoff_max: float = 60.0,
    ) -> None:
        for name, value in (
            ("notice_grace", notice_grace),
            ("request_timeout", request_timeout),
            ("backoff_initial", backoff_initial),
            ("backoff_max", backoff_max),
        ):
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not value > 0
                or not math.isfinite(value)
            ):
                raise ConfigurationError(f"{name} must be a positive number of seconds, got {value!r}")
        if isinstance(poll_timeout, bool) or not isinstance(poll_timeout, int) or poll_timeout < 1:
            raise ConfigurationError(f"poll_timeout must be a whole number of seconds >= 1, got {poll_timeout!r}")
        if backoff_max < backoff_initial:
            raise ConfigurationError("backoff_max must be >= backoff_initial")
        if not callable(getattr(lock, "request_release", None)):
            raise ConfigurationError(
                f"PreemptionWatcher needs a target with request_release(reason, requester=, deadline=), got {lock!r}"
            )
        self.lock = lock
        self.host = host or os.environ.get("GCE_METADATA_HOST") or DEFAULT_METADATA_HOST
        if not self.host or "/" in self.host:
            raise ConfigurationError(f"metadata host must be host or host:port, got {self.host!r}")
        self.notice_grace = float(notice_grace)
        self.poll_timeout = poll_timeout
        self.request_timeout = float(request_timeout)
        self.backoff_initial = float(backoff_initial)
        self.backoff_max = float(backoff_max)
        self._backoff = Backoff(self.backoff_initial, self.backoff_max)
        self.preempted = False
        self.noticed_at: float | None = None
        self.attempts = 0
        self.last_error: BaseException | None = None
        self._notice = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._conn: http.client.HTTPConnection | None = None
        self._conn_lock = threading.Lock()

    # -- lifecycle ------------------------------------------------------------

    def start(self) -> PreemptionWatcher:
        """Start the watching thread (once). Returns self."""
        if self._thread is not None:
            raise RuntimeError("this PreemptionWatcher was already started")
        self._thread = threading.Thread(target=quiet(self._run), name="handofflock-preemption", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop watching, interrupting a long poll in flight. Safe to call twice."""
        self._stop.set()
        with self._conn_lock:
            conn = self._conn
        if conn is not None and conn.sock is not None:
            try:
                conn.sock.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in recv()
            except OSError:
                pass
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until a notice arrives (True) or ``timeout`` passes (False)."""
        return self._notice.wait(timeout)

    def __enter__(self) -> PreemptionWatcher:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- the loop -------------------------------------------------------------

    def _run(self) -> None:
        etag: str | None = None
        wait = False  # the first request is a plain read: the notice may already be there
        failures = 0
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                value, etag = self._get(etag, wait=wait)
            except Exception as exc:  # OSError, timeouts, HTTP trouble, a reply we distrust
                if self._stop.is_set():
                    return
                failures += 1
                self.last_error = exc
                delay = self._backoff.delay(failures - 1)
                level = logging.INFO if failures == 1 else logging.DEBUG
                _log.log(
                    level, "metadata server %s not answering (%s); retrying in %.1f s", self.host, _describe(exc), delay
                )
                etag, wait = None, False  # start over with a plain read: we may have missed the change
                self._stop.wait(delay)
                continue
            if failures:
                _log.info("metadata server %s answers again", self.host)
            failures = 0
            if value.strip().upper() == "TRUE":
                self._noticed()
                return
            elapsed = time.monotonic() - started
            if wait and elapsed < self.backoff_initial:
                # A long poll that came back at once with no change: never spin on such a server.
                self._stop.wait(self.backoff_initial - elapsed)
            wait = True

    def _noticed(self) -> None:
        now = time.time()
        self.preempted, self.noticed_at = True, now
        target = getattr(self.lock, "url", None) or repr(self.lock)  # a RankLock has no url
        _log.warning(
            "preemption notice from %s: asking %s to release within %.0f s", self.host, target, self.notice_grace
        )
        try:
            self.lock.request_release("preemption", requester="preemption", deadline=now + self.notice_grace)
        except Exception:  # the notice stands (preempted, wait()); the target's trouble is said, never lost
            _log.exception("could not deliver the preemption notice to %s", target)
        self._notice.set()

    def _get(self, etag: str | None, *, wait: bool) -> tuple[str, str | None]:
        """One request: a plain read, or a long poll for a change from ``etag``."""
        path, read_timeout = PREEMPTED_PATH, self.request_timeout
        if wait:
            path += f"?wait_for_change=true&timeout_sec={self.poll_timeout}"
            if etag:
                path += f"&last_etag={quote(etag, safe='')}"
            read_timeout = self.poll_timeout + self.request_timeout
        conn = http.client.HTTPConnection(self.host, timeout=self.request_timeout)
        with self._conn_lock:
            self._conn = conn
        try:
            self.attempts += 1
            conn.connect()
            if self._stop.is_set():
                raise _NotMetadata("stopped")
            conn.sock.settimeout(read_timeout)
            conn.request("GET", path, headers={"Metadata-Flavor": "Google"})
            reply = conn.getresponse()
            body = reply.read(1024).decode("ascii", "replace")
            if reply.status != 200:
                raise _NotMetadata(f"HTTP {reply.status} {reply.reason}")
            if reply.getheader("Metadata-Flavor") != "Google":
                raise _NotMetadata("the reply lacks 'Metadata-Flavor: Google'; not a metadata server")
            return body, reply.getheader("ETag") or etag
        finally:
            with self._conn_lock:
                self._conn = None
            conn.close()

    def __repr__(self) -> str:
        state = "preempted" if self.preempted else ("watching" if self.running else "stopped")
        return f"<PreemptionWatcher {self.host} {state} attempts={self.attempts}>"


def _describe(exc: BaseException) -> str:
    if isinstance(exc, socket.timeout):
        return "timed out"
    return str(exc) or type(exc).__name__
