"""Statements that address partitions, for both processes: the policy that says whether
a batch goes as one statement per partition or as one statement, and the two runners
that apply it (`run` on the executor's async connections, `run_sync` on the scheduler's
cursor).

The policy, one per engine (`one_statement_per_partition`):
- Citus: one statement per partition of the batch, pipelined (one round trip for all
  of them). A statement that locks or writes rows must address ONE partition
  (docs/CONTRACT.md, "Beyond one server": `FOR UPDATE` and cheap writes exist only
  inside one shard).
- Plain PostgreSQL: one statement for the whole batch that names no partitions
  (EVERY). A statement per partition would cost a plan and an execution each.

Both forms come from one SQL template, whose `{partition_filter}` is filled once at
import (`Forms.of`), so there is one SQL source. Every template finds its rows by
their key, each with its own partition (`r.partition_id = x.partition_id AND r.job_id
= ...`), so the batch form needs no partition list.

Why no partition list on plain PostgreSQL: a filter `partition_id = ANY(the batch's
partitions)` beside the keyed join gave the generic plan a cheaper-looking path: scan
those partitions' rows of the day (the unique key's first column) and hash-join them,
instead of one keyed lookup per row. Its cost grows with the rows of the day and with
the number of day partitions (each one costed, though run-time pruning probes one per
row): with 38 day partitions an outcome write read ~2,900 buffers for 64 runs, and 320
without the filter (docs/decisions/0040-per-partition-statements.md). The scheduler's
lock and compare-and-set of job rows follow the same policy
(docs/decisions/0053-citus-dispatch.md).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TypeVar

import psycopg
from psycopg.pq import TransactionStatus

from scheduler_project.citus import Placements, citus_installed, citus_installed_async
from scheduler_project.outage import unreachable_worker

IDLE = TransactionStatus.IDLE

T = TypeVar("T")

# Which shard holds each partition (Citus), for this process: `run` groups by it.
PLACEMENTS = Placements()

PLACEHOLDER = "{partition_filter}"
# The right-hand side of `<alias>.partition_id ...` in each form.
ONE = "= %(partition)s"
# ... on plain PostgreSQL: no filter at all (see above); keyed joins name each row's own
# partition. A true test that no index can serve: `IS NOT NULL` can, and a generic plan
# made on stale statistics (a table that looked empty) used it to walk the whole jobs
# primary key once per outcome batch, 41,000 buffers for 32 runs.
EVERY = "IS DISTINCT FROM -1"


@dataclass(frozen=True)
class Forms:
    """One statement in its forms: `one` names %(partition)s, `shard` %(partitions)s all
    in one shard (both Citus), `many` none (plain PostgreSQL)."""

    one: str
    many: str
    shard: str = ""

    @classmethod
    def of(cls, template: str) -> Forms:
        return cls(_fill(template, ONE), _fill(template, EVERY), _fill(template, IN_SHARD))

    @classmethod
    def per_engine(cls, *, plain: str, citus: str) -> Forms:
        """A statement whose Citus forms differ from the plain PostgreSQL one."""
        return cls(_fill(citus, ONE), _fill(plain, EVERY), _fill(citus, IN_SHARD))


# ... on Citus, several partitions of one shard: Citus prunes `= ANY(...)` on the
# distribution column to the shards the values hash to, so the statement still goes to
# that one shard (its row locks and writes stay inside it).
IN_SHARD = "= ANY(%(partitions)s::int[])"


def in_shard(template: str) -> str:
    """The template as a statement over `%(partitions)s`, all of one shard (IN_SHARD)."""
    return _fill(template, IN_SHARD)


def every(template: str) -> str:
    """The template as a plain-PostgreSQL statement over every partition (EVERY)."""
    return _fill(template, EVERY)


# Bounds a template names as `{<bound>:<alias>}` (BOUNDS): on Citus the conditions
# below, on plain PostgreSQL `TRUE` unless the template is `bounded`.
#
# `{in_window:<alias>}`, a run's day window: `%(window_from)s <= <alias>.scheduled_at <
# %(window_to)s` (`window` gives the two parameters).
#
# Why on Citus: each statement is planned afresh on its worker (custom plans; Citus
# keeps no plan of a statement on a partitioned table), and a reference to job_runs
# the planner cannot prune with a constant is planned over every day partition, its
# partial indexes proved one by one (a month's retention is 38 of them). A bound whose
# values are known at planning prunes the days outside it
# (docs/decisions/0077-day-windows.md). Every window holds all the rows its reference
# may find (the keys of a batch, or a probe's own bound), so it changes no result.
#
# Why not on plain PostgreSQL: its executors keep one generic plan per statement
# (runs/execution/connections.py), which plans every partition once whatever the bound
# (a bound on parameters prunes only when the plan starts), and a range on a parameter
# is estimated at 0.5% of the rows, which once made the probes read a tenant's whole day
# (docs/decisions/0035-claim-day-bounds.md). The outcome statement is the exception
# (`bounded`): every reference in it is a keyed lookup, which the range cannot mislead,
# and the bound prunes the days when the generic plan starts: without it each execution
# set up every day partition of its two writes and two probes
# (docs/decisions/0088-outcome-day-window.md).
#
# The open floor's bounds (runs/open_floors.py, docs/decisions/0078-open-floors.md), for
# reads of a tenant's open runs of any day (the claim's running runs):
# - `{since_floor:<alias>}`: from `%(open_floor)s`, the lowest of the batch's tenants'
#   floors as the claimer last read them, to the window's end;
# - `{floor_holds:<tenants alias>}`: that tenant's floor is still no lower (else the
#   statement does nothing for it: a writer lowered it since);
# - `{above_floor:<alias>}`: the run is not older than its tenant's floor as this
#   statement sees it (the claim's `slots` row `s`), so that no run is set running before
#   the floor below it is visible to every later claim.
BOUNDS = {
    "in_window": (
        "({alias}.scheduled_at >= %(window_from)s::timestamptz"
        " AND {alias}.scheduled_at < %(window_to)s::timestamptz)"
    ),
    "since_floor": (
        "({alias}.scheduled_at >= %(open_floor)s::timestamptz"
        " AND {alias}.scheduled_at < %(window_to)s::timestamptz)"
    ),
    "floor_holds": "{alias}.open_floor >= %(open_floor)s::timestamptz",
    "above_floor": "{alias}.scheduled_at >= s.open_floor",
}
BOUND = re.compile(r"\{(" + "|".join(BOUNDS) + r"):(\w+)\}")
WINDOW_BOUND = BOUNDS["in_window"]
# A window's start that leaves out no day.
EARLIEST = datetime(1, 1, 1, tzinfo=UTC)


def bounded(template: str, *bounds: str) -> str:
    """The template with the named bounds written out as their conditions on every
    engine, plain PostgreSQL included (for a statement whose generic plan is cheaper to
    start with its days pruned; see BOUNDS)."""
    unknown = set(bounds) - set(BOUNDS)
    if unknown:
        raise ValueError(f"no bound {sorted(unknown)}")

    def written_out(m: re.Match) -> str:
        return BOUNDS[m.group(1)].format(alias=m.group(2)) if m.group(1) in bounds else m.group(0)

    return BOUND.sub(written_out, template)


def window(*slots: datetime) -> dict[str, datetime]:
    """The parameters of `{in_window:...}` for the days from the earliest of `slots` to
    the latest, both in."""
    return {"window_from": min(slots), "window_to": max(slots) + timedelta(microseconds=1)}


def _fill(template: str, form: str) -> str:
    if PLACEHOLDER not in template:
        raise ValueError("the template names no {partition_filter}")
    return BOUND.sub(
        lambda m: "TRUE" if form == EVERY else BOUNDS[m.group(1)].format(alias=m.group(2)),
        template.replace(PLACEHOLDER, form),
    )


def group(items: Iterable[tuple[int, T]]) -> dict[int, list[T]]:
    """Group (partition_id, item) pairs by partition, partitions in ascending order."""
    groups: dict[int, list[T]] = defaultdict(list)
    for partition_id, item in items:
        groups[partition_id].append(item)
    return dict(sorted(groups.items()))


def one_statement_per_partition(*, citus: bool) -> bool:
    """The policy: whether a batch's statement is sent once per partition (Citus) or
    once for the batch (plain PostgreSQL). See the module docstring for why."""
    return citus


async def split(conn) -> bool:
    """The policy for the database of the executor's async `conn`."""
    return one_statement_per_partition(citus=await citus_installed_async(conn))


