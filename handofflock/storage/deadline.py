"""What the GCS and S3 stores share about their requests: a total deadline for each, and the client that sends them.

A socket timeout bounds each socket operation, not the request: a server (or
a proxy) that sends its reply one byte every second never lets a single read
wait its full read timeout, and holds the request, and the thread that sent
it, for as long as it likes (measured: a read of an 8-byte lock object took
8 s, and a write whose reply trickled more than 25 s, both with
``timeout=(2, 2)``).

So every request is sent inside :meth:`HTTPStore.bounded`, which arms a
:class:`Deadline` with one watchdog thread per process. A request's connection
comes from a pool with the :class:`WatchedPool` hooks (mounted on a requests
session by :func:`install`, on botocore's pools by the S3 store); the pool
tells the deadline which connection carries the request. When the deadline
passes, the watchdog shuts that connection's socket down: a thread blocked
sending the request or reading the reply wakes at once with an error, which
:meth:`~HTTPStore.bounded` reports as a transient error (ambiguous for a write: it may
have been applied). A connection goes back to the pool only after its
deadline has let go of it, so a late watchdog never cuts another request's
connection.

Each is an :class:`HTTPStore`: the bucket, the timeouts, the SDK client
(never a parent's, in a forked child) and each request's deadline
(:meth:`HTTPStore.bounded`); :meth:`HTTPStore.shared` keeps one store per
bucket and settings, so locks on one bucket share one connection pool.

Imports requests and urllib3, nothing of Google's or Amazon's SDKs.
"""

from __future__ import annotations

import contextlib
import email.utils
import heapq
import itertools
import math
import os
import re
import socket
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any, Generic, TypeVar

import requests.adapters
import urllib3.connection
import urllib3.poolmanager
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from ..core.errors import ConfigurationError, HandoffLockError, StorageError, StorageTimeout, TransientStorageError
from ..core.threads import quiet
from .base import is_seconds

#: How often an expired deadline looks again for a socket to shut down (a connection still
#: connecting has none yet; its connect timeout is capped at the deadline by the caller).
_RECHECK = 0.02

_current = threading.local()


def _checked_timeout(timeout: object) -> tuple[float, float]:
    """A store's ``timeout``: ``(connect, read)`` seconds, or one number for both."""
    if isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        timeout = (timeout, timeout)
    if not isinstance(timeout, tuple) or len(timeout) != 2 or not all(is_seconds(t) for t in timeout):
        raise ConfigurationError(f"timeout must be (connect_seconds, read_seconds), both > 0, got {timeout!r}")
    return (float(timeout[0]), float(timeout[1]))


class Deadline:
    """One request's deadline, ``seconds`` from now (monotonic).

    ``expired`` turns True when the watchdog reaches it while the request is
    still under way; from then on every connection attached to it has its
    socket shut down, and ``cut`` says that one was.
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.at = time.monotonic() + seconds
        self.expired = False
        self.cut = False
        self._done = False
        self._conn: Any = None
        self._lock = threading.Lock()

    def remaining(self) -> float:
        return max(0.0, self.at - time.monotonic())

    def attach(self, conn: Any) -> None:
        """``conn`` now carries the request (called by the pool as it hands the connection out)."""
        with self._lock:
            if self._done:
                return
            self._conn = conn
            # our own name on urllib3's connection: _put_conn finds the deadline by it when the pool takes it back
            conn._handofflock_deadline = self
            if self.expired:
                self.cut |= _shut_down(conn)

    def detach(self, conn: Any) -> None:
        """``conn`` no longer carries the request (called as it goes back to the pool)."""
        with self._lock:
            if self._conn is conn:
                self._conn = None

    def finish(self) -> None:
        """The request is over, however it ended: nothing is shut down after this."""
        with self._lock:
            self._done = True
            self._conn = None

    def _expire(self) -> bool:
        """Called by the watchdog at the deadline; True to be called again shortly."""
        with self._lock:
            if self._done:
                return False
            self.expired = True
            if self._conn is not None:
                self.cut |= _shut_down(self._conn)
            return True


def _shut_down(conn: Any) -> bool:
    """Wake whatever blocks on ``conn``'s socket: shut it down both ways (it is closed by its owner).

    Returns whether there was a socket to shut down.
    """
    # A connection whose reply ends the connection (``Connection: close``) has been closed by
    # http.client while its reply is still being read from the socket: a connection that
    # remembers its socket (:class:`RememberingConnection`) is cut through that.
    sock = getattr(conn, "sock", None) or getattr(conn, "_handofflock_sock", None)
    if sock is not None and not isinstance(sock, socket.socket):  # urllib3's SSLTransport (TLS in TLS)
        sock = getattr(sock, "socket", None)
    if not isinstance(sock, socket.socket):
        return False
    # The plain socket's shutdown, also for an SSLSocket: ssl's own would unwrap it under the feet
    # of the thread reading from it. OSError: already shut down, or closed meanwhile.
    with contextlib.suppress(OSError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    return True


class _Watchdog:
    """One daemon thread that expires deadlines in order, started on first use."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Deadline]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition(threading.Lock())
        self._thread: threading.Thread | None = None

    def arm(self, deadline: Deadline, at: float) -> None:
        """Expire ``deadline`` at ``at`` (monotonic)."""
        with self._cond:
            heapq.heappush(self._heap, (at, next(self._seq), deadline))
            if self._thread is None:
                self._thread = threading.Thread(target=quiet(self._run), name="handofflock-deadlines", daemon=True)
                self._thread.start()
            elif self._heap[0][2] is deadline:
                self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    while self._heap and self._heap[0][2]._done:
                        heapq.heappop(self._heap)
                    left = self._heap[0][0] - time.monotonic() if self._heap else None
                    if left is not None and left <= 0:
                        deadline = heapq.heappop(self._heap)[2]
                        break
                    self._cond.wait(left)
            if deadline._expire():
                self.arm(deadline, time.monotonic() + _RECHECK)


