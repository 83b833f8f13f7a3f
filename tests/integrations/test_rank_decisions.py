"""What every rank learns when the ranks stop, and who the job is across restarts."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from ranksutil import ROOT

from handofflock import HandoffLock
from handofflock.core.identity import stable_job_id
from handofflock.integrations.ranks import RankLock, StopDecision, local_agree
from handofflock.integrations.torch import agree_device

HERE = Path(__file__).resolve().parent


@pytest.mark.timeout(120)
def test_a_followers_stop_request_made_while_the_job_waits_stands_once_the_lock_is_taken(tmp_path):
    url = (tmp_path / "l.json").as_uri()
    holder = HandoffLock(url, owner_id="job-B", ttl=10.0, waiter_check_interval=0.2)
    holder.acquire()
    job = subprocess.Popen([sys.executable, "-c", "import ranksutil, sys; from pathlib import Path; "
                            "p = ranksutil.torchrun(Path(sys.argv[1]), 2, sys.argv[2], timeout=90); "
                            "print(p.stdout); print(p.stderr[-3000:], file=sys.stderr); sys.exit(p.returncode)",
                            str(HERE / "rank_stop_job.py"), url],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT / "tests" / "support")
    try:
        deadline = time.monotonic() + 60
        while HandoffLock(url).status().waiter_id != "job-A":
            assert time.monotonic() < deadline and job.poll() is None, job.communicate()
            time.sleep(0.1)
        time.sleep(2.0)  # rank 1 asked meanwhile
        holder.release()
        out, err = job.communicate(timeout=90)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 0, out + err
    seen = dict(re.findall(r"rank (\d): (count \d+ decision \w+)", out))
    assert seen == {"0": "count 0 decision yield", "1": "count 0 decision yield"}, out  # both, before any step


def test_the_decision_carries_its_reason_and_status_to_every_rank():
    assert StopDecision("exit", "SIGTERM").exit_status == 143
    assert StopDecision("exit", "SIGUSR1").exit_status == 138
    assert StopDecision("exit", "preemption").exit_status == 75
    assert not StopDecision("yield", "waiter").exit


def test_an_exit_asked_on_a_rank_stands_and_a_later_acquire_never_takes_the_lock(tmp_path):
    lock = HandoffLock(tmp_path / "l.json", ttl=5.0)
    ranks = RankLock(lock, local_agree, every=1, rank=0)
    ranks.acquire()
    ranks.request_stop("exit", cause="SIGTERM")
    assert ranks.should_stop() and ranks.decision == StopDecision("exit", "SIGTERM", None)
    ranks.release()
    with pytest.raises(SystemExit) as stop:  # the documented loop's next acquire() ends the process instead
        ranks.acquire()
    assert stop.value.code == 143 and not lock.is_held


@pytest.mark.parametrize("env,expected", [
    ({}, None),
    ({"TORCHELASTIC_RUN_ID": "none"}, None),  # torchrun's default --rdzv-id names nothing
    ({"TORCHELASTIC_RUN_ID": "run7"}, "torchrun:run7"),
    ({"SLURM_JOB_ID": "812345", "TORCHELASTIC_RUN_ID": "run7"}, "slurm:812345"),
    ({"SLURM_JOB_ID": "812346", "SLURM_ARRAY_JOB_ID": "812300", "SLURM_ARRAY_TASK_ID": "4"}, "slurm:812300_4"),
    ({"SLURM_JOB_ID": "812345", "SLURM_STEP_ID": "1"}, "slurm:812345.1"),  # two srun steps are two jobs
    ({"SLURM_JOB_ID": "812345", "SLURM_STEP_ID": "0"}, "slurm:812345.0"),
    ({"SLURM_JOB_ID": "812345", "SLURM_STEP_ID": str(0xFFFFFFFB)}, "slurm:812345"),  # the batch script's own step
    ({"KUBERNETES_JOB_NAME": "train", "POD_NAMESPACE": "ml"}, "k8s:ml/train"),
    ({"KUBERNETES_JOB_NAME": "train", "POD_NAMESPACE": "ml", "JOB_COMPLETION_INDEX": "2"}, "k8s:ml/train/2"),
    ({"HANDOFFLOCK_JOB_ID": "nightly", "SLURM_JOB_ID": "1"}, "job:nightly"),
])
def test_a_job_is_named_by_what_its_restarts_keep(env, expected, tmp_path):
    assert stable_job_id(env, namespace_file=str(tmp_path / "absent")) == expected


class _Group:
    def __init__(self, bound=None):
        self.bound_device_id = bound


def test_the_vote_lives_where_the_process_group_works():
    assert agree_device(_Group(), "gloo", {}) == torch.device("cpu")
    assert agree_device(_Group(), "cpu:gloo,cuda:nccl", {"LOCAL_RANK": "1"}) == torch.device("cpu")
    assert agree_device(_Group(), "nccl", {"LOCAL_RANK": "3"}) == torch.device("cuda", 3)  # no set_device needed
    assert agree_device(_Group(torch.device("cuda", 5)), "nccl", {"LOCAL_RANK": "3"}) == torch.device("cuda", 5)


@pytest.mark.parametrize("reason,requester,cause", [("signal", "SIGTERM", "SIGTERM"), ("preemption", "gce", "preemption")])
def test_a_signal_or_notice_behind_a_more_urgent_waiter_still_makes_the_ranks_exit(tmp_path, reason, requester, cause):
    """A waiter asked first, with the earlier deadline (the most urgent request); then the kubelet's SIGTERM (or
    a preemption notice) asks too, through the holder's lock. The pod is going away: the ranks must exit with the
    signal's status (143, or 75 for a notice), as Slurm and Kubernetes read it, not yield and wait for the lock
    again until SIGKILL."""
    lock = HandoffLock(tmp_path / "l.json", ttl=30.0, min_hold=0)
    ranks = RankLock(lock, local_agree, every=1, rank=0)
    ranks.acquire()
    try:
        now = time.time()
        lock.request_release("waiter", requester="job-B", deadline=now + 5)
        lock.request_release(reason, requester=requester, deadline=now + 30)
        assert lock.release_request.reason == "waiter"  # the most urgent is the waiter's
        assert ranks.should_stop()
        assert ranks.decision.action == "exit" and ranks.decision.cause == cause, ranks.decision
    finally:
        lock.release()
