"""The executor's claim: tenant caps, fair share, priority aging, overlap,
cancel_previous (run leases: runs/execution/run_leases.py; the outcomes of attempts:
runs/execution/outcomes.py). Async (psycopg AsyncConnection), off the Django ORM, so
the hot path costs a few round trips per batch. Each function runs in its own
transaction unless it says otherwise. The statements, and the rules they follow on
Citus, are runs/execution/queries.py (LOCK_TENANTS, RUNNING, CLAIM).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import psycopg
from psycopg import pq

from runs import per_partition
from runs.execution import fair_share, queries
from runs.rows import ClaimedRun

# pg_advisory_xact_lock(key1, key2) namespace for "claiming runs of tenant key2".
TENANT_CLAIM_LOCK = 0x43524E59  # "CRNY"

# EXECUTOR_PRIORITY_AGING_SECONDS' default: a run waiting longer claims as priority 9.
DEFAULT_AGING_SECONDS = 60.0


async def claim_runs(
    conn,
    *,
    owner: str,
    limit: int,
    aging_seconds: float = DEFAULT_AGING_SECONDS,
    open_from: datetime | None = None,
    planner: fair_share.Planner | None = None,
) -> list[ClaimedRun]:
    """Claim up to `limit` runnable runs for `owner`: one read chooses the partitions and
    tenants in fair-share order (runs/execution/fair_share.py), then one short claim transaction
    for all of them: one claim statement for the batch (plain PostgreSQL) or one per
    partition until the batch is full (Citus). No transaction is open during any call.

    Never more running runs per tenant than tenants.max_concurrency, across all
    partitions: claimers of the same tenant are serialised by a transaction-scoped
    advisory lock, and the running counts are read (by a statement that starts) after
    the locks are held. Runs scheduled before `open_from` are not looked for
    (fair_share.OpenFrom: no open run is older). A `planner` may hand out its last
    plan again (fair_share.Planner); it is told whether the claim came back full.
    """
    if limit <= 0:
        return []
    planner = planner or fair_share.Planner()
    plan = await planner.plan(conn, limit=limit, aging_seconds=aging_seconds, open_from=open_from)
    if not plan.partitions:
        planner.forget()
        return []
    claimed = await _claim_planned(
        conn, plan, owner=owner, limit=limit, aging_seconds=aging_seconds, open_from=open_from
    )
    planner.claimed(full=len(claimed) >= limit)
    return claimed


async def _claim_planned(
    conn,
    plan: fair_share.ClaimPlan,
    *,
    owner: str,
    limit: int,
    aging_seconds: float,
    open_from: datetime | None,
) -> list[ClaimedRun]:
    """The claim transaction for the tenants (and, on Citus, partitions) `plan` names."""
    tenant_ids = sorted({t for _, ts in plan.partitions for t in ts})
    params = {
        "limit": limit,
        "owner": owner,
        "aging": aging_seconds,
        "max_rank": plan.max_rank,
        "aged": plan.aged,
        "open_from": fair_share.bound(open_from),
    }
    if not await per_partition.split(conn):
        return await _claim_batch(conn, params, tenant_ids)
    # Citus: the locks and the tenants' running counts (a read of every shard) once for
    # the batch, then a claim statement per partition in the same transaction, each
    # counting the claims of the partitions before it. A transaction per partition read
    # the counts per partition too: ~30 ms of fan-out for a few runs each.
    claimed: list[ClaimedRun] = []
    async with conn.transaction():
        running = await _lock_and_count(conn, tenant_ids)
        for partition_id, tenants in plan.partitions:
            params["limit"] = limit - len(claimed)
            got = await _claim(
                conn, queries.CLAIM.one, {**params, "partition": partition_id}, sorted(set(tenants)), running
            )
            for run in got:
                running[run.tenant_id] = running.get(run.tenant_id, 0) + 1
            claimed += got
            if len(claimed) >= limit:
                break
    claimed.sort(key=lambda run: (-run.priority, run.scheduled_at))
    return claimed


async def _claim_batch(conn, params: dict, tenant_ids: Sequence[int]) -> list[ClaimedRun]:
    """Plain PostgreSQL: one statement ranks the whole batch across tenants, as one
    partition's claim does within its partition (the plan's tenants and rank bound
    narrow it; its partitions are not needed), and counts the tenants' running runs
    itself. BEGIN, the locks, the claim and COMMIT go in one pipeline sync: one round
    trip, the lock held for that one.

    The executor waits on round trips, not CPU (docs/decisions/0033-claim-transaction.md):
    psycopg's transaction() syncs at BEGIN, and fetching
    the counts and then the claim before the commit made this four waits."""
    try:
        async with conn.pipeline():
            await conn.execute("BEGIN")
            await conn.execute(queries.LOCK_TENANTS, {"ns": TENANT_CLAIM_LOCK, "tenants": list(tenant_ids)})
            cursor = await conn.execute(
                queries.CLAIM.many,
                {**params, "tenants": list(tenant_ids), "epoch": datetime.now(UTC).timestamp()},
            )
            await conn.execute("COMMIT")
        # Read after the pipeline's one Sync has brought every result back (fetching
        # inside it would flush and wait once more).
        return [ClaimedRun(*row) for row in await cursor.fetchall()]
    except psycopg.Error:
        # A failed statement leaves the transaction aborted (the server skipped the rest
        # of the pipeline, COMMIT included): end it so the connection stays usable.
        if not conn.closed and conn.info.transaction_status != pq.TransactionStatus.IDLE:
            try:
                await conn.execute("ROLLBACK")
            except psycopg.Error:
                pass  # the connection is gone; the caller's error says why
        raise


async def _lock_and_count(conn, tenant_ids: Sequence[int]) -> dict[int, int]:
    """Inside the claim transaction: lock the tenants (in id order), then count their
    running runs across every partition. {tenant_id: running}."""
    await conn.execute(queries.LOCK_TENANTS, {"ns": TENANT_CLAIM_LOCK, "tenants": list(tenant_ids)})
    cursor = await conn.execute(queries.RUNNING, {"tenants": list(tenant_ids)})
    return dict(await cursor.fetchall())


async def _claim(
    conn, sql: str, params: dict, tenant_ids: Sequence[int], running: dict[int, int]
) -> list[ClaimedRun]:
    """One claim statement (a form of queries.CLAIM; `params` carries its partition
    parameter, the batch limit, owner, aging and rank bound) for `tenant_ids`, whose
    running counts are `running`. The lease ends count from this process's clock (see
    runs/execution/run_leases.py), a parameter: Citus refuses now() + a column in UPDATE ... SET."""
    cursor = await conn.execute(
        sql,
        {
            **params,
            "tenants": list(tenant_ids),
            "running": [running.get(t, 0) for t in tenant_ids],
            "epoch": datetime.now(UTC).timestamp(),
        },
    )
    return [ClaimedRun(*row) for row in await cursor.fetchall()]