_watchdog = _Watchdog()


_T = TypeVar("_T")


_STORES: weakref.WeakSet[HTTPStore[Any]] = weakref.WeakSet()
_SHARED: dict[tuple[Any, ...], Any] = {}
_SHARED_LOCK = threading.Lock()
_S = TypeVar("_S", bound="HTTPStore[Any]")


class HTTPStore(Generic[_T]):
    """A bucket reached over HTTP through an SDK client (GCS, S3): its timeouts, its client, its requests' deadline.

    ``timeout`` is ``(connect, read)`` seconds (or one number for both): how long
    to wait for a connection, and for each read from the socket.
    ``request_timeout`` bounds each request as a whole, from sending it to the
    last byte of its reply (default: connect plus read timeout; a call's
    ``timeout`` shortens it). ``client`` is the caller's own SDK client (then
    theirs to close), else one is made by :meth:`_make_client` on first use.

    A forked child never uses its parent's client: both would write requests to
    the same keep-alive sockets and read each other's replies (a read would
    return another object's bytes and generation). So in a child a client this
    store made is dropped (and kept referenced, so that collecting it never
    closes, or sends a TLS close on, a socket the parent still uses) and the
    next use makes a new one; a client given is the caller's to replace, and
    using it in the child raises.
    """

    #: The URL scheme, the bucket names the store accepts, and how to say so.
    scheme: str
    bucket_re: re.Pattern[str]
    bucket_rule: str
    #: The SDK's exceptions for an error reply (the server's answer, unless a deadline's cut made it).
    replies: tuple[type[BaseException], ...] = ()

    def __init__(self, bucket: str, *, client: _T | None, timeout: object, request_timeout: object) -> None:
        if not isinstance(bucket, str) or not self.bucket_re.match(bucket) or ".." in bucket:
            raise ConfigurationError(f"{bucket!r} is not a valid {self.bucket_rule}")
        self.bucket = bucket
        self.url = f"{self.scheme}://{bucket}"
        self._timeout = _checked_timeout(timeout)
        if request_timeout is not None and not is_seconds(request_timeout):
            raise ConfigurationError(f"request_timeout must be a finite number of seconds > 0, got {request_timeout!r}")
        # A reply that keeps coming, however slowly, never trips the read timeout; the
        # default allows what a request that uses both its timeouts in full could take.
        self._request_timeout = sum(self._timeout) if request_timeout is None else float(request_timeout)
        #: ``request_timeout`` as given (None: the default), checked against each lock's timing.
        self.explicit_request_timeout = None if request_timeout is None else self._request_timeout
        self._client = client
        #: Whether the client is this store's own (made here), not given.
        self._owns_client = client is None
        self._client_lock = threading.Lock()
        self._client_pid = os.getpid()  # where the client (and its connections) was made or given
        self._inherited: list[_T] = []
        _STORES.add(self)

    #: Environment that picks the endpoint and credentials: a shared store is kept per value of these.
    shared_env: tuple[str, ...] = ()

    @classmethod
    def shared(cls: type[_S], bucket: str, **options: Any) -> _S:
        """The process-wide store for ``bucket`` and ``options`` (and the current :attr:`shared_env`).

        Locks on the same bucket share one client and connection pool this way.
        """
        given = tuple(sorted((name, value) for name, value in options.items() if value is not None))
        key = (cls, bucket, given, *(os.environ.get(name) for name in cls.shared_env))
        with _SHARED_LOCK:
            if key not in _SHARED:
                _SHARED[key] = cls(bucket, **options)
            store: _S = _SHARED[key]
            return store

    def _make_client(self) -> _T:
        raise NotImplementedError

    def _error(self, exc: Exception, op: str, key: str | None) -> StorageError | None:
        """The handofflock error an SDK or transport error maps to; None to let it through as it is."""
        raise NotImplementedError

    @contextlib.contextmanager
    def mapped(self, op: str, key: str | None) -> Iterator[None]:
        """Turn every SDK and transport error raised inside into a handofflock error (:meth:`_error`)."""
        try:
            yield
        except HandoffLockError:
            raise
        except Exception as exc:
            error = self._error(exc, op, key)
            if error is None:
                raise
            raise error from exc

    def where(self, op: str, key: str | None) -> str:
        """How a message names one operation: ``write 'locks/a.json' in gs://bucket``."""
        return f"{op} {key!r} in {self.url}" if key else f"{op} in {self.url}"

    def transient(self, op: str, key: str | None, what: str, *, ambiguous: bool, **reply: Any) -> TransientStorageError:
        """A :class:`TransientStorageError` of ``op`` on ``key`` saying ``what`` happened (``reply``: its
        ``status`` and ``retry_after``, for an error reply)."""
        return TransientStorageError(
            f"{self.where(op, key)}: {what}", url=self.url, key=key, ambiguous=ambiguous, **reply
        )

    def unanswered(
        self, op: str, key: str | None, what: str, error: type[TransientStorageError] = TransientStorageError
    ) -> TransientStorageError:
        """An ``error`` of ``op`` on ``key``, whose reply did not come as ``what`` says: ambiguous for a write
        or a delete (it may have been applied), not for a read or a listing (nothing was changed)."""
        mutation = op in ("write", "delete")
        outcome = "the request may have been applied" if mutation else "nothing was changed"
        return error(f"{self.where(op, key)}: {what}; {outcome}", url=self.url, key=key, ambiguous=mutation)

    def permanent(self, op: str, key: str | None, what: str) -> StorageError:
        """A :class:`StorageError` of ``op`` on ``key``, saying ``what`` to check."""
        return StorageError(f"{self.where(op, key)}: {what}", url=self.url, key=key)

    @property
    def client(self) -> _T:
        """The SDK client in use, made on first access (under a lock, once)."""
        client = self._client
        if client is not None and self._client_pid != os.getpid():
            raise ConfigurationError(
                f"the client passed to {self!r} was made in process {self._client_pid}, which this process was "
                "forked from: its keep-alive connections are shared with that process, and replies would reach "
                "the wrong one. Pass a client made in this process."
            )
        if client is None:
            with self._client_lock:
                if self._client is None:
                    self._client = self._make_client()
                client = self._client
        return client

    @property
    def has_client(self) -> bool:
        """Whether a client is in hand (one given, or made since the last :meth:`close`)."""
        return self._client is not None

    def close(self) -> None:
        """Close the connections of a client this store made; the next operation makes a new one.

        A client passed to the constructor is left open for its owner.
        """
        with self._client_lock:
            client: Any = self._client if self._owns_client else None
            if self._owns_client:
                self._client = None
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()

    def _after_fork(self) -> None:
        self._client_lock = threading.Lock()
        if self._owns_client:
            if self._client is not None:
                self._inherited.append(self._client)
            self._client = None
            self._client_pid = os.getpid()

    @contextlib.contextmanager
    def bounded(self, op: str, key: str | None, timeout: float | None) -> Iterator[Deadline]:
        """Send one request of ``op`` (``read``, ``write``, ``delete``, ``list``) and read its reply inside the block.

        Within ``request_timeout``, or the call's ``timeout`` if shorter: past it
        the connection is shut down, and whatever that breaks is raised as a
        :class:`~handofflock.core.errors.StorageTimeout` saying so (ambiguous for a write or a
        delete: it may have been applied). An exception of :attr:`replies` (an
        SDK's error reply) is the server's answer unless the cut made it. The
        deadline is this thread's (:func:`current`) inside the block.

        The client is made first, outside the deadline: that is the SDK's own work, no I/O
        (0.2 s, up to 1.8 s on a loaded 2-core machine), and the request has yet to start.
        """
        _ = self.client
        seconds = self._request_timeout if timeout is None else min(self._request_timeout, timeout)

        def past() -> TransientStorageError:
            return self.unanswered(op, key, f"no complete reply within {seconds:g} s", StorageTimeout)

        deadline, previous = Deadline(seconds), current()
        _current.deadline = deadline
        _watchdog.arm(deadline, deadline.at)
        try:
            try:
                yield deadline
            except HandoffLockError:  # among them, credentials not ready in time: nothing sent
                raise
            except self.replies:
                if not deadline.cut:
                    raise
                raise past() from None
            except Exception as exc:
                # A connect timeout, capped at the deadline, can beat the watchdog to it by a hair.
                if not deadline.expired and deadline.remaining() > 0:
                    raise
                raise past() from exc
            if deadline.cut:
                # Done, yet its connection was shut down on the way: a reply framed by the end of the
                # connection alone would look complete though cut short. Not to be trusted.
                raise past()
        finally:
            deadline.finish()
            _current.deadline = previous

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.bucket!r})"


