"""Start jitter: stable per-slot offsets inside [0, jitter_seconds], field-level 400s for
jitter beyond the schedule's shortest gap, the window in previews, and real processes:
a dispatched run's not_before is its slot plus the offset and no executor starts it earlier."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from urllib.parse import urlencode

import pytest

from jobs import services
from jobs.models import Job
from jobs.schedule import jitter
from jobs.schedule.jitter import offset
from runs.models import JobRun
from tests.support.executor import wait_for
from tests.support.scheduler import make_job

JOBS = "/api/v1/jobs/"
JOB_ID = uuid.UUID("3f1d0c3e-8a39-4d4e-9b53-2d6a7f0f4c11")
TARGET = {"type": "task", "name": "noop", "kwargs": {}}


def test_ten_thousand_slots_have_stable_offsets_inside_the_window_roughly_uniform():
    window = 600
    first = datetime(2026, 1, 1, tzinfo=UTC)
    slots = [first + timedelta(hours=k) for k in range(10_000)]
    offsets = [offset(job_id=JOB_ID, scheduled_at=s, jitter_seconds=window) for s in slots]
    assert all(timedelta(0) <= o <= timedelta(seconds=window) for o in offsets)
    # Stable: a second computation (another node, a later batch) gives the same offsets.
    assert offsets == [offset(job_id=JOB_ID, scheduled_at=s, jitter_seconds=window) for s in slots]
    # Roughly uniform: 20 buckets of 30 s hold ~500 each (sd ~22); chi-square with 19
    # degrees of freedom is below 60 except with probability ~3e-6.
    buckets = [0] * 20
    for o in offsets:
        buckets[min(int(o.total_seconds() // 30), 19)] += 1
    assert all(350 <= n <= 650 for n in buckets), buckets
    chi2 = sum((n - 500) ** 2 / 500 for n in buckets)
    assert chi2 < 60, (chi2, buckets)
    # Not one offset for all slots of a job, and another job gets other offsets.
    assert len(set(offsets)) > 9_000
    other = [offset(job_id=uuid.uuid4(), scheduled_at=s, jitter_seconds=window) for s in slots[:100]]
    assert other != offsets[:100]


def test_zero_jitter_is_no_offset():
    assert offset(
        job_id=JOB_ID, scheduled_at=datetime(2026, 1, 1, tzinfo=UTC), jitter_seconds=0
    ) == timedelta(0)


def test_shortest_gap_of_interval_and_cron():
    now = datetime(2026, 3, 1, tzinfo=UTC)
    common = {"timezone": "UTC", "job_id": None, "now": now}
    assert jitter.shortest_gap(cron=None, interval_seconds=90, **common) == 90
    assert jitter.shortest_gap(cron="*/5 * * * *", interval_seconds=None, **common) == 300
    # 09:00 and 09:10 every day: the shortest gap is the 10 minutes, not the 23h50.
    assert jitter.shortest_gap(cron="0,10 9 * * *", interval_seconds=None, **common) == 600
    assert jitter.shortest_gap(cron=None, interval_seconds=None, **common) is None  # one-time job


def body(**fields) -> dict:
    return {"name": "j", "interval_seconds": 300, "target": TARGET, **fields}


@pytest.mark.parametrize(
    "payload",
    [
        body(jitter_seconds=301),  # more than the interval
        body(interval_seconds=None, cron="*/5 * * * *", jitter_seconds=301),  # more than the cron gap
        body(interval_seconds=None, cron="0,10 9 * * *", jitter_seconds=601),
        body(jitter_seconds=-1),
        body(jitter_seconds="30"),
        body(jitter_seconds=True),
        body(jitter_seconds=1.5),
        body(jitter_seconds=None),
        body(interval_seconds=None, run_at="2099-01-01T00:00:00Z", jitter_seconds=86_401),
    ],
)
def test_bad_jitter_is_a_400_naming_the_field(api, payload):
    response = api.post(JOBS, payload, format="json")
    assert response.status_code == 400, response.content
    assert "jitter_seconds" in response.json(), response.json()
    assert response.json()["jitter_seconds"] != ["Unknown field."]  # judged, not just unknown
    assert not Job.objects.exists()  # nothing half-written


def test_jitter_up_to_the_gap_is_accepted_and_shown(api):
    response = api.post(JOBS, body(jitter_seconds=300), format="json")
    assert response.status_code == 201, response.content
    assert response.json()["jitter_seconds"] == 300
    response = api.post(
        JOBS, body(interval_seconds=None, cron="0 * * * *", jitter_seconds=3600), format="json"
    )
    assert response.status_code == 201, response.content
    assert api.post(JOBS, body(), format="json").json()["jitter_seconds"] == 0


def test_shortening_the_schedule_under_a_jitter_is_refused(api):
    job = api.post(JOBS, body(interval_seconds=3600, jitter_seconds=1800), format="json").json()
    response = api.patch(f"{JOBS}{job['id']}/", {"interval_seconds": 600}, format="json")
    assert response.status_code == 400 and "jitter_seconds" in response.json(), response.content
    response = api.patch(
        f"{JOBS}{job['id']}/", {"interval_seconds": 600, "jitter_seconds": 600}, format="json"
    )
    assert response.status_code == 200, response.content


def test_previews_show_the_start_window(api):
    query = {"cron": "0 9 * * *", "timezone": "Europe/Berlin", "after": "2026-06-01T00:00:00Z", "count": 2}
    response = api.get(f"/api/v1/schedules/preview?{urlencode({**query, 'jitter_seconds': 30})}")
    assert response.status_code == 200, response.content
    first = response.json()["fire_times"][0]
    assert first["utc"] == "2026-06-01T07:00:00Z"  # the slot itself does not move
    assert first["note"] == "starts 09:00:00\u201309:00:30"
    too_much = api.get(f"/api/v1/schedules/preview?{urlencode({**query, 'jitter_seconds': 86_401})}")
    assert too_much.status_code == 400 and "jitter_seconds" in too_much.json()
    hourly = {**query, "cron": "0 * * * *", "jitter_seconds": 3601}
    over_gap = api.get(f"/api/v1/schedules/preview?{urlencode(hourly)}")
    assert over_gap.status_code == 400 and "jitter_seconds" in over_gap.json()

    job = api.post(
        JOBS, body(interval_seconds=None, cron="0 9 * * *", jitter_seconds=90), format="json"
    ).json()
    notes = [t["note"] for t in api.get(f"{JOBS}{job['id']}/preview?count=3").json()["fire_times"]]
    assert notes == ["starts 09:00:00\u201309:01:30"] * 3


def test_manual_runs_and_backfills_start_at_once(tenant):
    """Operator-requested runs are not delayed: only schedule and catch-up runs are jittered."""
    job = services.create_job(
        tenant=tenant, fields=dict(name="j", interval_seconds=3600, target=TARGET, jitter_seconds=3600)
    )
    before = datetime.now(UTC)
    slot = services.trigger_job(job=job)
    run = JobRun.objects.get(job_id=job.id, scheduled_at=slot)
    assert run.not_before - before < timedelta(seconds=30)


@pytest.mark.processes
@pytest.mark.django_db(transaction=True)
def test_dispatched_run_starts_at_its_offset_not_earlier(processes, tenant):
    slot = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=1)
    # A job id whose offset for this slot is 10..25 s: long enough to see the executor
    # leave the queued run alone, short enough for the test.
    job_id = next(
        i
        for i in iter(uuid.uuid4, None)
        if 10 <= offset(job_id=i, scheduled_at=slot, jitter_seconds=60).total_seconds() <= 25
    )
    expected = slot + offset(job_id=job_id, scheduled_at=slot, jitter_seconds=60)
    make_job(tenant, id=job_id, next_run_at=slot, interval_seconds=3600, jitter_seconds=60)
    processes.start("run_executor")
    processes.start("run_scheduler")

    run = wait_for(lambda: JobRun.objects.filter(job_id=job_id).first(), timeout=60, what="the dispatch")
    assert run.scheduled_at == slot  # the run key stays on the slot
    assert run.trigger in ("schedule", "catch_up")
    assert run.not_before == expected
    assert run.created_at < expected - timedelta(seconds=2), "dispatched too late to prove anything"
    done = wait_for(
        lambda: JobRun.objects.filter(job_id=job_id, status="succeeded").first(),
        timeout=120,
        what="the jittered run to succeed",
    )
    assert done.started_at >= expected
    assert JobRun.objects.filter(job_id=job_id).count() == 1
