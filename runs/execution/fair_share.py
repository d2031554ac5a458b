"""Fair share across tenants (docs/CONTRACT.md, "Execution"): which runs an executor
claims next. A tenant's k-th place ranks (runs it has running + k) / weight; the batch's
places go to the best ranks, then effective priority, then age. A tenant with nothing
running is served ahead of a busy tenant's backlog.

Two engines, two ways to find the places, one rule:
- plain PostgreSQL (`plan`, queries.PLAN_PLAIN): one read, no lock, per open tenant two
  index-ordered probes (best priority, longest waiting); `rank` turns the picks into the
  claim's rank bound, and the one claim statement ranks within it
  (docs/decisions/0033-claim-transaction.md). `Planner` reuses a plan while claims with
  it come back full.
- Citus (`Planner.refresh`, queries.WORK_MAP; `allocate`): a work map per worker, the
  runnable runs per (partition, tenant), read by one statement per worker and kept
  until used up, stale or announced; `allocate` applies the rule to it in Python, so
  the claims need no statement that visits every shard
  (docs/decisions/0075-citus-claims.md).
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from runs import open_floors, per_partition
from runs.execution import queries
from scheduler_project.citus import Placements

# Picks read per tenant on plain PostgreSQL: enough to find where its next runs are;
# the plan's rank bound counts a tenant's whole cap, so a batch is not cut to what the
# probes saw. (On Citus the groups are whole partitions, all read anyway: up to `limit`.)
PROBE = 8
# The effective priority of an aged run (and the highest a job can have).
AGED_PRIORITY = 9


@dataclass(frozen=True)
class Pick:
    tenant_id: int
    running: int
    weight: int
    partition_id: int
    effective_priority: int
    scheduled_at: datetime
    k: int  # the tenant's k-th pick
    available: int  # runs the tenant can be given now (its free slots, at most the batch)

    @property
    def rank(self) -> float:
        return (self.running + self.k) / self.weight


@dataclass(frozen=True)
class ClaimPlan:
    """Where to claim, in order: (partition_id, tenant ids to claim for there); and the
    rank of the batch's last place, which bounds every partition's claim so that a
    busy tenant's runs in an early partition cannot take the places that better-ranked
    runs in later partitions were given."""

    partitions: list[tuple[int, list[int]]]
    max_rank: float
    # Tenants with a pick of effective priority 9: the only ones whose claim probes for
    # aged runs (a run aged past EXECUTOR_PRIORITY_AGING_SECONDS counts as 9; a tenant with
    # an aged run is seen with one, since the plan probes for them too).
    aged: list[int] = field(default_factory=list)


def rank(picks: list[Pick], *, limit: int) -> ClaimPlan:
    """The plan from the picks: the batch's `limit` places go to the best ranks over every
    tenant's available runs ((running + k) / weight for k = 1..available); partitions
    in the order of their best pick within that bound."""
    tenants = {p.tenant_id: p for p in picks}
    places = heapq.merge(*(_places(t, limit=limit) for t in tenants.values()))
    bound = list(itertools.islice(places, limit))
    if not bound:
        return ClaimPlan([], 0.0)
    max_rank = bound[-1]
    order: dict[int, set[int]] = {}
    for p in sorted(picks, key=lambda p: (p.rank, -p.effective_priority, p.scheduled_at)):
        if p.rank <= max_rank:
            order.setdefault(p.partition_id, set()).add(p.tenant_id)
    aged = sorted({p.tenant_id for p in picks if p.effective_priority >= AGED_PRIORITY})
    return ClaimPlan([(partition, sorted(ts)) for partition, ts in order.items()], max_rank, aged)


def _places(tenant: Pick, *, limit: int) -> Iterator[float]:
    """The ranks of a tenant's next places, best first."""
    return ((tenant.running + k) / tenant.weight for k in range(1, min(tenant.available, limit) + 1))


