"""Run leases: a claimed run is held under a lease its executor extends (heartbeats);
a lease nobody extended is expired and the run is handed back (reaping).

Heartbeats extend the leases of the runs an executor holds, one statement for the batch
(one per partition on Citus, runs/per_partition.py). An attempt whose run is no longer
`running` under its attempt number is not extended: it was fenced off or cancelled.
Reaping hands back runs whose owner stopped heartbeating, naming their partitions as
every executor write does (runs/execution/queries.py, runs/per_partition.py): one
statement for all partitions with an expired lease on plain PostgreSQL, one per
partition on Citus. The attempt number is the fence: a reaped attempt's late outcome
matches no row. The statements are queries.HEARTBEAT, queries.EXPIRED_PARTITIONS and
queries.REAP.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import UTC, datetime

from runs import open_floors, per_partition
from runs.execution import fair_share, queries
from runs.rows import ReapedRun, RunKey

# --- heartbeats ---------------------------------------------------------------------------

log = logging.getLogger(__name__)


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
            **per_partition.window(*(key[1] for _, key in keyed)),
            "epoch": epoch,
            "run_partitions": [p for p, _ in keyed],
            "job_ids": [k[0] for _, k in keyed],
            "scheduled": [k[1] for _, k in keyed],
            "attempts": [k[2] for _, k in keyed],
        }

    grouped = per_partition.group((p, (p, key)) for p, key in runs)
    try:
        held = await per_partition.run(conn, queries.HEARTBEAT, grouped, params)
    except per_partition.WorkerUnreachable as exc:
        # A worker out of reach: its runs' leases could not be extended, and may still
        # hold. Counted as held: dropping them would stop calls that may well finish and
        # write before their leases end. If they do not, their writes are fenced.
        log.debug("heartbeat: %d run(s) on a worker out of reach kept as they are", len(exc.items))
        return {(row[0], row[1], row[2]) for row in exc.rows} | {key for _, key in exc.items}
    return {(row[0], row[1], row[2]) for row in held}


# --- reaping ------------------------------------------------------------------------------


# Runs one read hands back at most; a read that reaches it is followed by another at once
# (Executor.reap_in_turn).
REAP_LIMIT = 1000


async def reap_expired_leases(conn, *, limit: int = REAP_LIMIT) -> list[ReapedRun]:
    """Hand back runs whose owner stopped heartbeating (lease expiries).

    The expired attempt is fenced off by the status change: its late writes all
    require status='running' with its attempt number. Out of attempts → dead. One
    read finds the partitions with an expired lease (usually none: the read is all a
    healthy cluster pays), then one statement for them all, or one per partition
    (runs/per_partition.py).
    """
    citus = await per_partition.split(conn)
    if citus:
        days = {
            "open_floor": fair_share.bound(await open_floors.lowest(conn)),
            "ahead": datetime.now(UTC) + queries.AHEAD,
        }
        cursor = await conn.execute(queries.EXPIRED_PARTITIONS_IN_DAYS, days)
    else:
        cursor = await conn.execute(queries.EXPIRED_PARTITIONS)
    expired = sorted(await cursor.fetchall())
    if not expired:
        return []
    now = expired[0][1]
    if not citus:
        cursor = await conn.execute(queries.REAP.many, {"now": now, "limit": limit})
        return [ReapedRun(*row) for row in await cursor.fetchall()]
    reaped: list[ReapedRun] = []
    for partition_id, _ in expired:
        if len(reaped) >= limit:
            break
        cursor = await conn.execute(
            queries.REAP.one, {"partition": partition_id, "now": now, "limit": limit - len(reaped)}
        )
        reaped += [ReapedRun(*row) for row in await cursor.fetchall()]
    return reaped
