"""Per-tenant dispatch rate limit: `Tenant.max_runs_per_minute`.

A tenant's scheduled runs beyond its limit in a minute are not dropped: they are
inserted like any other and their `not_before` moves to the start of the first later
minute with room, so each minute (UTC, aligned) gets at most the limit and a herd of
10,000 `0 * * * *` jobs at 1,000 a minute drains over ten minutes. The run row, its
key and the compare-and-set that created it are untouched; only its start moves, and
`job_runs.rate_limited_to` records that it did (the ledger and run detail show it).

The budget is shared by every scheduler through `tenant_dispatch_windows` (tenant,
minute, runs), written in the dispatch transaction after the runs are inserted (the
statements: jobs/dispatch/queries.py, TENANT_*; docs/decisions/0028-tenant-rate-limit.md):

    lock the tenants' lock rows (tenant order)  -> allocations of a tenant serialise
    read their minutes from the current one on -> fresh snapshot after the lock
    allocate in Python (below, pure)
    add the counts, prune past minutes, move the deferred runs: one statement

Only runs the dispatcher inserted as `queued` count: a run the overlap policy skipped
or that already existed starts nothing. Manual triggers, backfills and replays do not
go through dispatch and are neither limited nor counted: an operator asked for each.

Cost: the limits come with the batch's read (`DueJob.tenant_max_runs_per_minute`), so a batch whose tenants
have no limit returns before any statement; a limited one pays three.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from uuid import UUID

from django.db import connection

from jobs.dispatch import queries
from jobs.dispatch.planning import Plan
from runs.rows import InsertedRun
from scheduler_project.citus import citus_installed

log = logging.getLogger(__name__)

WINDOW = timedelta(minutes=1)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# The read of due jobs (jobs/dispatch/fencing.read_due) carries each job's tenant limit
# under this name (None: unlimited).
LIMIT_ATTR = "tenant_max_runs_per_minute"


def window_of(moment: datetime) -> datetime:
    """The start of the UTC minute holding `moment`."""
    return _EPOCH + ((moment - _EPOCH) // WINDOW) * WINDOW


@dataclass(frozen=True)
class Wanted:
    """A queued run of a limited tenant and the moment it would start unlimited."""

    job_id: UUID
    scheduled_at: datetime
    partition_id: int
    priority: int
    start: datetime


def allocate(
    wanted: Sequence[Wanted], *, used: dict[datetime, int], limit: int
) -> tuple[dict[datetime, int], list[tuple[Wanted, datetime]]]:
    """Place one tenant's runs in minutes with room: (runs added per minute, [(deferred run, new start)]).

    Earliest start first, higher priority first within a minute. A run stays in its
    own minute while that has room, else goes to the start of the first later minute
    with room. Minutes only fill, so a cursor that never moves back finds them:
    O(runs + minutes), however long the backlog.
    """
    added: dict[datetime, int] = defaultdict(int)
    deferred: list[tuple[Wanted, datetime]] = []
    cursor: datetime | None = None
    for run in sorted(wanted, key=lambda w: (window_of(w.start), -w.priority, w.scheduled_at, str(w.job_id))):
        own = window_of(run.start)
        cursor = own if cursor is None or cursor < own else cursor
        while used.get(cursor, 0) + added.get(cursor, 0) >= limit:
            cursor += WINDOW
        added[cursor] += 1
        if cursor > own:
            deferred.append((run, cursor))
    return dict(added), deferred


def defer_excess(*, plans: Sequence[Plan], inserted: Sequence[InsertedRun], now: datetime) -> int:
    """Apply the tenants' limits to the runs this dispatch transaction just inserted.

    `plans` are the batch's plans whose compare-and-set succeeded, `now` the
    transaction's time (what `not_before` defaulted to). Returns the runs deferred.
    Runs in the caller's transaction; issues no statement when no tenant has a limit.
    """
    limits = {p.job.tenant_id: getattr(p.job, LIMIT_ATTR, None) for p in plans}
    limits = {tenant: limit for tenant, limit in limits.items() if limit}
    if not limits:
        return 0
    wanted = _wanted(plans, inserted, limits=limits, now=now)
    if not wanted:
        return 0
    current = window_of(now)
    with connection.cursor() as cursor:
        lock_tenants(cursor, list(wanted))
        used = used_windows(cursor, list(wanted), since=current)
        counts: list[tuple[int, datetime, int]] = []
        deferrals: list[tuple[UUID, datetime, int, datetime]] = []
        for tenant, runs in wanted.items():
            added, deferred = allocate(runs, used=used[tenant], limit=limits[tenant])
            counts += [(tenant, window, n) for window, n in added.items()]
            deferrals += [(w.job_id, w.scheduled_at, w.partition_id, to) for w, to in deferred]
        moved = record(
            cursor,
            counts=counts,
            deferrals=deferrals,
            prune_before=current,
            partitions={w.partition_id for runs in wanted.values() for w in runs},
        )
    if moved:
        log.debug("rate limit: %d runs of %d tenants deferred to later minutes", moved, len(wanted))
    return moved


def _wanted(
    plans: Sequence[Plan], inserted: Sequence[InsertedRun], *, limits: dict[int, int], now: datetime
) -> dict[int, list[Wanted]]:
    """The inserted queued runs of limited tenants, by tenant."""
    planned = {
        (run.job_id, run.scheduled_at): run for p in plans if p.job.tenant_id in limits for run in p.runs
    }
    out: dict[int, list[Wanted]] = defaultdict(list)
    for row in inserted:
        run = planned.get((row.job_id, row.scheduled_at))
        if run is None or row.status != "queued":
            continue
        start = max(run.not_before, now) if run.not_before else now
        out[run.tenant_id].append(Wanted(run.job_id, run.scheduled_at, run.partition_id, run.priority, start))
    return dict(out)


def lock_tenants(cursor, tenant_ids: Sequence[int]) -> None:
    """Take each tenant's lock row (created on first use), in tenant order.

    Held until the dispatch transaction ends, so two schedulers dispatching runs of
    one tenant allocate its minutes one after the other and the second sees the
    first's counts. The order is the same in every transaction: no deadlock.
    """
    cursor.execute(queries.TENANT_LOCK, [sorted(tenant_ids)])


def used_windows(cursor, tenant_ids: Sequence[int], *, since: datetime) -> dict[int, dict[datetime, int]]:
    """{tenant: {minute: runs already dispatched to start in it}} from `since` on.

    A statement of its own after lock_tenants: in READ COMMITTED it takes a snapshot
    after the lock was granted, so it sees what the previous holder committed.
    """
    cursor.execute(queries.TENANT_WINDOWS, [list(tenant_ids), since])
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
    partitions: set[int],
) -> int:
    """Add (tenant, minute, runs) to the counters, drop the tenants' past minutes, and
    move the deferred runs (job_id, scheduled_at, partition_id, not_before). Returns
    how many runs were moved. `partitions`: those of the counted runs, never empty (on
    Citus an empty list would not narrow the update to any shard, so it goes to all)."""
    citus = citus_installed(cursor)
    cursor.execute(
        queries.TENANT_RECORD_CITUS if citus else queries.TENANT_RECORD,
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
            **({"partitions": sorted(partitions)} if citus else {}),
        },
    )
    return cursor.fetchone()[1]
