"""Whether an S3-compatible store honours the conditions every write of the lock depends on.

The S3 backend's writes are conditional PUTs (``If-None-Match: *`` to create,
``If-Match: <etag>`` to replace). A store that ignores those headers applies
every PUT, so every racing writer "wins" and two owners hold the lock at once,
with no error anywhere. So before its first write a store is probed once, on a
scratch key beside the lock's (``<key>.handofflock-probe-<random>``):

1. a PUT with an ``If-Match`` that cannot match (the key does not exist) must be
   refused (412, or 404 ``NoSuchKey``);
2. a create with ``If-None-Match: *`` goes through, and a second one must be
   refused (412, or 409 ``ConditionalRequestConflict``).

A store that applies either is refused with
:class:`~handofflock.core.errors.LockingUnsupported`. The scratch key is
deleted afterwards (it is ours, never a lock object; a failed delete leaves a
few bytes behind, which is all). Which stores honour what is in
docs/storage.md ("S3-compatible stores").
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

from ..core.errors import LockingUnsupported
from .s3_format import PROBE_MARK

#: An ETag no object has (S3 ETags are MD5 hex digests of the content, or of the parts plus a count).
IMPOSSIBLE_ETAG = '"00000000000000000000000000000000-0"'


def check_conditions_honoured(
    put: Callable[..., Any],
    delete: Callable[[str], Any],
    refused: Callable[[BaseException], bool],
    *,
    key: str,
    url: str,
) -> None:
    """Probe as described above; raise :class:`LockingUnsupported` naming what the store ignored.

    ``put(Key=..., **conditions)`` sends one PUT of a few bytes (``IfMatch`` or
    ``IfNoneMatch``), ``delete(key)`` deletes a key, and ``refused(exc)`` says
    whether an exception from ``put`` is the store refusing the PUT on its
    condition (s3.py owns the SDK). Any other error is raised as it came, for
    the caller to map; the probe then counts as not done.
    """
    scratch = f"{key}{PROBE_MARK}{secrets.token_hex(4)}"

    def applied(**conditions: str) -> bool:
        try:
            put(Key=scratch, **conditions)
        except Exception as exc:
            if refused(exc):
                return False
            raise
        return True

    ignored = None
    try:
        if applied(IfMatch=IMPOSSIBLE_ETAG):
            ignored = "If-Match"
        elif applied(IfNoneMatch="*") and applied(IfNoneMatch="*"):
            ignored = "If-None-Match"
    finally:
        try:
            delete(scratch)
        except Exception:  # a few bytes left beside the lock; the answer stands
            pass
    if ignored is not None:
        raise LockingUnsupported(
            f"{url} ignores {ignored} on PUT: a conditional write to {scratch!r} that had to be refused was "
            f"applied, so two writers could both take the lock. handofflock needs a store that honours "
            f"If-Match and If-None-Match on PutObject (AWS S3, Cloudflare R2, MinIO since 2024-05); "
            f"for GCS use gs://, not its S3 (XML) API. See docs/storage.md, 'S3-compatible stores'",
            url=url,
            key=key,
        )
