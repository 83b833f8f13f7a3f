"""scripts/dev.py installs what each command needs, and users' extras take ranges (the pins are the tests')."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def dev(tmp_path, monkeypatch):
    """scripts/dev.py with its venv in tmp_path and pip recorded, not run."""
    spec = importlib.util.spec_from_file_location("dev_script", ROOT / "scripts" / "dev.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    venv = tmp_path / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    monkeypatch.setattr(module, "VENV", venv)
    module.calls = []
    monkeypatch.setattr(module.subprocess, "run", lambda args, **kw: module.calls.append(args))
    return module


def installs(dev) -> list[str]:
    return [" ".join(map(str, args[args.index("install") + 1 :])) for args in dev.calls if "install" in args]


def test_the_demo_installs_the_package_alone_and_test_after_it_installs_the_test_extra(dev):
    dev.ensure_venv("demo")
    assert len(installs(dev)) == 1 and "[test]" not in installs(dev)[0]
    dev.calls.clear()
    dev.ensure_venv("demo")
    assert installs(dev) == []  # reused
    dev.ensure_venv("test")
    assert any(f"-c {ROOT / 'constraints.txt'}" in line and "[test]" in line for line in installs(dev)), installs(dev)
    dev.calls.clear()
    dev.ensure_venv("demo")
    dev.ensure_venv("test")
    assert installs(dev) == []  # the test install includes the demo's


def test_users_extras_take_ranges_and_the_cpu_torch_pin_is_in_the_test_constraints_only():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for name, requirements in extras.items():
        for requirement in requirements:
            assert "==" not in requirement or name == "test" and not requirement.startswith("torch"), (name, requirement)
    assert "handofflock[docs]" in extras["test"]
    assert any(r.startswith("mkdocs") for r in extras["docs"])
    assert "torch==2.13.0" in (ROOT / "constraints.txt").read_text().splitlines()



CRASHING_RUN = {
    "pytest.ini": "",
    "conftest.py": """
import importlib.util
spec = importlib.util.spec_from_file_location("suite_conftest", {conftest!r})
suite = importlib.util.module_from_spec(spec)
spec.loader.exec_module(suite)
suite.HEAVY = {{"test_group.py": "group"}}
pytest_xdist_make_scheduler = suite.pytest_xdist_make_scheduler
""",
    "test_group.py": """
import os
def test_before(): pass
def test_crash(): os._exit(1)
def test_after_1(): pass
def test_after_2(): pass
""",
    "test_plain.py": """
import pytest
@pytest.mark.parametrize("i", range(12))
def test_plain(i): pass
""",
}


@pytest.mark.timeout(120)
def test_a_worker_that_crashes_fails_its_test_and_the_rest_of_the_run_still_runs_and_ends(tmp_path):
    """The suite's scheduler (tests/conftest.py) on a run as ``dev.py test`` starts it, where a worker dies
    in the middle of a heavy group: that test fails, named, and the group's tests it had not started run
    on another worker. The run ends in seconds, never waits for work no worker will be given."""
    for name, text in CRASHING_RUN.items():
        (tmp_path / name).write_text(text.format(conftest=str(ROOT / "tests" / "conftest.py")))
    env = dict(os.environ, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")  # startup in seconds: this run needs xdist alone
    args = [sys.executable, "-m", "pytest", "-p", "xdist", "-p", "no:cacheprovider", "-n", "3", "--dist", "loadgroup"]
    proc = subprocess.run([*args, "-rA"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=90)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "crashed while running 'test_group.py::test_crash'" in out, out
    assert "1 failed, 15 passed" in out, out
    for name in ("test_before", "test_after_1", "test_after_2"):
        assert f"PASSED test_group.py::{name}" in out, out


def test_the_framework_jobs_run_in_one_group_per_framework_handed_out_before_the_single_tests():
    """Two framework jobs of different frameworks may run at once (each picks its own free port and works
    in its own tmp_path); two of one framework never do. The groups go out longest first, then the tests
    that start processes, and the run ends on the quick ones."""
    spec = importlib.util.spec_from_file_location("suite_conftest", ROOT / "tests" / "conftest.py")
    suite = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(suite)
    group = suite.heavy_group
    workers = "tests/integrations/test_torchrun_workers.py::test_sigterm_with_dataloader_workers[{}-torchrun]"
    assert [group(workers.format(name)) for name in ("torch", "lightning", "hf")] == ["torch", "lightning", "hf"]
    assert group("tests/integrations/test_integrations_frameworks.py::test_hf_trainer_ranks_save[1]") == "hf"
    assert group("tests/integrations/test_lightning_signals.py::test_sigterm_during_a_fit") == "lightning"
    assert group("tests/integrations/test_integrations_torch.py::test_when_rank_0_dies") == "torch"
    assert group("tests/integrations/test_preemption.py::test_a_notice") is None
    assert group("tests/sim/test_torture.py::test_a_short_torture_run") == "simulation"
    units = ["tests/lock/test_acquire.py::a", "builds", "tests/processes/test_xproc_gcs.py::b", "hf", "torch",
             "simulation"]
    assert sorted(units, key=suite.handout_rank) == [
        "simulation", "torch", "hf", "builds", "tests/processes/test_xproc_gcs.py::b", "tests/lock/test_acquire.py::a"]
