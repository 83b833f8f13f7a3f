"""The documentation site (mkdocs + mkdocstrings) builds in strict mode: a broken reference fails here."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config), "-d", str(site)],
                          cwd=ROOT, capture_output=True, text=True, timeout=180)


@pytest.mark.timeout(200)
def test_the_site_builds_in_strict_mode_with_a_reference_for_the_public_api(tmp_path):
    done = build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 0, done.stderr
    assert "WARNING" not in done.stderr, done.stderr
    pages = {path.parent.name: path.read_text() for path in (tmp_path / "site" / "reference").glob("*/index.html")}
    wanted = {
        "lock": ["handofflock.HandoffLock.acquire", "handofflock.HandoffLock.release", "handofflock.ReleaseRequest"],
        "signals": ["handofflock.lock.events.send"],
        "steps": ["handofflock.Steps"],
        "os_signals": ["handofflock.install_signal_handlers", "handofflock.SignalHandlers"],
        "preemption": ["handofflock.PreemptionWatcher"],
        "fencing": ["handofflock.FencedObject"],
        "repair": ["handofflock.force_release"],
        "errors": ["handofflock.core.errors.LockLost", "handofflock.core.errors.LockContended"],
        "storage": ["handofflock.storage.open_url"],
        "metrics": ["handofflock.metrics.use_meter_provider", "handofflock.lock.logfields.LOGGERS"],
        "testing": ["handofflock.testing.emulator.FakeGCSServer", "handofflock.testing.faultproxy.FaultProxy"],
    }
    for page, ids in wanted.items():
        assert page in pages, f"no reference page {page!r}: {sorted(pages)}"
        for anchor in ids:
            assert f'id="{anchor}"' in pages[page], f"{anchor} is not documented on reference/{page}"
    # The docstrings themselves made it in, not only the headings.
    assert "Iterate ``iterable``" not in pages["lock"] and "until a release is requested" in pages["lock"]
    changelog = (tmp_path / "site" / "changelog" / "index.html").read_text()
    assert "Unreleased" in changelog, "the changelog page does not include CHANGELOG.md"
    for md in (ROOT / "docs").glob("*.md"):
        assert (tmp_path / "site" / ("" if md.stem == "index" else md.stem)).exists(), f"{md.name} is not in the site"


@pytest.mark.timeout(200)
def test_a_reference_to_a_name_that_does_not_exist_fails_the_build(tmp_path):
    docs = tmp_path / "docs"
    shutil.copytree(ROOT / "docs", docs)
    (docs / "reference" / "broken.md").write_text("# Broken\n\n::: handofflock.HandoffLock.no_such_method\n")
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    config["docs_dir"] = str(docs)
    config["nav"].append({"Broken": "reference/broken.md"})
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))
    done = build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert done.returncode != 0
    assert re.search(r"no_such_method|could not collect", done.stderr, re.IGNORECASE), done.stderr
