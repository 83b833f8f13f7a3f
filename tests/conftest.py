"""Shared fixtures. ``store`` runs a test once per backend, unchanged (the contract suite)."""

from __future__ import annotations

import itertools
import uuid

import pytest

from handofflock.storage import MemoryStorage

#: Every backend the contract suite runs against.
BACKENDS = ["memory", "local"]

_names = itertools.count()


def make_store(kind: str, request: pytest.FixtureRequest, tmp_path):
    """A fresh, empty store of the given kind."""
    if kind == "memory":
        name = f"test-{next(_names)}-{uuid.uuid4().hex[:8]}"
        request.addfinalizer(lambda: MemoryStorage.forget(name))
        return MemoryStorage.named(name)
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
