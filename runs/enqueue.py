"""The run queue's insert side in SQL: new occurrences (`enqueue_runs`) and the wake-up
of executors. Runs inside the caller's transaction (the dispatch transaction, or a
service's). The executor's side is runs/execution: the claim (claims.py), heartbeats and
reaping (run_leases.py), outcomes (outcomes.py); docs/state_machine.md lists every write.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import fields
from datetime import datetime

from django.db import connection

from runs import open_floors
from runs.execution.queries import NOTIFY_CHANNEL
from runs.keys import format_utc
from runs.rows import InsertedRun, NewRun
from scheduler_project.citus import citus_installed
from scheduler_project.db import raw_cursor

_INSERT_SQL = """
WITH incoming AS (
    SELECT * FROM unnest(
        %b::uuid[], %b::timestamptz[], %b::bigint[], %b::smallint[], %b::integer[], %b::text[],
        %b::smallint[], %b::text[], %b::text[], %b::integer[], %b::integer[], %b::integer[],
        %b::integer[], %b::boolean[], %b::timestamptz[]
    ) AS x(
        job_id, scheduled_at, tenant_id, partition_id, target_version, "trigger", priority, job_name,
        overlap_policy, max_attempts, retry_backoff_seconds, retry_backoff_cap_seconds,
        lease_seconds, overlap_check, not_before)
),
active AS (
    SELECT r.job_id,
           count(*) FILTER (WHERE r.status = 'running') AS running,
           count(*) FILTER (WHERE r.status IN ('queued', 'retrying')) AS waiting
    FROM job_runs r
    WHERE r.job_id IN (SELECT job_id FROM incoming)
      AND r.status IN ('queued', 'running', 'retrying') {active_partitions}
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
    not_before, target_version, job_name, overlap_policy, max_attempts, retry_backoff_seconds,
    retry_backoff_cap_seconds, lease_seconds, created_at, finished_at, last_error, attempts
)
SELECT job_id, scheduled_at, tenant_id, partition_id, status, "trigger", priority, 0,
       coalesce(not_before, now()), target_version, job_name, overlap_policy, max_attempts,
       retry_backoff_seconds, retry_backoff_cap_seconds, lease_seconds, now(),
       CASE WHEN status = 'skipped' THEN now() END,
       CASE WHEN status = 'skipped' THEN 'skipped: an earlier run of this job is still active' ELSE '' END,
       '[]'::jsonb
FROM decided
ON CONFLICT DO NOTHING
RETURNING job_id, scheduled_at, status
"""


# The overlap read names the batch's partitions on Citus only. There a read of job_runs
# by job_id alone goes to every shard, on every worker: one worker down failed every
# insert, the healthy workers' jobs too (docs/decisions/0073-one-worker-down.md), and
# each batch paid a round trip per shard. On plain PostgreSQL the statement stays as it
# was: a partition list beside a keyed lookup of job_runs misleads its planner
# (runs/per_partition.py says how).
_INSERT = {
    False: _INSERT_SQL.replace("{active_partitions}", ""),
    True: _INSERT_SQL.replace("{active_partitions}", "AND r.partition_id = ANY(%b::smallint[])"),
}

_NEW_RUN_FIELDS = tuple(f.name for f in fields(NewRun))


def _columns(runs: Sequence[NewRun]) -> list[list]:
    # One array per column, bound server-side in binary. The batch used to travel as
    # one JSON document for jsonb_to_recordset: encoding it (dataclass to dict, dates to
    # ISO text) and quoting it into the SQL text client-side cost more than the insert.
    return [[getattr(run, name) for run in runs] for name in _NEW_RUN_FIELDS]


def enqueue_runs(runs: Sequence[NewRun]) -> list[InsertedRun]:
    """Insert occurrences; an existing (job_id, scheduled_at) is left alone.

    The unique key is the last line of defence against a double fire: whatever
    races above it, the second insert of an occurrence is a no-op. Returns the rows
    actually inserted (queued or skipped by the overlap policy). Old slots lower their
    tenants' open floors in the same transaction (runs/open_floors.py).
    """
    if not runs:
        return []
    with connection.wrap_database_errors, raw_cursor(connection) as cursor:
        citus = citus_installed(cursor)
        columns = _columns(runs)
        if citus:
            columns.append(sorted({run.partition_id for run in runs}))
        # Before the insert: on Citus a write of the reference table tenants is refused
        # after a statement that used several connections to one worker in the
        # transaction, as the insert of a batch over many shards does.
        open_floors.lower(cursor, ((run.tenant_id, run.scheduled_at) for run in runs))
        cursor.execute(_INSERT[citus], columns)
        return [InsertedRun(job_id=j, scheduled_at=at, status=st) for j, at, st in cursor.fetchall()]


def notify_executors(*, oldest: datetime | None = None) -> None:
    """Wake LISTENing executors; delivered when the surrounding transaction commits.

    `oldest`, the oldest slot of the runs queued, is the payload (RFC 3339): on Citus an
    executor's work map reads the days from a floor on, and a run queued in an older day
    (a replay, a backfill, a catch-up) lowers it (runs/execution/fair_share.Planner).
    Runs of today and yesterday need none: no floor is above yesterday."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, %s)", [NOTIFY_CHANNEL, format_utc(oldest) if oldest else ""])


def oldest_slot(runs: Iterable) -> datetime | None:
    """The oldest `scheduled_at` of `runs` (rows or runs), the payload of notify_executors."""
    return min((run.scheduled_at for run in runs), default=None)
