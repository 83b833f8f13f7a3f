"""The job's latest-checkpoint pointer: every rank reads the newest checkpoint, only the current holder moves it.

memory:// stores, real HandoffLocks, a RankLock of one rank (local_agree) or two
(threads): milliseconds, no framework.
"""

from __future__ import annotations

import threading
import uuid

import pytest
from ranksutil import PausedHolder

from handofflock import FencedObject, FencedObjectCorrupt, HandoffLock, StaleToken
from handofflock.core.errors import ConfigurationError
from handofflock.integrations.checkpoints import Checkpoint, LatestCheckpoint
from handofflock.integrations.ranks import RankLock, local_agree
from handofflock.storage import open_url

TIMING = dict(ttl=30.0)  # no waiter here: a long lease only keeps a loaded machine from losing the lock


@pytest.fixture
def urls():
    store = f"memory://latest-{uuid.uuid4().hex[:8]}"
    return f"{store}/locks/train.json", f"{store}/ckpts/latest.json"


def test_a_new_process_reads_the_last_checkpoint_the_holder_pointed_to_not_an_earlier_one(urls):
    lock_url, pointer = urls
    lock = HandoffLock(lock_url, owner_id="job-A", **TIMING)
    with lock:
        latest = LatestCheckpoint(pointer, lock=lock)
        assert latest.claim() is None  # nothing yet: a fresh start
        latest.point("ckpts/handoff-step33.ckpt", 33)  # the yield
        latest.point("ckpts/last.ckpt", 60)  # a periodic save after it
    found = LatestCheckpoint(pointer).read()  # what a new process (any rank) reads
    assert found is not None and found.path.endswith("ckpts/last.ckpt") and found.step == 60
    assert found.token == lock.token and found.path.startswith("/")  # a local path is kept absolute


def test_a_replaced_holder_cannot_move_the_pointer_back(urls):
    lock_url, pointer = urls
    old = HandoffLock(lock_url, owner_id="job-A", **TIMING)
    with old:
        LatestCheckpoint(pointer, lock=old).point("ckpts/a.ckpt", 10)
    paused = PausedHolder(old.token, owner_id=old.owner_id)  # old's holder paused, and never noticed the handoff
    new = HandoffLock(lock_url, owner_id="job-A", **TIMING)
    with new:
        assert new.token > old.token
        LatestCheckpoint(pointer, lock=new).claim()  # before it saves anything
        with pytest.raises(StaleToken):
            LatestCheckpoint(pointer, lock=paused).point("ckpts/b.ckpt", 99)  # type: ignore[arg-type]
        kept = LatestCheckpoint(pointer).read()
        assert kept is not None and kept.path.endswith("a.ckpt") and (kept.step, kept.token) == (10, old.token)
        LatestCheckpoint(pointer, lock=new).point("ckpts/c.ckpt", 20)
        with pytest.raises(StaleToken):
            LatestCheckpoint(pointer, lock=paused).point("ckpts/b.ckpt", 99)  # type: ignore[arg-type]
    found = LatestCheckpoint(pointer).read()
    assert found is not None and found.path.endswith("c.ckpt") and found.step == 20 and found.token == new.token


def test_a_rank_without_the_lock_reads_and_its_point_writes_nothing(urls):
    _, pointer = urls
    reader = LatestCheckpoint(pointer)
    assert reader.point("ckpts/x.ckpt", 1) is None and reader.read() is None
    with pytest.raises(ConfigurationError, match="needs the lock"):
        reader.claim()


def test_the_holder_claims_the_pointer_before_any_rank_returns_from_acquire(urls):
    lock_url, pointer = urls
    lock = HandoffLock(lock_url, owner_id="job-A", **TIMING)
    ranks = RankLock(lock, local_agree, latest=LatestCheckpoint(pointer, lock=lock))
    ranks.acquire()
    try:
        store, key = open_url(pointer)
        assert FencedObject(store, key).read().highest_token == lock.token  # fenced before the first save
    finally:
        ranks.release()


def test_two_ranks_read_the_same_checkpoint_after_acquire(urls):
    lock_url, pointer = urls
    lock = HandoffLock(lock_url, owner_id="job-A", **TIMING)
    with lock:
        LatestCheckpoint(pointer, lock=lock).point("ckpts/s7.ckpt", 7)
    barrier = threading.Barrier(2)
    flags: list[list[bool]] = [[], []]

    def agree_of(rank: int):
        def agree(votes):
            flags[rank] = list(votes)
            barrier.wait(5)
            merged = [a or b for a, b in zip(flags[0], flags[1], strict=True)]
            barrier.wait(5)
            return merged

        return agree

    follower = RankLock(None, agree_of(1), rank=1, poll=0.05, latest=LatestCheckpoint(pointer))
    seen: dict[int, Checkpoint | None] = {}

    def run_follower() -> None:
        follower.acquire()
        seen[1] = follower.latest.read()
        follower.release()

    thread = threading.Thread(target=run_follower)
    thread.start()
    holder = RankLock(lock, agree_of(0), rank=0, poll=0.05, latest=LatestCheckpoint(pointer, lock=lock))
    holder.acquire()
    seen[0] = holder.latest.read()
    holder.release()
    thread.join(10)
    assert seen[0] == seen[1] and seen[0] is not None and seen[0].step == 7


def test_a_claim_that_fails_lets_the_lock_go_and_fails_the_acquire(urls):
    lock_url, pointer = urls
    newer = PausedHolder(2**62, owner_id="someone-newer")  # a token above any this lock will give
    LatestCheckpoint(pointer, lock=newer).point("ckpts/theirs.ckpt", 5)  # type: ignore[arg-type]
    lock = HandoffLock(lock_url, owner_id="job-A", **TIMING)
    ranks = RankLock(lock, local_agree, latest=LatestCheckpoint(pointer, lock=lock))
    with pytest.raises(StaleToken):
        ranks.acquire()
    assert not ranks.held and not lock.is_held and HandoffLock(lock_url).status().owner_id is None


@pytest.mark.parametrize(
    "payload",
    [{"path": "", "step": 1, "token": 5}, {"path": "a", "step": -1, "token": 5}, {"path": "a", "step": 1}, [1, 2]],
)
def test_a_pointer_whose_payload_is_not_a_checkpoint_is_refused_and_left_alone(urls, payload):
    _, pointer = urls
    store, key = open_url(pointer)
    FencedObject(store, key).write(payload, token=5)
    with pytest.raises(FencedObjectCorrupt, match="latest-checkpoint pointer"):
        LatestCheckpoint(pointer).read()
    assert FencedObject(store, key).read().payload == payload
