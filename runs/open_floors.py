"""Open floors: per tenant, a lower bound on the slots of its open (queued, retrying or
running) runs, `tenants.open_floor`. The claim on Citus reads a tenant's running runs
from its floor on, instead of from every day partition of the retention
(docs/decisions/0078-open-floors.md; the bounds: runs/per_partition.py, BOUNDS).

The rule, which every writer below keeps: **no open run of a tenant is older than its
floor.**

- **Opening a run lowers the floor in the same transaction** (`lower`): the run insert
  (runs/enqueue.py: dispatch, backfills, catch-ups, manual triggers) and replays
  (runs/services.py). Only for a slot older than RECENT: no floor is ever set later
  than queries.FLOOR_CAP's bound, well below that. Each such write also counts in
  `open_floor_version`, even where the floor is lower already: see the upkeep.
- **A run stays open with its slot unchanged** through claims, retries, deferrals and
  hand-backs: none of these touches a floor.
- **The upkeep raises floors** (`keep`, run by the executors on Citus, where the claim
  reads them): per tenant, the oldest slot of its open runs, capped by
  queries.FLOOR_CAP. It reads without a lock, in this order: the floors' versions, the cap,
  the open runs; then it writes each floor only where the version is still the one it
  read (compare-and-set). A writer that opened an old run after the versions were read
  counted in the version, so that floor is left alone; a writer that opened a recent run
  without writing is above the cap. It also lowers a floor found above an open run:
  whatever slipped past a writer is set right at the next upkeep.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from runs.execution import queries

# A writer lowers floors only for slots older than this. The upkeep's cap is at least
# 24 hours before any transaction it could miss began (queries.FLOOR_CAP), so a run of a
# newer slot is above every floor even with 12 hours between the writer's clock and the
# database's.
RECENT = timedelta(hours=12)

# Lower the floors of the tenants of runs being opened, and count the write; parameters:
# tenant ids, and each one's oldest slot. On Citus tenants is a reference table: the
# write reaches every copy, in the writer's transaction.
LOWER = """
UPDATE tenants t
SET open_floor = least(t.open_floor, x.slot), open_floor_version = t.open_floor_version + 1
FROM unnest(%s::bigint[], %s::timestamptz[]) AS x(tenant_id, slot)
WHERE t.id = x.tenant_id
"""


def lower(cursor, slots: Iterable[tuple[int, datetime]]) -> int:
    """Lower the floors of the tenants of `slots`, (tenant_id, scheduled_at) of runs the
    cursor's transaction opens, where a slot is older than RECENT. Returns the floors
    written."""
    cutoff = datetime.now(UTC) - RECENT
    oldest: dict[int, datetime] = {}
    for tenant_id, slot in slots:
        if slot < cutoff and slot < oldest.get(tenant_id, cutoff):
            oldest[tenant_id] = slot
    if not oldest:
        return 0
    tenants = sorted(oldest)
    cursor.execute(LOWER, [tenants, [oldest[t] for t in tenants]])
    return cursor.rowcount


async def lowest(conn) -> datetime | None:
    """The lowest floor of all tenants, None for none: no open run of any tenant is older."""
    cursor = await conn.execute(queries.LOWEST_FLOOR)
    (floor,) = await cursor.fetchone()
    return floor


async def keep(conn) -> int:
    """The upkeep: set every tenant's floor to the oldest slot of its open runs, at most
    the cap, where no writer lowered it meanwhile. `conn` in autocommit: each read is its
    own snapshot, taken in the order the module docstring gives. Returns the floors
    changed. One read of the open runs of every shard and day: the executors run it
    every few minutes (runs/execution/executor.py, FLOOR_UPKEEP_SECONDS)."""
    cursor = await conn.execute(queries.FLOOR_VERSIONS)
    versions = dict(await cursor.fetchall())
    cursor = await conn.execute(queries.FLOOR_CAP)
    (cap,) = await cursor.fetchone()
    cursor = await conn.execute(queries.OLDEST_OPEN_PER_TENANT)
    oldest = dict(await cursor.fetchall())
    tenants = sorted(versions)
    cursor = await conn.execute(
        queries.SET_FLOORS,
        {
            "tenants": tenants,
            "floors": [min(oldest.get(t, cap), cap) for t in tenants],
            "versions": [versions[t] for t in tenants],
        },
    )
    return cursor.rowcount
