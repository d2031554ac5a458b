"""The executor's ANALYZE of tables whose planner statistics are out of date
(runs/execution/table_statistics.py), on a real database and its own statistics views."""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime, time

import psycopg
import pytest
from django.db import connection

from runs.execution.table_statistics import (
    analyze_if_called_empty,
    keep_statistics,
    outgrown,
    understated,
    undescribed,
)
from tests.conftest import database_url
from tests.support.executor import day_partition_of, on_executor_connection, queue_runs, task_target, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

# Runs at a fixed hour of today, so that they share today's partition at any time of day.
TODAY_6AM = datetime.combine(datetime.now(UTC).date(), time(6), tzinfo=UTC)


def queue(tenant, count: int) -> str:
    """Queue `count` runs (each of its own job) in today's partition; the partition."""
    return day_partition_of(queue_runs(tenant, task_target("noop"), count=count, start=TODAY_6AM)[0])


def sql(statement: str, params=()):
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchone() if cursor.description else None


@contextlib.contextmanager
def autovacuum_off(table: str):
    """Autovacuum's own ANALYZE or truncation in the middle would change what is tested."""
    sql(f"ALTER TABLE {table} SET (autovacuum_enabled = off)")
    try:
        yield
    finally:
        sql(f"ALTER TABLE {table} RESET (autovacuum_enabled)")


def test_the_rules():
    assert outgrown(rows_when_analyzed=-1, rows_now=1000, min_rows=1000)  # never analyzed
    assert outgrown(rows_when_analyzed=0, rows_now=5000, min_rows=1000)
    assert not outgrown(rows_when_analyzed=0, rows_now=999, min_rows=1000)  # autovacuum's
    assert not outgrown(rows_when_analyzed=1_000_000, rows_now=1_900_000, min_rows=1000)
    assert outgrown(rows_when_analyzed=1_000_000, rows_now=2_000_000, min_rows=1000)
    # A table that shrank is left alone: analyzing it now is what calls it empty.
    assert not outgrown(rows_when_analyzed=20_000, rows_now=0, min_rows=1000)
    assert understated(rows_when_analyzed=0, pages_when_analyzed=400, rows_now=400)
    assert understated(rows_when_analyzed=3, pages_when_analyzed=400, rows_now=20_000)
    assert not understated(rows_when_analyzed=3, pages_when_analyzed=400, rows_now=3)  # still empty
    assert not understated(rows_when_analyzed=-1, pages_when_analyzed=0, rows_now=20_000)  # sized
    assert not understated(rows_when_analyzed=20_000, pages_when_analyzed=400, rows_now=20_000)
    # Citus shards: statistics of no row (no histogram) while rows are there.
    assert undescribed(rows_when_analyzed=-1, pages_when_analyzed=0, rows_now=1, pages_now=1)
    assert undescribed(rows_when_analyzed=0, pages_when_analyzed=0, rows_now=150, pages_now=4)
    # The file grew though the views do not count the rows yet.
    assert undescribed(rows_when_analyzed=0, pages_when_analyzed=0, rows_now=0, pages_now=4)
    assert not undescribed(rows_when_analyzed=-1, pages_when_analyzed=0, rows_now=0, pages_now=0)  # empty
    # Analyzed empty in pages its dead rows left: no growth, nothing counted yet.
    assert not undescribed(rows_when_analyzed=0, pages_when_analyzed=40, rows_now=0, pages_now=40)
    # Statistics of a row: the outgrown rule's business.
    assert not undescribed(rows_when_analyzed=1, pages_when_analyzed=1, rows_now=150, pages_now=4)


