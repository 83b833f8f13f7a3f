"""Shared fixtures. ``store`` runs a test once per backend, unchanged (the contract suite)."""

from __future__ import annotations

import itertools
import uuid

import pytest

from handofflock.storage import MemoryStorage
from handofflock.storage.gcs import GCSStorage
from handofflock.testing import FakeGCSServer

#: Every backend the contract suite runs against.
BACKENDS = ["memory", "local", "gcs"]

_names = itertools.count()


def make_store(kind: str, request: pytest.FixtureRequest, tmp_path):
    """A fresh, empty store of the given kind."""
    if kind == "memory":
        name = f"test-{next(_names)}-{uuid.uuid4().hex[:8]}"
        request.addfinalizer(lambda: MemoryStorage.forget(name))
        return MemoryStorage.named(name)
    if kind == "gcs":  # a fresh bucket per test on the session's emulator
        emulator = request.getfixturevalue("gcs_emulator")
        bucket = f"t{next(_names)}-{uuid.uuid4().hex[:12]}"
        emulator.create_bucket(bucket)
        return GCSStorage(bucket)
    if kind == "local":
        from handofflock.storage.local import LocalStorage

        return LocalStorage(tmp_path / "store")
    raise AssertionError(f"unknown backend {kind!r}")


@pytest.fixture(params=BACKENDS)
def store(request, tmp_path):
    """One empty store per backend."""
    s = make_store(request.param, request, tmp_path)
    yield s
    s.close()


@pytest.fixture(scope="session")
def gcs_emulator():
    """One fake-gcs-server for the whole session, with STORAGE_EMULATOR_HOST pointing at it.

    It has a bucket named ``handofflock-test``. It never skips: if the emulator
    cannot start, every test that needs it fails with the server's log.
    """
    with FakeGCSServer() as server, server.env():
        server.create_bucket("handofflock-test")
        yield server
