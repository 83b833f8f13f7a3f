"""A preemption notice on any node of a multi-rank job stops every rank at the same step.

Two ranks run as threads of this process, each with its own RankLock, agreeing
through a barrier (the elementwise OR an all-reduce computes); the watcher on
one node is given that node's RankLock, holder or not. The real gloo groups
are tests/integrations/test_integrations_torch.py's business.
"""

from __future__ import annotations

import threading
import time

import pytest
from fake_metadata import FakeMetadataServer

from handofflock import HandoffLock
from handofflock.integrations import RankLock
from handofflock.preemption import PreemptionWatcher

FAST = dict(backoff_initial=0.05, backoff_max=0.2, request_timeout=0.5, poll_timeout=5)


class ThreadGroup:
    """The ``agree`` collective of ranks that are threads: every rank's flags, OR-ed elementwise."""

    def __init__(self, world: int) -> None:
        self.barrier = threading.Barrier(world, timeout=20)
        self.votes: dict[int, tuple[bool, ...]] = {}

    def agree_for(self, rank: int):
        def agree(flags):
            self.votes[rank] = tuple(flags)
            self.barrier.wait()
            agreed = tuple(any(v[i] for v in self.votes.values()) for i in range(len(flags)))
            self.barrier.wait()  # all have read before anyone votes again
            return agreed

        return agree


def train(ranks: RankLock, out: dict, started: threading.Event) -> None:
    try:
        with ranks:
            steps = ranks.steps(range(100_000))
            for step in steps:
                if step == 3:
                    started.set()
                time.sleep(0.005)
            out.update(last=steps.last, stopped=steps.stopped, request=steps.request, decision=steps.decision)
    except BaseException as exc:  # the test reports it
        out["error"] = exc


@pytest.mark.timeout(60)
@pytest.mark.parametrize("node", ["holder", "follower"])
def test_a_notice_on_any_node_reaches_the_rank_lock_and_every_rank_stops_at_the_same_step(tmp_path, node):
    lock = HandoffLock(tmp_path / "train.lock.json", ttl=5.0)
    group = ThreadGroup(2)
    ranks = [RankLock(lock if r == 0 else None, group.agree_for(r), every=2, poll=0.05, rank=r) for r in range(2)]
    watched = ranks[0] if node == "holder" else ranks[1]
    delivered = []
    deliver = getattr(watched, "request_release", None)
    if deliver is not None:  # observe, then pass on
        watched.request_release = lambda *a, **kw: (delivered.append((a, kw)), deliver(*a, **kw))
    outs: list[dict] = [{}, {}]
    started = threading.Event()
    threads = [threading.Thread(target=train, args=(ranks[r], outs[r], started), daemon=True) for r in range(2)]
    with FakeMetadataServer() as server:
        with PreemptionWatcher(watched, host=server.host, notice_grace=25.0, **FAST) as watcher:
            for t in threads:
                t.start()
            assert started.wait(20), outs
            server.preempt()
            assert watcher.wait(5)
            for t in threads:
                t.join(20)
    assert not any(t.is_alive() for t in threads), "a rank never stopped"
    assert "error" not in outs[0] and "error" not in outs[1], outs
    deadline = watcher.noticed_at + 25.0
    assert delivered == [(("preemption",), {"requester": "preemption", "deadline": deadline})]
    assert outs[0]["stopped"] and outs[1]["stopped"]
    assert outs[0]["last"] == outs[1]["last"], f"ranks stopped at different steps: {outs}"
    # The node is going away: every rank agrees on an exit caused by the notice, never a yield-and-wait.
    assert [(o["decision"].action, o["decision"].cause) for o in outs] == [("exit", "preemption")] * 2
    if node == "holder":  # the holder's lock carries the request, deadline and all
        request = outs[0]["request"]
        assert (request.reason, request.deadline) == ("preemption", deadline)
    assert not lock.is_held, "the job handed the lock back on leaving"
