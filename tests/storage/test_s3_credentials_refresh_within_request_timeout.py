"""A refresh of the AWS credentials never holds a request past its deadline (issue 25).

botocore refreshes temporary credentials inside the request that finds them
due: the container (ECS) provider, IMDS, ``credential_process``, STS assume-role
and web identity, SSO. Their fetchers bound each socket read (2 s for the
container endpoint) or nothing at all (``credential_process``), so a source
that trickles its reply, or a process that stalls, held a lock's renewal as
long as it liked. Here the credentials come from a real source on this machine
(a container credentials endpoint on 127.0.0.1, or a ``credential_process``
program), the store is the real moto server the suite starts, and the source
stalls from its second answer on, when botocore's refresh window has opened:

* credentials due for refresh but still good (botocore's advisory and
  mandatory windows, 15 and 10 minutes before they expire) sign the request
  while the refresh runs in a thread of its own: the request is not held;
* credentials about to expire wait for the refresh only until the request's
  deadline, then the request fails as transient, nothing sent;
* a lock renewing through such a refresh keeps its lease.
"""

from __future__ import annotations

import datetime as dt
import http.server
import json
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.credentials import Credentials, RefreshableCredentials
from lockutil import eventually

from handofflock import HandoffLock, TransientStorageError, signals
from handofflock.storage.s3 import S3Storage
from handofflock.storage.s3_credentials import life_left

pytestmark = pytest.mark.s3
KEY = "locks/job.json"

#: The bound the requests below are held to (a lock's Timing.request_timeout, as with ttl 2.4 s).
BOUND = 0.5
#: What a loaded 2-core machine adds to a request to moto.
SLACK = 1.0
#: How long the source stalls once it stalls: far past any bound here.
STALL = 12.0


def expiration(seconds: float) -> str:
    at = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=seconds)
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


