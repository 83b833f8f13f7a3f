"""``handofflock run gs:/bkt/x.json -- true`` (or ``gs//bkt/x.json``) is refused (exit 64), never run on a local
file of that name."""

from __future__ import annotations

import subprocess

import pytest
from jobsutil import CONSOLE_SCRIPT, child_env, in_process

from handofflock.exit_codes import EXIT_CONFIG


@pytest.mark.parametrize(
    ("typo", "meant"),
    [("gs:/bkt/x.json", "gs://bkt/x.json"), ("s3:/b/k", "s3://b/k"), ("gcs://bkt/x.json", "gs://bkt/x.json")],
)
def test_run_refuses_a_url_typed_with_a_slip_and_creates_nothing(typo, meant, tmp_path, capsys):
    done = in_process(["run", typo, "--", "touch", "ran"], capsys, cwd=tmp_path)
    assert done.returncode == EXIT_CONFIG, done.stderr
    assert meant in done.stderr
    assert list(tmp_path.iterdir()) == []  # neither ./gs:/bkt/x.json nor the command's file


def test_status_refuses_a_relative_file_url(tmp_path, capsys):
    done = in_process(["status", "file:x.json"], capsys, cwd=tmp_path)
    assert done.returncode == EXIT_CONFIG, done.stderr
    assert "file:///" in done.stderr


def test_run_takes_a_file_url_without_an_authority(tmp_path, capfd):
    done = in_process(["run", "-q", f"file:{tmp_path}/lock.json", "--", "touch", "ran"], capfd, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "lock.json").exists() and (tmp_path / "ran").exists()


@pytest.mark.parametrize(("typo", "meant"), [("gs//bkt/x.json", "gs://bkt/x.json"), ("s3//b/k", "s3://b/k")])
def test_a_url_without_its_colon_is_refused_not_taken_for_a_local_path(typo, meant, tmp_path, capsys):
    """As a path, ``gs//bkt/x.json`` is ``./gs/bkt/x.json``: a lock private to this host, which two hosts
    would each hold. It is refused (exit 64), with what was meant, and nothing is created."""
    done = in_process(["run", typo, "--", "touch", "ran"], capsys, cwd=tmp_path)
    assert done.returncode == EXIT_CONFIG, done.stderr
    assert f"did you mean {meant!r}" in done.stderr
    assert list(tmp_path.iterdir()) == []  # neither ./gs/bkt/x.json nor the command's file


def test_the_real_command_refuses_a_url_without_its_colon(tmp_path):
    done = subprocess.run([str(CONSOLE_SCRIPT), "run", "gs//bkt/x.json", "--", "touch", "ran"], cwd=tmp_path,
                          capture_output=True, text=True, env=child_env(), timeout=60)
    assert done.returncode == EXIT_CONFIG, done.stderr
    assert "did you mean 'gs://bkt/x.json'" in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_directory_that_merely_ends_in_two_slashes_is_still_a_path(tmp_path, capfd):
    done = in_process(["run", "-q", "notes//x.json", "--", "true"], capfd, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "notes" / "x.json").exists()
