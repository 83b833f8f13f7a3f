"""What a lock is made with: timing, pacing, owner ids and labels, validated in the constructor, before any I/O."""

from __future__ import annotations

import uuid

import pytest
from jobsutil import in_process
from lockutil import make_lock
from simworld import KEY

from handofflock import (
    ConfigurationError,
    HandoffLock,
    LockRecordCorrupt,
    Timing,
)
from handofflock.core.identity import detect_label
from handofflock.core.record import MAX_TTL, Holder, Label, LockRecord
from handofflock.storage import MemoryStorage, open_url
from handofflock.storage.gcs import GCSStorage


@pytest.fixture
def url():
    name = f"edge-{uuid.uuid4().hex[:8]}"
    yield f"memory://{name}/locks/l.json"
    MemoryStorage.forget(name)

GCS_SPACING = 1.0  # GCS's default write spacing, given to the memory store where a test says so


def test_a_store_request_timeout_longer_than_the_renewal_window_is_refused():
    timing = Timing.build(ttl=10.0, min_write_interval=1.0)
    assert timing.request_timeout == (timing.renew_deadline - timing.renew_interval) / 2 == 1.875
    store = GCSStorage("some-bucket", request_timeout=20.0)
    with pytest.raises(ConfigurationError, match=r"request_timeout=20 s .* at most .* = 1.875 s"):
        HandoffLock("gs://some-bucket/locks/a.json", storage=store, key=KEY, ttl=10.0)
    with pytest.raises(ConfigurationError, match="request_timeout=20 s"):
        HandoffLock("gs://some-bucket/locks/a.json", storage=store, key=KEY, timing=timing)
    # Left at its default (20 s on GCS), the store is fine: the lock bounds its own requests.
    HandoffLock("gs://some-bucket/locks/a.json", storage=GCSStorage("some-bucket"), key=KEY, ttl=10.0)
    HandoffLock("gs://some-bucket/locks/a.json", storage=GCSStorage("some-bucket", request_timeout=1.5), key=KEY, ttl=10.0)


@pytest.mark.parametrize("grace", [-1.0, MAX_TTL * 2, True, float("nan")])
def test_a_label_grace_the_decoder_would_refuse_is_refused_before_anything_is_written(url, grace):
    with pytest.raises(ConfigurationError, match="grace"):
        make_lock(url, label=Label("job-a", grace=grace))
    store, key = open_url(url)
    assert store.read(key) is None


def test_run_refuses_a_grace_over_a_week_with_a_usage_error(tmp_path, capsys):
    """Accepted, ``--grace 1000000`` would write a label every reader calls corrupt while the job runs."""
    url = (tmp_path / "locks" / "l.json").as_uri()
    proc = in_process(["run", url, "--ttl", "5", "--grace", "1000000", "--", "true"], capsys)
    assert proc.returncode == 64 and "--grace" in proc.stderr, (proc.returncode, proc.stderr)
    assert not (tmp_path / "locks" / "l.json").exists()  # never asked for the lock


def test_a_bad_label_is_refused_when_the_lock_is_made(url):
    for bad in ("", "x" * 257, "tab\there", 5):
        with pytest.raises(ConfigurationError, match="label"):
            HandoffLock(url, label=bad)


def test_the_default_label_names_host_and_pid_outside_any_scheduler():
    assert detect_label({}, pid=4242, host="gpu-3", namespace_file="/nonexistent") == "host=gpu-3 pid=4242"


def test_kubernetes_pod_and_namespace_from_the_downward_api_names():
    env = {"POD_NAME": "train-0", "POD_NAMESPACE": "ml", "KUBERNETES_SERVICE_HOST": "10.0.0.1", "HOSTNAME": "train-0"}
    assert detect_label(env, pid=1, host="train-0", namespace_file="/nonexistent") == "pod=ml/train-0 pid=1"


def test_kubernetes_without_the_downward_api_uses_hostname_and_the_service_account_namespace(tmp_path):
    ns = tmp_path / "namespace"
    ns.write_text("research\n")
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "HOSTNAME": "train-7f9c"}
    assert detect_label(env, pid=1, host="train-7f9c", namespace_file=str(ns)) == "pod=research/train-7f9c pid=1"


def test_slurm_array_tasks_and_torchrun_ranks_are_named():
    env = {"SLURM_JOB_ID": "812346", "SLURM_ARRAY_JOB_ID": "812345", "SLURM_ARRAY_TASK_ID": "3",
           "RANK": "2", "LOCAL_RANK": "0", "TORCHELASTIC_RUN_ID": "abc"}
    assert detect_label(env, pid=9, host="node12", namespace_file="/nonexistent") == "host=node12 pid=9 slurm=812345_3 rank=2"
    assert "rank" not in detect_label({"RANK": "2"}, pid=9, host="h"), "RANK alone is not torchrun's"


def test_a_hostile_environment_still_makes_a_valid_label():
    label = detect_label({"POD_NAME": "x\n" * 300}, pid=1, host="h")
    HandoffLock("memory://detect/l.json", label=label)  # accepted: cleaned and cut to fit


def test_a_ttl_the_stores_spacing_cannot_serve_is_refused_naming_the_minimum():
    store = MemoryStorage("ttl-floor")
    with pytest.raises(ConfigurationError, match="at least 5 s"):
        HandoffLock("memory://x", storage=store, key=KEY, ttl=4.0, min_write_interval=GCS_SPACING)
    HandoffLock("memory://x", storage=store, key=KEY, ttl=5.0, min_write_interval=GCS_SPACING)
    with pytest.raises(ConfigurationError, match="renew_interval"):
        HandoffLock("memory://x", storage=store, key=KEY, ttl=10.0, renew_interval=0.5, min_write_interval=GCS_SPACING)


