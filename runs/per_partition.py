"""Statements that address one partition each, for several partitions at once.

Every write of the executor addresses one `partition_id` (DESIGN section 10); a batch
that spans partitions becomes one statement per partition, sent pipelined so that
plain PostgreSQL still pays one round trip for the batch.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import TypeVar

T = TypeVar("T")


def group(items: Iterable[tuple[int, T]]) -> dict[int, list[T]]:
    """Group (partition_id, item) pairs by partition, partitions in ascending order."""
    groups: dict[int, list[T]] = defaultdict(list)
    for partition_id, item in items:
        groups[partition_id].append(item)
    return dict(sorted(groups.items()))


async def run(conn, sql: str, params: Sequence[dict]) -> list[tuple]:
    """Run `sql` (which returns rows) once per partition's parameters, pipelined: one
    round trip for all of them, each statement addressing one partition. The rows of
    every statement."""
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
