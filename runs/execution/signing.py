"""Signatures of the executor's HTTP calls, as the Standard Webhooks specification defines
them, so a target verifies a call with that specification's own library in any language.

- `webhook-id`: the run key and the attempt (`<job_id>/<scheduled_at>#<attempt>`), one per
  attempt; `Idempotency-Key` stays the key to deduplicate on.
- `webhook-timestamp`: unix seconds when the call is sent.
- `webhook-signature`: `v1,` + base64 HMAC-SHA256 of `<id>.<timestamp>.<body>` (the exact
  bytes sent, empty included) keyed by the tenant's secret, one per secret that signs,
  space-separated: during a rotation's overlap both the new and the previous secret sign.

A secret is `whsec_` + base64 of random bytes; the key is those bytes. The tenants' secrets
are created and rotated by jobs/tenant_services.py and arrive with each claimed run
(runs/execution/claims.py), so signing reads nothing.
"""

from __future__ import annotations

import base64
import hmac
import secrets as random_source
from collections.abc import Sequence
from functools import lru_cache

SECRET_PREFIX = "whsec_"
# The specification asks for 24 to 64 bytes.
SECRET_BYTES = 32

ID_HEADER = "webhook-id"
TIMESTAMP_HEADER = "webhook-timestamp"
SIGNATURE_HEADER = "webhook-signature"
# Lower case: HTTP header names are case-insensitive, and the target's own headers are
# compared with these lowered.
HEADERS = frozenset({ID_HEADER, TIMESTAMP_HEADER, SIGNATURE_HEADER})


def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(random_source.token_bytes(SECRET_BYTES)).decode()


def message_id(run_key: str, attempt: int) -> str:
    """ASCII (a UUID, an RFC 3339 instant, digits) and unique per attempt of a run."""
    return f"{run_key}#{attempt}"


def signature_headers(
    *, message_id: str, timestamp: int, body: bytes, secrets: Sequence[str]
) -> dict[str, str]:
    """`webhook-timestamp` and `webhook-signature` of one call (its `webhook-id` is `message_id`)."""
    if not secrets:
        # A tenant always has a secret (a check constraint on tenants): an unsigned call
        # would be a bug, and a target that verifies would refuse it anyway.
        raise ValueError("no signing secret to sign the call with")
    signed = f"{message_id}.{timestamp}.".encode() + body
    return {TIMESTAMP_HEADER: str(timestamp), SIGNATURE_HEADER: " ".join(_sign(s, signed) for s in secrets)}


def _sign(secret: str, signed: bytes) -> str:
    return "v1," + base64.b64encode(hmac.digest(_key(secret), signed, "sha256")).decode()


# Decoded once per secret; an executor calls for few tenants, and a rotated-out secret
# ages out of the cache.
@lru_cache(maxsize=1024)
def _key(secret: str) -> bytes:
    return base64.b64decode(secret.removeprefix(SECRET_PREFIX))