def test_statistics_that_call_a_filled_partition_empty_are_corrected_before_a_claim(tenant):
    table = queue(tenant, 200)
    with autovacuum_off(table):
        # ANALYZE after a mass delete, before VACUUM truncates: "no rows in these pages",
        # which the planner keeps believing however many rows arrive.
        sql(f"DELETE FROM {table}")
        sql(f"ANALYZE {table}")
        rows_then, pages_then = sql("SELECT reltuples, relpages FROM pg_class WHERE relname = %s", [table])
        assert rows_then == 0 and pages_then > 0
        assert on_executor_connection(analyze_if_called_empty) == ()  # it is empty: left alone
        queue(tenant, 1)
        assert on_executor_connection(analyze_if_called_empty) == ()  # nearly: still left alone

        queue(tenant, 200)  # reuses the dead rows' pages: more than a row a page
        # No wait for the statistics views: the catalog and the table itself are read.
        assert on_executor_connection(analyze_if_called_empty) == (table,)
        assert sql("SELECT reltuples FROM pg_class WHERE oid = %s::regclass", [table])[0] >= 200
        assert on_executor_connection(analyze_if_called_empty) == ()


def test_job_targets_called_empty_are_corrected_before_a_claim(tenant):
    """The claim joins each run's target version: job_targets' statistics calling it
    empty (all jobs deleted, then new ones) made claims 15-19 times slower until
    autovacuum looked again."""
    queue(tenant, 200)  # each run's job gets its target version
    with autovacuum_off("job_targets"):
        sql("DELETE FROM job_targets")
        sql("ANALYZE job_targets")
        rows_then, pages_then = sql("SELECT reltuples, relpages FROM pg_class WHERE relname = 'job_targets'")
        assert rows_then == 0 and pages_then > 0
        assert "job_targets" not in on_executor_connection(analyze_if_called_empty)

        queue(tenant, 200)  # new jobs' versions, in the pages the deleted ones left
        assert "job_targets" in on_executor_connection(analyze_if_called_empty)
        assert sql("SELECT reltuples FROM pg_class WHERE relname = 'job_targets'")[0] >= 200
        assert "job_targets" not in on_executor_connection(analyze_if_called_empty)


def live_rows(table: str) -> int:
    return sql("SELECT n_live_tup FROM pg_stat_user_tables WHERE relid = %s::regclass", [table])[0]


def live_rows_reported(table: str, at_least: int) -> None:
    """Wait until the statistics views count the inserting session's rows (PostgreSQL
    flushes them within a second while the session is busy, ten when it is idle)."""
    wait_for(lambda: live_rows(table) >= at_least, timeout=30, what=f"{at_least} rows of {table}")


def keep(min_rows: int) -> tuple[str, ...]:
    return on_executor_connection(lambda conn: keep_statistics(conn, min_rows=min_rows))


def test_a_partition_that_outgrew_its_statistics_is_analyzed_once(tenant):
    table = queue(tenant, 1)
    with autovacuum_off(table):
        sql(f"ANALYZE {table}")  # its statistics describe one row
        queue(tenant, 300)
        live_rows_reported(table, 301)
        # While another session holds a lock ANALYZE needs (autovacuum, a partition
        # change), it is skipped, and not reported as done.
        with psycopg.connect(database_url()) as other:
            other.execute(f"LOCK TABLE {table} IN SHARE UPDATE EXCLUSIVE MODE")
            assert table not in keep(min_rows=50)
        assert table in keep(min_rows=50)
        assert sql("SELECT reltuples FROM pg_class WHERE oid = %s::regclass", [table])[0] >= 301
        assert table not in keep(min_rows=50)  # 301 rows, analyzed at 301


def test_growth_below_the_floor_and_deletes_are_left_to_autovacuum(tenant):
    table = queue(tenant, 1)
    with autovacuum_off(table):
        sql(f"ANALYZE {table}")
        queue(tenant, 100)
        live_rows_reported(table, 101)
        assert table not in keep(min_rows=10**9)
        assert table in keep(min_rows=50)
        sql(f"DELETE FROM {table}")
        wait_for(
            lambda: (
                sql("SELECT n_live_tup FROM pg_stat_user_tables WHERE relid = %s::regclass", [table])[0] == 0
            ),
            timeout=30,
            what=f"{table}'s deletes reported",
        )
        assert table not in keep(min_rows=50)  # an ANALYZE now would call it empty
        assert sql("SELECT reltuples FROM pg_class WHERE oid = %s::regclass", [table])[0] >= 101
