"""Storage backends, chosen by URL.

========================  ===============================================
``gs://bucket/path.json``  Google Cloud Storage (honours STORAGE_EMULATOR_HOST);
                           ``?userProject=PROJECT`` bills a requester-pays bucket's
                           requests to PROJECT
``s3://bucket/path.json``  Amazon S3 or an S3-compatible store (``pip install handofflock[s3]``;
                           honours AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, AWS_PROFILE)
``file:///abs/path.json``  the local filesystem (also ``file:/abs/path.json`` and plain paths)
``memory://name[/key]``    in-process, thread-safe, with fault hooks
========================  ===============================================

:func:`open_url` returns the store and the lock's key inside it. Other objects
in the same store (a fencing journal, a checkpoint pointer) use keys relative
to the same root: the bucket, the lock file's directory, or the memory store.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit

from ..core.errors import ConfigurationError, InvalidKey, InvalidLockURL
from .base import MAX_KEY_BYTES, MAX_RECORD_BYTES, Storage, validate_generation, validate_key, validate_prefix
from .memory import MemoryStorage

__all__ = [
    "MAX_KEY_BYTES",
    "MAX_RECORD_BYTES",
    "MemoryStorage",
    "Storage",
    "open_url",
    "validate_generation",
    "validate_key",
    "validate_prefix",
]

#: The key used for ``memory://name`` when the URL names no object.
DEFAULT_MEMORY_KEY = "lock.json"


def open_url(url: str | os.PathLike[str]) -> tuple[Storage, str]:
    """Open the store a lock URL points at; return ``(storage, key)``.

    No I/O happens here: GCS clients are created lazily and local directories
    are not touched until the first operation.

    >>> store, key = open_url("memory://demo/locks/train.json")
    >>> key
    'locks/train.json'
    """
    if not isinstance(url, (str, os.PathLike)):
        raise InvalidLockURL(f"lock URL must be a str or path, got {type(url).__name__}")
    text = os.fspath(url)
    if isinstance(text, bytes):
        raise InvalidLockURL("lock URL must be text, not bytes")
    if not text.strip():
        raise InvalidLockURL("lock URL is empty")
    if "://" not in text:
        return _open_local(_local_path(text), original=text)

    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    if scheme in _SCHEME_TYPOS:
        raise InvalidLockURL(
            f"lock URL {text!r}: {parts.scheme + '://'!r} is not a scheme handofflock knows; "
            f"did you mean {_SCHEME_TYPOS[scheme] + '://' + text.split('://', 1)[1]!r}?"
        )
    if parts.fragment or (parts.query and scheme != "gs"):
        raise InvalidLockURL(f"lock URL {text!r} must not have a query or fragment")
    if scheme in ("gs", "s3"):
        return _open_bucket(scheme, parts.netloc, parts.path, parts.query, original=text)
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise InvalidLockURL(f"file URL {text!r} names host {parts.netloc!r}; use file:///absolute/path.json")
        return _open_local(Path(unquote(parts.path)), original=text)
    if scheme == "memory":
        if not parts.netloc:
            raise InvalidLockURL(f"memory URL {text!r} needs a store name: memory://name[/key]")
        key = unquote(parts.path.lstrip("/")) or DEFAULT_MEMORY_KEY
        return MemoryStorage.named(parts.netloc), _checked_key(key, text)
    raise InvalidLockURL(
        f"unsupported lock URL scheme {parts.scheme!r} in {text!r}; use gs://bucket/path.json, s3://bucket/path.json, "
        "file:///path.json, a plain path, or memory://name"
    )


#: The schemes a lock URL may have, and the ones people type meaning one of them.
_SCHEMES = ("gs", "s3", "file", "memory")
_SCHEME_TYPOS = {"gcs": "gs", "gc": "gs", "google": "gs", "s3a": "s3", "s3n": "s3", "mem": "memory"}

#: ``name:`` at the start of a string: what a URL's scheme looks like (RFC 3986).
_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):(.*)$", re.DOTALL)


def _local_path(text: str) -> Path:
    """The path named by ``text``, which has no ``://``; refuse a URL typed with a slip.

    ``gs:/bucket/x.json`` or ``s3:bucket/x.json`` would otherwise lock a local
    file named ``./gs:/bucket/x.json``, private to this host: two hosts would each
    "hold" it and both run. So a string that starts like a URL (a scheme we
    know, or any ``name:/``) must be a URL form we accept. ``file:/abs/path``
    (RFC 8089's form without an authority) is one; ``./gs:x`` is a local path.
    """
    match = _SCHEME_RE.match(text)
    if match is None:
        _refuse_missing_colon(text)
        return Path(text)
    scheme, rest = match.group(1).lower(), match.group(2)
    if scheme == "file":
        if rest.startswith("/") and not rest.startswith("//"):
            return Path(unquote(rest))
        raise InvalidLockURL(
            f"file URL {text!r} is not absolute: use file:///absolute/path.json (or file:/absolute/path.json), "
            "or a plain path for one relative to the current directory"
        )
    if scheme not in _SCHEMES and scheme not in _SCHEME_TYPOS and not rest.startswith("/"):
        return Path(text)  # "notes:v2.json": a file name with a colon in it
    meant = _SCHEME_TYPOS.get(scheme, scheme)
    local = f"(for a local file of that name, write ./{text})"
    if meant not in _SCHEMES:
        raise InvalidLockURL(
            f"lock URL {text!r} starts like a URL, but {match.group(1)!r} is not a scheme handofflock knows: use "
            f"gs://bucket/path.json, s3://bucket/path.json, file:///path.json or memory://name {local}"
        )
    example = f"{meant}://{rest.lstrip('/')}" if rest.strip("/") else f"{meant}://bucket/path.json"
    raise InvalidLockURL(f"lock URL {text!r} looks like a URL with a typo: did you mean {example!r}? {local}")


#: ``gs//bucket/x.json``: a scheme we know (or a typo of one) and ``//``, with the colon left out.
_NO_COLON_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)//(.*)$", re.DOTALL)


def _refuse_missing_colon(text: str) -> None:
    """Refuse ``gs//bkt/x.json`` or ``s3//b/k``, a URL whose colon was left out: as a path it is a local
    file ``./gs/bkt/x.json``, private to this host, which two hosts would each "hold"."""
    match = _NO_COLON_RE.match(text)
    if match is None:
        return
    scheme, rest = match.group(1).lower(), match.group(2)
    meant = _SCHEME_TYPOS.get(scheme, scheme)
    if meant not in _SCHEMES:
        return  # "notes//v2.json": a directory of that name
    slashes = ":///" if meant == "file" else "://"
    raise InvalidLockURL(
        f"lock URL {text!r} looks like a URL without its colon: did you mean {meant + slashes + rest.lstrip('/')!r}? "
        f"(for a local file of that name, write ./{text})"
    )


def _checked_key(key: str, url: str) -> str:
    try:
        return validate_key(key)
    except InvalidKey as exc:
        raise InvalidLockURL(f"lock URL {url!r} names an invalid object: {exc}") from exc


def _gcs_options(query: str, original: str) -> dict[str, str]:
    """The GCSStorage options a ``gs://`` URL's query sets: only ``userProject`` (requester-pays billing)."""
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=True) if query else []
    except ValueError as exc:
        raise InvalidLockURL(f"GCS URL {original!r} has a malformed query: {exc}") from exc
    for index, (name, _) in enumerate(pairs):
        if name != "userProject":
            raise InvalidLockURL(
                f"GCS URL {original!r} has an unknown option {name!r}; the only one is "
                "userProject=PROJECT (the project billed for a requester-pays bucket)"
            )
        if index:
            raise InvalidLockURL(f"GCS URL {original!r} gives {name} twice")
    return {"user_project": pairs[0][1]} if pairs else {}


