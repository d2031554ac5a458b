"""What a create or an edit of a job means, before anything is written.

One home for the PATCH rules (the API serializer and the admin form used to carry
their own copies): a new job's defaults, "naming one trigger replaces the others",
the merge with the stored job, the set of fields a request really changes, and the
shared rules of jobs.rules.job on the merged state. No database access: jobs.services
calls these on the row it has locked, and the admin form calls them to show errors
field by field before saving.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any
from uuid import UUID

from django.conf import settings

from jobs.models import Job, MisfirePolicy, OverlapPolicy
from jobs.rules.job import TRIGGER_FIELDS, JobInvalid, validate_job
from runs.target_secrets import SecretNotCarried, unmask_target

# Field defaults of a new job (docs/CONTRACT.md, "REST API"); the model agrees.
DEFAULTS: dict[str, Any] = {
    "time_zone": "UTC",
    "misfire_policy": MisfirePolicy.RUN_ONCE,
    "max_catch_up": 100,
    "overlap_policy": OverlapPolicy.SKIP,
    "max_attempts": 5,
    "retry_backoff_seconds": 10,
    "retry_backoff_cap_seconds": 3600,
    "lease_seconds": 30,
    "priority": 0,
    "alert_after_failures": 3,
    "jitter_seconds": 0,
    "starting_deadline_seconds": None,
    "paused": False,
    "start_at": None,
    "end_at": None,
    "cron_expr": None,
    "interval_seconds": None,
    "run_at": None,
    "dst_policy": {},
}
EDITABLE_FIELDS = (*DEFAULTS, "name", "target")


def new_job_values(fields: Mapping[str, Any], *, job_id: UUID, now: datetime) -> dict[str, Any]:
    """Every field of a new job: the defaults overlaid with `fields`, validated and cleaned.

    `job_id` is the id the job will get: `H` is hashed with it, so validating with any
    other seed could accept an expression the real job can never fire (or refuse one).
    Raises JobInvalid (model field names) with every problem found.
    """
    _refuse_unknown(fields)
    merged = {**DEFAULTS, **fields}
    clean = _validated(merged, now=now, changed=None, job_id=job_id)
    return {key: clean[key] for key in merged}


def job_changes(job: Job, changes: Mapping[str, Any], *, now: datetime) -> dict[str, Any]:
    """The cleaned field changes an edit of `job` (its stored state) really makes.

    Naming one trigger replaces the job's trigger (the other two are cleared); a target
    read back with "***" for its secrets keeps the stored values (and their marking) while
    it calls the same origin or task, and is refused at another; the merged state must
    satisfy every rule, and "in the future" is demanded only of times the edit changes
    (renaming a finished one-time job works). Raises JobInvalid (model field names).
    """
    _refuse_unknown(changes)
    changes = dict(changes)
    if "target" in changes:
        try:
            changes["target"] = unmask_target(changes["target"], job.target)
        except SecretNotCarried as exc:
            raise JobInvalid(
                {
                    "target": [
                        f'{field}: "***" keeps a stored secret only while the target calls the same '
                        "origin (scheme, host, port) or task; send the value again."
                        for field in exc.fields
                    ]
                }
            ) from None
    if any(f in changes for f in TRIGGER_FIELDS):
        for other in TRIGGER_FIELDS:
            changes.setdefault(other, None)
    merged = {**{f: getattr(job, f) for f in EDITABLE_FIELDS}, **changes}
    # A client that sends back an unchanged past run_at is not setting it.
    changed = {key for key, value in changes.items() if getattr(job, key) != value}
    clean = _validated(merged, now=now, changed=changed, job_id=job.id)
    return {key: clean[key] for key in changes}


def _refuse_unknown(fields: Mapping[str, Any]) -> None:
    # Callers pass shapes already, but a key the model has and the rules do not judge
    # (tenant, next_run_at) must never reach a write unchecked.
    unknown = sorted(set(fields) - set(EDITABLE_FIELDS))
    if unknown:
        raise JobInvalid({key: ["Unknown field."] for key in unknown})


def _validated(merged: dict[str, Any], *, now: datetime, changed: set[str] | None, job_id: UUID) -> dict:
    if merged.get("cron_expr") == "":
        merged["cron_expr"] = None
    clean = validate_job(
        merged,
        now=now,
        allow_private=settings.SCHEDULER_ALLOW_PRIVATE_TARGETS,
        changed=changed,
        job_id=job_id,
    )
    # The model stores "no cron" as an empty string.
    clean["cron_expr"] = clean.get("cron_expr") or ""
    return clean
