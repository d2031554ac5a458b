"""Service writes racing a scheduler batch, and keys that must not collide.

The scheduler's dispatch transaction is reproduced on a second connection (lock the
job row, insert its run, advance next_run_at, do not commit yet) so the interleaving
is exact rather than hoped for.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from django.db import connection

from jobs import planning, services
from jobs.leases import conninfo_from_settings
from jobs.models import Job
from runs import partitions
from runs.models import JobRun
from runs.queue import enqueue_runs

TARGET = {"type": "task", "name": "noop", "kwargs": {}}


def make_job(tenant, **fields):
    fields = {"name": "j", "interval_seconds": 60, "target": TARGET, **fields}
    return services.create_job(tenant=tenant, **fields)


@pytest.mark.django_db(transaction=True)
def test_delete_during_a_scheduler_batch_leaves_no_run_behind(tenant):
    job = make_job(tenant)
    batch = psycopg.connect(conninfo_from_settings(connection.settings_dict))
    batch.execute("BEGIN")
    batch.execute("SELECT id FROM jobs WHERE id = %s FOR UPDATE SKIP LOCKED", [job.id])
    batch.execute(
        "INSERT INTO job_runs (job_id, scheduled_at, tenant_id, partition_id, status, not_before, target)"
        " VALUES (%s, %s, %s, %s, 'queued', now(), '{}'::jsonb)",
        [job.id, job.next_run_at, tenant.id, job.partition_id],
    )
    errors: list[Exception] = []

    def delete() -> None:
        from django.db import connection as own

        try:
            services.delete_job(job=job)
        except Exception as exc:
            errors.append(exc)
        finally:
            own.close()

    worker = threading.Thread(target=delete)
    worker.start()
    time.sleep(0.5)
    assert worker.is_alive(), "delete_job must wait for the batch holding the job row"
    batch.execute("COMMIT")
    batch.close()
    worker.join(10)
    assert errors == []
    assert not Job.objects.filter(pk=job.pk).exists()
    assert not JobRun.objects.filter(job_id=job.pk).exists()


@pytest.mark.django_db
def test_a_schedule_edit_keeps_interval_slots_on_whole_seconds(tenant):
    job = make_job(tenant)
    job = services.update_job(job=job, changes={"interval_seconds": 120})
    assert job.next_run_at.microsecond == 0


@pytest.mark.django_db
def test_a_manual_trigger_never_takes_a_scheduled_slot(tenant):
    job = make_job(tenant)
    slot = job.next_run_at
    manual = services.trigger_job(job=job, now=slot)
    assert manual != slot
    # The scheduler's insert of the real occurrence still goes in.
    assert enqueue_runs([planning.run_for(job, scheduled_at=slot, trigger="schedule")])


@pytest.mark.django_db
def test_two_triggers_in_one_microsecond_are_two_runs(tenant):
    job = make_job(tenant)
    at = datetime.now(UTC).replace(microsecond=123)
    first = services.trigger_job(job=job, now=at)
    second = services.trigger_job(job=job, now=at)
    assert first != second
    assert JobRun.objects.filter(job_id=job.pk, trigger="manual").count() == 2


@pytest.mark.django_db
def test_retention_keeps_days_and_rows_that_still_have_active_runs(tenant):
    job = make_job(tenant, interval_seconds=None, cron_expr="0 * * * *")
    today = datetime.now(UTC).date()
    midnight = datetime(today.year, today.month, today.day, tzinfo=UTC)
    queued_today = midnight + timedelta(hours=1)
    enqueue_runs([planning.run_for(job, scheduled_at=queued_today, trigger="backfill", overlap_check=False)])
    old = midnight - timedelta(days=45)
    enqueue_runs(
        [
            planning.run_for(job, scheduled_at=old, trigger="backfill", overlap_check=False),
            planning.run_for(
                job, scheduled_at=old + timedelta(hours=1), trigger="backfill", overlap_check=False
            ),
        ]
    )
    JobRun.objects.filter(job_id=job.pk, scheduled_at=old).update(status="succeeded")

    report = partitions.maintain(days_ahead=0, retention_days=30, today=today + timedelta(days=31))

    assert partitions.partition_name(today) not in report.dropped
    left = set(JobRun.objects.filter(job_id=job.pk).values_list("scheduled_at", flat=True))
    assert left == {queued_today, old + timedelta(hours=1)}
