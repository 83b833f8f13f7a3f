"""The typed errors: they survive pickling and process pools with their messages and attributes."""

from __future__ import annotations

import pickle
from concurrent.futures import ProcessPoolExecutor

import pytest

from handofflock import fencing
from handofflock.core import errors


def _every_error_class() -> list[type]:
    defined = {**vars(errors), **vars(fencing)}  # the fenced resource's errors live beside it
    return [c for c in defined.values() if isinstance(c, type) and issubclass(c, errors.HandoffLockError)]


def _sample(cls: type) -> BaseException:
    samples = {
        errors.PreconditionFailed: lambda: cls("k", 3, url="gs://b/k"),
        errors.NotFound: lambda: cls("k", url="gs://b/k"),
        errors.LockRecordCorrupt: lambda: cls("k", "bad", generation=2, url="gs://b/k"),
        fencing.StaleToken: lambda: cls("k", 1, 2, writer_id="w", holder_id="h"),
        fencing.FencedObjectCorrupt: lambda: cls("k", "bad", generation=2),
        fencing.FencedObjectFull: lambda: cls("k", 10, 5),
        fencing.FencedObjectTooLarge: lambda: cls("k", 10, 5),
    }
    for base, make in samples.items():
        if cls is base:
            return make()
    try:
        return cls("a message")
    except TypeError:
        return cls("a message", url="gs://b/k")


def _raise_precondition_failed() -> None:
    raise errors.PreconditionFailed("k", 3, url="gs://b/k")


@pytest.mark.parametrize("cls", _every_error_class(), ids=lambda c: c.__name__)
def test_every_error_survives_pickling_with_its_message_and_attributes(cls):
    exc = _sample(cls)
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is cls and str(back) == str(exc) and back.args == exc.args and vars(back) == vars(exc)


@pytest.mark.timeout(60)
def test_an_error_raised_in_a_process_pool_worker_arrives_intact():
    with ProcessPoolExecutor(1) as pool:
        with pytest.raises(errors.PreconditionFailed) as info:
            pool.submit(_raise_precondition_failed).result(timeout=30)
    assert info.value.expected_generation == 3 and info.value.key == "k"
