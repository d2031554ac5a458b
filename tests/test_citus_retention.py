"""Retention on a distributed job_runs: day partitions made after the table
was distributed are distributed with it, rows parked in the default partition move into
their new day, and an old day is dropped. On plain PostgreSQL the same calls do the
same to an ordinary partitioned table, so this file runs in both suites."""

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from jobs.dispatch.planning import run_for
from jobs.services import create_job
from runs.day_partitions import maintain, partition_name
from runs.enqueue import enqueue_runs
from runs.models import JobRun, JobRunRow
from scheduler_project.citus import citus_installed

pytestmark = pytest.mark.django_db


def colocation_of(*tables: str) -> dict[str, int | None]:
    """Citus co-location group of each table (None: not distributed; {} on plain PostgreSQL)."""
    with connection.cursor() as cursor:
        if not citus_installed(cursor):
            return {}
        cursor.execute(
            "SELECT t, p.colocationid FROM unnest(%s::text[]) AS t"
            " LEFT JOIN pg_dist_partition p ON p.logicalrelid = to_regclass(t)",
            [list(tables)],
        )
        return dict(cursor.fetchall())


def test_a_new_day_is_distributed_with_its_parent_and_takes_the_default_rows(tenant):
    job = create_job(
        tenant=tenant, fields=dict(name="r", interval_seconds=60, target={"type": "task", "name": "noop"})
    )
    slot = datetime.now(UTC).replace(microsecond=0) + timedelta(days=20)
    enqueue_runs([run_for(job, scheduled_at=slot, trigger="backfill", overlap_check=False)])

    report = maintain(days_ahead=21, retention_days=30)

    day = partition_name(slot.date())
    assert day in report.created and report.moved_rows == 1
    groups = colocation_of("jobs", "job_runs", day)
    if groups:  # Citus: the new day lives in the shards of its parent, next to the job
        assert groups[day] is not None and groups[day] == groups["jobs"] == groups["job_runs"]
    run = JobRun.objects.get(partition_id=job.partition_id, job=job, scheduled_at=slot)
    assert run.status == "queued"
    # The run key holds in the new day: a second insert of the slot is a no-op.
    assert enqueue_runs([run_for(job, scheduled_at=slot, trigger="backfill", overlap_check=False)]) == []


def test_an_old_day_is_dropped_and_a_busy_one_kept(tenant):
    job = create_job(
        tenant=tenant, fields=dict(name="r", interval_seconds=60, target={"type": "task", "name": "noop"})
    )
    today = datetime.now(UTC).date()
    midnight = datetime(today.year, today.month, today.day, tzinfo=UTC)
    done, busy = midnight + timedelta(hours=1), midnight + timedelta(days=1, hours=1)
    enqueue_runs(
        [run_for(job, scheduled_at=t, trigger="backfill", overlap_check=False) for t in (done, busy)]
    )
    JobRunRow.objects.filter(job=job, scheduled_at=done).update(status="succeeded")

    report = maintain(days_ahead=0, retention_days=30, today=today + timedelta(days=32))

    assert partition_name(today) in report.dropped
    assert partition_name(today + timedelta(days=1)) not in report.dropped  # its run is still queued
    assert list(JobRun.objects.filter(job=job).values_list("scheduled_at", flat=True)) == [busy]