class ContainerEndpoint:
    """An ECS container credentials endpoint on 127.0.0.1 (``AWS_CONTAINER_CREDENTIALS_FULL_URI``).

    Each answer expires ``expires_in`` seconds after it is made. Once told to
    stall, it sends its answers one byte at a time, STALL seconds in all.
    """

    def __init__(self, expires_in: float) -> None:
        self.expires_in = expires_in
        self.answers = 0
        self._stall_from = 10**9
        self._stopped = threading.Event()
        source = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                source.answers += 1
                stall = source.answers >= source._stall_from
                body = json.dumps(
                    {
                        "AccessKeyId": f"ASIA{uuid.uuid4().hex[:16].upper()}",
                        "SecretAccessKey": uuid.uuid4().hex,
                        "Token": uuid.uuid4().hex,
                        "Expiration": expiration(source.expires_in),
                    }
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    for i in range(len(body)) if stall else ():
                        if source._stopped.wait(STALL / len(body)):
                            return  # the test is over: the connection ends, the refresh fails
                        self.wfile.write(body[i : i + 1])
                        self.wfile.flush()
                    if not stall:
                        self.wfile.write(body)
                except OSError:
                    pass

            def log_message(self, *args: object) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()  # a quick shutdown()

    def configure(self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
        monkeypatch.setenv(
            "AWS_CONTAINER_CREDENTIALS_FULL_URI", f"http://127.0.0.1:{self._server.server_address[1]}/creds"
        )

    def stall_from_now(self) -> None:
        self._stall_from = self.answers + 1

    def stop(self) -> None:
        self._stopped.set()
        self._server.shutdown()
        self._server.server_close()


PROGRAM = """\
import datetime as dt, json, pathlib, sys, time, uuid
state = pathlib.Path(sys.argv[1])
control = json.loads(state.with_suffix(".control").read_text())
answers = state.with_suffix(".answers")
n = len(answers.read_text()) + 1 if answers.exists() else 1
answers.write_text("x" * n)
if n >= control["stall_from"]:
    for _ in range(int(control["stall"] * 20)):
        if state.with_suffix(".stop").exists():
            sys.exit(1)
        time.sleep(0.05)
at = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=control["expires_in"])
print(json.dumps({"Version": 1, "AccessKeyId": "ASIA" + uuid.uuid4().hex[:16].upper(),
                  "SecretAccessKey": uuid.uuid4().hex, "SessionToken": uuid.uuid4().hex,
                  "Expiration": at.strftime("%Y-%m-%dT%H:%M:%SZ")}))
"""


class CredentialProcess:
    """A profile whose ``credential_process`` is a program (botocore runs it at the load and at each
    refresh). Each answer expires ``expires_in`` seconds after it is made; once told to stall, the
    program takes STALL seconds to answer."""

    def __init__(self, expires_in: float) -> None:
        self.expires_in = expires_in
        self._state: Path | None = None

    def configure(self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
        program = tmp_path / "creds.py"
        program.write_text(PROGRAM)
        self._state = tmp_path / "creds"
        self._control(10**9)
        config = tmp_path / "config"
        config.write_text(f"[default]\ncredential_process = {sys.executable} {program} {self._state}\n")
        monkeypatch.setenv("AWS_CONFIG_FILE", str(config))

    @property
    def answers(self) -> int:
        assert self._state is not None
        answers = self._state.with_suffix(".answers")
        return len(answers.read_text()) if answers.exists() else 0

    def _control(self, stall_from: int) -> None:
        assert self._state is not None
        control = {"expires_in": self.expires_in, "stall_from": stall_from, "stall": STALL}
        self._state.with_suffix(".control").write_text(json.dumps(control))

    def stall_from_now(self) -> None:
        self._control(self.answers + 1)

    def stop(self) -> None:
        if self._state is not None:
            self._state.with_suffix(".stop").write_text("")


SOURCES = {"container": ContainerEndpoint, "credential_process": CredentialProcess}


@pytest.fixture(params=list(SOURCES))
def source_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def credentials_from(
    s3_server: Any, source_kind: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[Any]:
    """``credentials_from(expires_in)``: the source of this run, the only one botocore finds."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    made: list[Any] = []

    def make(expires_in: float) -> Any:
        source = SOURCES[source_kind](expires_in)
        source.configure(monkeypatch, tmp_path)
        made.append(source)
        return source

    yield make
    for source in made:
        source.stop()


@pytest.fixture
def bucket(s3_server: Any) -> str:
    name = f"c-{uuid.uuid4().hex[:16]}"
    s3_server.create_bucket(name)
    return name


#: botocore's advisory refresh window (RefreshableCredentials: 15 minutes before they expire).
ADVISORY = 15 * 60
#: A life inside that window and outside its mandatory one (10 minutes), far above STILL_GOOD (1 minute):
#: botocore refreshes such credentials as it signs with them, which still may sign meanwhile.
DUE_BUT_GOOD = ADVISORY - 120


def timed_read(store: S3Storage) -> tuple[float, BaseException | None]:
    started = time.monotonic()
    try:
        store.read(KEY, timeout=BOUND)
    except TransientStorageError as exc:
        return time.monotonic() - started, exc
    return time.monotonic() - started, None


def test_credentials_due_for_refresh_but_still_good_sign_at_once_while_a_stalled_refresh_runs(
    credentials_from, bucket, source_kind
):
    """Every answer is good for 13 min, inside botocore's refresh window (15 min): each request finds a
    refresh due. Once a refresh stalls, a read goes at once with the credentials in hand (before: held
    by the refresh, STALL seconds)."""
    source = credentials_from(DUE_BUT_GOOD)
    store = S3Storage(bucket)
    store.read(KEY)  # the client, the credentials' load, and the store's one-time probe, unbounded
    source.stall_from_now()
    stalls_from = source.answers + 1
    # A refresh that answered at once may still be finishing; the next read after it starts one that stalls.
    eventually(lambda: store.read(KEY) is None and source.answers >= stalls_from, what="a refresh that stalls")
    elapsed, error = timed_read(store)
    print(f"[{source_kind}] a read with a refresh due, the source stalling: {elapsed:.2f} s, {error!r}")
    assert error is None and elapsed < BOUND + SLACK, f"held {elapsed:.2f} s by the refresh ({error!r})"


def test_credentials_about_to_expire_wait_for_their_refresh_only_until_the_request_deadline(
    credentials_from, bucket, source_kind
):
    """Every answer is good for under a minute (59 s, less the part second the expiry's format drops),
    and the source stalls: the read waits for the refresh until its deadline, then fails as transient,
    nothing sent (before: STALL seconds)."""
    source = credentials_from(59)
    store = S3Storage(bucket)
    store.read(KEY)  # each request of which waits for a refresh that answers at once
    source.stall_from_now()
    elapsed, error = timed_read(store)
    print(
        f"[{source_kind}] a read whose credentials expire in under a minute, the source stalling: {elapsed:.2f} s, {error!r}"
    )
    assert elapsed < BOUND + SLACK, f"held {elapsed:.2f} s by the refresh"
    assert isinstance(error, TransientStorageError) and not error.ambiguous, repr(error)
    assert "credentials" in str(error) and "nothing was sent" in str(error)


def test_a_first_load_that_stalls_holds_neither_the_client_nor_a_request_past_its_deadline(
    credentials_from, bucket, source_kind
):
    """The source stalls from its first answer: making the client loads nothing (before: it waited
    for the load, STALL seconds), and a request waits for the load only until its deadline."""
    source = credentials_from(3600)
    source.stall_from_now()
    store = S3Storage(bucket)
    started = time.monotonic()
    assert store.client is not None
    made = time.monotonic() - started
    assert made < 5.0, f"making the client waited {made:.2f} s for the credentials"
    elapsed, error = timed_read(store)
    print(
        f"[{source_kind}] client made in {made:.2f} s; a read while the first load stalls: {elapsed:.2f} s, {error!r}"
    )
    assert isinstance(error, TransientStorageError) and not error.ambiguous and "loading" in str(error), repr(error)
    # the store's one-time probe: its PUT, then the DELETE of its scratch key, each wait their deadline
    assert elapsed < 2 * BOUND + SLACK, f"held {elapsed:.2f} s by the load"


def test_life_left_reads_the_expiry_through_botocores_public_refresh_needed():
    def refreshable(seconds: float) -> RefreshableCredentials:
        at = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=seconds)
        return RefreshableCredentials("a", "s", "t", at, lambda: {}, "test")

    assert abs(life_left(refreshable(95)) - 95) < 1.0
    assert life_left(refreshable(-5)) == 0.0
    assert life_left(refreshable(10 * 3600)) == 3600.0  # "at least an hour"
    assert life_left(Credentials("a", "s")) == 3600.0  # static ones never expire


def test_a_lock_keeps_its_lease_on_s3_through_a_credentials_refresh_that_stalls(credentials_from, bucket, source_kind):
    """The lock holds on credentials inside botocore's refresh window (13 min), and the source stalls
    mid-hold: every renewal still lands (before: the first renewal after it hung, the lease was lost)."""
    source = credentials_from(DUE_BUT_GOOD)
    store = S3Storage(bucket)
    lock = HandoffLock(f"s3://{bucket}/{KEY}", storage=store, key=KEY, ttl=4.0, renew_interval=0.4, renew_deadline=2.0)
    lost: list[Any] = []

    def on_lost(sender: Any, **kw: Any) -> None:
        lost.append(kw)

    signals.lost.connect(on_lost, sender=lock, weak=False)
    try:
        assert lock.acquire(timeout=10)
        source.stall_from_now()  # the next renewal finds a refresh due, which stalls
        before = store.read(KEY)
        assert before is not None
        # A renewal held by the refresh loses the lease within renew_deadline of the last one that landed.
        time.sleep(lock.timing.renew_deadline + 2 * lock.timing.renew_interval)
        after = store.read(KEY)
        assert after is not None and after[1] > before[1], "renewals landed after the refresh window opened"
        lock.check()
        assert lost == [] and lock.healthy
        print(f"[{source_kind}] renewed from generation {before[1]} to {after[1]} while the refresh stalled")
    finally:
        signals.lost.disconnect(on_lost, sender=lock)
        if lock.is_held:
            lock.release()
