"""A lock URL typed with a slip is refused, never taken for a local file that only this host sees."""

from __future__ import annotations

import pytest

from handofflock import ConfigurationError, HandoffLock
from handofflock.storage import open_url

TYPOS = {
    "gs:/bkt/x.json": "gs://bkt/x.json",
    "gs:bkt/x.json": "gs://bkt/x.json",
    "s3:/b/k.json": "s3://b/k.json",
    "S3:/b/k.json": "s3://b/k.json",
    "gcs://bkt/x.json": "gs://bkt/x.json",
    "s3a://b/k.json": "s3://b/k.json",
    "memory:/m/k.json": "memory://m/k.json",
}


@pytest.mark.parametrize("typo", sorted(TYPOS))
def test_a_url_missing_its_slashes_is_refused_with_the_url_meant(typo, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigurationError, match="typo|not a scheme") as caught:
        HandoffLock(typo)
    assert repr(TYPOS[typo]) in str(caught.value)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("bad", ["gs:", "file:relative.json", "file:", "ftp://host/x.json", "c:/x.json", "gcs://"])
def test_other_strings_that_start_like_a_url_are_refused(bad, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigurationError):
        open_url(bad)


def test_file_colon_slash_absolute_path_is_a_file_url(tmp_path):
    """RFC 8089 allows file: without an authority: file:/abs/path."""
    store, key = open_url(f"file:{tmp_path}/locks/a.json")
    same, same_key = open_url(f"file://{tmp_path}/locks/a.json")
    assert (store.root, key) == (same.root, same_key)


def test_an_upper_case_scheme_is_the_same_scheme():
    """RFC 3986: schemes are case-insensitive."""
    store, key = open_url("GS://bkt/x.json")
    assert (store.bucket, key) == ("bkt", "x.json")


def test_a_local_name_with_a_colon_or_a_dot_slash_stays_a_local_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert open_url("notes:v2.json")[1] == "notes:v2.json"
    store, key = open_url("./gs:/bkt/x.json")
    assert key == "x.json" and str(store.root).endswith("gs:/bkt")
