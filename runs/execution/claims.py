"""The executor's claim in SQL: tenant caps, fair share, priority aging, overlap,
cancel_previous (run leases: runs/execution/run_leases.py; the outcomes of attempts:
runs/execution/outcomes.py). Async (psycopg AsyncConnection), off the Django ORM, so
the hot path costs a few round trips per batch. Each function runs in its own
transaction unless it says otherwise.

Every statement that writes or locks a run on Citus names its one `partition_id`
(docs/CONTRACT.md, "Beyond one server": `FOR UPDATE` and cheap writes exist only inside one shard); on
plain PostgreSQL the heartbeat names all of a batch's partitions at once
(runs/per_partition.py: one template, two forms), and the batch claim, one statement
over every partition, names none (_CLAIM_SQL says why). Keyed joins also name each
row's own partition. Reads that only
count or choose (tenants' running runs, which partitions to claim from, expired leases)
may span partitions. Times derived from a column (lease ends, retry times) are computed
from a timestamp passed in, not from now() inside the UPDATE, and attempt entries are
built outside UPDATE ... SET: Citus refuses volatile functions, and stable ones applied
to columns, in a distributed UPDATE. docs/decisions/0040-per-partition-statements.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import psycopg
from psycopg import pq

from runs import attempts, per_partition
from runs.execution import fair_share
from runs.rows import ClaimedRun

# pg_advisory_xact_lock(key1, key2) namespace for "claiming runs of tenant key2".
TENANT_CLAIM_LOCK = 0x43524E59  # "CRNY"

# EXECUTOR_PRIORITY_AGING_SECONDS' default: a run waiting longer claims as priority 9.
DEFAULT_AGING_SECONDS = 60.0


# ... and of one a newer run of a cancel_previous job cut short.
_CANCELLED_BY_NEWER_ENTRY = attempts.sql_entry(
    attempt="o.attempt",
    owner="o.owner",
    started_at="o.started_at",
    finished_at="now()",
    duration_ms=attempts.sql_duration_ms(started="o.started_at", finished="now()"),
    outcome="'cancelled'",
    result_code="NULL",
    error="'cancelled by a newer run'",
    retry_in_s="NULL",
)

# Step 1 of a claim: lock the tenants fair_share chose for it, in tenant id
# order (claimers never deadlock). A statement without distributed tables: on Citus it
# runs on the coordinator, so one tenant's claims are serialised whichever shard they
# touch (inside a statement on a shard the lock would be taken on that worker).
_LOCK_TENANTS_SQL = """
SELECT count(*) FROM (
    SELECT pg_advisory_xact_lock(%(ns)s, u.t::integer)
    FROM unnest(%(tenants)s::bigint[]) WITH ORDINALITY AS u(t, n)
    ORDER BY u.n
    OFFSET 0
) locks
"""

# Step 2, under those locks: the tenants' running runs, across every partition (the
# cap is per tenant). Plain PostgreSQL counts them inside the claim (_COUNTED_RUNNING).
# On Citus, a read of its own, not a CTE of the claim: there a statement
# that reads several shards is split into a plan per CTE with intermediate results
# (about ten round trips to the workers); without it the claim goes to one shard whole.
# READ COMMITTED: this statement sees every claim committed before it began, and no
# claim of these tenants can commit before ours while we hold their locks.
_RUNNING_SQL = """
SELECT tenant_id, count(*) FROM job_runs
WHERE status = 'running' AND tenant_id = ANY(%(tenants)s::bigint[])
GROUP BY tenant_id
"""

# Step 3, in the partitions named (one per statement on Citus), with those counts.
# Per locked tenant, its best runs by effective priority (a run waiting longer than
# `aging` seconds counts as priority 9, so a flood of 9s cannot hold a 0 back forever):
# the union of two index-ordered probes, the best by priority and the longest waiting,
# each at most the tenant's places in the batch (slots.probe). Per job, at most one run
# unless the job allows overlap (a job's runs are all in its partition). Across tenants, the fair-share rank
# (running + k-th pick) / weight decides, as in fair_share.
_CLAIM_TEMPLATE = """
WITH busy AS MATERIALIZED (
    -- Every running run, older than the claim's bound too: the caps and the skip and
    -- buffer_one checks count them, and the bound may be a second old.
    SELECT tenant_id, job_id FROM job_runs r WHERE r.partition_id {partition_filter} AND r.status = 'running'
),
slots AS (
    -- probe: how many runs of the tenant `chosen` could take, its free slots and its
    -- places within the batch's rank bound ((running + k) / weight <= max_rank). The
    -- probes lock what they read (FOR UPDATE inside the LATERAL): probing each tenant
    -- for the whole batch locked 640 rows to claim 32 among 20 tenants.
    SELECT t.id AS tenant_id, t.weight, run.n AS running, t.max_concurrency - run.n AS free,
           least(t.max_concurrency - run.n, %(limit)s,
                 greatest(0, floor(%(max_rank)s::float8 * t.weight + 1e-9)::bigint - run.n)) AS probe,
           -- The secrets that sign the tenant's calls (runs/execution/signing.py), read
           -- with the row the claim reads anyway: the previous one too while the
           -- overlap of a rotation lasts, on the database clock like the rotation.
           CASE WHEN t.previous_signing_secret_until > now()
                THEN ARRAY[t.signing_secret, t.previous_signing_secret]
                ELSE ARRAY[t.signing_secret] END AS signing_secrets
    FROM tenants t JOIN {running} ON run.tenant_id = t.id
),
by_priority AS (
    SELECT c.* FROM slots s CROSS JOIN LATERAL (
        SELECT r.partition_id, r.id, r.scheduled_at, r.job_id, r.tenant_id, r.priority, r.overlap_policy,
               r.not_before
        FROM job_runs r
        WHERE r.partition_id {partition_filter} AND r.tenant_id = s.tenant_id
          AND r.status IN ('queued', 'retrying') AND r.not_before <= now() AND {not_ahead} AND {open_from}
          AND (r.overlap_policy NOT IN ('skip', 'buffer_one')
               OR r.job_id NOT IN (SELECT job_id FROM busy))
        ORDER BY r.priority DESC, r.scheduled_at
        LIMIT s.probe
        FOR UPDATE OF r SKIP LOCKED
    ) c
    WHERE s.free > 0
),
by_age AS (
    SELECT c.* FROM slots s CROSS JOIN LATERAL (
        SELECT r.partition_id, r.id, r.scheduled_at, r.job_id, r.tenant_id, r.priority, r.overlap_policy,
               r.not_before
        FROM job_runs r
        WHERE r.partition_id {partition_filter} AND r.tenant_id = s.tenant_id
          AND r.status IN ('queued', 'retrying')
          AND r.not_before <= now() - %(aging)s * interval '1 second' AND {not_ahead} AND {open_from}
          AND (r.overlap_policy NOT IN ('skip', 'buffer_one')
               OR r.job_id NOT IN (SELECT job_id FROM busy))
        ORDER BY r.not_before
        LIMIT s.probe
        FOR UPDATE OF r SKIP LOCKED
    ) c
    -- Only tenants the plan saw a run of effective priority 9 for (runs/execution/fair_share.py,
    -- ClaimPlan.aged): for the others this probe found nothing, at two buffers per day
    -- partition per tenant (a fifth of a claim's buffers with 20 tenants).
    WHERE s.free > 0 AND s.tenant_id = ANY(%(aged)s::bigint[])
),
picked AS (
    SELECT u.*,
           CASE WHEN u.not_before <= now() - %(aging)s * interval '1 second' THEN 9
                ELSE u.priority END AS effective_priority
    FROM (SELECT * FROM by_priority UNION SELECT * FROM by_age) u
),
superseded AS (
    -- cancel_previous: the newest occurrence wins. A run must not start while a newer
    -- occurrence of its job waits, runs or has succeeded (an old retry or a replay
    -- would run beside it, or redo stale work after it): it is cancelled instead.
    -- Claims of one job are serialised by the tenant lock, so every order ends with
    -- at most one running occurrence (see docs/decisions/0036-cancel-previous.md).
    SELECT p.partition_id, p.id, p.job_id, p.scheduled_at FROM picked p
    WHERE p.overlap_policy = 'cancel_previous'
      AND EXISTS (SELECT 1 FROM job_runs n
                  WHERE n.partition_id {partition_filter} AND n.partition_id = p.partition_id
                    AND n.job_id = p.job_id AND n.scheduled_at > p.scheduled_at
                    AND n.status IN ('queued', 'retrying', 'running', 'succeeded'))
),
ranked AS (
    SELECT p.*, row_number() OVER (PARTITION BY p.job_id ORDER BY p.scheduled_at) AS job_rank
    FROM picked p
    WHERE NOT EXISTS (SELECT 1 FROM superseded x WHERE x.id = p.id AND x.scheduled_at = p.scheduled_at)
),
dropped AS (
    UPDATE job_runs d SET
        status = 'cancelled', finished_at = now(), lease_until = NULL,
        last_error = 'cancelled: a newer occurrence of this job supersedes it (cancel_previous)'
    FROM superseded x
    WHERE d.partition_id {partition_filter} AND d.partition_id = x.partition_id
      AND d.job_id = x.job_id AND d.scheduled_at = x.scheduled_at
    RETURNING d.job_id
),
eligible AS (
    SELECT e.*, row_number() OVER (PARTITION BY e.tenant_id
                                   ORDER BY e.effective_priority DESC, e.scheduled_at) AS tenant_rank
    FROM ranked e WHERE e.job_rank = 1 OR e.overlap_policy = 'allow'
),
chosen AS (
    -- The k-th pick of a tenant with n running ranks (n + k) / weight: fair share
    -- across tenants first, effective priority and age within it. The running counts
    -- include this batch's claims in earlier partitions, so the bound from the plan
    -- holds across the batch (a small slack for float rounding).
    SELECT e.*, s.signing_secrets FROM eligible e JOIN slots s ON s.tenant_id = e.tenant_id
    WHERE e.tenant_rank <= s.free
      AND (s.running + e.tenant_rank)::float8 / s.weight <= %(max_rank)s::float8 + 1e-9
    ORDER BY (s.running + e.tenant_rank)::float8 / s.weight, e.effective_priority DESC, e.scheduled_at
    LIMIT %(limit)s
),
claimed AS (
    -- started_at is the claim statement's own time, not its transaction's: the claim
    -- runs after the tenant locks and running counts of the same transaction, and a
    -- previous run of a skip job can finish between the two (a run would look as if it
    -- started before its predecessor finished).
    UPDATE job_runs r SET
        status = 'running', attempt = r.attempt + 1,
        lease_until = to_timestamp(%(epoch)s + r.lease_seconds),
        owner = %(owner)s, started_at = statement_timestamp(), finished_at = NULL
    FROM chosen c
    WHERE r.partition_id {partition_filter} AND r.partition_id = c.partition_id
      AND r.job_id = c.job_id AND r.scheduled_at = c.scheduled_at
    RETURNING r.job_id, r.scheduled_at, r.tenant_id, r.partition_id, r.attempt, r.target, r.job_name,
              r.overlap_policy, r.priority, r.max_attempts, r.retry_backoff_seconds,
              r.retry_backoff_cap_seconds, r.lease_seconds, r.started_at, c.signing_secrets,
              r.deferrals, r.deferred_since,
              CASE WHEN {attempts_used} > 1 THEN r.attempts -> -1 ->> 'outcome' END
),
older AS (
    -- cancel_previous: the older running run loses the run; its worker finds out at
    -- its next heartbeat (the row is no longer 'running') and stops its call. Its
    -- history entry is built here, so the UPDATE below only copies it; the UPDATE
    -- re-checks the attempt it was built for.
    SELECT o.partition_id, o.job_id, o.scheduled_at, o.attempt,
           jsonb_build_array({_CANCELLED_BY_NEWER_ENTRY}) AS entry
    FROM job_runs o JOIN chosen c ON o.partition_id = c.partition_id AND o.job_id = c.job_id
    WHERE o.partition_id {partition_filter} AND c.overlap_policy = 'cancel_previous'
      AND o.status = 'running' AND o.scheduled_at < c.scheduled_at
),
cancelled AS (
    UPDATE job_runs o SET
        status = 'cancelled', finished_at = now(), lease_until = NULL,
        last_error = 'cancelled by a newer run',
        attempts = o.attempts || x.entry
    FROM older x
    WHERE o.partition_id {partition_filter} AND o.partition_id = x.partition_id
      AND o.job_id = x.job_id AND o.scheduled_at = x.scheduled_at
      AND o.attempt = x.attempt AND o.status = 'running'
    RETURNING o.job_id
)
SELECT * FROM claimed ORDER BY priority DESC, scheduled_at
"""
_CLAIM_TEMPLATE = _CLAIM_TEMPLATE.replace("{_CANCELLED_BY_NEWER_ENTRY}", _CANCELLED_BY_NEWER_ENTRY)
_CLAIM_TEMPLATE = _CLAIM_TEMPLATE.replace("{not_ahead}", fair_share.NOT_AHEAD)
_CLAIM_TEMPLATE = _CLAIM_TEMPLATE.replace("{open_from}", fair_share.OPEN_FROM)
_CLAIM_TEMPLATE = _CLAIM_TEMPLATE.replace("{attempts_used}", attempts.sql_used("r"))

# The tenants' running runs in the claim's `slots`, as (tenant_id, n) rows named `run`:
# - plain PostgreSQL, counted by the claim itself: its snapshot is taken when it starts,
#   after the lock statement before it returned, so it sees every claim of these
#   tenants committed before ours and none can commit meanwhile (the locks);
# - Citus (and the per-partition forms), given: _RUNNING_SQL read them once for the
#   batch (a read of every shard), and each partition's claim adds the ones before it.
# Counted from `busy`, which the batch form reads over every partition: one pass over
# the running runs. (A LATERAL count per tenant probed every day partition per tenant,
# 340 buffers a claim with 20 tenants; a scalar subquery in the select list was pulled up
# into `slots` and counted again at each use of n.)
_COUNTED_RUNNING = """(
    SELECT u.t AS tenant_id, count(b.tenant_id) AS n
    FROM unnest(%(tenants)s::bigint[]) AS u(t) LEFT JOIN busy b ON b.tenant_id = u.t
    GROUP BY u.t
) AS run"""
_GIVEN_RUNNING = "unnest(%(tenants)s::bigint[], %(running)s::bigint[]) AS run(tenant_id, n)"
# The batch form counts (plain PostgreSQL), the one-partition form is given the counts.
# The batch form names no partitions (runs/per_partition.py): with the plan's, each
# tenant's probe fetched and skipped its runs elsewhere, 5,324 buffers for 102 runs.
_CLAIM_SQL = per_partition.Forms(
    one=per_partition.Forms.of(_CLAIM_TEMPLATE.replace("{running}", _GIVEN_RUNNING)).one,
    many=per_partition.every(_CLAIM_TEMPLATE.replace("{running}", _COUNTED_RUNNING)),
)


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
                conn, _CLAIM_SQL.one, {**params, "partition": partition_id}, sorted(set(tenants)), running
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
            await conn.execute(_LOCK_TENANTS_SQL, {"ns": TENANT_CLAIM_LOCK, "tenants": list(tenant_ids)})
            cursor = await conn.execute(
                _CLAIM_SQL.many,
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
    await conn.execute(_LOCK_TENANTS_SQL, {"ns": TENANT_CLAIM_LOCK, "tenants": list(tenant_ids)})
    cursor = await conn.execute(_RUNNING_SQL, {"tenants": list(tenant_ids)})
    return dict(await cursor.fetchall())


async def _claim(
    conn, sql: str, params: dict, tenant_ids: Sequence[int], running: dict[int, int]
) -> list[ClaimedRun]:
    """One claim statement (a form of _CLAIM_SQL; `params` carries its partition
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