def _after_fork_in_child() -> None:
    # The parent's watchdog thread does not exist in the child, and its locks may have been held.
    global _watchdog, _SHARED_LOCK
    _watchdog = _Watchdog()
    _current.__dict__.clear()
    _SHARED_LOCK = threading.Lock()
    for store in list(_STORES):
        store._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def retry_after_seconds(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header: delta-seconds or an HTTP date."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when is None:
            return None
        seconds = when.timestamp() - time.time()
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)


def current() -> Deadline | None:
    """The deadline of the request this thread is sending (the innermost :meth:`HTTPStore.bounded`), if any."""
    return getattr(_current, "deadline", None)


class WatchedPool:
    """Connection-pool mix-in: hand the current thread's deadline the connection it will use."""

    # urllib3's private pool hooks, overridden: the one place a connection is handed out and taken back.
    def _get_conn(self, timeout: float | None = None) -> Any:
        conn = super()._get_conn(timeout)  # type: ignore[misc]
        deadline = current()
        if deadline is not None:
            deadline.attach(conn)
        return conn

    def _put_conn(self, conn: Any) -> None:
        deadline = getattr(conn, "_handofflock_deadline", None)
        if deadline is not None:
            deadline.detach(conn)  # before anyone else can take it from the pool
            conn._handofflock_deadline = None  # our own name, as in Deadline.attach
        super()._put_conn(conn)  # type: ignore[misc]