def split_sync(cursor) -> bool:
    """The policy for the database of `cursor` (the scheduler's, on Django's connection)."""
    return one_statement_per_partition(citus=citus_installed(cursor))


async def run(
    conn, forms: Forms, groups: dict[int, list[T]], params: Callable[[list[T]], dict]
) -> list[tuple]:
    """Run a statement over the grouped items, returning the rows of every statement sent.

    `params(items)` gives a statement's parameters for some of the items; the partitions
    parameter is added here. One statement per shard (naming its partitions of the
    batch), pipelined, or one for all the items: the policy (`split`). Per shard, not per
    partition: on Citus each statement costs a few milliseconds of planning and a round
    trip to its worker whatever its size, and a shard holds several partitions.
    """
    if not groups:
        return []
    if not await split(conn):
        items = [item for batch in groups.values() for item in batch]
        cursor = await conn.execute(forms.many, params(items))
        return await cursor.fetchall()
    nodes = await PLACEMENTS.read_async(conn, list(groups))
    by_worker: dict[str, dict[int, dict[int, list[T]]]] = defaultdict(lambda: defaultdict(dict))
    for partition, batch in groups.items():
        by_worker[nodes[partition]][PLACEMENTS.shard(partition)][partition] = batch
    rows: list[tuple] = []
    away: list[T] = []
    cause: psycopg.Error | None = None
    # One pipeline per worker: a worker out of reach fails its own statements, not the
    # others' (outside a transaction; inside one, the caller's transaction fails whole).
    for shards in by_worker.values():
        each = [
            {**params([i for batch in in_shard.values() for i in batch]), "partitions": sorted(in_shard)}
            for in_shard in shards.values()
        ]
        try:
            rows += await _each(conn, forms.shard, each)
        except psycopg.Error as exc:
            if len(by_worker) == 1 or not unreachable_worker(exc) or conn.info.transaction_status != IDLE:
                raise
            PLACEMENTS.forget()  # a shard may have moved
            away += [item for in_shard in shards.values() for batch in in_shard.values() for item in batch]
            cause = exc
    if cause is not None:
        raise WorkerUnreachable(cause, rows=rows, items=away)
    return rows


