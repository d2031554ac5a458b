"""The run queue's insert side in SQL: new occurrences (`enqueue_runs`) and the wake-up
of executors. Runs inside the caller's transaction (the dispatch transaction, or a
service's). The executor's side (claim, heartbeat, complete, reap) is runs/claims.py.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import fields

from django.db import connection

from runs.connections import NOTIFY_CHANNEL
from runs.rows import InsertedRun, NewRun

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


_NEW_RUN_FIELDS = tuple(f.name for f in fields(NewRun))


def _encode(run: NewRun) -> dict:
    # A shallow dict: asdict() deep-copied every run's target only for json.dumps to
    # read it once (about half of a dispatch batch's Python time, by cProfile).
    row = {name: getattr(run, name) for name in _NEW_RUN_FIELDS}
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
