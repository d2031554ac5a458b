"""Which partitions an executor claims from next, in fair-share order: one read, no lock.

Claims lock and write in one partition per statement (runs/execution/claims.py), so a batch is
gathered partition by partition. Which partitions, and in which order, is what keeps
fair share across tenants (docs/CONTRACT.md, "Execution"): this read ranks the runs every tenant
with a free slot would hand out next, exactly as a claim ranks them ((runs it has
running + its k-th pick) / weight, then effective priority, then age), keeps the first
`limit` of them, and returns their partitions best rank first, each with the tenants
whose runs put it there. A tenant with nothing running therefore puts its partition
at the head of the list while a busy tenant's backlog waits: the partition of the
run fair share would pick next is claimed next, wherever it lives.

Reads may span partitions (docs/CONTRACT.md, "Beyond one server": a row lock must not). Two forms of the
same read (queries.PLAN_PLAIN, queries.PLAN_CITUS), chosen per connection by the
per-partition policy (runs/per_partition.split):
- plain PostgreSQL: per open tenant, two index-ordered probes (best priority, longest
  waiting), as cheap as the claim's own;
- Citus: a LIMIT inside a LATERAL subquery that correlates on a non-distribution
  column cannot be pushed down to the shards, so the shards each aggregate their
  runnable runs per (partition, tenant) (a pushed-down GROUP BY on the distribution
  column) and the coordinator ranks those groups. It reads every runnable row once,
  spread over the workers (docs/decisions/0033-claim-transaction.md; what that costs: docs/SCALING.md).
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime

from runs import per_partition
from runs.execution import queries

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
    # The Citus form wherever the claims go per partition (runs/per_partition.split), so
    # that the tests of the per-partition forms run it on plain PostgreSQL too.
    sql = queries.PLAN_CITUS if await per_partition.split(conn) else queries.PLAN_PLAIN
    params = {"limit": limit, "aging": aging_seconds, "probe": PROBE, "open_from": bound(open_from)}
    cursor = await conn.execute(sql, params)
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

    def forget(self) -> None:
        self._read_at = None


def bound(open_from: datetime | None) -> datetime | str:
    """The parameter of queries.OPEN_FROM: the bound, or none."""
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
