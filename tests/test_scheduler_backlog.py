"""A long outage must not wedge dispatch.

After a week of downtime every minutely job has 10k missed slots. Planning them
used to happen with the rows locked, outlived idle_in_transaction_session_timeout on
every batch and dispatched nothing, ever. These tests seed that backlog for real.
"""

from __future__ import annotations

import time
import uuid
from datetime import datetime, timedelta

import psycopg
import pytest
from django.db import connection

from jobs.dispatch import scheduler as scheduler_module
from jobs.dispatch.planning import MISFIRE_COUNT_CAP
from jobs.dispatch.scheduler import Scheduler
from jobs.models import Job, Misfire
from jobs.services import partition_for
from runs.models import JobRun
from tests.conftest import database_url
from tests.support.scheduler import TARGET

pytestmark = pytest.mark.django_db(transaction=True)

PARTITIONS = 8  # few partitions, so overdue and on-time jobs share every one of them


def db_now() -> datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


def seed(tenant, *, count: int, name: str, next_run_at: datetime, **fields) -> list[Job]:
    jobs = []
    for i in range(count):
        job_id = uuid.uuid4()
        jobs.append(
            Job(
                id=job_id,
                tenant=tenant,
                name=f"{name}{i}",
                target=TARGET,
                partition_id=partition_for(job_id) % PARTITIONS,
                next_run_at=next_run_at,
                **fields,
            )
        )
    return Job.objects.bulk_create(jobs, batch_size=1000)


@pytest.mark.processes
def test_a_week_of_downtime_drains_while_on_time_jobs_keep_firing(tenant, processes):
    now = db_now()
    week_ago = now.replace(second=0, microsecond=0) - timedelta(days=7)
    overdue = seed(tenant, count=300, name="late", next_run_at=week_ago, cron_expr="* * * * *")
    # On-time jobs in the same partitions, firing every 5 s from 3 s from now.
    on_time = seed(tenant, count=300, name="ok", next_run_at=now + timedelta(seconds=3), interval_seconds=5)
    proc = processes.start(
        "run_scheduler",
        env={"SCHEDULER_LEASE_SECONDS": "10", "SCHEDULER_PARTITIONS": str(PARTITIONS)},
    )
    late_ids = [j.id for j in overdue]
    ok_ids = [j.id for j in on_time]
    first_slot = now + timedelta(seconds=3)
    # The backlog can drain before the on-time jobs' first slot comes due, so wait
    # for both: nothing behind, and every on-time job's first slot dispatched.
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        behind = Job.objects.filter(id__in=late_ids, next_run_at__lte=db_now()).count()
        first_slots = JobRun.objects.filter(job_id__in=ok_ids, scheduled_at=first_slot).count()
        if behind == 0 and first_slots == 300:
            break
        assert proc.poll() is None, processes.log_of(proc)
        time.sleep(1)
    log = processes.log_of(proc)
    assert behind == 0, f"{behind} of 300 overdue jobs still behind after 90 s\n{log[-3000:]}"
    assert "idle-in-transaction" not in log

    # Each overdue job: exactly one catch-up run (run_once) and one misfire row.
    late_runs = JobRun.objects.filter(job_id__in=late_ids)
    assert late_runs.filter(trigger="catch_up").count() == 300
    assert late_runs.values("job_id").distinct().count() == 300
    misfires = Misfire.objects.filter(job_id__in=late_ids)
    assert misfires.count() == 300
    assert set(misfires.values_list("missed_count", "count_is_lower_bound").distinct()) == {
        (MISFIRE_COUNT_CAP, True)
    }

    # The on-time jobs kept firing meanwhile: every slot as a scheduled run, none
    # late enough to be a misfire, none missing from their start to the last dispatch.
    assert not Misfire.objects.filter(job_id__in=ok_ids).exists()
    ok_runs = list(
        JobRun.objects.filter(job_id__in=ok_ids).values_list("scheduled_at", "created_at", "trigger")
    )
    assert ok_runs and {t for _, _, t in ok_runs} == {"schedule"}
    worst = max(created - scheduled for scheduled, created, _ in ok_runs)
    assert worst < timedelta(seconds=30), f"on-time jobs were dispatched up to {worst} late"
    assert first_slots == 300


def test_thirty_days_of_a_five_minute_job_catch_up_is_bounded(tenant):
    now = db_now()
    month_ago = now.replace(minute=0, second=0, microsecond=0) - timedelta(days=30)
    (job,) = seed(
        tenant,
        count=1,
        name="ny",
        next_run_at=month_ago,
        cron_expr="*/5 * * * *",
        time_zone="America/New_York",
        misfire_policy="catch_up",
        max_catch_up=100,
    )
    sched = Scheduler(
        node_id="n1",
        conninfo=database_url(),
        heartbeat_thread=False,
        maintain_partitions=False,
        lease_seconds=10,
        partitions_count=PARTITIONS,
    )
    try:
        started = time.monotonic()
        while sched.step():
            pass
        assert time.monotonic() - started < 10
    finally:
        sched.close()
    slots = list(
        JobRun.objects.filter(job_id=job.id).order_by("scheduled_at").values_list("scheduled_at", "trigger")
    )
    assert slots == [(month_ago + k * timedelta(minutes=5), "catch_up") for k in range(100)]
    (m,) = Misfire.objects.filter(job=job)
    # 30 days of */5 is 8,640 slots (New York has no DST change between these dates
    # or one that shifts a whole hour of slots: either way far past the count cap).
    assert (m.runs_created, m.missed_count, m.count_is_lower_bound) == (100, MISFIRE_COUNT_CAP, True)
    job.refresh_from_db()
    assert job.next_run_at > db_now() - timedelta(minutes=5)


def test_a_killed_batch_halves_the_next_one_down_to_one(tenant, monkeypatch, caplog):
    """The server ends the dispatch transaction (as a timeout or an admin would): the
    next batch is half as large, and the work still gets done."""
    now = db_now()
    jobs = seed(tenant, count=40, name="j", next_run_at=now - timedelta(seconds=5), interval_seconds=3600)
    kills = {"left": 3}
    real_enqueue = scheduler_module.enqueue_runs

    def enqueue_then_maybe_die(runs):
        if kills["left"]:
            kills["left"] -= 1
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                pid = cursor.fetchone()[0]
            with psycopg.connect(database_url(), autocommit=True) as other:
                other.execute("SELECT pg_terminate_backend(%s::int, 10000)", [pid])
        return real_enqueue(runs)

    monkeypatch.setattr(scheduler_module, "enqueue_runs", enqueue_then_maybe_die)
    sched = Scheduler(
        node_id="n1",
        conninfo=database_url(),
        heartbeat_thread=False,
        maintain_partitions=False,
        lease_seconds=10,
        partitions_count=PARTITIONS,
        batch_size=16,
    )
    limits = []
    try:
        for _ in range(20):
            sched.lease.tick_now()
            sched.step()
            limits.append(sched.batch_limit)
            if not Job.objects.filter(next_run_at__lte=now).exists():
                break
    finally:
        sched.close()
    assert limits[:3] == [8, 4, 2]
    assert "the next batch takes at most 8 jobs" in caplog.text
    assert JobRun.objects.filter(job_id__in=[j.id for j in jobs]).count() == 40
    assert max(limits) <= 16 and limits[-1] > 2  # grew back after full batches