class RememberingConnection:
    """Connection mix-in: keep the socket, which http.client forgets while a ``Connection: close``
    reply (HTTP/1.0 servers, many token endpoints) is still being read, so a deadline can cut it."""

    def connect(self) -> None:
        super().connect()  # type: ignore[misc]
        self._handofflock_sock = self.sock  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        # urllib3 puts a connection's repr into its errors, which reach the user: the address, not a class name.
        return f"{self.host}:{self.port}"  # type: ignore[attr-defined]

    __str__ = __repr__


def watched(pool: type[Any], connection: type[Any]) -> type[Any]:
    """``pool`` with the :class:`WatchedPool` hooks, making ``connection``\\ s that remember their socket."""
    remembering = type(f"Remembering{connection.__name__}", (RememberingConnection, connection), {})
    return type(f"Watched{pool.__name__}", (WatchedPool, pool), {"ConnectionCls": remembering})


_POOLS = {
    "http": watched(HTTPConnectionPool, urllib3.connection.HTTPConnection),
    "https": watched(HTTPSConnectionPool, urllib3.connection.HTTPSConnection),
}


class DeadlineAdapter(requests.adapters.HTTPAdapter):
    """requests' adapter, with connection pools that let a :class:`Deadline` cut their connections.

    Behaves exactly like ``HTTPAdapter`` for a request sent outside :meth:`HTTPStore.bounded`.
    Through an HTTP(S) proxy as well; not through a SOCKS proxy, whose pools
    are urllib3's own (there only ``timeout`` applies).
    """

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = _POOLS

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> Any:
        manager = super().proxy_manager_for(proxy, **proxy_kwargs)
        if manager.pool_classes_by_scheme is urllib3.poolmanager.pool_classes_by_scheme:
            manager.pool_classes_by_scheme = _POOLS
        return manager


def install(session: Any) -> bool:
    """Mount a :class:`DeadlineAdapter` on ``session`` in place of its plain ``HTTPAdapter``\\ s.

    Only an adapter of exactly requests' own class is replaced, by one with the
    same settings: a session with adapters of its own (mutual TLS, say) is left
    as it is. Returns whether both ``https://`` and ``http://`` are now watched.
    """
    adapters = getattr(session, "adapters", None)
    if not isinstance(session, requests.Session) or adapters is None:
        return False
    prefixes = ("https://", "http://")
    for prefix in prefixes:
        adapter = adapters.get(prefix)
        if type(adapter) is requests.adapters.HTTPAdapter:
            session.mount(
                prefix,
                DeadlineAdapter(
                    # private (requests'): pool settings have no public getter; the new adapter keeps them
                    pool_connections=adapter._pool_connections,
                    pool_maxsize=adapter._pool_maxsize,
                    max_retries=adapter.max_retries,
                    pool_block=adapter._pool_block,
                ),
            )
            adapter.close()
    return all(isinstance(adapters.get(prefix), DeadlineAdapter) for prefix in prefixes)
