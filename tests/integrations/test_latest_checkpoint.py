"""The job's latest-checkpoint pointer: every rank reads the newest checkpoint, only the current holder moves it.

memory:// stores, real HandoffLocks, a RankLock of one rank (local_agree) or two
(threads): milliseconds, no framework.
"""

from __future__ import annotations

import threading
import uuid

import pytest
from ranksutil import PausedHolder

from handofflock import FencedObject, FencedObjectCorrupt, HandoffLock, LockLost, StaleToken
from handofflock.core.errors import ConfigurationError, HandoffLockError
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


def two_ranks():
    """The collectives of a job of two ranks run as threads: ``agree_of(rank)`` for each."""
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

    return agree_of


def test_two_ranks_read_the_same_checkpoint_after_acquire(urls):
    lock_url, pointer = urls
    lock = HandoffLock(lock_url, owner_id="job-A", **TIMING)
    with lock:
        LatestCheckpoint(pointer, lock=lock).point("ckpts/s7.ckpt", 7)
    agree_of = two_ranks()
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


def point_on_two_ranks(urls, *, newer_claims: bool = False, seal=None) -> dict[int, object]:
    """Both ranks acquire, then move the pointer once (``ranks.point``): what each got back or raised."""
    lock_url, pointer = urls
    lock = HandoffLock(lock_url, owner_id="job-A", **TIMING)
    agree_of = two_ranks()
    ranks = [RankLock(lock, agree_of(0), rank=0, poll=0.05, latest=LatestCheckpoint(pointer, lock=lock)),
             RankLock(None, agree_of(1), rank=1, poll=0.05, latest=LatestCheckpoint(pointer))]
    outcome: dict[int, object] = {}

    def run(rank: int) -> None:
        ranks[rank].acquire()
        if newer_claims and rank == 0:
            LatestCheckpoint(pointer, lock=PausedHolder(lock.token + 1, "job-B")).claim()  # type: ignore[arg-type]
        try:
            outcome[rank] = ranks[rank].point("ckpts/s3.ckpt", 3, seal=seal)
        except Exception as exc:
            outcome[rank] = exc
        finally:
            ranks[rank].abandon()

    follower = threading.Thread(target=run, args=(1,))
    follower.start()
    run(0)
    follower.join(10)
    assert not any(r.held for r in ranks) and HandoffLock(lock_url).status().owner_id is None
    return outcome


def test_a_refused_pointer_move_raises_lock_lost_on_every_rank_at_that_save(urls):
    outcome = point_on_two_ranks(urls, newer_claims=True)
    assert isinstance(outcome[0], LockLost) and isinstance(outcome[0].__cause__, StaleToken), outcome
    assert isinstance(outcome[1], LockLost), outcome  # before: nothing here; the holder alone raised StaleToken
    assert LatestCheckpoint(urls[1]).read() is None  # the newer holder's claim: nothing was pointed


def test_a_pointer_move_returns_the_checkpoint_on_the_holder_and_its_seal_names_it(urls):
    outcome = point_on_two_ranks(urls, seal=lambda token: f"ckpts/s3-token{token}.ckpt")
    assert outcome[1] is None and isinstance(outcome[0], Checkpoint), outcome
    assert outcome[0].path.endswith(f"ckpts/s3-token{outcome[0].token}.ckpt") and outcome[0].step == 3
    assert LatestCheckpoint(urls[1]).read() == outcome[0]


def test_a_pointer_move_that_fails_otherwise_fails_on_every_rank(urls):
    def seal(token: int) -> str:
        raise OSError("disk full")

    outcome = point_on_two_ranks(urls, seal=seal)
    assert isinstance(outcome[0], OSError) and not isinstance(outcome[0], LockLost), outcome
    assert isinstance(outcome[1], HandoffLockError) and "could not move" in str(outcome[1]), outcome


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


def test_an_hf_resume_path_whose_pointed_folder_the_rotation_removed_falls_back_to_the_highest_checkpoint(tmp_path):
    """The Trainer rotates (``save_total_limit``) inside its save, before ``on_save`` moves the pointer: a
    process that dies between the two leaves the pointer on a deleted folder. ``resume_path`` then names the
    newest whole checkpoint the Trainer wrote, with a warning, not a path that is gone."""
    pytest.importorskip("transformers")
    from handofflock.integrations.transformers import HandoffLockTrainerCallback, latest_pointer

    out = tmp_path / "out"
    (out / "checkpoint-8").mkdir(parents=True)  # the new save, whole, not yet renamed nor pointed at
    lock = HandoffLock(f"memory://rot-{uuid.uuid4().hex[:8]}/locks/train.json", **TIMING)
    with lock:
        LatestCheckpoint(latest_pointer(out), lock=lock).point(str(out / "checkpoint-06-token5"), 6)  # rotated away
    with pytest.warns(UserWarning, match="no longer exists"):
        assert HandoffLockTrainerCallback.resume_path(out) == str(out / "checkpoint-8")
    (out / "checkpoint-06-token5").mkdir()
    assert HandoffLockTrainerCallback.resume_path(out) == str(out / "checkpoint-06-token5")  # the pointer, when there
