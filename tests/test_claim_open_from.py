"""The claim's lower bound on scheduled_at (runs/claim_order.OpenFrom): the oldest day
that holds an open run. The probes leave out the day partitions before it, which hold
only finished runs."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, time, timedelta

import pytest
from django.db import connection

from runs import claim_order, claims, connections
from runs.partitions import maintain, partition_name
from tests.conftest import database_url
from tests.support.executor import queue_runs, row, set_running, task_target

pytestmark = pytest.mark.django_db(transaction=True)

TODAY = datetime.now(UTC).date()


def day_start(days_ago: int) -> datetime:
    return datetime.combine(TODAY - timedelta(days=days_ago), time(), tzinfo=UTC)


@pytest.fixture
def past_days():
    """Day partitions for the five days before today, dropped afterwards."""
    for back in range(5, 0, -1):
        maintain(days_ahead=0, retention_days=60, today=TODAY - timedelta(days=back))
    yield
    with connection.cursor() as cursor:
        for back in range(1, 6):
            cursor.execute(f"DROP TABLE IF EXISTS {partition_name(TODAY - timedelta(days=back))}")


def on_executor_connection(work):
    async def go():
        conn = await connections.connect_async(database_url())
        try:
            return await work(conn)
        finally:
            await conn.close()

    return asyncio.run(go())


def read_open_from() -> datetime | None:
    return on_executor_connection(claim_order.OpenFrom().get)


@pytest.mark.usefixtures("past_days")
def test_the_bound_is_the_oldest_day_with_an_open_run_and_yesterday_at_the_latest(tenant):
    assert read_open_from() == day_start(1)  # nothing open: yesterday
    (queued,) = queue_runs(tenant, task_target("noop"), start=day_start(3) + timedelta(hours=5))
    assert read_open_from() == day_start(3)
    set_running(queued)
    assert read_open_from() == day_start(3)  # a running run may still be retried
    type(row(queued)).objects.filter(job_id=queued[0]).update(status="succeeded")
    assert read_open_from() == day_start(1)


def test_an_open_run_in_the_default_partition_means_no_bound(tenant):
    # No partition holds that day: the row lands in the default partition.
    queue_runs(tenant, task_target("noop"), start=day_start(400))
    assert read_open_from() is None


@pytest.mark.usefixtures("past_days")
def test_a_claim_leaves_out_runs_before_the_bound_and_finds_them_once_it_is_read_again(tenant):
    (recent,) = queue_runs(tenant, task_target("noop"))
    bound = read_open_from()
    assert bound == day_start(1)
    # Queued in an older day after the bound was read (a replay, say).
    (old,) = queue_runs(tenant, task_target("noop"), start=day_start(4))

    async def claim(conn, open_from):
        return {
            (r.job_id, r.scheduled_at)
            for r in await claims.claim_runs(conn, owner="me:1", limit=10, open_from=open_from)
        }

    assert on_executor_connection(lambda conn: claim(conn, bound)) == {recent}
    fresh = read_open_from()
    assert fresh == day_start(4)
    assert on_executor_connection(lambda conn: claim(conn, fresh)) == {old}