class WorkerUnreachable(psycopg.OperationalError):
    """`run` reached some workers and not others: `rows` are the answers of the statements
    that ran, `items` the ones sent to the worker out of reach (nothing of theirs was
    written). An OperationalError that names the worker, like Citus's own: a caller that
    does not look inside treats it as before, as an outage."""

    def __init__(self, cause: psycopg.Error, *, rows: list[tuple], items: list) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.rows = rows
        self.items = items


def run_sync(
    cursor, forms: Forms, groups: dict[int, list[T]], params: Callable[[list[T]], dict]
) -> list[tuple]:
    """`run` on a sync psycopg cursor, inside the caller's transaction.

    The statements of the per-partition form go in one pipeline (executemany with
    returning): on Citus a dispatch batch spans ~100 partitions, and a round trip each
    (with a scheduler process that must be woken between them on a busy host) cost more
    than the statements.
    """
    if not groups:
        return []
    if not split_sync(cursor):
        items = [item for batch in groups.values() for item in batch]
        cursor.execute(forms.many, params(items))
        return cursor.fetchall()
    each = _per_partition(groups, params)
    if len(each) == 1:
        cursor.execute(forms.one, each[0])  # see _each: no pipeline for one statement
        return cursor.fetchall()
    cursor.executemany(forms.one, each, returning=True)
    rows: list[tuple] = []
    while True:
        rows += cursor.fetchall()
        if not cursor.nextset():
            return rows


def _per_partition(groups: dict[int, list[T]], params: Callable[[list[T]], dict]) -> list[dict]:
    return [{**params(batch), "partition": p} for p, batch in groups.items()]


async def _each(conn, sql: str, params: Sequence[dict]) -> list[tuple]:
    if len(params) == 1:
        # The common case (a batch from one partition): a pipeline's extra sync costs
        # more than it saves.
        cursor = await conn.execute(sql, params[0])
        return await cursor.fetchall()
    rows: list[tuple] = []
    async with conn.pipeline():
        cursors = [await conn.execute(sql, p) for p in params]
        for cursor in cursors:
            rows += await cursor.fetchall()
    return rows
