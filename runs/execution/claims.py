"""The executor's claim: tenant caps, fair share, priority aging, overlap,
cancel_previous (run leases: runs/execution/run_leases.py; the outcomes of attempts:
runs/execution/outcomes.py). Async (psycopg AsyncConnection), off the Django ORM, so
the hot path costs a few round trips per batch. Each function runs in its own
transaction unless it says otherwise. The statements, and the rules they follow on
Citus, are runs/execution/queries.py (LOCK_TENANTS, CLAIM; on Citus LOCK_PARTITION_TENANTS,
HOLDS_RESERVE, CLAIM_IN_SHARD).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TypeVar

import psycopg
from psycopg import pq

from runs import per_partition
from runs.execution import fair_share, queries
from runs.execution.connections import close_quietly
from runs.rows import ClaimedRun
from scheduler_project.citus import by_node
from scheduler_project.outage import OutageLog, first_line, unreachable_worker

T = TypeVar("T")

log = logging.getLogger(__name__)

# pg_advisory_xact_lock(key1, key2) namespace for "claiming runs of tenant key2".
TENANT_CLAIM_LOCK = 0x43524E59  # "CRNY"
# On Citus, "claiming runs of tenant t in partition p" is pg_advisory_xact_lock(key) of
# one bigint key: this in its top 16 bits, p in the next 16, t in the low 32
# (queries.LOCK_PARTITION_TENANTS). One-key advisory locks never meet two-key ones. A
# partition past 65,535 (SCHEDULER_PARTITIONS) would share keys: more waiting, no lock missed.
PARTITION_CLAIM_LOCK = 0x4350  # "CP"

# The per-partition claim's rank bound on Citus: none, its grants already say how many
# runs of each tenant it takes (fair share was applied by fair_share.allocate).
UNBOUNDED_RANK = 1e12

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
    holds: Holds | None = None,
    mine: dict[int, int] | None = None,
    outage: OutageLog | None = None,
    lanes: Lanes | None = None,
) -> list[ClaimedRun]:
    """Claim up to `limit` runnable runs for `owner`. No transaction is open during any call.

    Plain PostgreSQL: one read chooses the tenants in fair-share order
    (runs/execution/fair_share.py), then one short claim transaction for all of them, one
    statement for the batch. Never more running runs per tenant than
    tenants.max_concurrency: claimers of the same tenant are serialised by a
    transaction-scoped advisory lock, and the running counts are read (by a statement
    that starts) after the locks are held. Runs scheduled before `open_from` are not
    looked for (fair_share.OpenFrom: no open run is older). A `planner` may hand out its
    last plan again (fair_share.Planner); it is told whether the claim came back full.

    Citus (wherever claims go per partition, runs/per_partition.split): `_claim_by_node`,
    with `holds` (this executor's tenant_holds), `mine` (its runs in flight per tenant),
    `outage` (the process's OutageLog, which sets a worker out of reach aside) and
    `lanes` (the connections its shards' claims go on side by side; by default one after
    another on `conn`).
    """
    if limit <= 0:
        return []
    planner = planner or fair_share.Planner()
    if await per_partition.split(conn):
        return await _claim_by_node(
            conn,
            planner,
            holds or Holds(owner=owner),
            owner=owner,
            limit=limit,
            aging_seconds=aging_seconds,
            mine=mine,
            outage=outage,
            lanes=lanes,
        )
    plan = await planner.plan(conn, limit=limit, aging_seconds=aging_seconds, open_from=open_from)
    if not plan.partitions:
        planner.forget()
        return []
    params = {
        "limit": limit,
        "owner": owner,
        "aging": aging_seconds,
        "max_rank": plan.max_rank,
        "aged": plan.aged,
        "open_from": fair_share.bound(open_from),
    }
    claimed = await _claim_batch(conn, params, sorted({t for _, ts in plan.partitions for t in ts}))
    planner.claimed(full=len(claimed) >= limit)
    return claimed


# A hold outlives its last write by this much; the claim loop writes every hold of its
# executor again at least every HOLD_SECONDS / 3 while it holds runs (every grant
# round trip does, and Holds.refresh when none came). An executor that stops writing
# (crashed, stalled) stops counting against the tenants' caps about when its runs'
# leases end and they become claimable again.
HOLD_SECONDS = 30


@dataclass
class Holds:
    """This executor's runs per tenant in tenant_holds (Citus), which every claimer's
    grant counts against the tenants' caps. All writes go through the claim connection,
    one at a time: a grant (`reserve`), and holds given back (`release`); each is a
    delta of the row as it is, so no write undoes another.

    Spare holds: the holds of runs that finished, and grants a claim did not use, are
    kept for the next claims of the same tenant instead of being given back and asked
    for again, while the tenant is `roomy`: a claim they cover takes no grant round
    trip (`grant`). They count against the cap in tenant_holds like any hold; what they
    cost is room other executors cannot take meanwhile, at most one claim batch per
    tenant of the claim (`trim`), and only within seconds of a grant that left at least
    that much (docs/decisions/0084-spare-holds.md)."""

    owner: str
    told: dict[int, int] = field(default_factory=dict)  # what tenant_holds holds for us
    hold_seconds: int = HOLD_SECONDS
    # Per tenant, (its cap, the room beside every hold, monotonic time) as the last
    # grant round trip saw them.
    room: dict[int, tuple[int, int, float]] = field(default_factory=dict)
    _refreshed_at: float = 0.0  # monotonic time every hold was last written

    def excess(self, mine: dict[int, int]) -> dict[int, int]:
        """Held but no longer in flight (finished, deferred, fenced, handed back): spare."""
        return {t: n - mine.get(t, 0) for t, n in self.told.items() if n > mine.get(t, 0)}

    def roomy(self, tenant: int, *, cap: int, keep: int) -> bool:
        """Whether spare holds of `tenant`, up to `keep`, may be kept and used: a grant
        round trip less than HOLD_SECONDS / 3 ago found at least `keep` of room beside
        every hold, under the cap the claimer reads now. So a stalled claim loop, a
        tenant others have filled since, and a cap changed by an operator each end the
        spare at the next claim, which asks for its grants and gives the spare back."""
        cap_then, room, at = self.room.get(tenant, (None, 0, 0.0))
        fresh = time.monotonic() - at < self.hold_seconds / 3
        return cap_then == cap and room >= keep and fresh

    def _keep(self, tenant: int, *, caps: dict[int, int], keep: int) -> int:
        """How much spare of `tenant` may stay: `keep` if it is a tenant of this claim
        (in `caps`) and roomy, else none."""
        return keep if tenant in caps and self.roomy(tenant, cap=caps[tenant], keep=keep) else 0

    def _kept(self, spare: dict[int, int], *, caps: dict[int, int], keep: int) -> dict[int, int]:
        """Per tenant of `spare`, how much of it may stay (`_keep`), read once: `roomy`
        reads the clock."""
        return {t: self._keep(t, caps=caps, keep=keep) for t in spare}

    @staticmethod
    def _beyond(spare: dict[int, int], kept: dict[int, int]) -> dict[int, int]:
        """The spare to give back: beyond what each tenant may keep (`kept`)."""
        return {t: n - kept[t] for t, n in spare.items() if n > kept[t]}

    async def grant(
        self, conn, want: dict[int, int], *, caps: dict[int, int], mine: dict[int, int], keep: int
    ) -> dict[int, int]:
        """Grants for `want` ({tenant_id: runs}): from spare (held, not in flight: `mine`
        is what is) where the tenant may keep it, the rest from `reserve`. Spare not used
        now is given back beyond what the tenant may keep (`_beyond`), in the same round
        trip as the reserve if there is one. A claim whose grants all come from spare
        writes nothing unless spare is given back or the holds are due a refresh."""
        spare = self.excess(mine)
        kept = self._kept(spare, caps=caps, keep=keep)
        use = Counter({t: min(n, want.get(t, 0)) for t, n in spare.items() if kept[t]})
        release = self._beyond({t: n - use[t] for t, n in spare.items()}, kept)
        need = {t: n - use[t] for t, n in want.items() if n > use[t]}
        if need:
            return dict(use + Counter(await self.reserve(conn, need, caps=caps, release=release)))
        await self.release(conn, release)
        await self.refresh(conn)
        return dict(+use)

    async def trim(self, conn, mine: dict[int, int], *, caps: dict[int, int], keep: int) -> None:
        """After a claim (`mine`: the runs in flight now, its own included): give back the
        spare beyond what each tenant may keep: grants the claim did not use."""
        spare = self.excess(mine)
        await self.release(conn, self._beyond(spare, self._kept(spare, caps=caps, keep=keep)))

    async def reserve(
        self, conn, want: dict[int, int], *, caps: dict[int, int], release: dict[int, int]
    ) -> dict[int, int]:
        """Give back `release` and hold up to `want` more runs per tenant, as far as its cap
        allows beside what every executor holds: {tenant_id: granted}. One transaction
        on the coordinator, one round trip: BEGIN, the tenants' locks, the grant, COMMIT.
        It writes every hold of this executor, and its count of each tenant it names
        becomes what the row holds."""
        tenants = sorted(set(want) | set(release))
        try:
            async with conn.pipeline():
                await conn.execute("BEGIN")
                await conn.execute(queries.LOCK_TENANTS, {"ns": TENANT_CLAIM_LOCK, "tenants": tenants})
                cursor = await conn.execute(
                    queries.HOLDS_RESERVE,
                    {
                        "owner": self.owner,
                        "tenants": tenants,
                        "want": [want.get(t, 0) for t in tenants],
                        "release": [release.get(t, 0) for t in tenants],
                        "caps": [caps.get(t, 0) for t in tenants],
                        "hold": self.hold_seconds,
                    },
                )
                await conn.execute("COMMIT")
            rows = await cursor.fetchall()
        except psycopg.Error:
            self._unsure()
            await _end_failed(conn)
            raise
        now = time.monotonic()
        for tenant, _, room, held in rows:
            self._add(tenant, held - self.told.get(tenant, 0))
            if tenant in caps:
                self.room[tenant] = (caps[tenant], room, now)
        self._refreshed_at = now
        return {tenant: n for tenant, n, _, _ in rows}

    async def release(self, conn, counts: dict[int, int]) -> None:
        """Give back `counts` runs per tenant."""
        counts = {t: n for t, n in counts.items() if n > 0}
        if not counts:
            return
        tenants = sorted(counts)
        try:
            await conn.execute(
                queries.HOLDS_RELEASE,
                {"owner": self.owner, "tenants": tenants, "counts": [counts[t] for t in tenants]},
            )
        except psycopg.Error:
            self._unsure()
            raise
        for tenant in tenants:
            self._add(tenant, -counts[tenant])

    def _unsure(self) -> None:
        """A write failed, perhaps after it committed: this executor's counts may differ
        from the rows until a grant round trip reads them back, so no spare is used
        before one (a count above the row would start runs no hold records)."""
        self.room.clear()

    async def refresh(self, conn) -> None:
        """Keep the holds counting while their runs are in flight and no claim writes them."""
        if self.told and time.monotonic() - self._refreshed_at >= self.hold_seconds / 3:
            await conn.execute(queries.HOLDS_REFRESH, {"owner": self.owner, "hold": self.hold_seconds})
            self._refreshed_at = time.monotonic()

    def _add(self, tenant: int, n: int) -> None:
        left = self.told.get(tenant, 0) + n
        if left > 0:
            self.told[tenant] = left
        else:
            self.told.pop(tenant, None)


async def _claim_by_node(
    conn,
    planner: fair_share.Planner,
    holds: Holds,
    *,
    owner: str,
    limit: int,
    aging_seconds: float,
    mine: dict[int, int] | None,
    outage: OutageLog | None,
    lanes: Lanes | None,
) -> list[ClaimedRun]:
    """Citus: no statement visits every shard, and one worker out of reach stops only its
    own partitions (docs/decisions/0075-citus-claims.md, 0073-one-worker-down.md).

    1. The work map (fair_share.Planner.refresh): per worker, the runnable runs per
       (partition, tenant), read again only when used up, stale or announced.
    2. The batch's places by fair share from the map (fair_share.allocate), ties going
       to the fullest shard: each shard is a claim statement.
    3. Grants under the tenants' caps from tenant_holds, on the coordinator only
       (Holds.grant, under the tenants' advisory locks): what every executor holds,
       not a count of running runs over every shard. The holds of runs this executor no
       longer has in flight (`mine`: what it has) are its spare: while the tenant is
       roomy they grant this claim without a round trip, and spare beyond a batch, or
       of other tenants, is given back in the grant's statement.
    4. Per shard, a transaction of the (tenant, partition) locks and one claim
       statement for its partitions of the batch (`_claim_in`), in one round trip and
       committed on that shard's worker alone; the shards' claims run side by side on
       `lanes`, the biggest first. The locks serialise claimers of one job, so that each
       sees the runs the other set running (overlap policies).
    5. The grants the claims did not use are given back, or kept as spare (up to a
       batch per tenant) while the tenant is roomy.
    """
    mine = dict(mine or {})
    excess = holds.excess(mine)
    placements = await planner.placements.read_async(conn, list(range(planner.partition_count())))
    nodes = by_node(placements)
    away = outage.set_aside([n for n in nodes if n]) if outage else set()
    healthy: dict[str, list[int]] = {}
    refreshed = False
    for node, partitions in nodes.items():
        if node in away:
            continue
        try:
            refreshed |= await planner.refresh(conn, node, partitions, aging_seconds=aging_seconds)
        except psycopg.Error as exc:
            if not _node_away(exc, planner, outage):
                raise
            continue
        healthy[node] = partitions
    groups = planner.groups(healthy)
    limits = await planner.limits(conn, groups, refresh=refreshed)
    running: Counter[int] = Counter()
    for g in groups:
        running[g.tenant_id] += g.running
    places = fair_share.allocate(groups, limits, running, limit=limit, shard_of=planner.placements.shard)
    if not places:
        if excess:
            await holds.release(conn, excess)
        else:
            await holds.refresh(conn)
        return []
    want = _per_tenant(places.values())
    caps = {t: limits[t].cap for t in want}
    granted = await holds.grant(conn, want, caps=caps, mine=mine, keep=limit)
    claimed: list[ClaimedRun] = []
    try:
        shards: dict[int, dict[int, dict[int, int]]] = {}  # shard -> partition -> tenant -> n
        for partition, quotas in _trim(places, granted).items():
            shards.setdefault(planner.placements.shard(partition), {})[partition] = quotas
        asked = sorted(shards.values(), key=_size, reverse=True)
        results = await (lanes or Lanes()).run(
            conn,
            [
                functools.partial(
                    _claim_in, in_shard=in_shard, owner=owner, aging_seconds=aging_seconds, planner=planner
                )
                for in_shard in asked
            ],
        )
        failed: psycopg.Error | None = None
        took: dict[str, tuple[Counter[tuple[int, int]], int]] = {}
        away_now: set[str] = set()
        for in_shard, got in zip(asked, results, strict=True):
            node = placements[next(iter(in_shard))]
            if isinstance(got, psycopg.Error):
                if _node_away(got, planner, outage):
                    away_now.add(node)
                else:
                    failed = failed or got
                continue
            counts, total = took.get(node, (Counter(), 0))
            counts.update((r.partition_id, r.tenant_id) for r in got)
            took[node] = (counts, total + _size(in_shard))
            claimed += got
        for node, (counts, total) in took.items():
            if outage and node and node not in away_now:
                outage.reached([node])
            planner.took(node, counts, total)
        if failed is not None:
            if not claimed:
                raise failed
            # The other shards' runs are claimed (committed): returned, they are called;
            # raised, they would sit running, uncalled, until their leases ended.
            log.warning("a shard's claim failed (%s); the other shards' runs go on", first_line(failed))
    finally:
        # Grants not used: spare up to a batch while the tenant is roomy, given back otherwise.
        await holds.trim(
            conn, dict(Counter(mine) + Counter(run.tenant_id for run in claimed)), caps=caps, keep=limit
        )
    claimed.sort(key=lambda run: (-run.priority, run.scheduled_at))
    return claimed


def _per_tenant(quotas: Iterable[dict[int, int]]) -> Counter[int]:
    """{tenant: runs} summed over several {tenant: runs}."""
    total: Counter[int] = Counter()
    for q in quotas:
        total.update(q)
    return total


def _trim(places: dict[int, dict[int, int]], granted: dict[int, int]) -> dict[int, dict[int, int]]:
    """`places` cut to what each tenant was granted, its best places first (allocate's order)."""
    left = dict(granted)
    out: dict[int, dict[int, int]] = {}
    for partition, quotas in places.items():
        for tenant, n in quotas.items():
            take = min(n, left.get(tenant, 0))
            if take > 0:
                out.setdefault(partition, {})[tenant] = take
                left[tenant] -= take
    return out


def _node_away(exc: psycopg.Error, planner: fair_share.Planner, outage: OutageLog | None) -> bool:
    """Whether `exc` says a Citus worker is out of reach: then the outage log has it (and
    sets the worker aside), the placements are read again (a shard may have moved), and
    the caller goes on with the other workers."""
    if unreachable_worker(exc) is None or outage is None:
        return False
    outage.failed(exc)
    planner.placements.forget()
    return True


async def _claim_in(
    conn,
    *,
    in_shard: dict[int, dict[int, int]],
    owner: str,
    aging_seconds: float,
    planner: fair_share.Planner,
) -> list[ClaimedRun]:
    """One shard's claim: {partition: {tenant: runs granted there}} of one shard, in a
    transaction of its own (the partitions' locks, then the claim statement) in one
    pipeline sync (one round trip), committed on that shard's worker alone.

    The statement's day window (runs/per_partition.py, BOUNDS) runs from the oldest
    runnable slot the work map saw among its (partition, tenant) groups to a day ahead
    (NOT_AHEAD's bound): its probes skip older runs that became runnable since the map
    was read (a retry come due, a replay) until the map is read again, at most
    MAP_SECONDS later or after this claim if it comes back short. Running runs, which
    caps and overlap count, are read from the tenants' open floors as the planner last
    read them (CLAIM's `busy`; runs/open_floors.py): a tenant whose floor fell below
    since gets nothing from the statement."""
    now = datetime.now(UTC)
    oldest = planner.oldest(in_shard) or per_partition.EARLIEST
    grants = _per_tenant(in_shard.values())
    tenants = sorted(grants)
    partitions = sorted(in_shard)
    aged = sorted(planner.aged() & set(tenants))
    # The leanest form for what the work map saw (queries.CLAIM_IN_SHARD): a
    # cancel_previous run queued since is left for a claim after the map's next read.
    form = (bool(aged), planner.cancel_previous(partitions, tenants))
    try:
        async with conn.pipeline():
            await conn.execute("BEGIN")
            # The (tenant, partition) locks of every pair the statement may claim from,
            # held until this transaction (and with it the worker's) commits: two
            # claimers of one job take turns, so each one's statement sees the runs the
            # other set running (overlap policies). Without them two claimers of one
            # skip job each took one of its runs: the first locked the oldest, the
            # second skipped it (SKIP LOCKED) and took the next, and neither saw the
            # other's run as running. A job's runs are all in its partition, and the
            # caps are the grants' (Holds.reserve): claims of one tenant in other
            # partitions, here or in another lane, need not wait.
            await conn.execute(
                queries.LOCK_PARTITION_TENANTS,
                {"ns": PARTITION_CLAIM_LOCK, "partitions": partitions, "tenants": tenants},
            )
            cursor = await conn.execute(
                queries.CLAIM_IN_SHARD[form],
                {
                    "partitions": partitions,
                    "tenants": tenants,
                    "granted": [grants[t] for t in tenants],
                    "limit": _size(in_shard),
                    "owner": owner,
                    "aging": aging_seconds,
                    "max_rank": UNBOUNDED_RANK,
                    "aged": aged,
                    "open_from": fair_share.bound(None),
                    **per_partition.window(oldest, now + queries.AHEAD),
                    "open_floor": planner.open_floor(tenants),
                    "epoch": now.timestamp(),
                },
            )
            await conn.execute("COMMIT")
        return [ClaimedRun(*row) for row in await cursor.fetchall()]
    except psycopg.Error:
        await _end_failed(conn)
        raise


def _size(in_shard: dict[int, dict[int, int]]) -> int:
    """The runs a shard's claim was granted."""
    return sum(n for quotas in in_shard.values() for n in quotas.values())


# The claims of one Citus claim go on this many connections at once at most: the
# claim connection and up to two more (Lanes).
CLAIM_LANES = 3


@dataclass
class Lanes:
    """Connections a Citus claim's shard statements run on side by side, each shard's
    in its own transaction: the claim connection, and up to `size` - 1 more opened by
    `connect` when a claim first needs them and kept. A claim of one shard (the usual
    case at scale: a batch fits in one shard's runs) uses the claim connection alone.
    The default, one lane, runs them one after another on the claim connection."""

    connect: Callable[[], Awaitable[psycopg.AsyncConnection]] | None = None
    size: int = 1
    _more: list[psycopg.AsyncConnection] = field(default_factory=list)

    async def run(self, conn, calls: list[Callable[[object], Awaitable[T]]]) -> list[T | psycopg.Error]:
        """Each call awaited with a lane's connection, as many at once as there are
        lanes, in order: the results in the calls' order, a psycopg.Error a call raised
        in its place. A connection a call left broken is closed, to be opened afresh."""
        if not calls:
            return []
        results: list[T | psycopg.Error] = [None] * len(calls)  # type: ignore[list-item]
        lanes = min(self.size if self.connect else 1, len(calls))
        while len(self._more) < lanes - 1:
            self._more.append(await self.connect())
        pending = iter(enumerate(calls))

        async def lane(on) -> None:
            for i, call in pending:
                try:
                    results[i] = await call(on)
                except psycopg.Error as exc:
                    results[i] = exc
                    if on.broken or on.closed:
                        return  # the other lanes take the rest

        # Every lane ends before this returns, even when one raises something else (a
        # bug): none is left using a connection the caller goes on with.
        ended = await asyncio.gather(
            *(lane(on) for on in [conn, *self._more[: lanes - 1]]), return_exceptions=True
        )
        for on in [c for c in self._more if c.broken or c.closed]:
            self._more.remove(on)
            await close_quietly(on)
        for exc in ended:
            if exc is not None:
                raise exc
        for i, _ in pending:  # every lane's connection broke before these
            results[i] = psycopg.OperationalError("no claim connection left to run this on")
        return results

    async def close(self) -> None:
        for on in self._more:
            await close_quietly(on)
        self._more.clear()


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
                queries.CLAIM,
                {**params, "tenants": list(tenant_ids), "epoch": datetime.now(UTC).timestamp()},
            )
            await conn.execute("COMMIT")
        # Read after the pipeline's one Sync has brought every result back (fetching
        # inside it would flush and wait once more).
        return [ClaimedRun(*row) for row in await cursor.fetchall()]
    except psycopg.Error:
        await _end_failed(conn)
        raise


async def _end_failed(conn) -> None:
    """A failed statement leaves the transaction aborted (the server skipped the rest of
    the pipeline, COMMIT included): end it so the connection stays usable."""
    if not conn.closed and conn.info.transaction_status != pq.TransactionStatus.IDLE:
        try:
            await conn.execute("ROLLBACK")
        except psycopg.Error:
            pass  # the connection is gone; the caller's error says why
