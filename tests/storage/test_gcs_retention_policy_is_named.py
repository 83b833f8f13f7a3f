"""A bucket retention policy is named as such, not as a missing IAM role (issue 25).

GCS refuses to overwrite an object under a retention policy (or object
retention, or a hold) with a 403; before, the lock told the user to check the
account's roles, which cannot help.
"""

from __future__ import annotations

import json
import uuid

import pytest
import requests

from handofflock import HandoffLock, StorageError
from handofflock.storage.gcs import GCSStorage, says_retained
from handofflock.testing.faultproxy import FaultProxy

KEY = "locks/job.json"


def reply(status: int, body: dict) -> requests.Response:
    response = requests.Response()
    response.status_code = status
    # private (requests'): a Response with a body, as one read off the wire; requests has no public way to build one
    response._content, response._content_consumed = json.dumps(body).encode(), True
    return response


#: As GCS sends it (reason "retentionPolicyNotMet"), and as older replies word it (reason "forbidden").
RETAINED = [
    {"error": {"code": 403, "message": "Object 'b/locks/job.json' is subject to bucket's retention policy or object "
               "retention and cannot be deleted or overwritten until 2031-09-20T12:18:15.93713-07:00",
               "errors": [{"domain": "global", "reason": "retentionPolicyNotMet", "message": "..."}]}},
    {"error": {"code": 403, "message": "Object 'b/locks/job.json' is subject to bucket's retention policy and cannot "
               "be deleted, overwritten or archived until 2021-02-05T11:36:47.70576-08:00",
               "errors": [{"domain": "global", "reason": "forbidden", "message": "..."}]}},
]
IAM = {"error": {"code": 403, "message": "me@p.iam.gserviceaccount.com does not have storage.objects.create access "
                 "to the Google Cloud Storage object.",
                 "errors": [{"domain": "global", "reason": "forbidden", "message": "..."}]}}


@pytest.mark.parametrize("body", RETAINED)
def test_a_403_about_retention_is_told_from_a_missing_permission(body):
    assert says_retained(reply(403, body))
    assert not says_retained(reply(403, IAM))


@pytest.mark.gcs
def test_a_renewal_refused_by_a_retention_policy_names_the_policy_not_iam_roles(gcs_emulator):
    bucket = f"r-{uuid.uuid4().hex[:16]}"
    gcs_emulator.create_bucket(bucket)
    with FaultProxy(gcs_emulator.url, lifetime=60) as proxy:
        with proxy.env():
            store = GCSStorage(bucket, timeout=(1.0, 2.0))
        lock = HandoffLock(f"gs://{bucket}/{KEY}", storage=store, key=KEY, ttl=5.0)
        proxy.inject("retention", method="POST")
        with pytest.raises(StorageError) as info:
            lock.acquire(timeout=5)
    message = str(info.value)
    assert "retention policy" in message and "roles/" not in message, message
