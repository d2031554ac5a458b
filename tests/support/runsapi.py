"""Helpers for the runs API / dead-letter / admin / metrics tests: jobs made through the
job service, run rows written directly with their snapshot (no executor needed)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.utils import timezone

HTTP_TARGET = {
    "type": "http",
    "url": "https://hooks.example.com/run?token=abc123&team=blue",
    "method": "POST",
    "headers": {
        "Authorization": "Bearer very-secret",
        "X-Api-Key": "k-123",
        "Cookie": "session=s1",
        "X-Auth-Token": "t-1",
        "Content-Type": "application/json",
        "X-Team": "blue",
    },
    "body": '{"hello": "world"}',
    "timeout_seconds": 10,
}


def make_job(tenant, name: str = "nightly", **fields):
    from jobs.services import create_job

    fields.setdefault("interval_seconds", 3600)
    fields.setdefault("target", HTTP_TARGET)
    return create_job(tenant=tenant, fields=dict(name=name, **fields))


def make_run(job, scheduled_at: datetime, status: str = "queued", **fields):
    """A run row as the scheduler would write it, then moved to `status` as the executor would:
    a succeeded one into run_history. An open one lowers its tenant's open floor as every
    writer does (runs/open_floors.py). Returns the run as readers see it (JobRun)."""
    from django.db import connection, transaction

    from runs import history, open_floors
    from runs.models import ACTIVE_STATUSES, JobRun, JobRunRow

    values = {
        "job_id": job.id,
        "tenant_id": job.tenant_id,
        "scheduled_at": scheduled_at,
        "partition_id": job.partition_id,
        "status": status,
        "trigger": "schedule",
        "priority": job.priority,
        "not_before": scheduled_at,
        "target_version": job.target_version,
        "job_name": job.name,
        "overlap_policy": job.overlap_policy,
        "max_attempts": job.max_attempts,
    }
    values.update(fields)
    with transaction.atomic():
        if values["status"] in ACTIVE_STATUSES:
            with connection.cursor() as cursor:
                open_floors.lower(cursor, [(values["tenant_id"], scheduled_at)])
        row = JobRunRow.objects.create(**values)
        if values["status"] == "succeeded":
            with connection.cursor() as cursor:
                cursor.execute(
                    "WITH moved AS (DELETE FROM job_runs WHERE id = %s RETURNING *) "
                    + history.insert_sql("moved"),
                    [row.id],
                )
    return JobRun.objects.get(pk=row.pk)


def attempt_entry(n: int, outcome: str, code: int | None = 500, error: str = "HTTP 500") -> list:
    """A stored attempts entry (runs/attempts.py) of a call at 07:00 on 2026-03-08 that took 1 s."""
    from runs.attempts import AttemptRecord

    started = datetime(2026, 3, 8, 7, tzinfo=UTC)
    return AttemptRecord(
        attempt=n,
        owner="exec-1",
        started_at=started,
        finished_at=started + timedelta(seconds=1),
        duration_ms=1000.0,
        outcome=outcome,
        result_code=code,
        error=error,
        retry_in_s=None,
    ).to_stored()


def make_dead_run(job, scheduled_at: datetime, attempts: int = 3, **fields):
    history = [attempt_entry(n, "retry") for n in range(1, attempts)] + [attempt_entry(attempts, "dead")]
    fields.setdefault("finished_at", timezone.now())
    return make_run(
        job,
        scheduled_at,
        status="dead",
        attempt=attempts,
        attempts=history,
        result_code=500,
        last_error="HTTP 500",
        started_at=scheduled_at,
        **fields,
    )


def minute_slots(count: int, *, end: datetime | None = None, step: timedelta = timedelta(minutes=1)) -> list:
    """`count` whole-minute instants ending at `end` (default: the last whole minute)."""
    end = end or datetime.now(UTC).replace(second=0, microsecond=0)
    return [end - step * i for i in range(count)]
