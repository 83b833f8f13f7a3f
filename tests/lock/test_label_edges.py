"""Labels at their edges: a grace the decoder would refuse is refused up front; a writer that keeps
unknown fields (the original design) cannot pass the previous owner's label on to the next.

``HandoffLock(label=Label(text, grace))`` checks only the text; ``handofflock run --grace``
checks only that the grace is finite and >= 0. The decoder (core/record.py ``_opt_label``)
refuses a grace outside [0, MAX_TTL] (a week) or not a number. So a lock constructed
without error writes a record that every reader, the writer included, then calls corrupt:
the lock is bricked until ``repair``. Expected: ConfigurationError in the constructor
(or --grace refused with exit 64), never a record nobody can read.
"""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest
from lockutil import make_lock

from handofflock import ConfigurationError, HandoffLock, LockRecordCorrupt
from handofflock.core.record import MAX_TTL, Label, LockRecord
from handofflock.storage import MemoryStorage, open_url

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def url():
    name = f"edge-{uuid.uuid4().hex[:8]}"
    yield f"memory://{name}/locks/l.json"
    MemoryStorage.forget(name)


@pytest.mark.parametrize("grace", [-1.0, MAX_TTL * 2, True, float("nan")])
def test_a_label_grace_the_decoder_would_refuse_is_refused_before_anything_is_written(url, grace):
    with pytest.raises(ConfigurationError, match="grace"):
        make_lock(url, label=Label("job-a", grace=grace))
    store, key = open_url(url)
    assert store.read(key) is None


def test_run_refuses_a_grace_over_a_week_with_a_usage_error(tmp_path):
    """Accepted, ``--grace 1000000`` would write a label every reader calls corrupt while the job runs."""
    url = (tmp_path / "locks" / "l.json").as_uri()
    proc = subprocess.run(
        [sys.executable, "-m", "handofflock", "run", url, "--ttl", "5", "--grace", "1000000", "--", "true"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 64 and "--grace" in proc.stderr, (proc.returncode, proc.stderr)
    assert not (tmp_path / "locks" / "l.json").exists()  # never asked for the lock


def test_a_writer_of_the_original_design_that_takes_the_lock_drops_the_old_label(url):
    """A writer of the original four-field design (it knows neither instances nor labels, and keeps
    unknown fields as they are) takes an expired lock: it writes ownerId/expiresAt and leaves
    ``ownerInstance`` and ``ownerLabel`` of the previous owner in place. The label names that
    instance, which the record still carries, so it "counts": ``status`` shows the new owner
    with the previous job's label (pod, pid, grace). record.py's docstring says the old label
    stops counting when such a writer takes the lock ("writing its own instance, or none").
    """
    import orjson

    old = make_lock(url, label=Label("pod=ml/old-job pid=1", grace=30.0))
    assert old.acquire()
    old._unschedule()  # it dies without releasing
    store, key = open_url(url)
    data, generation = store.read(key)
    doc = orjson.loads(data)
    # the original design: take an expired lock by setting the four fields it knows, keep the rest
    doc.update(ownerId="other-impl-job", expiresAt=doc["expiresAt"] + 100.0, waitingOwnerId=None, waiterExpiresAt=None)
    store.write(key, orjson.dumps(doc), if_generation_match=generation)

    st = make_lock(url).status()
    assert st.owner_id == "other-impl-job"
    assert st.owner_label is None, f"the new owner {st.owner_id!r} is shown with the old owner's label {st.owner_label}"
