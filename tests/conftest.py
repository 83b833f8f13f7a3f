"""Shared fixtures. ``store`` runs a test once per backend, unchanged (the contract suite)."""

from __future__ import annotations

import functools
import itertools
import os
import re
import signal
import sys
import time
import uuid
from pathlib import Path

import pytest

from handofflock.storage import MemoryStorage
from handofflock.storage.gcs import GCSStorage
from handofflock.testing import ExternalEmulator, FakeGCSServer

# The helpers every folder shares (lockutil, jobsutil, simworld, the processes in procs/, ...) live in
# tests/support/; test folders have no __init__.py (pytest's prepend import mode), so put it on the path.
SUPPORT = Path(__file__).resolve().parent / "support"
sys.path.insert(0, str(SUPPORT))

#: An emulator named when the session starts (Google's storage-testbench, say) replaces fake-gcs-server.
EXTERNAL = os.environ.get("STORAGE_EMULATOR_HOST")

#: Every backend the contract suite runs against.
BACKENDS = ["memory", "local", "gcs", "s3"]

_names = itertools.count()

# A suite started in the background (`cmd &` in a script, nohup, some CI runners) inherits
# SIGINT, SIGQUIT and SIGHUP ignored, and so would every process a test starts: `run` then
# rightly leaves them ignored, and the tests that send them would wait in vain. The tests
# start from the dispositions of an interactive start.
for _sig, _default in ((signal.SIGINT, signal.default_int_handler), (signal.SIGQUIT, signal.SIG_DFL), (signal.SIGHUP, signal.SIG_DFL)):
    if signal.getsignal(_sig) is signal.SIG_IGN:
        signal.signal(_sig, _default)


def make_store(kind: str, request: pytest.FixtureRequest, tmp_path):
    """A fresh, empty store of the given kind."""
    if kind == "memory":
        name = f"test-{next(_names)}-{uuid.uuid4().hex[:8]}"
        request.addfinalizer(lambda: MemoryStorage.forget(name))
        return MemoryStorage.named(name)
    if kind == "gcs":  # a fresh bucket per test on the session's emulator
        emulator = request.getfixturevalue("gcs_emulator")
        bucket = f"t{next(_names)}-{uuid.uuid4().hex[:12]}"
        emulator.create_bucket(bucket)
        return GCSStorage(bucket)
    if kind == "s3":  # a fresh bucket per test on the session's moto server
        from handofflock.storage.s3 import S3Storage

        server = request.getfixturevalue("s3_server")
        bucket = f"t{next(_names)}-{uuid.uuid4().hex[:12]}"
        server.create_bucket(bucket)
        return S3Storage(bucket)
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


@pytest.fixture(scope="session")
def gcs_emulator():
    """One GCS emulator for the whole session, with STORAGE_EMULATOR_HOST pointing at it.

    fake-gcs-server, started on 127.0.0.1; or, when STORAGE_EMULATOR_HOST is
    set as the session starts, the emulator it names (see docs/storage.md for
    running the suite against storage-testbench). It has a bucket named
    ``handofflock-test``. It never skips: if the emulator cannot start (or does
    not answer), every test that needs it fails saying why.
    """
    server = ExternalEmulator(EXTERNAL) if EXTERNAL else FakeGCSServer()
    with server, server.env():
        server.create_bucket("handofflock-test")
        yield server


@pytest.fixture(scope="session")
def s3_server():
    """One moto S3 server process for the whole session, with boto3 pointed at it (AWS_ENDPOINT_URL_S3).

    It never skips: if moto is missing or its server does not start, every test that needs it fails saying why.
    Every store makes a botocore session of its own, which would parse the S3 models again (a fifth of a
    second idle, per test): while the server is up, those sessions share one loader of the models.
    """
    from handofflock.testing.s3server import MotoS3Server

    with MotoS3Server() as server, server.env(), pytest.MonkeyPatch.context() as patch:
        import botocore.session

        patch.setattr(botocore.session, "create_loader", functools.cache(botocore.session.create_loader))
        server.create_bucket("handofflock-test")
        yield server


#: Under pytest-xdist (``scripts/dev.py test`` runs the whole suite on several workers with
#: ``--dist loadgroup``), the tests that keep the CPUs busy run one after another within their group,
#: each group on one worker: the framework jobs under torchrun (``torch``, ``lightning`` and ``hf``, by
#: the framework their ranks run: see :func:`heavy_group`), the simulation and torture runs, and the
#: builds (the wheel, the docs site, the bench, whose runs a module shares). Each group takes a few
#: minutes at most, so that no single one is the run's critical path, and at most one framework job
#: per group runs at a time. The rest mostly wait on servers, clocks and child processes and are spread
#: one test at a time. Keys are path prefixes under tests/ ("frameworks": split by framework). (Our own
#: scheduler, not ``xdist_group`` marks: xdist 3.8 names a test's group by rewriting ``item._nodeid``,
#: which pytest 9 no longer reads.)
HEAVY = {
    "integrations/test_hf_": "frameworks",
    "integrations/test_integrations_": "frameworks",
    "integrations/test_lightning_": "frameworks",
    "integrations/test_rank_decisions.py": "frameworks",
    "integrations/test_torchrun_": "frameworks",
    "sim/": "simulation",
    "package/test_package.py": "builds",
    "package/test_docs_site.py": "builds",
    "package/test_bench.py": "builds",
}

