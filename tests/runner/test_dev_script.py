"""scripts/dev.py installs what each command needs, and users' extras take ranges (the pins are the tests')."""

from __future__ import annotations

import importlib.util
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

