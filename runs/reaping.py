"""Reaping of expired leases: runs whose owner stopped heartbeating are handed back.
The statements name their partitions as every executor write does (runs/claims.py,
runs/per_partition.py): one for all partitions with an expired lease on plain
PostgreSQL, one per partition on Citus.
"""

from __future__ import annotations

from runs import attempts, connections, per_partition
from runs.rows import ReapedRun

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
# runs/claims.py module docstring: Citus refuses functions of columns in UPDATE ... SET).
_REAP_SQL = per_partition.Forms.of(f"""
WITH expired AS (
    SELECT r.partition_id, r.job_id, r.scheduled_at, r.attempt - r.deferrals >= r.max_attempts AS dead,
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
    if not await connections.one_partition_per_statement(conn):
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
