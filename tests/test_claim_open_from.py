"""The claim's lower bound on scheduled_at (runs/execution/fair_share.OpenFrom): the oldest day
that holds an open run. The probes leave out the day partitions before it, which hold
only finished runs."""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta

import pytest
from django.db import connection

from runs.day_partitions import maintain, partition_name
from runs.execution import claims, fair_share, queries
from runs.models import JobRunRow
from tests.support.executor import on_executor_connection, queue_runs, set_running, task_target

pytestmark = pytest.mark.django_db(transaction=True)


def today():
    return datetime.now(UTC).date()


def day_start(days_ago: int) -> datetime:
    return datetime.combine(today() - timedelta(days=days_ago), time(), tzinfo=UTC)


@pytest.fixture
def past_days():
    """Day partitions for the five days before today, dropped afterwards."""
    first = today()
    for back in range(5, 0, -1):
        maintain(days_ahead=0, retention_days=60, today=first - timedelta(days=back))
    yield
    with connection.cursor() as cursor:
        for back in range(1, 6):
            cursor.execute(f"DROP TABLE IF EXISTS {partition_name(first - timedelta(days=back))}")


def read_open_from() -> datetime | None:
    return on_executor_connection(fair_share.OpenFrom().get)


@pytest.mark.usefixtures("past_days")
def test_the_bound_is_the_oldest_day_with_an_open_run_and_yesterday_at_the_latest(tenant):
    assert read_open_from() == day_start(1)  # nothing open: yesterday
    (queued,) = queue_runs(tenant, task_target("noop"), start=day_start(3) + timedelta(hours=5))
    assert read_open_from() == day_start(3)
    set_running(queued)
    assert read_open_from() == day_start(3)  # a running run may still be retried
    JobRunRow.objects.filter(job_id=queued[0]).update(status="succeeded")
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


@pytest.mark.usefixtures("past_days")
def test_running_runs_older_than_a_stale_bound_still_count_against_the_cap():
    """The bound may be a second old: a run claimed meanwhile in an older day (by
    another executor, after a replay) still holds its tenant's only slot."""
    from jobs.tenant_services import create_tenant

    tenant, _ = create_tenant(slug="one-slot", max_concurrency=1)
    bound = read_open_from()
    (old,) = queue_runs(tenant, task_target("noop"), start=day_start(4))
    set_running(old)
    queue_runs(tenant, task_target("noop"))

    async def claim(conn):
        return await claims.claim_runs(conn, owner="me:1", limit=10, open_from=bound)

    assert bound == day_start(1)
    assert on_executor_connection(claim) == []


def test_the_bound_is_kept_for_a_second_unless_forgotten(monkeypatch):
    reads = []

    async def scenario(conn):
        open_from = fair_share.OpenFrom()
        reads.append(await open_from.get(conn))
        # A run of an older day would change nothing until the bound is read again.
        monkeypatch.setattr(queries, "OLDEST_OPEN_DAY", "SELECT NULL::timestamptz")
        reads.append(await open_from.get(conn))  # kept
        open_from.forget()  # a NOTIFY, or an empty claim
        reads.append(await open_from.get(conn))  # read again

    on_executor_connection(scenario)
    assert reads == [day_start(1), day_start(1), None]