async def plan(conn, *, limit: int, aging_seconds: float, open_from: datetime | None = None) -> ClaimPlan:
    params = {"limit": limit, "aging": aging_seconds, "probe": PROBE, "open_from": bound(open_from)}
    cursor = await conn.execute(queries.PLAN_PLAIN, params)
    return rank([Pick(*row) for row in await cursor.fetchall()], limit=limit)


# How long a claimer claims again from its last plan, without reading a new one, while
# its claims with it come back full: a backlog draining, where the read ranked the same
# tenants the same way claim after claim (0.8-1.0 ms of database time per claim with 20
# tenants, more than a tenth of the executor's per run; docs/decisions/0034-plan-reuse.md).
PLAN_REUSE_SECONDS = 0.25


@dataclass
class Planner:
    """One claimer's plans: a new one per claim, unless the last one is younger than
    PLAN_REUSE_SECONDS, was read for at least as large a batch, and every claim made
    with it came back full.

    What a reused plan may miss is bounded by that age: a tenant whose runs became due
    since (a NOTIFY makes the claimer `forget` it, so only runs that come due without
    one, retries and deferrals, wait) or whose rank improved (its runs finished). What
    it cannot break: caps, overlap and the rank among the tenants it names are decided
    by the claim itself, under the tenants' locks. Its rank bound may be off either
    way: where the named tenants' running counts grew, it narrows the claim, which
    comes back short and ends the reuse; where they fell, their probes lock more rows
    than the batch takes (at most the batch per tenant, released at the claim's commit).

    Plain PostgreSQL only. On Citus a plan names the partitions that hold the batch's
    places and the claims go there one by one: a claim empties them, the next claim
    with the same plan comes back short, and reusing it would cost a claim, not save a
    read.
    """

    _plan: ClaimPlan | None = None
    _limit: int = 0  # the batch size the plan was read for
    # When the plan was read; None once forgotten. Marked before the read, as OpenFrom
    # does: a forget() (a NOTIFY) while it runs makes the next claim read again.
    _read_at: float | None = None

    async def plan(self, conn, *, limit: int, aging_seconds: float, open_from: datetime | None) -> ClaimPlan:
        fresh = (
            self._plan is not None
            and self._read_at is not None
            and limit <= self._limit
            and time.monotonic() - self._read_at < PLAN_REUSE_SECONDS
        )
        if fresh and not await per_partition.split(conn):
            return self._plan
        self._read_at = time.monotonic()
        try:
            self._plan = await plan(conn, limit=limit, aging_seconds=aging_seconds, open_from=open_from)
        except BaseException:
            self._read_at = None
            raise
        self._limit = limit
        return self._plan

    def claimed(self, *, full: bool) -> None:
        """A claim with the plan came back full (reuse it) or short (read a new one)."""
        if not full:
            self.forget()

    def forget(self, *, oldest: datetime | None = None) -> None:
        """Read again at the next claim: runs were queued (a NOTIFY), none before `oldest`
        if it is given (the NOTIFY's payload, runs/enqueue.notify_executors)."""
        self._read_at = None
        self._map_read_at.clear()
        if oldest is None:
            return
        self._floor = {node: min(floor, oldest) for node, floor in self._floor.items()}
        # A full read in flight may not see those runs: its floor must not be higher.
        self._notified_since = {node: min(lowest, oldest) for node, lowest in self._notified_since.items()}

    def read_all(self) -> None:
        """Read every day at the next claim: NOTIFYs may have been missed."""
        self.forget()
        self._floor.clear()

    # Citus: the work map, per worker ({node: its groups}), and when each part was read.
    _map: dict[str, list[Group]] = field(default_factory=dict)
    _map_read_at: dict[str, float] = field(default_factory=dict)
    _limits: dict[int, Limits] = field(default_factory=dict)
    # Citus: per worker, the oldest slot an open run of its partitions can have (the day
    # window's start), and when a full read last set it.
    _floor: dict[str, datetime] = field(default_factory=dict)
    _full_read_at: dict[str, float] = field(default_factory=dict)
    # Per full read in flight, the oldest slot NOTIFYs named since it started.
    _notified_since: dict[str, datetime] = field(default_factory=dict)

    # Citus: which worker holds each partition, and how many partitions there are.
    placements: Placements = field(default_factory=lambda: per_partition.PLACEMENTS)
    partitions: int | None = None

    def partition_count(self) -> int:
        """The partitions runs can be in: the scheduler's (SCHEDULER_PARTITIONS)."""
        if self.partitions is None:
            from django.conf import settings

            self.partitions = settings.SCHEDULER_PARTITIONS
        return self.partitions

    async def refresh(self, conn, node: str, partitions: list[int], *, aging_seconds: float) -> bool:
        """Read `node`'s part of the work map again if it is older than MAP_SECONDS or
        forgotten: one read of that worker's shards (a worker out of reach raises, and its
        part is dropped). Whether it read.

        The read covers the days from the node's floor on (queries.WORK_MAP's window): the
        oldest open slot the last full read saw, at most the start of yesterday (UTC), so
        that what dispatch queues is always inside. A run can be opened before the floor
        only by a replay, a backfill, a resume's catch-up or a scheduler catching up after
        an outage, whose NOTIFY names its oldest slot and lowers the floor (`forget`); a
        NOTIFY missed while the listening connection was down is covered by the full read
        after it reconnects (`read_all`), and anything else by a full read every
        FULL_READ_SECONDS, which starts at the lowest of the tenants' open floors
        (runs/open_floors.py)."""
        now = time.monotonic()
        if now - self._map_read_at.get(node, -MAP_SECONDS) < MAP_SECONDS:
            return False
        self._map_read_at[node] = now  # before the read: a forget() meanwhile wins
        full = node not in self._floor or now - self._full_read_at.get(node, 0.0) >= FULL_READ_SECONDS
        wall = datetime.now(UTC)
        yesterday = wall.replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=1)
        if full:
            self._notified_since[node] = yesterday
        try:
            # A full read starts at the lowest of the tenants' open floors
            # (runs/open_floors.py), read before the map: no open run of any tenant is older.
            start = (
                ((await open_floors.lowest(conn)) or per_partition.EARLIEST) if full else self._floor[node]
            )
            cursor = await conn.execute(
                queries.WORK_MAP,
                {
                    "partitions": partitions,
                    "aging": aging_seconds,
                    "first": MAP_FIRST_RUNS,
                    **per_partition.window(start, wall + queries.AHEAD),
                },
            )
            rows = await cursor.fetchall()
        except BaseException:
            self._map_read_at.pop(node, None)
            self._map.pop(node, None)
            self._notified_since.pop(node, None)
            raise
        self._map[node] = [Group(*row[:6], list(row[6] or []), list(row[7] or []), row[9]) for row in rows]
        if full:
            # What the read saw, and what NOTIFYs named meanwhile (yesterday at the latest).
            self._floor[node] = min([row[8] for row in rows] + [self._notified_since.pop(node)])
            self._full_read_at[node] = now
        return True

    def groups(self, nodes) -> list[Group]:
        """The map's groups on `nodes`."""
        return [g for node in nodes for g in self._map.get(node, [])]

    async def limits(self, conn, groups: list[Group], *, refresh: bool) -> dict[int, Limits]:
        """The weights, caps and open floors of the groups' tenants, read with the map (a
        coordinator read of the reference table tenants)."""
        tenants = sorted({g.tenant_id for g in groups})
        if refresh or any(t not in self._limits for t in tenants):
            cursor = await conn.execute(queries.TENANT_LIMITS, [tenants])
            self._limits = {t: Limits(w, c, floor) for t, w, c, floor in await cursor.fetchall()}
        return self._limits

    def open_floor(self, tenants: Iterable[int]) -> datetime | str:
        """The `open_floor` parameter of a claim for `tenants` (runs/per_partition.py,
        BOUNDS): the lowest of their open floors as last read, or '-infinity' if one has
        none (or was not read)."""
        floors = [self._limits[t].floor if t in self._limits else None for t in tenants]
        return bound(None if not floors or None in floors else min(floors))

    def oldest(self, quotas: dict[int, dict[int, int]]) -> datetime | None:
        """The oldest runnable slot the map saw in the (partition, tenant) groups of
        `quotas` ({partition: {tenant: runs}}), or None if it saw none."""
        slots = [
            g.scheduled_at
            for gs in self._map.values()
            for g in gs
            if g.scheduled_at is not None and g.tenant_id in quotas.get(g.partition_id, {})
        ]
        return min(slots, default=None)

    def cancel_previous(self, partitions: Iterable[int], tenants: Iterable[int]) -> bool:
        """Whether the map saw a runnable cancel_previous run of `tenants` in `partitions`."""
        partitions, tenants = set(partitions), set(tenants)
        return any(
            g.cancel_previous and g.partition_id in partitions and g.tenant_id in tenants
            for gs in self._map.values()
            for g in gs
        )

    def aged(self) -> set[int]:
        """Tenants with a run the map saw aged to priority 9 (their claims probe for them)."""
        return {g.tenant_id for gs in self._map.values() for g in gs if g.effective_priority >= AGED_PRIORITY}

    def took(self, node: str, claimed: dict[tuple[int, int], int], asked: int) -> None:
        """Claims in `node`'s partitions took `claimed` runs per (partition, tenant) of
        the `asked` the grants allowed: the map no longer offers them. (Its running counts
        stay as read: runs finish meanwhile, and the caps are the grants' to enforce.)
        Claims that came back short found runs the map saw blocked or taken by another
        claimer: the node's part is read again at its next claim."""
        for g in self._map.get(node, []):
            got = claimed.get((g.partition_id, g.tenant_id), 0)
            g.runs = max(0, g.runs - got)
            del g.priorities[:got], g.times[:got]
        if sum(claimed.values()) < asked:
            self._map_read_at.pop(node, None)


