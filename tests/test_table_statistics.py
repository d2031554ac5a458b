"""The executor's ANALYZE of tables that outgrew their statistics
(runs/table_statistics.py), on a real database and its own statistics views."""

from __future__ import annotations

import pytest
from django.db import connection

from runs.table_statistics import TableStatistics, analyze_if_called_empty, needs_analyze
from tests.support.executor import on_executor_connection, queue_runs, task_target, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def step(keeper: TableStatistics):
    return on_executor_connection(keeper.step)


def partition_of(key) -> str:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tableoid::regclass::text FROM job_runs WHERE job_id = %s AND scheduled_at = %s", list(key)
        )
        return cursor.fetchone()[0]


def reltuples(table: str) -> float:
    with connection.cursor() as cursor:
        cursor.execute("SELECT reltuples FROM pg_class WHERE oid = %s::regclass", [table])
        return cursor.fetchone()[0]


def test_the_rule_reacts_to_growth_not_to_churn():
    assert needs_analyze(changes=1000, rows_when_analyzed=-1, min_changes=1000)  # never analyzed
    assert needs_analyze(changes=5000, rows_when_analyzed=0, min_changes=1000)  # analyzed empty
    assert not needs_analyze(changes=999, rows_when_analyzed=0, min_changes=1000)  # autovacuum's
    # A table of a million rows with a tenth changed is autovacuum's business.
    assert not needs_analyze(changes=100_000, rows_when_analyzed=1_000_000, min_changes=1000)
    assert needs_analyze(changes=1_000_000, rows_when_analyzed=1_000_000, min_changes=1000)


def test_a_partition_that_outgrew_its_statistics_is_analyzed_and_plans_are_marked_stale(tenant):
    keeper, bystander = TableStatistics(min_changes=50), TableStatistics(min_changes=10**9)
    first = queue_runs(tenant, task_target("noop"), count=1)
    table = partition_of(first[0])
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {table}")  # its statistics now describe (about) one row
    assert reltuples(table) < 10
    assert not step(bystander).statistics_changed  # a first look has nothing to compare

    queue_runs(tenant, task_target("noop"), count=300)

    # The inserting session reports its changes within about a second of going idle.
    looks = []

    def analyzed_now() -> bool:
        looks.append(step(keeper))
        return table in looks[-1].analyzed

    wait_for(analyzed_now, timeout=15, what=f"{table} analyzed")
    assert looks[-1].statistics_changed
    assert reltuples(table) >= 301
    assert table not in step(keeper).analyzed  # its change count starts again from 0
    # Another executor (which analyzes nothing itself) learns its plans are stale, once.
    assert step(bystander).statistics_changed
    assert not step(bystander).statistics_changed


def test_changes_below_the_floor_are_left_to_autovacuum(tenant):
    keeper = TableStatistics(min_changes=10**9)
    queue_runs(tenant, task_target("noop"), count=100)
    for _ in range(3):
        assert step(keeper).analyzed == ()


def test_statistics_that_call_a_filled_partition_empty_are_corrected_at_once(tenant):
    # ANALYZE after a mass delete, before VACUUM truncates: "0 rows in these pages",
    # which the planner keeps believing however many rows arrive.
    keys = queue_runs(tenant, task_target("noop"), count=200)
    table = partition_of(keys[0])
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {table}")
        cursor.execute(f"ANALYZE {table}")
        cursor.execute("SELECT reltuples, relpages FROM pg_class WHERE oid = %s::regclass", [table])
        rows_then, pages_then = cursor.fetchone()
    assert rows_then == 0 and pages_then > 0
    assert on_executor_connection(analyze_if_called_empty) == ()  # it is empty: left alone

    queue_runs(tenant, task_target("noop"), count=200)
    # No wait for the statistics views: the catalog and the table itself are read.
    assert on_executor_connection(analyze_if_called_empty) == (table,)
    assert reltuples(table) >= 200
    assert on_executor_connection(analyze_if_called_empty) == ()
