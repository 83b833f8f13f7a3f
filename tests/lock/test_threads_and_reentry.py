"""One instance is one party: not reentrant, and threads do not queue on it; one instance per thread works."""

from __future__ import annotations

import threading

import pytest

from handofflock import AlreadyAcquired, HandoffLock, HandoffLockError
from lockutil import FAST, raw_read, url_for


@pytest.mark.parametrize("backend", ["memory", "local"])
def test_threads_sharing_one_instance_are_told_at_once_to_use_one_instance_each(backend, request, tmp_path):
    url = url_for(backend, request, tmp_path)
    lock = HandoffLock(url)
    inside, leave = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def holder() -> None:
        with lock:
            inside.set()
            leave.wait(20)

    def other() -> None:
        try:
            with lock:
                pass
        except BaseException as exc:  # handed to the test
            errors.append(exc)

    first = threading.Thread(target=holder)
    first.start()
    assert inside.wait(20)
    others = [threading.Thread(target=other) for _ in range(2)]
    for t in others:
        t.start()
    for t in others:
        t.join(5)
    leave.set()
    first.join(20)
    assert len(errors) == 2 and all(isinstance(e, AlreadyAcquired) for e in errors), errors
    assert all(isinstance(e, HandoffLockError) and isinstance(e, RuntimeError) for e in errors)
    assert "give each thread its own HandoffLock" in str(errors[0]), str(errors[0])
    assert raw_read(url)[0].owner_id is None  # the holder's block released it; the others changed nothing


def test_a_nested_acquire_in_the_same_thread_is_refused_and_the_outer_hold_goes_on(request, tmp_path):
    url = url_for("local", request, tmp_path)
    lock = HandoffLock(url)
    with lock:
        token = lock.token
        with pytest.raises(AlreadyAcquired, match="not reentrant"):
            with lock:
                pass
        assert lock.is_held and lock.token == token and raw_read(url)[0].owner_id == lock.owner_id
    assert not lock.is_held and raw_read(url)[0].owner_id is None


def test_one_instance_per_thread_takes_turns(request, tmp_path):
    url = url_for("memory", request, tmp_path)
    turns: list[str] = []
    mutex = threading.Lock()

    def worker(name: str) -> None:
        own = HandoffLock(url, owner_id=name, wait_for_slot=True, **FAST)
        with own.acquire(timeout=30):
            with mutex:
                turns.append(name)

    threads = [threading.Thread(target=worker, args=(f"t{i}",)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(40)
    assert sorted(turns) == ["t0", "t1", "t2"]