# --- Citus: the work map and the allocation of a batch ------------------------------------

# How long a worker's part of the work map serves while claims still find runs with it;
# a NOTIFY (runs queued), a claim that comes back short, or a failure reads it again.
MAP_SECONDS = 1.0
# How often a read of the map covers every day an open run can be of (from the lowest of
# the tenants' open floors), not only those from the worker's floor on (Planner.refresh):
# a safety net for a run opened before that floor that no NOTIFY named.
FULL_READ_SECONDS = 30.0
# Runs per group the map lists one by one, so that a tenant's places follow its runs'
# order across partitions (past them, a group's remaining runs rank after its last one).
MAP_FIRST_RUNS = 16


@dataclass
class Group:
    """The runnable runs of one tenant in one partition, as the work map last read them."""

    partition_id: int
    tenant_id: int
    runs: int
    running: int
    scheduled_at: datetime | None
    effective_priority: int
    # Its first runs (up to MAP_FIRST_RUNS) in claim order: effective priority, slot.
    priorities: list[int] = field(default_factory=list)
    times: list[datetime] = field(default_factory=list)
    cancel_previous: bool = False  # whether a runnable run of the group is cancel_previous


@dataclass(frozen=True)
class Limits:
    weight: int
    cap: int  # max_concurrency
    floor: datetime | None = None  # the open floor (runs/open_floors.py); None: none


