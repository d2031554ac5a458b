"""Statements that address partitions: one statement per partition on Citus, one for the
whole batch on plain PostgreSQL.

Every write of the executor names the partitions it touches (docs/CONTRACT.md, "Beyond one server"). On
Citus a statement must address ONE partition (`FOR UPDATE` and cheap writes exist only
inside one shard), so a batch that spans partitions becomes one statement per
partition, pipelined. Plain PostgreSQL has no such limit, and a statement per
partition costs it a plan and an execution each: there the batch is one statement
that names no partitions (EVERY). Both forms come from one SQL template, whose
`{partition_filter}` is filled once at import (`Forms.of`), so there is one SQL source.
Which form a connection uses: runs/execution/connections.one_partition_per_statement.

Why no partition list on plain PostgreSQL: every statement finds its rows by their
key, each with its own partition (`r.partition_id = x.partition_id AND r.job_id = ...`).
A filter `partition_id = ANY(the batch's partitions)` beside it gave the generic plan a
cheaper-looking path: scan those partitions' rows of the day (the unique key's first
column) and hash-join them, instead of one keyed lookup per row. Its cost grows with
the rows of the day and with the number of day partitions (each one costed, though
run-time pruning probes one per row): with 38 day partitions an outcome write read
~2,900 buffers for 64 runs, and 320 without the filter
(docs/decisions/0040-per-partition-statements.md).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from runs.execution import connections

T = TypeVar("T")

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
    """One statement in its two forms: `one` names %(partition)s (Citus), `many` none."""

    one: str
    many: str

    @classmethod
    def of(cls, template: str) -> Forms:
        return cls(_fill(template, ONE), _fill(template, EVERY))


def every(template: str) -> str:
    """The template as a plain-PostgreSQL statement over every partition (EVERY)."""
    return _fill(template, EVERY)


def _fill(template: str, form: str) -> str:
    if PLACEHOLDER not in template:
        raise ValueError("the template names no {partition_filter}")
    return template.replace(PLACEHOLDER, form)


def group(items: Iterable[tuple[int, T]]) -> dict[int, list[T]]:
    """Group (partition_id, item) pairs by partition, partitions in ascending order."""
    groups: dict[int, list[T]] = defaultdict(list)
    for partition_id, item in items:
        groups[partition_id].append(item)
    return dict(sorted(groups.items()))


async def run(
    conn, forms: Forms, groups: dict[int, list[T]], params: Callable[[list[T]], dict]
) -> list[tuple]:
    """Run a statement over the grouped items, returning the rows of every statement sent.

    `params(items)` gives a statement's parameters for some of the items; the partition
    parameter is added here. Per-partition mode: one statement per partition, pipelined
    (one round trip for all of them). Otherwise one statement for all the items.
    """
    if not groups:
        return []
    if not await connections.one_partition_per_statement(conn):
        items = [item for batch in groups.values() for item in batch]
        cursor = await conn.execute(forms.many, params(items))
        return await cursor.fetchall()
    return await _each(conn, forms.one, [{**params(batch), "partition": p} for p, batch in groups.items()])


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
