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

# Rows are inserted in the order given (`position`): ids follow it, so a catch-up's runs
# are numbered oldest first whatever join the planner picks, on both engines
# (tests/test_scheduler_misfire.py).
_INSERT_SQL = """
WITH incoming AS (
    SELECT * FROM unnest(
        %b::uuid[], %b::timestamptz[], %b::bigint[], %b::smallint[], %b::integer[], %b::text[],
        %b::smallint[], %b::text[], %b::text[], %b::integer[], %b::integer[], %b::integer[],
        %b::integer[], %b::boolean[], %b::timestamptz[]
    ) WITH ORDINALITY AS x(
        job_id, scheduled_at, tenant_id, partition_id, target_version, "trigger", priority, job_name,
        overlap_policy, max_attempts, retry_backoff_seconds, retry_backoff_cap_seconds,
        lease_seconds, overlap_check, not_before, position)
),
active AS (
    SELECT r.job_id,
           count(*) FILTER (WHERE r.status = 'running') AS running,
           count(*) FILTER (WHERE r.status IN ('queued', 'retrying')) AS waiting
    FROM job_runs r
    WHERE {active_runs_of}
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
    not_before, target_version, job_name, overlap_policy, max_attempts, retry_backoff_seconds,
    retry_backoff_cap_seconds, lease_seconds, created_at, finished_at, last_error, attempts
)
SELECT job_id, scheduled_at, tenant_id, partition_id, status, "trigger", priority, 0,
       coalesce(not_before, now()), target_version, job_name, overlap_policy, max_attempts,
       retry_backoff_seconds, retry_backoff_cap_seconds, lease_seconds, now(),
       CASE WHEN status = 'skipped' THEN now() END,
       CASE WHEN status = 'skipped' THEN 'skipped: an earlier run of this job is still active' ELSE '' END,
       '[]'::jsonb
FROM decided{floor_holds}
ORDER BY position
ON CONFLICT DO NOTHING
RETURNING partition_id, job_id, scheduled_at, status
"""

# The inserted occurrences that already succeeded: their rows moved to run_history,
# beyond job_runs' unique key (docs/decisions/0085-run-history.md; on Citus after the
# outcome, 0087). A statement of its own, after the insert: its snapshot is newer than
# any success the insert waited for. A read, the common case (nothing found): a DELETE
# over every day partition of job_runs in the same statement cost dispatch a tenth of
# its throughput. On Citus both name the batch's partitions: keyed by a join alone,
# they would go to every shard, and one worker down would fail every insert
# (docs/decisions/0073-one-worker-down.md).
# Both name the days of their keys, so that the planner leaves out the other day
# partitions: the join alone planned every day of the retention, 2.3 of the read's 2.7
# ms per batch.
_SUCCEEDED_SQL = """
SELECT h.partition_id, h.job_id, h.scheduled_at
FROM unnest(%b::smallint[], %b::uuid[], %b::timestamptz[]) AS k(partition_id, job_id, scheduled_at)
JOIN run_history h
  ON h.partition_id = k.partition_id AND h.job_id = k.job_id AND h.scheduled_at = k.scheduled_at
WHERE h.scheduled_at BETWEEN %b::timestamptz AND %b::timestamptz"""
# ... and the inserts of those undone, before anyone could see them.
_UNDO_SQL = """
DELETE FROM job_runs q
USING unnest(%b::smallint[], %b::uuid[], %b::timestamptz[]) AS k(partition_id, job_id, scheduled_at)
WHERE q.partition_id = k.partition_id AND q.job_id = k.job_id AND q.scheduled_at = k.scheduled_at
  AND q.scheduled_at BETWEEN %b::timestamptz AND %b::timestamptz"""
_SUCCEEDED = {False: _SUCCEEDED_SQL, True: _SUCCEEDED_SQL + "\n  AND h.partition_id = ANY(%b::smallint[])"}
_UNDO = {False: _UNDO_SQL, True: _UNDO_SQL + "\n  AND q.partition_id = ANY(%b::smallint[])"}


def _keys(rows: Sequence[tuple], *, citus: bool) -> list[list]:
    """_SUCCEEDED's and _UNDO's parameters for rows led by (partition_id, job_id, scheduled_at)."""
    columns = [[row[i] for row in rows] for i in range(3)]
    keyed = [*columns, min(columns[2]), max(columns[2])]
    return [*keyed, sorted(set(columns[0]))] if citus else keyed


# The overlap read (`active`) differs by engine.
# - Plain PostgreSQL takes the batch's job ids as an array and reads from the lowest open
#   floor of the batch's tenants on: no open run of a tenant is older than its floor
#   (runs/open_floors.py). Without the bound a month of days that hold finished runs
#   cost two buffers per job and day: 390 jobs, 39 days, 24,930 buffers and 6 ms; with
#   it 2,311 and 3 ms.
#   The floor is read by a statement of its own (`open_floors.BATCH_FLOOR`) and given to
#   the insert as a constant, which the planner prunes the days below by. Read inside
#   the insert, it pruned them only when the statement ran, after the overlap read had
#   been planned over every day: planning took about 9.5 of a 500-run batch's 28 ms
#   (docs/decisions/0089-dispatch-floor-constant.md). A writer that opens an older run
#   lowers the floor, and may commit between the two statements: the insert writes only
#   if the floor it sees is still no lower (`floor_holds`). When it wrote nothing,
#   `enqueue_runs` runs the form that reads the floor itself (`_INSERT_READING_FLOOR`).
#   The array rather than a join with `incoming`: joined, each day was probed once per
#   job in a nested loop, as many buffers in twice the time. No partition list: beside a
#   keyed lookup of job_runs it misleads the planner (runs/per_partition.py).
# - Citus keeps the join and names the batch's partitions. A read of job_runs by job_id
#   alone goes to every shard, on every worker: one worker down failed every insert, the
#   healthy workers' jobs too (docs/decisions/0073-one-worker-down.md). The array form
#   took about twice as long there (2,000 jobs over 30 shards: 500-640 ms against
#   265-350), probably because Citus writes the ids into the text of every shard's query.
# The floor given back to the insert: NULL (no floor) is -infinity.
_GIVEN_FLOOR = "coalesce(%b::timestamptz, '-infinity')"


