"""SQL of the per-tenant dispatch rate limit (the logic is jobs/dispatch/rate_limits.py).

All three statements run inside the dispatch transaction, and only when the batch
inserted queued runs of a tenant that has a limit. Every value is computed in Python
and passed as a parameter (no now(), random() or column arithmetic on time in an
UPDATE), and every row touched is keyed by tenant (tenant_dispatch_windows) or by the
run's own key with its partition_id (job_runs), so on Citus each write is routed to
the shard that holds it and nothing locks a row of the tenants reference table.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from uuid import UUID

# The row that serialises a tenant's allocations: one per tenant, never a real minute.
LOCK_WINDOW = "-infinity"

_LOCK_SQL = f"""
INSERT INTO tenant_dispatch_windows (tenant_id, window_start, runs)
SELECT t, '{LOCK_WINDOW}'::timestamptz, 0 FROM unnest(%s::bigint[]) AS t ORDER BY t
ON CONFLICT (tenant_id, window_start) DO UPDATE SET runs = 0
"""

_READ_SQL = f"""
SELECT tenant_id, window_start, runs FROM tenant_dispatch_windows
WHERE tenant_id = ANY(%s) AND window_start >= %s AND window_start > '{LOCK_WINDOW}'
"""

_RECORD_SQL = f"""
WITH counted AS (
    INSERT INTO tenant_dispatch_windows (tenant_id, window_start, runs)
    SELECT * FROM unnest(%(tenant)s::bigint[], %(window)s::timestamptz[], %(runs)s::integer[])
    ON CONFLICT (tenant_id, window_start)
    DO UPDATE SET runs = tenant_dispatch_windows.runs + excluded.runs
    RETURNING 1
),
pruned AS (
    DELETE FROM tenant_dispatch_windows
    WHERE tenant_id = ANY(%(tenants)s::bigint[]) AND window_start < %(before)s
      AND window_start > '{LOCK_WINDOW}'
    RETURNING 1
),
deferred AS (
    UPDATE job_runs AS r SET not_before = d.not_before, rate_limited_to = d.not_before
    FROM unnest(%(job_id)s::uuid[], %(scheduled_at)s::timestamptz[], %(partition_id)s::smallint[],
                %(not_before)s::timestamptz[]) AS d(job_id, scheduled_at, partition_id, not_before)
    WHERE r.job_id = d.job_id AND r.scheduled_at = d.scheduled_at AND r.partition_id = d.partition_id
      AND r.status = 'queued'
    RETURNING 1
)
SELECT (SELECT count(*) FROM counted), (SELECT count(*) FROM deferred)
"""


def lock_tenants(cursor, tenant_ids: Sequence[int]) -> None:
    """Take each tenant's lock row (created on first use), in tenant order.

    Held until the dispatch transaction ends, so two schedulers dispatching runs of
    one tenant allocate its minutes one after the other and the second sees the
    first's counts. The order is the same in every transaction: no deadlock.
    """
    cursor.execute(_LOCK_SQL, [sorted(tenant_ids)])


def used_windows(cursor, tenant_ids: Sequence[int], *, since: datetime) -> dict[int, dict[datetime, int]]:
    """{tenant: {minute: runs already dispatched to start in it}} from `since` on.

    A statement of its own after lock_tenants: in READ COMMITTED it takes a snapshot
    after the lock was granted, so it sees what the previous holder committed.
    """
    cursor.execute(_READ_SQL, [list(tenant_ids), since])
    out: dict[int, dict[datetime, int]] = {t: {} for t in tenant_ids}
    for tenant_id, window, runs in cursor.fetchall():
        out[tenant_id][window] = runs
    return out


def record(
    cursor,
    *,
    counts: Sequence[tuple[int, datetime, int]],
    deferrals: Sequence[tuple[UUID, datetime, int, datetime]],
    prune_before: datetime,
) -> int:
    """Add (tenant, minute, runs) to the counters, drop the tenants' past minutes, and
    move the deferred runs (job_id, scheduled_at, partition_id, not_before). Returns
    how many runs were moved."""
    cursor.execute(
        _RECORD_SQL,
        {
            "tenant": [c[0] for c in counts],
            "window": [c[1] for c in counts],
            "runs": [c[2] for c in counts],
            "tenants": sorted({c[0] for c in counts}),
            "before": prune_before,
            "job_id": [d[0] for d in deferrals],
            "scheduled_at": [d[1] for d in deferrals],
            "partition_id": [d[2] for d in deferrals],
            "not_before": [d[3] for d in deferrals],
        },
    )
    return cursor.fetchone()[1]