#: The order units are handed out: the groups, longest first (by the sums of their tests' durations,
#: ``pytest --durations=0``), then the single tests of the folders whose tests start processes and
#: servers (seconds each), then the rest (mostly milliseconds), so that the run ends on short tests.
FIRST = ("simulation", "torch", "lightning", "hf", "builds", "processes/", "runner/", "package/", "integrations/")


def heavy_group(nodeid: str) -> str | None:
    """The group a test runs in, one after another (None: a unit of its own). A framework job's group is
    the framework named in its module, name or parameters (``lightning``, ``hf``), else ``torch``."""
    path = nodeid.removeprefix("tests/")
    group = next((group for prefix, group in HEAVY.items() if path.startswith(prefix)), None)
    if group != "frameworks":
        return group
    words = set(re.split(r"[^a-z0-9]+", path))
    return "lightning" if "lightning" in words else "hf" if "hf" in words else "torch"


def handout_rank(scope: str) -> int:
    """Where a unit (a group's name, or a test's node id) comes in :data:`FIRST`; len(FIRST) if nowhere."""
    path = scope.removeprefix("tests/")
    ranks = (i for i, first in enumerate(FIRST) if path == first or (first.endswith("/") and path.startswith(first)))
    return next(ranks, len(FIRST))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class HeavyTogether(LoadScopeScheduling):
        """Each heavy group is one unit of work; every other test is a unit of its own; handed out in the
        order of :data:`FIRST` (xdist's own order is by number of tests, not time)."""

        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            return heavy_group(nodeid) or nodeid

        def _assign_work_unit(self, node):
            if not self.ordered:  # the first hand-out: the queue is complete
                self.ordered = True
                units = sorted(self.workqueue.items(), key=lambda unit: handout_rank(unit[0]))  # stable
                self.workqueue.clear()
                self.workqueue.update(units)
            super()._assign_work_unit(node)

        def remove_node(self, node):
            """A worker is gone: the test it crashed in is reported failed by xdist (the name returned) and
            not run again; the tests it had not started go back to the queue, for the other workers and its
            replacement. (LoadScopeScheduling's own puts back every unit the worker was ever given, finished
            tests and the crashed one included: a unit with nothing left to run is sent to a worker that then
            reports nothing, is never given more, and the run waits forever.)"""
            workload = self.assigned_work.pop(node)
            left = [(scope, [nodeid for nodeid, done in unit.items() if not done]) for scope, unit in workload.items()]
            left = [(scope, nodeids) for scope, nodeids in left if nodeids]
            if not left:
                return None
            crashed = left[0][1].pop(0)  # a worker runs its tests in the order they were sent
            for scope, nodeids in reversed(left):
                if nodeids:  # first in the queue: a heavy group cut short is again the longest unit
                    self.workqueue[scope] = dict.fromkeys(nodeids, False)
                    self.workqueue.move_to_end(scope, last=False)
            for other in self.assigned_work:
                self._reschedule(other)
            return crashed

    return HeavyTogether(config, log)


def pytest_collection_modifyitems(config, items):
    """Tests that pin fake-gcs-server's quirks say so (``fake_gcs_quirk``) and skip on another emulator."""
    if not EXTERNAL:
        return
    skip = pytest.mark.skip(reason=f"pins a quirk of fake-gcs-server; this run uses the emulator at {EXTERNAL}")
    pages = pytest.mark.skip(reason=f"counts listing pages; the emulator at {EXTERNAL} may ignore maxResults (storage-testbench does)")
    for item in items:
        if "fake_gcs_quirk" in item.keywords:
            item.add_marker(skip)
        elif "emulator_pages" in item.keywords:
            item.add_marker(pages)


def pytest_terminal_summary(terminalreporter):
    """``scripts/dev.py test`` runs the static checks beside the suite: show their report before the last line."""
    report = os.environ.get("HANDOFFLOCK_LINT_REPORT")
    if not report or hasattr(terminalreporter.config, "workerinput"):  # an xdist worker: the controller shows it
        return
    done = Path(report).with_suffix(".done")
    deadline = time.monotonic() + 600  # mypy from cold on a loaded machine: minutes at most
    while not done.exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    terminalreporter.write_sep("-", "static checks (ruff, ruff format, mypy --strict), run beside the tests")
    terminalreporter.write(Path(report).read_text() if done.exists() else "the static checks did not finish in 600 s\n")
    Path(report + ".shown").touch()


@pytest.fixture
def world():
    """A fresh simulated world: memory store, a self-advancing FakeClock, schedulers (tests/support/simworld.py)."""
    from simworld import new_world

    return new_world()


@pytest.fixture
def sim():
    """Simulated processes on one simulated time, each lock its own (tests/support/simworld.py's ``Sim``)."""
    from simworld import Sim

    s = Sim()
    yield s
    s.end()


@pytest.fixture
def env():
    """A memory store, a fake clock and a scheduler run by hand: ``(name, clock, scheduler, store)``."""
    from handofflock import FakeClock, Scheduler

    name = f"timing-{uuid.uuid4().hex[:8]}"
    clock = FakeClock()
    sched = Scheduler(clock, autostart=False)
    yield name, clock, sched, MemoryStorage.named(name)
    MemoryStorage.forget(name)
