"""On Citus the executors keep the planner statistics of the shards, read from the
workers' own catalogs in one executor's turn (runs/execution/table_statistics.py): a
shard that holds rows its statistics do not describe is analyzed on its worker, once.

Skipped outside `make test-citus`.
"""

from __future__ import annotations

import contextlib
import json
import os
from datetime import UTC, datetime, time, timedelta

import pytest
from django.db import connection

from runs.day_partitions import maintain
from runs.execution import queries, table_statistics, turns
from runs.execution.table_statistics import keep_statistics
from tests.support.executor import on_executor_connection, queue_runs, task_target, wait_for

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not os.environ.get("CRONYARD_CITUS_WORKERS"), reason="a make test-citus test"),
]

# Days no other test in this database writes runs into: their shards start never analyzed.
# Past days: queuing a run there lowers its tenant's open floor, so the turn reads the day.
AGO_25_DAYS = datetime.combine(datetime.now(UTC).date() - timedelta(days=25), time(6), tzinfo=UTC)
AGO_24_DAYS = AGO_25_DAYS + timedelta(days=1)
AGO_23_DAYS = AGO_25_DAYS + timedelta(days=2)
IN_3_DAYS = datetime.combine(datetime.now(UTC).date() + timedelta(days=3), time(6), tzinfo=UTC)


@pytest.fixture(autouse=True)
def past_days():
    """The past days' partitions (a test database starts with today's and those ahead)."""
    maintain(days_ahead=2, retention_days=3650, today=AGO_25_DAYS.date())


def table_of(day: datetime) -> str:
    return f"job_runs_p{day:%Y%m%d}"


def sql(statement: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(statement)


@contextlib.contextmanager
def autovacuum_off(table: str):
    """The workers' autovacuum analyzing a shard first would leave the turn nothing to do.
    (Citus passes the setting on to the shards.)"""
    sql(f"ALTER TABLE {table} SET (autovacuum_enabled = off)")
    try:
        yield
    finally:
        sql(f"ALTER TABLE {table} RESET (autovacuum_enabled)")


def shards(table: str) -> dict[str, tuple[float, int]]:
    """The table's shards on every worker: {shard: (reltuples as the turn reads them, -1
    when never analyzed; n_live_tup)}, from each worker's own catalog and views."""
    with connection.cursor() as cursor:
        cursor.execute(queries.STATS_SHARDS, [queries.STATS_SHARDS_ON_WORKER])
        found = {}
        for _, _, reached, result in cursor.fetchall():
            assert reached, result
            for _, shard, rows_then, _, rows_now, _ in json.loads(result):
                if shard.rsplit("_", 1)[0] == table:
                    found[shard] = (rows_then, rows_now)
        return found


def set_floors(floor: datetime) -> None:
    """Every tenant's open floor at `floor`: the turn's days start at the lowest."""
    with connection.cursor() as cursor:
        cursor.execute("UPDATE tenants SET open_floor = %s", [floor])


def keep() -> tuple[str, ...]:
    """keep_statistics in a turn of its own: the turn is made due first (seconds 0 sets
    the next one to now), so that the call reads the workers whatever ran before."""
    with connection.cursor() as cursor:
        cursor.execute(queries.TAKE_TURN, {"task": turns.STATISTICS, "seconds": 0})
    return on_executor_connection(keep_statistics)


def fill(tenant, day: datetime, count: int) -> set[str]:
    """Queue `count` runs of `day`; the shards that hold them, once the workers' views
    count them."""
    queue_runs(tenant, task_target("noop"), count=count, start=day, spacing=timedelta(0))
    table = table_of(day)
    wait_for(
        lambda: sum(rows_now for _, rows_now in shards(table).values()) >= count,
        timeout=30,
        what="the workers' views counting the new rows",
    )
    holding = {shard for shard, (_, rows_now) in shards(table).items() if rows_now > 0}
    assert len(holding) > 1  # the runs' jobs hash to several shards
    return holding


def test_shards_whose_statistics_describe_no_row_are_analyzed_once_they_hold_rows(tenant):
    table = table_of(AGO_25_DAYS)
    with autovacuum_off(table):
        set_floors(AGO_25_DAYS)
        assert shards(table), f"no shard of {table} found on the workers"
        assert all(rows_then == -1 for rows_then, _ in shards(table).values())  # never analyzed
        assert table not in keep()  # no rows: nothing to describe

        holding = fill(tenant, AGO_25_DAYS, 300)
        assert table in keep()
        after = shards(table)
        assert all(after[shard][0] > 0 for shard in holding), after  # each has a histogram now
        assert all(after[shard][0] == -1 for shard in set(after) - holding)  # the empty ones: left alone
        assert sum(after[shard][0] for shard in holding) == pytest.approx(300, abs=1)

        # Described now, and not outgrown: later turns leave the day alone.
        assert table not in keep()
        assert table not in keep()

        # Analyzed empty in the pages its rows left (no VACUUM has truncated them): the
        # shards are as big as when analyzed, and hold nothing to describe.
        sql(f"DELETE FROM {table}")
        sql(f"ANALYZE {table}")
        assert all(rows_then == 0 for rows_then, _ in shards(table).values())
        assert table not in keep()
        assert table not in keep()


def test_a_shard_vacuumed_before_its_first_analyze_still_counts_as_undescribed(tenant):
    """VACUUM (and CREATE INDEX, as when Citus moves a shard) set a shard's row count
    without writing a histogram: the turn reads "never analyzed" from the views."""
    table = table_of(AGO_24_DAYS)
    with autovacuum_off(table):
        holding = fill(tenant, AGO_24_DAYS, 200)
        sql(f"VACUUM {table}")
        assert table in keep()
        assert all(shards(table)[shard][0] > 0 for shard in holding)
        assert table not in keep()


def test_the_turn_reads_the_days_from_the_lowest_open_floor_to_a_day_ahead(tenant):
    """Shards of other days hold no run a hot statement reads (runs/open_floors.py): the
    turn neither reads nor analyzes them, whatever their statistics say."""
    past, ahead = table_of(AGO_23_DAYS), table_of(IN_3_DAYS)
    with autovacuum_off(past), autovacuum_off(ahead):
        holding = fill(tenant, AGO_23_DAYS, 200)  # lowers the tenant's floor to the day
        sql(f"UPDATE job_runs SET status = 'succeeded' WHERE tenant_id = {tenant.id}")
        set_floors(datetime.now(UTC) - timedelta(days=1))  # as the upkeep raises them
        assert not shards(past)
        assert past not in keep()

        set_floors(AGO_23_DAYS)  # as a replay of one of them lowers it
        assert set(shards(past)) >= holding
        assert past in keep()

        queue_runs(tenant, task_target("noop"), count=50, start=IN_3_DAYS, spacing=timedelta(0))
        assert not shards(ahead)
        assert ahead not in keep()
        # A day ahead is in: a run may be claimed up to then (queries.AHEAD).
        assert shards(table_of(datetime.now(UTC) + timedelta(days=1)))


def test_one_executor_reads_the_workers_per_turn(tenant, monkeypatch):
    """Asked twice within one interval, only the first ask is a turn and reads the
    workers (the turn is one coordinator statement; the read visits every worker)."""
    monkeypatch.setattr(table_statistics, "SHARDS_EVERY_SECONDS", 60.0)

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
