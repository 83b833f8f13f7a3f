"""The S3 backend's AWS credentials: loaded and refreshed beside a request, never inside it.

botocore finds credentials through its provider chain and refreshes temporary
ones (the container/ECS endpoint, IMDS, ``credential_process``, STS assume-role
and web identity, SSO) inside the request that finds them due: its
``RefreshableCredentials`` call the provider from the thread that signs, from
15 minutes before they expire, and from 10 minutes before every signing thread
waits for it. The providers bound each socket read (2 s for the container
endpoint, 1 s for IMDS) or nothing at all (a ``credential_process`` program
runs as long as it likes), so a source that trickles its answer, or stalls,
held a lock's renewal as long as it did: 12 s with the request bound to 0.5 s
(tests/storage/test_s3_credentials_refresh_within_request_timeout.py).

The clients of :class:`~handofflock.storage.s3.S3Storage` sign with
:class:`BoundedCredentials` instead, over botocore's own chain. Every load and
refresh runs in a thread of its own, one at a time, and a request is given:

* credentials not due for a refresh, at once;
* while a refresh runs, the credentials in hand, as long as at least
  :data:`STILL_GOOD` of their life is left: a refresh that stalls costs no
  request anything while they last (botocore would hold every request);
* otherwise (the first load, credentials about to expire) what the refresh
  brings, if it brings it before the request's deadline
  (:func:`.deadline.current`); past it the request fails as transient,
  nothing sent, and the refresh goes on for the next one.

The refresh is botocore's own (``get_frozen_credentials`` of the credentials
its chain found): what it fetches, caches and logs is unchanged, only the
thread differs. Like every ``s3*`` module of the backend, this one imports
botocore; none outside them does.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import boto3.session
import botocore.credentials
import botocore.exceptions
import botocore.session

from ..core.errors import TransientStorageError
from ..core.threads import quiet
from .deadline import current as current_deadline

__all__ = ["STILL_GOOD", "BoundedCredentials", "boto3_session", "life_left"]

#: While a refresh runs, credentials in hand sign requests as long as this much of their life is
#: left (seconds): room for a request to reach S3, and for this host's clock and AWS's to differ.
STILL_GOOD = 60.0

#: The longest life :func:`life_left` tells apart: beyond it, "at least this".
_HORIZON = 3600.0


def boto3_session(url: str, *, profile: str | None, region: str | None) -> Any:
    """A boto3 session (for the store at ``url``) whose clients sign with :class:`BoundedCredentials`.

    The provider chain is botocore's own, with the session's profile and region,
    made (in the refresh thread) when botocore first asks for credentials, as it makes a client.
    """
    session = botocore.session.Session()

    def load() -> Any:
        region = session.get_config_variable("region")
        return botocore.credentials.create_credential_resolver(session, region_name=region).load_credentials()

    # botocore's session asks its "credential_provider" component to load_credentials() once, and
    # signs every request of its clients with what that returns (a public component name).
    session.register_component("credential_provider", BoundedCredentials(load, url))
    return boto3.session.Session(botocore_session=session, profile_name=profile, region_name=region)


class _Refresh:
    """One load or refresh, under way in its own thread."""

    def __init__(self, old: Any, usable_until: float) -> None:
        #: The credentials in hand as it started (None: none yet), and until when (monotonic) they may sign.
        self.old = old
        self.usable_until = usable_until
        self.done = threading.Event()
        self.frozen: Any = None
        self.error: Exception | None = None


class BoundedCredentials:
    """botocore credentials whose load and refreshes never hold a request past its deadline.

    ``load`` returns what botocore's chain finds (None: nothing). See the module docstring.
    """

    def __init__(self, load: Callable[[], Any], url: str) -> None:
        self._load = load
        self._url = url
        self._lock = threading.Lock()
        #: What the chain found; asked only by the refresh thread, so it changes only there.
        self._inner: Any = None
        #: What it held after the last load or refresh (botocore's ReadOnlyCredentials).
        self._frozen: Any = None
        self._refresh: _Refresh | None = None

    @property
    def method(self) -> str:
        """Where botocore found them (``container-role``, ``custom-process``, ...), once loaded."""
        return str(getattr(self._inner, "method", None) or "not loaded yet")

    def get_frozen_credentials(self) -> Any:
        """The credentials to sign a request with now (botocore calls this as it signs)."""
        with self._lock:
            refresh = self._refresh
            if refresh is None:
                if self._frozen is not None and not _due(self._inner):
                    return self._frozen
                refresh = self._refresh = self._start()
        if refresh.old is not None and time.monotonic() < refresh.usable_until:
            return refresh.old
        bound = current_deadline()
        if not refresh.done.wait(None if bound is None else bound.remaining()):
            assert bound is not None
            doing = "loading" if refresh.old is None else "refreshing"
            raise TransientStorageError(
                f"{self._url}: the AWS credentials were not ready within the request's deadline "
                f"({bound.seconds:g}s): botocore is still {doing} them ({self.method}); nothing was sent. "
                "If this goes on, check the credentials source (the container endpoint, the instance "
                "metadata service, the credential_process program, STS)",
                url=self._url,
                ambiguous=False,
            )
        if refresh.error is not None:
            raise refresh.error
        return refresh.frozen

    def load_credentials(self) -> BoundedCredentials:
        """Start the first load, if nothing has started it, without waiting for it.

        botocore asks its credential provider (this object) as it makes a client:
        the load starts then, beside the rest of that work.
        """
        with self._lock:
            if self._refresh is None and self._frozen is None:
                self._refresh = self._start()
        return self

    def get_deferred_property(self, name: str) -> Callable[[], Any]:
        """botocore asks for ``account_id`` this way, for endpoints that name the account."""
        return lambda: getattr(self._frozen, name, None)

    def _start(self) -> _Refresh:
        """Start a load or refresh (under ``_lock``, none under way: ``_inner`` and ``_frozen`` agree)."""
        old = self._frozen
        usable_until = time.monotonic() + life_left(self._inner) - STILL_GOOD if old is not None else -1.0
        refresh = _Refresh(old, usable_until)
        thread = threading.Thread(
            target=quiet(self._run), args=(refresh,), name="handofflock-s3-credentials", daemon=True
        )
        thread.start()
        return refresh

    def _run(self, refresh: _Refresh) -> None:
        inner = self._inner
        try:
            if inner is None:
                inner = self._load()
                if inner is None:
                    raise botocore.exceptions.NoCredentialsError()
            # botocore's refresh, when they are due: here, in this thread, not in a request's.
            refresh.frozen = inner.get_frozen_credentials()
        except Exception as exc:  # a request that waits for this one raises it (mapped in s3.py)
            refresh.error = exc
        with self._lock:
            if refresh.error is None:
                self._inner, self._frozen = inner, refresh.frozen
            self._refresh = None
        refresh.done.set()


def _due(credentials: Any) -> bool:
    """Whether botocore would refresh them as they sign (its advisory window; static ones never)."""
    refresh_needed = getattr(credentials, "refresh_needed", None)
    return bool(refresh_needed is not None and refresh_needed())


def life_left(credentials: Any) -> float:
    """How many seconds ``credentials`` stay valid at least (0 if expired; :data:`_HORIZON` at most).

    From botocore's public ``refresh_needed(seconds)`` (True when fewer than
    ``seconds`` are left), halving the interval: to within 0.1 s.
    """
    refresh_needed = getattr(credentials, "refresh_needed", None)
    if refresh_needed is None or not refresh_needed(_HORIZON):
        return _HORIZON
    if refresh_needed(0):
        return 0.0
    low, high = 0.0, _HORIZON
    while high - low > 0.1:
        middle = (low + high) / 2
        if refresh_needed(middle):
            high = middle
        else:
            low = middle
    return low
