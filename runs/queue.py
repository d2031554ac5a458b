"""The run queue in SQL: inserting occurrences, claiming, fencing. The only raw SQL
besides runs/partitions.py. Each function runs inside the caller's transaction
unless it says otherwise.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from uuid import UUID

from django.db import connection

NOTIFY_CHANNEL = "cronyard_runs"


@dataclass(frozen=True)
class NewRun:
    """One occurrence to insert, with the snapshot of the job that executing needs."""

    job_id: UUID
    scheduled_at: datetime
    tenant_id: int
    partition_id: int
    target: dict
    trigger: str = "schedule"
    priority: int = 0
    job_name: str = ""
    overlap_policy: str = "skip"
    max_attempts: int = 5
    retry_backoff_seconds: int = 10
    retry_backoff_cap_seconds: int = 3600
    lease_seconds: int = 30
    # When False the run is queued whatever else the job has active (catch-up
    # backlogs, manual triggers, backfills: an operator asked for each of them).
    overlap_check: bool = True
    not_before: datetime | None = field(default=None)


@dataclass(frozen=True)
class InsertedRun:
    job_id: UUID
    scheduled_at: datetime
    status: str


_INSERT_SQL = """
WITH incoming AS (
    SELECT * FROM jsonb_to_recordset(%s::jsonb) AS x(
        job_id uuid, scheduled_at timestamptz, tenant_id bigint, partition_id smallint,
        target jsonb, "trigger" text, priority smallint, job_name text, overlap_policy text,
        max_attempts integer, retry_backoff_seconds integer, retry_backoff_cap_seconds integer,
        lease_seconds integer, overlap_check boolean, not_before timestamptz)
),
active AS (
    SELECT r.job_id,
           count(*) FILTER (WHERE r.status = 'running') AS running,
           count(*) FILTER (WHERE r.status IN ('queued', 'retrying')) AS waiting
    FROM job_runs r
    WHERE r.job_id IN (SELECT job_id FROM incoming)
      AND r.status IN ('queued', 'running', 'retrying')
    GROUP BY r.job_id
),
decided AS (
    SELECT i.*,
           CASE
             WHEN NOT i.overlap_check THEN 'queued'
             WHEN i.overlap_policy = 'skip' AND coalesce(a.running + a.waiting, 0) > 0 THEN 'skipped'
             WHEN i.overlap_policy = 'buffer_one' AND coalesce(a.waiting, 0) > 0 THEN 'skipped'
             ELSE 'queued'
           END AS status
    FROM incoming i LEFT JOIN active a ON a.job_id = i.job_id
)
INSERT INTO job_runs (
    job_id, scheduled_at, tenant_id, partition_id, status, "trigger", priority, attempt,
    not_before, target, job_name, overlap_policy, max_attempts, retry_backoff_seconds,
    retry_backoff_cap_seconds, lease_seconds, created_at, finished_at, last_error, attempts
)
SELECT job_id, scheduled_at, tenant_id, partition_id, status, "trigger", priority, 0,
       coalesce(not_before, now()), target, job_name, overlap_policy, max_attempts,
       retry_backoff_seconds, retry_backoff_cap_seconds, lease_seconds, now(),
       CASE WHEN status = 'skipped' THEN now() END,
       CASE WHEN status = 'skipped' THEN 'skipped: an earlier run of this job is still active' ELSE '' END,
       '[]'::jsonb
FROM decided
ON CONFLICT DO NOTHING
RETURNING job_id, scheduled_at, status
"""


def _encode(run: NewRun) -> dict:
    row = asdict(run)
    row["job_id"] = str(run.job_id)
    row["scheduled_at"] = run.scheduled_at.isoformat()
    row["not_before"] = run.not_before.isoformat() if run.not_before else None
    return row


def enqueue_runs(runs: Sequence[NewRun]) -> list[InsertedRun]:
    """Insert occurrences; an existing (job_id, scheduled_at) is left alone.

    The unique key is the last line of defence against a double fire: whatever
    races above it, the second insert of an occurrence is a no-op. Returns the rows
    actually inserted (queued or skipped by the overlap policy).
    """
    if not runs:
        return []
    payload = json.dumps([_encode(run) for run in runs])
    with connection.cursor() as cursor:
        cursor.execute(_INSERT_SQL, [payload])
        return [InsertedRun(job_id=row[0], scheduled_at=row[1], status=row[2]) for row in cursor.fetchall()]


def notify_executors() -> None:
    """Wake LISTENing executors; delivered when the surrounding transaction commits."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, '')", [NOTIFY_CHANNEL])
