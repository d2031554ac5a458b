"""Redact secrets that audit entries written before this migration may hold.

A client that sent a secret header back as "***" without its `secret_headers` marking
had the stored value restored but the marking dropped: the job's target, its later
runs and the audit entry then showed the secret in clear. The write path now keeps
the marking (runs/target_secrets.unmask_target). Audit entries cannot be edited through any
surface, so this migration redacts the ones already written: every header that any
audit entry of the same job marked secret is "***" in every entry of that job, and the
job's target and its runs' snapshots get the marking back (so the API and the console
show "***" again; the executor still sends the value).

Frozen history: the redaction rule below is the one in force when this migration was
written, copied here, not imported.
"""

import json
import re

from django.db import migrations

REDACTED = "***"
SECRET_NAME = re.compile(r"auth|cookie|token|secret|key|passw|credential|session|signature", re.IGNORECASE)


def _marks(target):
    names = target.get("secret_headers") if isinstance(target, dict) else None
    return {str(n).lower() for n in names} if isinstance(names, list) else set()


def _targets(changes):
    """The target snapshots an entry holds: a created job's, or both sides of an edit."""
    value = changes.get("target") if isinstance(changes, dict) else None
    if isinstance(value, dict):
        return [value]
    if isinstance(value, list):
        return [t for t in value if isinstance(t, dict)]
    return []


def _redacted(target, marked):
    headers = target.get("headers")
    if not isinstance(headers, dict):
        return target
    shown = {
        name: REDACTED if SECRET_NAME.search(str(name)) or str(name).lower() in marked else value
        for name, value in headers.items()
    }
    return {**target, "headers": shown}


def redact(apps, schema_editor):
    AuditEntry = apps.get_model("jobs", "AuditEntry")
    # The database being migrated, which is not always the default one.
    db = schema_editor.connection.alias
    entries = AuditEntry.objects.using(db).filter(changes__has_key="target").order_by("job_id", "id")
    by_job = {}
    for entry in entries.iterator(chunk_size=2000):
        by_job.setdefault(entry.job_id, []).append(entry)
    with schema_editor.connection.cursor() as cursor:
        for job_id, job_entries in by_job.items():
            marked = set()
            for entry in job_entries:
                for target in _targets(entry.changes):
                    marked |= _marks(target)
            if not marked:
                continue
            changed = []
            for entry in job_entries:
                value = entry.changes["target"]
                if isinstance(value, dict):
                    new = _redacted(value, marked)
                else:
                    new = [_redacted(t, marked) if isinstance(t, dict) else t for t in value]
                if new != value:
                    entry.changes = {**entry.changes, "target": new}
                    changed.append(entry)
            AuditEntry.objects.using(db).bulk_update(changed, ["changes"])
            _mark_stored(cursor, job_id, marked)


def _mark_stored(cursor, job_id, marked):
    """Give the job's target and its runs' snapshots back the marking of headers they hold
    under a name an audit entry marked (only names not secret by name need it)."""
    cursor.execute("SELECT partition_id, target FROM jobs WHERE id = %s", [job_id])
    row = cursor.fetchone()
    if row is None:
        return
    partition_id, target = row
    if isinstance(target, str):
        target = json.loads(target)
    headers = target.get("headers") if isinstance(target, dict) else None
    if not isinstance(headers, dict):
        return
    lost = sorted(
        name.lower()
        for name in headers
        if name.lower() in marked and not SECRET_NAME.search(name) and name.lower() not in _marks(target)
    )
    if not lost:
        return
    cursor.execute(
        "UPDATE jobs SET target = jsonb_set(target, '{secret_headers}', "
        "coalesce(target->'secret_headers', '[]'::jsonb) || %s::jsonb) WHERE id = %s AND partition_id = %s",
        [json.dumps(lost), job_id, partition_id],
    )
    cursor.execute("SELECT to_regclass('job_runs') IS NOT NULL")
    if not cursor.fetchone()[0]:
        return
    cursor.execute(
        "UPDATE job_runs SET target = jsonb_set(target, '{secret_headers}', "
        "coalesce(target->'secret_headers', '[]'::jsonb) || %s::jsonb) "
        "WHERE job_id = %s AND partition_id = %s AND jsonb_typeof(target->'headers') = 'object'",
        [json.dumps(lost), job_id, partition_id],
    )


class Migration(migrations.Migration):
    # No dependency on the runs app: it would reorder a fresh install's history. A fresh
    # database has no audit entry, so nothing here reads job_runs before it exists.
    dependencies = [("jobs", "0012_jobs_failing_idx")]

    operations = [migrations.RunPython(redact, migrations.RunPython.noop, elidable=True)]
