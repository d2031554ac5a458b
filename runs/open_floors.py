"""Open floors: per tenant, a lower bound on the slots of its open (queued, retrying or
running) runs, `tenants.open_floor`. The claim on Citus reads a tenant's running runs
from its floor on, instead of from every day partition of the retention, and the
dispatch insert's overlap read on plain PostgreSQL a job's open runs
(docs/decisions/0078-open-floors.md; the bounds: runs/per_partition.py, BOUNDS;
runs/enqueue.py).

The rule, which every writer below keeps: **no open run of a tenant is older than its
floor.**

- **Opening a run lowers the floor in the same transaction** (`lower`): the run insert
  (runs/enqueue.py: dispatch, backfills, catch-ups, manual triggers) and replays
  (runs/services.py). Only for a slot older than RECENT: no floor is ever later than a
  day before now (the upkeep's cap, FLOOR_CAP, and a new tenant's default).
  Each such write also counts in `open_floor_version`, even where the floor is lower
  already: see the upkeep.
- **A run stays open with its slot unchanged** through claims, retries, deferrals and
  hand-backs: none of these touches a floor.
- **The upkeep raises floors** (`keep`, by one executor once per UPKEEP_SECONDS:
  runs/execution/turns.py): per tenant, to the oldest slot of its open runs, capped by
  FLOOR_CAP. It reads without a lock, in this order: the floors and their
  versions, the cap, then (on Citus) it waits for the transactions prepared on the
  workers to end, then the open runs. It raises a floor only where the version is still
  the one it read (compare-and-set): a writer that opened an old run after the versions
  were read counted in the version, so that floor is left alone; one that had committed
  on the coordinator but not yet on its worker has ended by the time the open runs are
  read, so its run is seen; a writer that opened a recent run without writing is above
  the cap. It lowers a floor found above an open run whatever the version: whatever
  slipped past a writer is set right at the next upkeep.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from scheduler_project.citus import citus_installed_async

# A writer lowers floors only for slots older than this. The upkeep's cap is at least
# 24 hours before any transaction it could miss began (FLOOR_CAP), so a run of a
# newer slot is above every floor even with 12 hours between the writer's clock and the
# database's.
RECENT = timedelta(hours=12)

# Lower the floors of the tenants of runs being opened, and count the writes; parameters:
# tenant ids, and each one's oldest slot. The rows are locked first, in id order
# (LOCK_TO_LOWER), so that two writers lock them in the same order whatever plan the
# update gets (no deadlock). On Citus tenants is a reference table: the write reaches
# every copy, in the writer's transaction.
LOCK_TO_LOWER = "SELECT 1 FROM tenants WHERE id = ANY(%s::bigint[]) ORDER BY id FOR UPDATE"
LOWER = """
UPDATE tenants t
SET open_floor = least(t.open_floor, x.slot), open_floor_version = t.open_floor_version + 1
FROM unnest(%s::bigint[], %s::timestamptz[]) AS x(tenant_id, slot)
WHERE t.id = x.tenant_id
"""

# The lowest floor of some tenants, -infinity for none, as a sub-select (the run insert's
# overlap read and its guard, runs/enqueue.py); and as a statement of its own, NULL for
# none (-infinity has no Python value). Parameter: the tenant ids.
TENANTS_FLOOR = (
    "(SELECT coalesce(min(t.open_floor), '-infinity') FROM tenants t WHERE t.id = ANY(%b::bigint[]))"
)
BATCH_FLOOR = f"SELECT nullif({TENANTS_FLOOR}, '-infinity')"

# --- the upkeep's statements (the executor runs them: `lowest`, `keep`) ---------------------

# The lowest floor of all, NULL for none: the day windows of reads of every tenant's
# open runs start there (open_floors.lowest: the work map's full reads, the reaper's).
LOWEST_FLOOR = "SELECT nullif(min(open_floor), '-infinity') FROM tenants"

# Step 1: every tenant's floor version and floor (NULL for none), before anything else is
# read.
FLOOR_VERSIONS = "SELECT id, open_floor_version, nullif(open_floor, '-infinity') FROM tenants"

# Step 2: the highest floor the upkeep may set. The start of yesterday (UTC), and a day
# before the oldest transaction open on this database (a writer of a recent
# run that has not committed yet, whose run step 3 cannot see, opened it at or after its
# transaction began). On Citus every writer's transaction is on the coordinator, where
# this runs. A session of another role shows no transaction start: such writers are
# covered by the day cap alone (docs/decisions/0078-open-floors.md).
FLOOR_CAP = """
SELECT least(
    date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' - interval '24 hours',
    coalesce((SELECT min(a.xact_start) FROM pg_stat_activity a
              WHERE a.datname = current_database() AND a.backend_type = 'client backend'), now())
        - interval '24 hours')
"""

# Between steps 2 and 3, on Citus: the transactions prepared on each worker (two-phase
# commit), as (worker, reached, their gids joined by commas); open_floors._prepared_ended
# waits for them to end.
PREPARED_ON_WORKERS = """
SELECT nodename || ':' || nodeport, success, CASE WHEN success THEN result ELSE '' END
FROM run_command_on_workers($$
    SELECT coalesce(string_agg(gid, ','), '') FROM pg_prepared_xacts WHERE database = current_database()
$$)
"""

# Step 3: the oldest slot of each tenant's open runs, over every shard and day.
OLDEST_OPEN_PER_TENANT = """
SELECT r.tenant_id, min(r.scheduled_at) FROM job_runs r
WHERE r.status IN ('queued', 'retrying', 'running')
GROUP BY r.tenant_id
"""

# Step 4: the floors that change. One found above an open run (`lower`) is lowered
# whatever its version, if it is still above the new one; the others are raised only
# where no writer lowered them since step 1 (the version is the one read then), and
# never lowered: an upkeep that read before another one raised the floor must not
# lower it again.
SET_FLOORS = """
UPDATE tenants t SET open_floor = x.floor
FROM unnest(%(tenants)s::bigint[], %(floors)s::timestamptz[], %(versions)s::bigint[], %(lower)s::boolean[])
     AS x(id, floor, version, lower)
