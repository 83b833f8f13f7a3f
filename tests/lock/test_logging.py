"""The package's loggers: documented, silent by default, records carry the lock's fields."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import threading
import uuid
from pathlib import Path

from lockutil import eventually, make_lock

import handofflock
from handofflock import HandoffLock, signals
from handofflock.lock import logfields

ROOT = Path(__file__).resolve().parents[2]


def loggers_in_source() -> set[str]:
    names = set()
    for path in (ROOT / "handofflock").rglob("*.py"):
        names.update(re.findall(r'getLogger\(\s*"([^"]+)"\s*\)', path.read_text()))
    names.discard("handofflock")  # the root, given its NullHandler in __init__
    return names


def test_every_logger_of_the_package_is_documented_and_gets_the_fields():
    found = loggers_in_source()
    assert len(found) >= 7, found
    docs = (ROOT / "docs" / "observability.md").read_text()
    undocumented = {name for name in found if f"`{name}`" not in docs}
    assert not undocumented, f"loggers missing from docs/observability.md: {sorted(undocumented)}"
    assert found <= set(logfields.LOGGERS), f"not in logfields.LOGGERS: {sorted(found - set(logfields.LOGGERS))}"


def test_the_package_logger_has_a_null_handler_so_an_unconfigured_application_prints_nothing():
    assert any(isinstance(h, logging.NullHandler) for h in logging.getLogger("handofflock").handlers)
    done = subprocess.run(
        [sys.executable, "-c", "import logging, handofflock; logging.getLogger('handofflock.renew').warning('renewal failed')"],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0
    assert done.stderr == "", "logging's last-resort handler printed: no NullHandler on 'handofflock'"


def test_records_of_an_acquire_renew_handoff_carry_the_lock_url_owner_and_token(caplog):
    url = f"memory://logs-{uuid.uuid4().hex[:8]}/locks/train.json"
    owner, waiter = make_lock(url), make_lock(url)
    with caplog.at_level(logging.DEBUG, logger="handofflock"):
        assert owner.acquire()
        thread = threading.Thread(target=waiter.acquire, kwargs={"timeout": 30})
        thread.start()
        eventually(lambda: owner.release_requested, what="the owner noticing the waiter")
        owner_token = owner.token
        assert owner.release() == waiter.owner_id
        thread.join(30)
        waiter.release()
    ours = [r for r in caplog.records if r.name.startswith("handofflock.")]
    by = {(r.name, r.owner_id) for r in ours}
    assert ("handofflock.acquire", owner.owner_id) in by and ("handofflock.acquire", waiter.owner_id) in by
    assert ("handofflock.renew", owner.owner_id) in by and ("handofflock.release", owner.owner_id) in by
    for r in ours:
        assert r.lock_url == url, (r.name, r.getMessage())
        assert r.owner_id in (owner.owner_id, waiter.owner_id), r.getMessage()
    released = [r for r in ours if r.name == "handofflock.release" and r.owner_id == owner.owner_id]
    assert released and released[0].token == owner_token


def test_fields_passed_with_extra_are_kept_and_records_without_a_lock_get_none():
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    log = logging.getLogger("handofflock.repair")
    log.addHandler(handler)
    try:
        log.warning("explicit", extra={"lock_url": "gs://b/k.json", "owner_id": "me", "token": 7})
        log.warning("no lock here")
    finally:
        log.removeHandler(handler)
    assert (records[0].lock_url, records[0].owner_id, records[0].token) == ("gs://b/k.json", "me", 7)
    assert not hasattr(records[1], "lock_url")
    assert handofflock.__version__


def test_a_receiver_that_raises_is_logged_with_the_lock_it_was_sent_for():
    """The events logger speaks for the lock that sent the signal: its record carries the lock's fields."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    keep = Keep(logging.DEBUG)
    events_log = logging.getLogger("handofflock.lock.events")
    events_log.addHandler(keep)
    lock = HandoffLock("memory://logfields-events/l.json", owner_id="A", ttl=10.0, release_at_exit=False)

    def boom(sender, **kw):
        raise RuntimeError("receiver fails")

    signals.acquired.connect(boom, sender=lock)
    try:
        assert lock.acquire()
        lock.release()
    finally:
        signals.acquired.disconnect(boom, sender=lock)
        events_log.removeHandler(keep)
    raised = [r for r in records if "raised" in r.getMessage()]
    assert raised and all((r.lock_url, r.owner_id) == (lock.url, "A") for r in raised)