def allocate(
    groups: list[Group],
    limits: dict[int, Limits],
    running: dict[int, int],
    *,
    limit: int,
    shard_of: Callable[[int], int] = lambda partition: partition,
) -> dict[int, dict[int, int]]:
    """The batch's places by fair share, as {partition_id: {tenant_id: runs}}.

    The same rule as `rank` and the claims on plain PostgreSQL (docs/CONTRACT.md,
    "Execution"): a tenant's k-th place ranks (running + k) / weight, and the `limit`
    best places over every tenant go, none past a tenant's cap. Within a tenant its
    places go to its runs best first across its groups (effective priority, then the
    oldest slot; the map lists each group's first runs), each group at most the runs
    the map saw there; ties (a top-of-the-hour backlog shares one slot) go to the shard
    with the most runs (`shard_of` a partition): each shard is a claim statement, about
    as dear for one run as for a hundred. `running` counts the tenants' running runs."""
    by_tenant: dict[int, list[Group]] = {}
    runnable = [g for g in groups if g.runs > 0 and g.tenant_id in limits]
    in_shard: dict[int, int] = {}
    for g in runnable:
        in_shard[shard_of(g.partition_id)] = in_shard.get(shard_of(g.partition_id), 0) + g.runs
        by_tenant.setdefault(g.tenant_id, []).append(g)
    places = []
    for tenant, tgroups in by_tenant.items():
        lim = limits[tenant]
        n = running.get(tenant, 0)
        available = min(sum(g.runs for g in tgroups), max(0, lim.cap - n), limit)
        places.append([((n + k) / lim.weight, tenant) for k in range(1, available + 1)])
    taken: dict[int, int] = {}
    for _, tenant in itertools.islice(heapq.merge(*places), limit):
        taken[tenant] = taken.get(tenant, 0) + 1
    out: dict[int, dict[int, int]] = {}
    for tenant, n in taken.items():
        fullness = {g.partition_id: -in_shard[shard_of(g.partition_id)] for g in by_tenant[tenant]}
        runs = heapq.merge(*(_runs(g, fullness[g.partition_id], shard_of) for g in by_tenant[tenant]))
        for *_, partition in itertools.islice(runs, n):
            quotas = out.setdefault(partition, {})
            quotas[tenant] = quotas.get(tenant, 0) + 1
    return out