@pytest.mark.gcs
def test_gcs_default_pacing_refuses_a_ttl_it_cannot_serve(gcs_emulator):
    with pytest.raises(ConfigurationError, match="at least 5 s"):
        HandoffLock("gs://handofflock-test/locks/short.json", ttl=4.0)
    lock = HandoffLock("gs://handofflock-test/locks/five.json", ttl=5.0)
    assert lock.min_write_interval == 1.0 and lock.renew_interval == 1.0 and lock.renew_deadline == 2.5


def test_a_configuration_error_names_what_the_user_set():
    store = MemoryStorage("ttl-names")
    with pytest.raises(ConfigurationError) as info:
        HandoffLock("memory://x", storage=store, key=KEY, ttl=0.1)
    # The user set ttl alone: the error is about ttl, not about waiter_ttl, which they never set.
    assert str(info.value).startswith("ttl=0.1 is too short") and "waiter_ttl =" not in str(info.value)


def test_the_constructor_does_no_io_and_validates_intervals():
    from handofflock import ConfigurationError

    HandoffLock("gs://no-such-bucket-anywhere/x.json")  # no request: nothing raised
    for bad in (dict(ttl=0), dict(ttl=-1), dict(ttl=10, renew_interval=6, renew_deadline=5),
                dict(ttl=10, renew_deadline=10), dict(waiter_check_interval=0), dict(waiter_poll_interval=float("nan")),
                dict(max_clock_skew=-1), dict(ttl=1e9), dict(waiter_ttl=1.0, waiter_poll_interval=1.0),
                dict(waiter_ttl=1e12)):
        with pytest.raises(ConfigurationError):
            HandoffLock("memory://cfg/x.json", **bad)


@pytest.mark.parametrize("owner_id", ["", "a\nb", "tab\there", "del\x7f", "x" * 513, 7])
def test_an_owner_id_the_decoder_would_call_corrupt_is_refused_before_anything_is_written(owner_id):
    """The constructor applies the decoder's rule for ids: otherwise the lock would write a record
    that it, and every contender, then reads as corrupt, stuck until someone forces it."""
    from handofflock import ConfigurationError

    with pytest.raises(ConfigurationError, match="owner_id"):
        HandoffLock("memory://cfg/x.json", owner_id=owner_id)
    if isinstance(owner_id, str):  # what a record naming it would have been taken for
        with pytest.raises(LockRecordCorrupt):
            LockRecord.decode(LockRecord(Holder(owner_id, 1.0), ttl=1.0).encode())


def test_writes_to_one_gcs_object_are_spaced_a_second_apart_by_default_and_elsewhere_not():
    from handofflock.fencing import FencedObject
    from handofflock.storage import open_url

    gcs_lock = HandoffLock("gs://some-bucket/locks/a.json")  # no I/O: nothing is sent
    assert gcs_lock.min_write_interval == 1.0
    assert FencedObject.beside(gcs_lock, "ckpt.json").min_write_interval == 1.0
    # The option itself: an explicit 0 turns the default spacing off (for a store that allows it).
    assert HandoffLock("gs://some-bucket/locks/a.json", min_write_interval=0.0).min_write_interval == 0.0
    for url in ("memory://spacing/a.json", "file:///tmp/never-written/a.json"):
        lock = HandoffLock(url)
        assert lock.min_write_interval == 0.0
        assert FencedObject(open_url(url)[0], "ckpt.json").min_write_interval == 0.0


def test_a_timing_value_built_directly_obeys_the_same_rules():
    from handofflock import Timing

    good = Timing.build(ttl=10.0)
    assert Timing(**{**good.__dict__}) == good  # every field explicit: accepted as built
    with pytest.raises(ConfigurationError, match="renew_deadline"):
        Timing(**{**good.__dict__, "renew_deadline": good.ttl})  # ttl > renew_deadline broken
    with pytest.raises(ConfigurationError):
        Timing(**{**good.__dict__, "min_write_interval": 1.0, "renew_interval": 0.5})  # faster than the store takes


def test_a_lock_takes_a_shared_timing_value_or_keywords_but_not_both(tmp_path):
    from handofflock import Timing

    timing = Timing.build(ttl=12.0, waiter_check_interval=0.5)
    lock = HandoffLock(str(tmp_path / "a.json"), timing=timing)
    assert lock.timing is timing and lock.ttl == 12.0 and lock.waiter_check_interval == 0.5
    with pytest.raises(ConfigurationError, match="not both"):
        HandoffLock(str(tmp_path / "b.json"), timing=timing, ttl=30.0)
    with pytest.raises(ConfigurationError, match="Timing"):
        HandoffLock(str(tmp_path / "c.json"), timing={"ttl": 12.0})


def test_a_short_ttl_is_refused_with_an_error_about_ttl_not_waiter_ttl(url):
    with pytest.raises(ConfigurationError) as info:
        HandoffLock(url, ttl=0.1)
    message = str(info.value)
    assert message.startswith("ttl=0.1 is too short") and "at least 2 s" in message
    assert "waiter_ttl =" not in message and "waiter_ttl (default" not in message
    with pytest.raises(ConfigurationError, match=r"^waiter_ttl = 0.1 must be"):  # set by the user: named as such
        HandoffLock(url, ttl=5.0, waiter_ttl=0.1)
