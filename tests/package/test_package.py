"""The package as users get it: the wheel and sdist build, pass ``twine check``, and work from a clean venv."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from handofflock import __version__

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str | Path, cwd: Path, timeout: float = 300, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    assert done.returncode == 0, f"{args} exited {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_wheel_and_sdist_build_pass_twine_check_and_run_from_a_clean_venv(tmp_path):
    dist = tmp_path / "dist"
    run(sys.executable, "-m", "build", "--outdir", dist, ROOT, cwd=tmp_path)
    (wheel,) = dist.glob("handofflock-*.whl")
    (sdist,) = dist.glob("handofflock-*.tar.gz")
    assert wheel.name == f"handofflock-{__version__}-py3-none-any.whl"
    checked = run(sys.executable, "-m", "twine", "check", "--strict", wheel, sdist, cwd=tmp_path)
    assert checked.stdout.count("PASSED") == 2, checked.stdout

    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in ("handofflock/py.typed", "handofflock/_watchdog.py",
                   "handofflock/metrics.py", f"handofflock-{__version__}.dist-info/entry_points.txt"):
        assert needed in names, f"{needed} is missing from the wheel"
    assert not any(name.startswith("tests/") for name in names)
    metadata = zipfile.ZipFile(wheel).read(f"handofflock-{__version__}.dist-info/METADATA").decode()
    assert "Provides-Extra: otel" in metadata and "Classifier: Typing :: Typed" in metadata
    assert "Project-URL: Changelog" in metadata
    with tarfile.open(sdist) as tar:
        assert any(name.endswith("/README.md") for name in tar.getnames())

    venv = tmp_path / "venv"
    # Without a pip of its own (installing one costs a venv most of its making): this pip installs into it.
    run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp_path)
    bin_dir = venv / ("Scripts" if os.name == "nt" else "bin")
    run(sys.executable, "-m", "pip", "--python", bin_dir / "python", "install", "--disable-pip-version-check", "--quiet",
        wheel, cwd=tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "STORAGE_EMULATOR_HOST")}
    # From a directory outside the checkout: the installed copy runs, not the source tree.
    where = run(bin_dir / "python", "-c", "import handofflock; print(handofflock.__file__)", cwd=tmp_path, env=env)
    assert Path(where.stdout.strip()).is_relative_to(venv), where.stdout
    version = run(bin_dir / "handofflock", "--version", cwd=tmp_path, env=env)
    assert version.stdout.strip() == f"handofflock {__version__}"
    short = run(bin_dir / "handofflock", "-V", cwd=tmp_path, env=env)
    assert short.stdout == version.stdout
    demo = run(bin_dir / "python", "-m", "handofflock.demo", cwd=tmp_path, env=env, timeout=180)
    assert "resumed at step" in demo.stdout and demo.stdout.rstrip().endswith("yes"), demo.stdout


def test_version_flags_print_the_version_from_version_py(capsys):
    from handofflock.cli import main

    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"handofflock {__version__}\n"
    assert main(["-V"]) == 0
    assert capsys.readouterr().out == f"handofflock {__version__}\n"
