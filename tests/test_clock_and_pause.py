"""Slot decisions use the database's clock; pausing never drops undispatched slots silently.

The web host's clock is moved with time_machine (which
cannot move PostgreSQL's `now()`): every service must still decide on the database's.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.db import connection

from jobs import services
from jobs.models import Job, Misfire
from runs.models import JobRun
from tests.support.scheduler import make_job

pytestmark = pytest.mark.django_db

HOOK = {"type": "task", "name": "noop", "kwargs": {}}
MINUTE = timedelta(minutes=1)


def db_now() -> datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


@pytest.fixture
def web_clock_two_days_behind():
    with time_machine.travel(datetime.now(UTC) - timedelta(days=2), tick=True):
        yield


def test_create_and_edit_anchor_on_the_database_clock(tenant, web_clock_two_days_behind):
    now = db_now()
    job = services.create_job(tenant=tenant, fields=dict(name="hourly", cron_expr="0 * * * *", target=HOOK))
    assert now < job.next_run_at <= now + timedelta(hours=1)
    job = services.update_job(job=job, changes={"cron_expr": "30 * * * *"})
    assert now < job.next_run_at <= now + timedelta(hours=1)


def test_resume_moves_past_the_database_now(tenant, web_clock_two_days_behind):
    now = db_now()
    job = make_job(tenant, next_run_at=now - 30 * MINUTE, paused=True)
    job = services.resume_job(job=job)
    # On the web host's clock (two days ago) the old slot would still be in the future.
    assert now < job.next_run_at <= now + MINUTE


def test_backfill_judges_the_future_on_the_database_clock(tenant, web_clock_two_days_behind):
    now = db_now()
    job = make_job(tenant, next_run_at=now + MINUTE, cron_expr="0 * * * *")
    end = now.replace(minute=0, second=0, microsecond=0)
    _, slots = services.backfill_job(job=job, start=end - timedelta(hours=2), end=end)
    assert slots == [end - timedelta(hours=2), end - timedelta(hours=1), end]


def test_pause_records_slots_a_scheduler_never_reached(api, tenant):
    """Scheduler down for 10.5 minutes, the operator pauses, then resumes without catch_up."""
    now = db_now()
    first = now.replace(second=0, microsecond=0) - 10 * MINUTE
    job = make_job(tenant, next_run_at=first, misfire_policy="run_once")
    assert api.post(f"/api/v1/jobs/{job.id}/pause").status_code == 200
    (m,) = Misfire.objects.filter(job=job)
    assert (m.policy, m.runs_created, m.first_missed_at, m.count_is_lower_bound) == ("skip", 0, first, False)
    assert m.missed_count in (11, 12)  # the minute may turn during the test
    assert m.last_missed_at == first + (m.missed_count - 1) * MINUTE
    job.refresh_from_db()
    assert job.paused and job.next_run_at > now

    assert api.post(f"/api/v1/jobs/{job.id}/resume", {}, format="json").status_code == 200
    assert not JobRun.objects.filter(job_id=job.id).exists()
    listed = api.get(f"/api/v1/jobs/{job.id}/misfires/").json()
    items = listed["results"] if isinstance(listed, dict) else listed
    assert [i["missed_count"] for i in items] == [m.missed_count]


def test_pause_then_resume_catch_up_does_not_fire_pre_pause_slots_twice(api, tenant):
    now = db_now()
    first = now.replace(second=0, microsecond=0) - 10 * MINUTE
    job = make_job(tenant, next_run_at=first, misfire_policy="run_once")
    api.post(f"/api/v1/jobs/{job.id}/pause")
    api.post(f"/api/v1/jobs/{job.id}/resume", {"catch_up": "all"}, format="json")
    # Paused for milliseconds: at most the one slot of a minute turning meanwhile.
    assert JobRun.objects.filter(job_id=job.id).count() <= 1
    assert Misfire.objects.filter(job=job).count() == 1


def test_pausing_an_on_time_job_records_nothing(api, tenant):
    job = make_job(tenant, next_run_at=db_now() + MINUTE)
    api.post(f"/api/v1/jobs/{job.id}/pause")
    assert not Misfire.objects.filter(job=job).exists()
    assert Job.objects.get(pk=job.pk).paused