def _runs(g: Group, fullness: int, shard_of: Callable[[int], int]) -> Iterator[tuple]:
    """A group's runs in claim order as sort keys: its listed ones, then the rest ranked
    after the last of them. Ties go to the fullest shard (`fullness`, negated)."""
    shard = shard_of(g.partition_id)
    listed = list(zip(g.priorities, g.times, strict=False)) or [(g.effective_priority, g.scheduled_at)]
    for i in range(g.runs):
        priority, at = listed[min(i, len(listed) - 1)]
        yield (-priority, at, fullness, shard, i, g.partition_id)


def bound(open_from: datetime | None) -> datetime | str:
    """A lower bound on slots as a statement's parameter (queries.OPEN_FROM, an open
    floor): the bound, or '-infinity' for none."""
    return "-infinity" if open_from is None else open_from


# How long a read of OpenFrom serves; it is also read again after a NOTIFY (new runs;
# a replay or a backfill may queue one in an older day) and after an empty claim.
OPEN_FROM_SECONDS = 1.0


@dataclass
class OpenFrom:
    """One claimer's lower bound for the probes (queries.OPEN_FROM, read by
    queries.OLDEST_OPEN_DAY), re-read every OPEN_FROM_SECONDS or when forgotten. None
    on Citus: its plan reads the open runs of every shard whole, not per tenant and day
    (not bounded yet)."""

    value: datetime | None = None
    _read_at: float | None = None

    async def get(self, conn) -> datetime | None:
        now = time.monotonic()
        if self._read_at is None or now - self._read_at >= OPEN_FROM_SECONDS:
            # Marked read before the read: a forget() (a NOTIFY) while it runs makes the
            # next claim read again.
            self._read_at = now
            try:
                if await per_partition.split(conn):
                    self.value = None
                else:
                    cursor = await conn.execute(queries.OLDEST_OPEN_DAY)
                    (self.value,) = await cursor.fetchone()
            except BaseException:
                self._read_at = None
                raise
        return self.value

    def forget(self) -> None:
        self._read_at = None