def _form(active_runs_of: str, *, floor_holds: str = "") -> str:
    return _INSERT_SQL.replace("{active_runs_of}", active_runs_of).replace("{floor_holds}", floor_holds)


_FLOOR = open_floors.TENANTS_FLOOR
_INSERT = {
    False: _form(
        f"r.job_id = ANY(%b::uuid[]) AND r.scheduled_at >= {_GIVEN_FLOOR}",
        floor_holds=f"\nWHERE {_FLOOR} >= {_GIVEN_FLOOR}",
    ),
    True: _form("r.job_id IN (SELECT job_id FROM incoming) AND r.partition_id = ANY(%b::smallint[])"),
}
_INSERT_READING_FLOOR = _form(f"r.job_id = ANY(%b::uuid[]) AND r.scheduled_at >= {_FLOOR}")

_NEW_RUN_FIELDS = tuple(f.name for f in fields(NewRun))


def _parameters(
    runs: Sequence[NewRun], *, citus: bool, floor: datetime | None = None, reading_floor: bool = False
) -> list[list]:
    """The insert's parameters: one array per column of the runs, then the overlap
    read's (the comment above). For _INSERT on plain PostgreSQL, the batch's lowest floor
    as open_floors.BATCH_FLOOR read it (None: the tenants have none); for
    _INSERT_READING_FLOOR (`reading_floor`), the tenants only."""
    # Bound server-side in binary. The batch used to travel as one JSON document for
    # jsonb_to_recordset: encoding it (dataclass to dict, dates to ISO text) and quoting
    # it into the SQL text client-side cost more than the insert.
    columns = [[getattr(run, name) for run in runs] for name in _NEW_RUN_FIELDS]
    if citus:
        return [*columns, sorted({run.partition_id for run in runs})]
    if reading_floor:
        return [*columns, columns[0], _tenants(runs)]
    return [*columns, columns[0], floor, _tenants(runs), floor]


def _tenants(runs: Sequence[NewRun]) -> list[int]:
    return sorted({run.tenant_id for run in runs})


def _insert(cursor, runs: Sequence[NewRun], *, citus: bool) -> list[tuple]:
    """The insert's RETURNING rows (the comment above says why two statements on plain
    PostgreSQL, and three when the first insert wrote nothing)."""
    if citus:
        cursor.execute(_INSERT[True], _parameters(runs, citus=True), binary=True)
        return cursor.fetchall()
    cursor.execute(open_floors.BATCH_FLOOR, [_tenants(runs)], binary=True)
    (floor,) = cursor.fetchone()
    cursor.execute(_INSERT[False], _parameters(runs, citus=False, floor=floor), binary=True)
    inserted = cursor.fetchall()
    if inserted:
        return inserted
    # Every run was there already, or a writer lowered the floor since it was read.
    cursor.execute(_INSERT_READING_FLOOR, _parameters(runs, citus=False, reading_floor=True), binary=True)
    return cursor.fetchall()


def enqueue_runs(runs: Sequence[NewRun]) -> list[InsertedRun]:
    """Insert occurrences; an existing (job_id, scheduled_at) is left alone.

    The run key is the last line of defence against a double fire: whatever races above
    it, the second insert of an occurrence is a no-op. job_runs' unique key says it for
    every run but a success, which has moved to run_history; the inserted rows found
    there are deleted again, before anyone can see them. Returns the rows
    actually inserted (queued or skipped by the overlap policy). Old slots lower their
    tenants' open floors in the same transaction (runs/open_floors.py).
    """
    if not runs:
        return []
    with connection.wrap_database_errors, raw_cursor(connection) as cursor:
        citus = citus_installed(cursor)
        # Before the insert: on Citus a write of the reference table tenants is refused
        # after a statement that used several connections to one worker in the
        # transaction, as the insert of a batch over many shards does.
        open_floors.lower(cursor, ((run.tenant_id, run.scheduled_at) for run in runs))
        # binary: the RETURNING's timestamps load in C, not through Django's text loader.
        inserted = _insert(cursor, runs, citus=citus)
        if not inserted:
            return []
        cursor.execute(_SUCCEEDED[citus], _keys(inserted, citus=citus), binary=True)
        succeeded = cursor.fetchall()
        if succeeded:
            cursor.execute(_UNDO[citus], _keys(succeeded, citus=citus), binary=True)
        gone = {(j, at) for _, j, at in succeeded}
        kept = [(j, at, st) for _, j, at, st in inserted if (j, at) not in gone]
        return [InsertedRun(job_id=j, scheduled_at=at, status=st) for j, at, st in kept]


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