WHERE t.id = x.id
  AND CASE WHEN x.lower THEN x.floor < t.open_floor
           ELSE x.floor > t.open_floor AND t.open_floor_version = x.version END
"""


# How long the upkeep waits for the transactions it found prepared on the workers to
# end (`keep`); past that it only lowers floors, and raises them at its next round.
PREPARED_WAIT_SECONDS = 10.0


# How far inside RECENT a slot counts as old for `may_lower`: planning and writing a run
# are moments apart, and a writer's clock may differ from this one by as much.
MAY_LOWER_MARGIN = timedelta(hours=1)


def may_lower(slot: datetime, *, now: datetime) -> bool:
    """Whether opening a run of `slot` around `now` may lower its tenant's floor (`lower`).
    On Citus that is a write of the reference table `tenants`, which needs every worker:
    the scheduler commits such runs apart from the others (jobs/dispatch/scheduler.py)."""
    return slot < now - RECENT + MAY_LOWER_MARGIN


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
    cursor.execute(LOCK_TO_LOWER, [tenants])
    cursor.execute(LOWER, [tenants, [oldest[t] for t in tenants]])
    return cursor.rowcount


async def lowest(conn) -> datetime | None:
    """The lowest floor of all tenants, None for none: no open run of any tenant is older."""
    cursor = await conn.execute(LOWEST_FLOOR)
    (floor,) = await cursor.fetchone()
    return floor


# The upkeep runs once per UPKEEP_SECONDS across every executor (the executor takes
# its turn: runs/execution/turns.py): it reads every open run of every shard, and N
# executors each running it would multiply that by N. Between two, a floor stays where a
# writer lowered it or where the last upkeep set it: the claims read more days, never
# fewer.
UPKEEP_SECONDS = 300.0


async def keep(conn) -> int:
    """The upkeep: raise every tenant's floor to the oldest slot of its open runs, at
    most the cap, and lower a floor found above an open run. `conn` in autocommit: each
    read is its own snapshot, taken in the order the module docstring gives. A floor is
    raised only where no writer lowered it since its version was read, and only once
    the transactions then prepared on the Citus workers have ended (`_prepared_ended`);
    it is lowered whenever it is above an open run, and only then. Returns the floors
    changed."""
    cursor = await conn.execute(FLOOR_VERSIONS)
    read = {tenant: (version, floor) for tenant, version, floor in await cursor.fetchall()}
    cursor = await conn.execute(FLOOR_CAP)
    (cap,) = await cursor.fetchone()
    may_raise = await _prepared_ended(conn)
    cursor = await conn.execute(OLDEST_OPEN_PER_TENANT)
    oldest = dict(await cursor.fetchall())
    changes = []
    for tenant, (version, floor) in sorted(read.items()):
        new = min(oldest.get(tenant, cap), cap)
        # Lowered only where an open run is below the floor, the one case where the rule
        # is broken: a floor above the cap but below every open run (a new tenant's, a day
        # before its creation) is right as it is, and lowering it would make every claimer
        # that read it get nothing from its next claim (CLAIM's `floor_holds`).
        lowered = floor is not None and tenant in oldest and oldest[tenant] < floor
        raised = floor is None or new > floor
        if lowered or (raised and may_raise):
            changes.append((tenant, new, version, lowered))
    if not changes:
        return 0
    tenants, floors, versions, lower = (list(column) for column in zip(*changes, strict=True))
    cursor = await conn.execute(
        SET_FLOORS, {"tenants": tenants, "floors": floors, "versions": versions, "lower": lower}
    )
    return cursor.rowcount


async def _prepared_ended(conn) -> bool:
    """On Citus, whether every transaction prepared on the workers when this is called
    has ended (within PREPARED_WAIT_SECONDS, every worker reached); True on plain
    PostgreSQL.

    Why: a writer commits on the coordinator (where the upkeep read its version) before
    its runs commit on their worker (two-phase commit: the workers prepare first, then
    commit after the coordinator). Until then the upkeep's read of open runs does not
    see the run, and its compare-and-set would pass. Every such writer is prepared on
    its worker now; once those transactions have ended, what they opened is visible."""
    if not await citus_installed_async(conn):
        return True
    deadline = time.monotonic() + PREPARED_WAIT_SECONDS
    pending = await _prepared(conn)
    while pending:
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.05)
        now = await _prepared(conn)
        pending = None if now is None else pending & now
    return pending is not None


async def _prepared(conn) -> set[tuple[str, str]] | None:
    """(worker, gid) of every transaction prepared on the workers; None if one is out of
    reach."""
    cursor = await conn.execute(PREPARED_ON_WORKERS)
    rows = await cursor.fetchall()
    if not all(ok for _, ok, _ in rows):
        return None
    return {(node, gid) for node, _, gids in rows for gid in gids.split(",") if gid}
