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

from jobs import services
from jobs.dispatch import planning
from jobs.models import Job
from runs import day_partitions as partitions
from runs.enqueue import enqueue_runs
from runs.models import JobRun, JobRunRow
from scheduler_project import db

TARGET = {"type": "task", "name": "noop", "kwargs": {}}


def make_job(tenant, **fields):
    fields = {"name": "j", "interval_seconds": 60, "target": TARGET, **fields}
    return services.create_job(tenant=tenant, fields=fields)


@pytest.mark.django_db(transaction=True)
def test_delete_during_a_scheduler_batch_leaves_no_run_behind(tenant):
    job = make_job(tenant)
    batch = psycopg.connect(db.conninfo(connection.settings_dict))
    batch.execute("BEGIN")
    # A dispatch batch locks the job in its partition (one shard on Citus).
    batch.execute(
        "SELECT id FROM jobs WHERE partition_id = %s AND id = %s FOR UPDATE SKIP LOCKED",
        [job.partition_id, job.id],
    )
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
    JobRunRow.objects.filter(job_id=job.pk, scheduled_at=old).update(status="succeeded")

    report = partitions.maintain(days_ahead=0, retention_days=30, today=today + timedelta(days=31))

    assert partitions.partition_name(today) not in report.dropped
    left = set(JobRun.objects.filter(job_id=job.pk).values_list("scheduled_at", flat=True))
    assert left == {queued_today, old + timedelta(hours=1)}


def _waiting_on_a_lock(deadline_s: float = 60.0) -> bool:
    """Poll until some other backend of this database waits for a lock (no sleeps + timing)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
            )
            if cursor.fetchone()[0]:
                return True
        time.sleep(0.05)
    return False


def _in_thread(target, results: dict, key: str) -> threading.Thread:
    def run() -> None:
        from django.db import connection as own

        try:
            results[key] = target()
        except Exception as exc:  # surfaced by the test's assertions
            results[key] = exc
        finally:
            own.close()

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    return worker


@pytest.fixture
def restore_day_partitions(transactional_db):
    """These tests drop today's partition for real (committed DDL): put it back, as
    the migration made it, so a later test in the same worker finds what it expects."""
    yield
    partitions.maintain(days_ahead=7, retention_days=30)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("restore_day_partitions")
def test_retention_does_not_drop_a_day_whose_run_is_being_replayed(tenant):
    # Retention must not drop a day under a replay. A maintain() that checked "no active
    # run" and then dropped the day with no lock between did: a replay that had not
    # committed yet was invisible to the check, the DROP waited for it, and the freshly
    # queued run vanished with the day.
    from django.db import transaction

    from runs.services import replay_run

    job = make_job(tenant, interval_seconds=None, cron_expr="0 * * * *")
    today = datetime.now(UTC).date()
    slot = datetime(today.year, today.month, today.day, 1, tzinfo=UTC)
    enqueue_runs([planning.run_for(job, scheduled_at=slot, trigger="backfill", overlap_check=False)])
    JobRunRow.objects.filter(job_id=job.pk).update(status="dead")
    later = today + timedelta(days=31)
    # That day's partition exists already: creating it would itself wait for the replay
    # (CREATE ... PARTITION OF locks job_runs) and hide the race being tested.
    partitions.maintain(days_ahead=0, retention_days=10_000, today=later)
    replayed, release = threading.Event(), threading.Event()
    results: dict = {}

    def replay_and_hold():
        with transaction.atomic():
            run = replay_run(job_id=job.pk, scheduled_at=slot, actor="test")
            replayed.set()
            assert release.wait(120), "test never released the replay"
        return run.status

    replayer = _in_thread(replay_and_hold, results, "replay")
    assert replayed.wait(60)
    maintainer = _in_thread(
        lambda: partitions.maintain(days_ahead=0, retention_days=30, today=later, lock_timeout_ms=120_000),
        results,
        "maintain",
    )
    try:
        # Whatever retention does, it has to wait for the replay's transaction.
        assert _waiting_on_a_lock(), "maintain() should wait for the open replay"
    finally:
        release.set()
        replayer.join(60)
        maintainer.join(60)
    assert not replayer.is_alive() and not maintainer.is_alive()
    assert results["replay"] == "queued", results
    report = results["maintain"]
    assert not isinstance(report, Exception), report
    assert partitions.partition_name(today) not in report.dropped
    assert list(JobRun.objects.filter(job_id=job.pk).values_list("status", flat=True)) == ["queued"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("restore_day_partitions")
def test_retention_gives_up_on_a_busy_day_instead_of_blocking_job_runs(tenant):
    # DROP needs an ACCESS EXCLUSIVE lock on job_runs; waiting for it queues every
    # executor and scheduler query behind the DROP. A lock not granted within
    # lock_timeout_ms skips the day until the next maintenance run.
    job = make_job(tenant, interval_seconds=None, cron_expr="0 * * * *")
    today = datetime.now(UTC).date()
    slot = datetime(today.year, today.month, today.day, 1, tzinfo=UTC)
    enqueue_runs([planning.run_for(job, scheduled_at=slot, trigger="backfill", overlap_check=False)])
    JobRunRow.objects.filter(job_id=job.pk).update(status="succeeded")
    later = today + timedelta(days=31)
    partitions.maintain(days_ahead=0, retention_days=10_000, today=later)
    reader = psycopg.connect(db.conninfo(connection.settings_dict))
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM job_runs")  # a long read, e.g. a runs listing
    results: dict = {}
    maintainer = _in_thread(
        lambda: partitions.maintain(days_ahead=0, retention_days=30, today=later, lock_timeout_ms=200),
        results,
        "maintain",
    )
    try:
        maintainer.join(60)
        assert not maintainer.is_alive(), "maintain() must give up on the lock, not wait for the reader"
    finally:
        reader.execute("ROLLBACK")
        reader.close()
        maintainer.join(60)
    report = results["maintain"]
    assert not isinstance(report, Exception), report
    assert partitions.partition_name(today) not in report.dropped
    # Once the reader is gone the day goes at the next run.
    report = partitions.maintain(days_ahead=0, retention_days=30, today=later, lock_timeout_ms=200)
    assert partitions.partition_name(today) in report.dropped
    assert not JobRun.objects.filter(job_id=job.pk).exists()
