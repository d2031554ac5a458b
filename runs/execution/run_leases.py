"""Run leases: a claimed run is held under a lease its executor extends (heartbeats);
a lease nobody extended is expired and the run is handed back (reaping).

Heartbeats extend the leases of the runs an executor holds, one statement for the batch
(one per partition on Citus, runs/per_partition.py). An attempt whose run is no longer
`running` under its attempt number is not extended: it was fenced off or cancelled.
Reaping hands back runs whose owner stopped heartbeating, naming their partitions as
every executor write does (runs/execution/claims.py, runs/per_partition.py): one
statement for all partitions with an expired lease on plain PostgreSQL, one per
partition on Citus. The attempt number is the fence: a reaped attempt's late outcome
matches no row.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

from runs import attempts, per_partition
from runs.rows import ReapedRun, RunKey

# --- heartbeats ---------------------------------------------------------------------------

_HEARTBEAT_SQL = per_partition.Forms.of(
    """
UPDATE job_runs r SET lease_until = to_timestamp(%(epoch)s + r.lease_seconds)
FROM unnest(%(run_partitions)s::smallint[], %(job_ids)s::uuid[], %(scheduled)s::timestamptz[],
            %(attempts)s::integer[])
    AS h(partition_id, job_id, scheduled_at, attempt)
WHERE r.partition_id {partition_filter} AND r.partition_id = h.partition_id
  AND r.job_id = h.job_id AND r.scheduled_at = h.scheduled_at
  AND r.attempt = h.attempt AND r.status = 'running' AND r.job_id = ANY(%(job_ids)s::uuid[])
RETURNING r.job_id, r.scheduled_at, r.attempt
"""
)


async def heartbeat_runs(conn, runs: Iterable[tuple[int, RunKey]]) -> set[RunKey]:
    """Extend the lease of every (partition_id, (job_id, scheduled_at, attempt)) still
    held; return the keys held.

    A key missing from the answer was fenced off (lease expired and reclaimed) or
    cancelled: its worker must stop and write nothing. Lease ends are counted from this
    process's clock (executors and database hosts keep NTP time; a skew of s seconds
    moves every lease end by s).
    """
    epoch = datetime.now(UTC).timestamp()

    def params(keyed: list[tuple[int, RunKey]]) -> dict:
        return {
            "epoch": epoch,
            "run_partitions": [p for p, _ in keyed],
            "job_ids": [k[0] for _, k in keyed],
            "scheduled": [k[1] for _, k in keyed],
            "attempts": [k[2] for _, k in keyed],
        }

    grouped = per_partition.group((p, (p, key)) for p, key in runs)
    held = await per_partition.run(conn, _HEARTBEAT_SQL, grouped, params)
    return {(row[0], row[1], row[2]) for row in held}


# --- reaping ------------------------------------------------------------------------------

# The history entry of an attempt whose lease ran out: when it finished is unknown.
_REAPED_ENTRY = attempts.sql_entry(
    attempt="r.attempt",
    owner="r.owner",
    started_at="r.started_at",
    finished_at="NULL",
    duration_ms="NULL",
    outcome=f"'{attempts.LEASE_EXPIRED}'",
    result_code="NULL",
    error="'lease expired (no heartbeat)'",
    retry_in_s="0",
)

# Partitions holding an expired lease: a read across partitions, no lock. The running
# rows are few (at most the executors' slots), all in job_runs_running_idx.
_EXPIRED_PARTITIONS_SQL = """
SELECT DISTINCT partition_id, now() FROM job_runs WHERE status = 'running' AND lease_until < now()
"""

# The expired leases of the partitions named (one on Citus). The history entry and the
# message are built in the locking SELECT, so the UPDATE only copies values (see the
# runs/execution/claims.py module docstring: Citus refuses functions of columns in UPDATE ... SET).
_REAP_SQL = per_partition.Forms.of(f"""
WITH expired AS (
    SELECT r.partition_id, r.job_id, r.scheduled_at, {attempts.sql_used_up("r")} AS dead,
           jsonb_build_array({_REAPED_ENTRY}) AS entry,
           'lease expired: attempt ' || r.attempt || ' by ' || r.owner || ' stopped heartbeating' AS error
    FROM job_runs r
    WHERE r.partition_id {{partition_filter}} AND r.status = 'running' AND r.lease_until < %(now)s
    ORDER BY r.lease_until
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE job_runs r SET
    status = CASE WHEN e.dead THEN 'dead' ELSE 'retrying' END,
    not_before = %(now)s,
    lease_until = NULL,
    finished_at = CASE WHEN e.dead THEN %(now)s END,
    last_error = e.error,
    attempts = r.attempts || e.entry
FROM expired e
WHERE r.partition_id {{partition_filter}} AND r.partition_id = e.partition_id
  AND r.job_id = e.job_id AND r.scheduled_at = e.scheduled_at
  AND r.status = 'running' AND r.lease_until < %(now)s
RETURNING r.job_id, r.scheduled_at, r.tenant_id, r.job_name, r.attempt, r.owner, r.status, r.last_error
""")


async def reap_expired_leases(conn, *, limit: int = 1000) -> list[ReapedRun]:
    """Hand back runs whose owner stopped heartbeating (lease expiries).

    The expired attempt is fenced off by the status change: its late writes all
    require status='running' with its attempt number. Out of attempts → dead. One
    read finds the partitions with an expired lease (usually none: the read is all a
    healthy cluster pays), then one statement for them all, or one per partition
    (runs/per_partition.py).
    """
    cursor = await conn.execute(_EXPIRED_PARTITIONS_SQL)
    expired = sorted(await cursor.fetchall())
    if not expired:
        return []
    now = expired[0][1]
    if not await per_partition.split(conn):
        cursor = await conn.execute(_REAP_SQL.many, {"now": now, "limit": limit})
        return [ReapedRun(*row) for row in await cursor.fetchall()]
    reaped: list[ReapedRun] = []
    for partition_id, _ in expired:
        if len(reaped) >= limit:
            break
        cursor = await conn.execute(
            _REAP_SQL.one, {"partition": partition_id, "now": now, "limit": limit - len(reaped)}
        )
        reaped += [ReapedRun(*row) for row in await cursor.fetchall()]
    return reaped