def _open_bucket(scheme: str, bucket: str, path: str, query: str, *, original: str) -> tuple[Storage, str]:
    kind = "GCS" if scheme == "gs" else "S3"
    if not bucket:
        raise InvalidLockURL(f"{kind} URL {original!r} has no bucket: use {scheme}://bucket/path/name.json")
    key = unquote(path.lstrip("/"))
    if not key or key.endswith("/"):
        raise InvalidLockURL(f"{kind} URL {original!r} names no object: use {scheme}://{bucket}/path/name.json")
    options = _gcs_options(query, original)
    try:  # the bucket's name is checked by the store
        if scheme == "gs":
            from .gcs import GCSStorage  # the only place google.cloud.storage is imported

            store: Storage = GCSStorage.shared(bucket, **options)
        else:
            from .s3 import S3Storage  # the only place boto3 is imported

            store = S3Storage.shared(bucket)
    except ImportError as exc:
        if scheme == "gs":  # google-cloud-storage is no extra: a broken install, said as it is
            raise
        raise InvalidLockURL(
            f"S3 URL {original!r} needs boto3, which is not installed: pip install 'handofflock[s3]' ({exc})"
        ) from exc
    except ConfigurationError as exc:
        raise InvalidLockURL(f"{kind} URL {original!r}: {exc}") from exc
    return store, _checked_key(key, original)


def _open_local(path: Path, *, original: str) -> tuple[Storage, str]:
    from .local import LocalStorage

    if not path.name or original.endswith(("/", os.sep)):
        raise InvalidLockURL(f"local lock URL {original!r} names a directory, not a file")
    path = Path(os.path.abspath(path))  # no resolve(): symlinks are refused by the backend, not followed
    return LocalStorage(path.parent), _checked_key(path.name, original)
