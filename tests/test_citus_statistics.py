"""On Citus the executors keep the planner statistics of the shards (the "undescribed",
"called empty" and "outgrown" rules of runs/execution/table_statistics.py, applied to
each worker's shards in one executor's turn), read from the workers' own catalogs.

Skipped outside `make test-citus`.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, time, timedelta

import pytest
from django.db import connection

from runs.execution import queries, turns
from runs.execution.table_statistics import keep_statistics
from tests.support.executor import on_executor_connection, queue_runs, task_target, wait_for

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not os.environ.get("CRONYARD_CITUS_WORKERS"), reason="a make test-citus test"),
]

# A day no other test in this database writes runs into: its shards start never analyzed.
DAY = datetime.combine(datetime.now(UTC).date() + timedelta(days=3), time(6), tzinfo=UTC)
TABLE = f"job_runs_p{DAY:%Y%m%d}"


def shards() -> dict[str, tuple[float, int]]:
    """The day partition's shards on every worker: {shard: (reltuples, n_live_tup)}, as
    each worker's own catalog and statistics views say."""
    with connection.cursor() as cursor:
        cursor.execute(queries.STATS_SHARDS, [queries.STATS_SHARDS_ON_WORKER])
        found = {}
        for _, _, reached, result in cursor.fetchall():
            assert reached, result
            for shard, rows_then, _, rows_now, _ in json.loads(result):
                if shard.rsplit("_", 1)[0] == TABLE:
                    found[shard] = (rows_then, rows_now)
        return found


def keep() -> tuple[str, ...]:
    """keep_statistics in a turn of its own: the turn is made due first (seconds 0 sets
    the next one to now), so that the call reads the workers whatever ran before."""
    with connection.cursor() as cursor:
        cursor.execute(queries.TAKE_TURN, {"task": turns.STATISTICS, "seconds": 0})
    return on_executor_connection(keep_statistics)


def test_shards_whose_statistics_describe_no_row_are_analyzed_once_they_hold_rows(tenant):
    assert shards(), f"no shard of {TABLE} found on the workers"
    assert all(rows_then <= 0 for rows_then, _ in shards().values())  # never analyzed
    assert TABLE not in keep()  # no rows: nothing to describe

    queue_runs(tenant, task_target("noop"), count=300, start=DAY, spacing=timedelta(0))
    # The workers' statistics views count the inserting sessions' rows within seconds.
    wait_for(
        lambda: sum(rows_now for _, rows_now in shards().values()) >= 300,
        timeout=30,
        what="the workers' views counting the new rows",
    )
    holding = {shard for shard, (_, rows_now) in shards().items() if rows_now > 0}
    assert len(holding) > 1  # the runs' jobs hash to several shards

    assert TABLE in keep()
    after = shards()
    assert all(after[shard][0] > 0 for shard in holding), after  # each has a histogram now
    assert all(after[shard][0] <= 0 for shard in set(after) - holding)  # the empty ones: left alone
    assert sum(after[shard][0] for shard in holding) == pytest.approx(300, abs=1)

    # Described now, and not outgrown: later turns leave the day alone.
    assert TABLE not in keep()
    assert TABLE not in keep()


def test_one_executor_reads_the_workers_per_turn(tenant):
    """Asked twice within one interval, only the first ask is a turn and reads the
    workers (the turn is one coordinator statement; the read visits every worker)."""

    async def twice(conn) -> int:
        reads = []
        real = conn.execute

        async def counting(query, *args, **kwargs):
            if query is queries.STATS_SHARDS:
                reads.append(query)
            return await real(query, *args, **kwargs)

        conn.execute = counting
        await real(queries.TAKE_TURN, {"task": turns.STATISTICS, "seconds": 0})
        await keep_statistics(conn)
        await keep_statistics(conn)
        return len(reads)

    assert on_executor_connection(twice) == 1
