"""The audit log: one explicit `record()` per change, called by the service that makes it.

Explicit calls rather than database triggers (django-pghistory) on purpose: the entry
must say *who* (an admin user or a tenant token), *which action* (a pause is not "an
UPDATE of paused") and carry the caller's intent (a resume's catch-up choice), none of
which a row trigger sees; and the scheduler's and executors' own writes (millions of
next_run_at advances and outcome writes) must not be audited at all. The call sits
inside the service's transaction, so an entry exists exactly when the change committed.
See docs/decisions/0014-audit-log.md.
"""

from __future__ import annotations

from datetime import date, datetime
from typing import Any
from uuid import UUID

from jobs.models import API_FIELD_NAMES, AuditAction, AuditEntry, Job
from runs.target_secrets import marked_secret, redact_target

# Writes made outside the API and the admin (management commands, tests, the shell).
SYSTEM = "system"


def admin_actor(user: Any) -> str:
    return f"admin:{user.get_username()}"


def tenant_actor(*, slug: str, token_prefix: str) -> str:
    return f"tenant:{slug} token:{token_prefix}"


def record(
    *,
    actor: str,
    action: AuditAction | str,
    job: Job | None = None,
    changes: dict | None = None,
    tenant_id: int | None = None,
    job_id: UUID | None = None,
    job_name: str = "",
) -> AuditEntry:
    """Write one audit entry; call it inside the transaction of the change it describes.

    Give `job`, or (for a run's operations, which know only the run's snapshot) its
    `tenant_id`, `job_id` and `job_name`.
    """
    if job is not None:
        tenant_id, job_id, job_name = job.tenant_id, job.id, job.name
    return AuditEntry.objects.create(
        actor=actor or SYSTEM,
        action=action,
        tenant_id=tenant_id,
        job_id=job_id,
        job_name=job_name,
        changes=plain(changes or {}),
    )


def field_diff(*, before: dict, after: dict) -> dict:
    """`{field: [old, new]}` for the fields whose value changed; targets are redacted, so
    a changed secret header shows as "***" -> "***" (that it changed, never its value).

    Both sides are redacted with the header names either side marks secret: a header
    that stops being marked still shows "***" on the side that holds its secret."""
    diff = {}
    for name, new in after.items():
        old = before.get(name)
        if old == new:
            continue
        if name == "target":
            marked = sorted(marked_secret(old) | marked_secret(new))
            old, new = (redact_target(t, also_secret=marked) if t else t for t in (old, new))
        diff[api_name(name)] = [old, new]
    return diff


def snapshot(values: dict) -> dict:
    """A created job's fields as an audit entry shows them (target redacted, API names)."""
    out = {api_name(name): value for name, value in values.items()}
    if isinstance(out.get("target"), dict):
        out["target"] = redact_target(out["target"])
    return out


def api_name(field: str) -> str:
    """A job field's name as the API spells it (`cron_expr` -> `cron`)."""
    return API_FIELD_NAMES.get(field, field)


def shown_changes(changes: Any) -> Any:
    """An entry's `changes` by the API's field names, as every reader shows them. Entries
    written before the log used the API's names hold the columns' (`cron_expr`); they are
    renamed when read, not rewritten: an audit log is kept as it was written. No API name
    is another field's column name, so renaming an entry twice changes nothing."""
    if not isinstance(changes, dict):
        return changes
    return {api_name(key): value for key, value in changes.items()}


def plain(value: Any) -> Any:
    """`value` as an entry stores it: JSON-ready and stable (datetimes as ISO strings,
    UUIDs as text, nested containers too)."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, datetime | date):
        return value.isoformat().replace("+00:00", "Z")
    if isinstance(value, UUID):
        return str(value)
    return value
