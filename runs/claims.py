"""The executor's side of the run queue in SQL: claim (tenant caps, fair share,
priority aging, overlap, cancel_previous), heartbeat, complete (with job health), and
reaping of expired leases. Async (psycopg AsyncConnection), off the Django ORM, so the
hot path costs one round trip per batch. Each function runs in its own transaction
unless it says otherwise.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from uuid import UUID

from runs import attempts
from runs.rows import ClaimedRun, Completion, ReapedRun

# pg_advisory_xact_lock(key1, key2) namespace for "claiming runs of tenant key2".
TENANT_CLAIM_LOCK = 0x43524E59  # "CRNY"

# EXECUTOR_PRIORITY_AGING_SECONDS' default: a run waiting longer claims as priority 9.
DEFAULT_AGING_SECONDS = 60.0



# The history entry of an attempt whose lease ran out: when it finished is unknown.
_REAPED_ENTRY = attempts.sql_entry(
    attempt="r.attempt",
    owner="r.owner",
    started_at="r.started_at",
    finished_at="NULL",
    duration_ms="NULL",
    outcome="'lease expired'",
    result_code="NULL",
    error="'lease expired (no heartbeat)'",
    retry_in_s="0",
)
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

_REAP_SQL = f"""
WITH expired AS (
    SELECT id, scheduled_at FROM job_runs
    WHERE status = 'running' AND lease_until < now()
    ORDER BY lease_until
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE job_runs r SET
    status = CASE WHEN r.attempt - r.deferrals >= r.max_attempts THEN 'dead' ELSE 'retrying' END,
    not_before = now(),
    lease_until = NULL,
    finished_at = CASE WHEN r.attempt - r.deferrals >= r.max_attempts THEN now() END,
    last_error = 'lease expired: attempt ' || r.attempt || ' by ' || r.owner || ' stopped heartbeating',
    attempts = r.attempts || jsonb_build_array({_REAPED_ENTRY})
FROM expired e
WHERE r.id = e.id AND r.scheduled_at = e.scheduled_at
  AND r.status = 'running' AND r.lease_until < now()
RETURNING r.job_id, r.scheduled_at, r.tenant_id, r.job_name, r.attempt, r.owner, r.status, r.last_error
"""

# Fair share (DESIGN section 5, docs/DECISIONS.md "Fair share and aging"): a tenant's
# claim order is its share of the executors, not its place in one global queue. Each
# tenant with due runs is ranked by (runs it has running + its k-th pick) / weight:
# the tenant using least of its share goes next, so a tenant with 2,000 queued runs
# and every slot busy yields the next free slot to a tenant with none running. No
# state beyond the running rows the claim already counts: it stays stateless,
# per-statement, and correct with any number of claimers.
#
# Step 1 of a claim: lock (in tenant id order, so claimers never deadlock) the tenants
# that have a due run and a free slot, at most `tenants` of them, least served first.
# Each tenant's oldest due run is one probe of job_runs_tenant_waiting_idx; runs of
# busy skip/buffer_one jobs are passed over (a tenant whose only due runs are blocked
# would take a lock and a place for nothing). The running set is materialised once,
# so the NOT IN is a hashed subplan, not a per-row probe of the running index.
_LOCK_TENANTS_SQL = """
WITH running AS MATERIALIZED (
    SELECT tenant_id, job_id FROM job_runs WHERE status = 'running'
),
open_tenants AS (
    SELECT t.id, t.weight, coalesce(ru.n, 0) AS n FROM tenants t
    LEFT JOIN (SELECT tenant_id, count(*) AS n FROM running GROUP BY tenant_id) ru ON ru.tenant_id = t.id
    WHERE t.max_concurrency > coalesce(ru.n, 0)
),
heads AS (
    SELECT o.id AS tenant_id, o.n, o.weight, h.not_before FROM open_tenants o CROSS JOIN LATERAL (
        SELECT r.not_before FROM job_runs r
        WHERE r.tenant_id = o.id
          AND r.status IN ('queued', 'retrying') AND r.not_before <= now()
          AND (r.overlap_policy NOT IN ('skip', 'buffer_one')
               OR r.job_id NOT IN (SELECT job_id FROM running))
        ORDER BY r.not_before
        LIMIT 1
    ) h
)
SELECT s.tenant_id, pg_advisory_xact_lock(%(ns)s, s.tenant_id::integer)::text
FROM (
    SELECT tenant_id FROM heads
    ORDER BY (n + 1)::float8 / weight, not_before
    LIMIT %(tenants)s
) s
ORDER BY s.tenant_id
"""

# Step 2, under those locks and with a fresh snapshot (READ COMMITTED: every statement
# sees what committed before it began, so the running counts include other claimers'
# committed claims). Per locked tenant, its best runs by effective priority (a run
# waiting longer than `aging` seconds counts as priority 9, so a flood of 9s cannot
# hold a 0 back forever): the union of two index-ordered probes, the best by priority
# and the longest waiting, each at most the tenant's free slots. Per job, at most one
# run unless the job allows overlap. Across tenants, the fair-share rank above decides.
_CLAIM_SQL = """
WITH busy AS MATERIALIZED (
    SELECT job_id FROM job_runs WHERE status = 'running'
),
slots AS (
    SELECT t.id AS tenant_id, t.weight, run.n AS running, t.max_concurrency - run.n AS free
    FROM tenants t CROSS JOIN LATERAL (SELECT count(*) AS n FROM job_runs x
                                       WHERE x.tenant_id = t.id AND x.status = 'running') run
    WHERE t.id = ANY(%(tenants)s)
),
by_priority AS (
    SELECT c.* FROM slots s CROSS JOIN LATERAL (
        SELECT r.id, r.scheduled_at, r.job_id, r.tenant_id, r.priority, r.overlap_policy, r.not_before
        FROM job_runs r
        WHERE r.tenant_id = s.tenant_id
          AND r.status IN ('queued', 'retrying') AND r.not_before <= now()
          AND (r.overlap_policy NOT IN ('skip', 'buffer_one')
               OR r.job_id NOT IN (SELECT job_id FROM busy))
        ORDER BY r.priority DESC, r.scheduled_at
        LIMIT least(s.free, %(limit)s)
        FOR UPDATE OF r SKIP LOCKED
    ) c
    WHERE s.free > 0
),
by_age AS (
    SELECT c.* FROM slots s CROSS JOIN LATERAL (
        SELECT r.id, r.scheduled_at, r.job_id, r.tenant_id, r.priority, r.overlap_policy, r.not_before
        FROM job_runs r
        WHERE r.tenant_id = s.tenant_id
          AND r.status IN ('queued', 'retrying')
          AND r.not_before <= now() - %(aging)s * interval '1 second'
          AND (r.overlap_policy NOT IN ('skip', 'buffer_one')
               OR r.job_id NOT IN (SELECT job_id FROM busy))
        ORDER BY r.not_before
        LIMIT least(s.free, %(limit)s)
        FOR UPDATE OF r SKIP LOCKED
    ) c
    WHERE s.free > 0
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
    -- at most one running occurrence (see docs/DECISIONS.md).
    SELECT p.id, p.scheduled_at FROM picked p
    WHERE p.overlap_policy = 'cancel_previous'
      AND EXISTS (SELECT 1 FROM job_runs n
                  WHERE n.job_id = p.job_id AND n.scheduled_at > p.scheduled_at
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
    WHERE d.id = x.id AND d.scheduled_at = x.scheduled_at
    RETURNING d.job_id
),
eligible AS (
    SELECT e.*, row_number() OVER (PARTITION BY e.tenant_id
                                   ORDER BY e.effective_priority DESC, e.scheduled_at) AS tenant_rank
    FROM ranked e WHERE e.job_rank = 1 OR e.overlap_policy = 'allow'
),
chosen AS (
    -- The k-th pick of a tenant with n running ranks (n + k) / weight: fair share
    -- across tenants first, effective priority and age within it.
    SELECT e.* FROM eligible e JOIN slots s ON s.tenant_id = e.tenant_id
    WHERE e.tenant_rank <= s.free
    ORDER BY (s.running + e.tenant_rank)::float8 / s.weight, e.effective_priority DESC, e.scheduled_at
    LIMIT %(limit)s
),
claimed AS (
    UPDATE job_runs r SET
        status = 'running', attempt = r.attempt + 1,
        lease_until = now() + r.lease_seconds * interval '1 second',
        owner = %(owner)s, started_at = now(), finished_at = NULL
    FROM chosen c
    WHERE r.id = c.id AND r.scheduled_at = c.scheduled_at
    RETURNING r.job_id, r.scheduled_at, r.tenant_id, r.attempt, r.target, r.job_name, r.overlap_policy,
              r.priority, r.max_attempts, r.retry_backoff_seconds, r.retry_backoff_cap_seconds,
              r.lease_seconds, r.started_at, r.deferrals, r.deferred_since
),
cancelled AS (
    -- cancel_previous: the older running run loses the run; its worker finds out at
    -- its next heartbeat (the row is no longer 'running') and stops its call.
    UPDATE job_runs o SET
        status = 'cancelled', finished_at = now(), lease_until = NULL,
        last_error = 'cancelled by a newer run',
        attempts = o.attempts || jsonb_build_array({_CANCELLED_BY_NEWER_ENTRY})
    FROM chosen c
    WHERE c.overlap_policy = 'cancel_previous' AND o.job_id = c.job_id
      AND o.status = 'running' AND o.scheduled_at < c.scheduled_at
    RETURNING o.job_id
)
SELECT * FROM claimed ORDER BY priority DESC, scheduled_at
""".replace("{_CANCELLED_BY_NEWER_ENTRY}", _CANCELLED_BY_NEWER_ENTRY)

_HEARTBEAT_SQL = """
UPDATE job_runs r SET lease_until = now() + r.lease_seconds * interval '1 second'
FROM unnest(%s::uuid[], %s::timestamptz[], %s::integer[]) AS h(job_id, scheduled_at, attempt)
WHERE r.job_id = h.job_id AND r.scheduled_at = h.scheduled_at
  AND r.attempt = h.attempt AND r.status = 'running'
RETURNING r.job_id, r.scheduled_at, r.attempt
"""

_COMPLETE_SQL = """
WITH done AS (
    UPDATE job_runs r SET
        status = x.status,
        not_before = CASE WHEN x.status = 'retrying'
                          THEN now() + coalesce(x.retry_in_s, 0) * interval '1 second'
                          ELSE r.not_before END,
        lease_until = NULL,
        finished_at = CASE WHEN x.status IN ('succeeded', 'dead') THEN now() END,
        result_code = x.result_code,
        last_error = x.error,
        attempts = r.attempts || jsonb_build_array(x.entry)
    FROM jsonb_to_recordset(%s::jsonb) AS x(
        job_id uuid, scheduled_at timestamptz, attempt integer, status text, retry_in_s float8,
        result_code integer, error text, entry jsonb)
    WHERE r.job_id = x.job_id AND r.scheduled_at = x.scheduled_at
      AND r.attempt = x.attempt AND r.status = 'running'
    RETURNING r.job_id, r.scheduled_at, r.attempt, r.status, x.entry ->> 'outcome' AS outcome
),
-- Job health, in the same statement (no extra round trip per batch). An attempt the
-- executor handed back on shutdown says nothing about the target: it does not count.
judged AS (
    SELECT job_id, status,
           row_number() OVER (PARTITION BY job_id ORDER BY scheduled_at DESC, attempt DESC) AS rn
    FROM done WHERE outcome IS DISTINCT FROM 'handed back'
),
newest_ok AS (
    SELECT job_id, min(rn) AS rn FROM judged WHERE status = 'succeeded' GROUP BY job_id
),
per_job AS (
    SELECT j.job_id,
           (array_agg(j.status ORDER BY j.rn))[1] AS last_status,
           o.rn IS NOT NULL AS any_ok,
           count(*) FILTER (WHERE j.status <> 'succeeded') AS fails,
           count(*) FILTER (WHERE j.status <> 'succeeded' AND j.rn < o.rn) AS fails_since_ok
    FROM judged j LEFT JOIN newest_ok o USING (job_id)
    GROUP BY j.job_id, o.rn
),
-- Lock the job rows in id order: two executors completing runs of the same jobs in
-- different orders must not deadlock (a deadlock would lose a batch of outcomes).
locked AS MATERIALIZED (
    SELECT jb.id FROM jobs jb WHERE jb.id IN (SELECT job_id FROM per_job)
    ORDER BY jb.id FOR NO KEY UPDATE
),
health AS (
    UPDATE jobs jb SET
        last_outcome = CASE p.last_status WHEN 'succeeded' THEN 'succeeded' WHEN 'dead' THEN 'dead'
                                          ELSE 'failed' END,
        last_success_at = CASE WHEN p.any_ok THEN now() ELSE jb.last_success_at END,
        last_failure_at = CASE WHEN p.fails > 0 THEN now() ELSE jb.last_failure_at END,
        consecutive_failures = CASE WHEN p.any_ok THEN p.fails_since_ok
                                    ELSE jb.consecutive_failures + p.fails END,
        -- A success ends the streak; the next streak alerts again.
        failure_alerted = jb.failure_alerted AND NOT p.any_ok
    FROM per_job p, locked l
    WHERE jb.id = p.job_id AND l.id = jb.id
    RETURNING jb.id
)
-- (A data-modifying WITH runs to completion whether or not the result reads it.)
SELECT job_id, scheduled_at, attempt FROM done
"""


async def reap_expired_leases(conn, *, limit: int = 1000) -> list[ReapedRun]:
    """Hand back runs whose owner stopped heartbeating (lease expiries).

    The expired attempt is fenced off by the status change: its late writes all
    require status='running' with its attempt number. Out of attempts → dead.
    """
    cursor = await conn.execute(_REAP_SQL, {"limit": limit})
    return [ReapedRun(*row) for row in await cursor.fetchall()]


async def claim_runs(
    conn, *, owner: str, limit: int, aging_seconds: float = DEFAULT_AGING_SECONDS
) -> list[ClaimedRun]:
    """Claim up to `limit` runnable runs for `owner`, in one short transaction.

    Never more running runs per tenant than tenants.max_concurrency: claimers of the
    same tenant are serialised by a transaction-scoped advisory lock, and the slot
    count is taken after the lock is held. The transaction ends before any call.
    """
    if limit <= 0:
        return []
    async with conn.transaction():
        # At most `limit` tenants: a batch cannot give more than one run to more than that.
        cursor = await conn.execute(_LOCK_TENANTS_SQL, {"ns": TENANT_CLAIM_LOCK, "tenants": limit})
        tenants = [row[0] for row in await cursor.fetchall()]
        if not tenants:
            return []
        cursor = await conn.execute(
            _CLAIM_SQL, {"tenants": tenants, "limit": limit, "owner": owner, "aging": aging_seconds}
        )
        return [ClaimedRun(*row) for row in await cursor.fetchall()]


async def heartbeat_runs(conn, keys: Sequence[tuple[UUID, datetime, int]]) -> set[tuple[UUID, datetime, int]]:
    """Extend the lease of every (job_id, scheduled_at, attempt) still held; return those held.

    A key missing from the answer was fenced off (lease expired and reclaimed) or
    cancelled: its worker must stop and write nothing.
    """
    if not keys:
        return set()
    cursor = await conn.execute(
        _HEARTBEAT_SQL, [[k[0] for k in keys], [k[1] for k in keys], [k[2] for k in keys]]
    )
    return {(row[0], row[1], row[2]) for row in await cursor.fetchall()}


async def complete_runs(conn, completions: Sequence[Completion]) -> set[tuple[UUID, datetime, int]]:
    """Write the outcomes of attempts, each only if that attempt still holds its run.

    Returns the keys written; the others were fenced off and wrote nothing.
    """
    if not completions:
        return set()
    payload = json.dumps(
        [
            {
                "job_id": str(c.job_id),
                "scheduled_at": c.scheduled_at.isoformat(),
                "attempt": c.attempt,
                "status": c.status,
                "retry_in_s": c.retry_in_s,
                "result_code": c.result_code,
                "error": c.error,
                "entry": c.entry,
            }
            for c in completions
        ]
    )
    cursor = await conn.execute(_COMPLETE_SQL, [payload])
    return {(row[0], row[1], row[2]) for row in await cursor.fetchall()}
