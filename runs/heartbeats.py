"""Heartbeats: extending the leases of the runs an executor holds, one statement for
the batch (one per partition on Citus, runs/per_partition.py). An attempt whose run is
no longer `running` under its attempt number is not extended: it was fenced off or
cancelled (runs/reaping.py hands back the leases nobody extended)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

from runs import per_partition
from runs.rows import RunKey

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
