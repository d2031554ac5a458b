"""Job API happy paths: create/list/detail/patch/delete, actions, trailing slashes, schema."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import requests
from rest_framework.test import APIClient

from jobs.dispatch.planning import run_for
from jobs.models import Job
from runs.enqueue import enqueue_runs
from runs.keys import format_utc, parse_utc
from runs.models import JobRun, JobRunRow
from runs.selectors import target_of
from tests.support import clock

JOBS = "/api/v1/jobs/"
HOOK = {"type": "http", "url": "https://example.com/hook"}
ROOT = Path(__file__).resolve().parent.parent


def create(api, **fields) -> dict:
    payload = {"name": "job", "target": HOOK, **fields}
    response = api.post(JOBS, payload, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def travel(moment: str):
    return clock.travel(moment)


def test_cron_job_in_new_york_before_spring_forward_fires_at_0700z(api):
    with travel("2026-03-07T12:00:00Z"):
        job = create(api, cron="30 2 * * *", timezone="America/New_York")
    # 02:30 does not exist on 2026-03-08 in New York: it fires at 03:00 EDT = 07:00Z.
    assert job["next_run_at"] == "2026-03-08T07:00:00Z"
    assert job["trigger_type"] == "cron"
    assert job["cron"] == "30 2 * * *"
    assert job["timezone"] == "America/New_York"
    assert job["interval_seconds"] is None and job["run_at"] is None
    assert "02:30" in job["schedule_description"] and "America/New_York" in job["schedule_description"]
    stored = Job.objects.get(pk=job["id"])
    assert stored.cron_expr == "30 2 * * *" and stored.time_zone == "America/New_York"
    assert job["partition_id"] == stored.partition_id
    assert job["created_at"].endswith("Z") and job["updated_at"].endswith("Z")
    assert job["misfires"] == {"count": 0, "url": f"/api/v1/jobs/{job['id']}/misfires/"}


def test_defaults_follow_the_design(api):
    job = create(api, cron="@daily")
    assert job["timezone"] == "UTC"
    assert job["misfire_policy"] == "run_once"
    assert job["max_catch_up"] == 100
    assert job["overlap_policy"] == "skip"
    assert job["max_attempts"] == 5
    assert job["retry_backoff_seconds"] == 10
    assert job["retry_backoff_cap_seconds"] == 3600
    assert job["lease_seconds"] == 30
    assert job["priority"] == 0
    assert job["paused"] is False
    assert job["target"] == {
        "type": "http",
        "url": "https://example.com/hook",
        "method": "POST",
        "headers": {},
        "body": None,
        "timeout_seconds": 30,
    }


def test_interval_job_is_anchored_at_creation(api):
    with travel("2026-05-01T10:00:00Z"):
        job = create(api, interval_seconds=900)
    assert job["next_run_at"] == "2026-05-01T10:15:00Z"
    assert job["trigger_type"] == "interval"
    assert job["schedule_description"] == "Every 15 minutes"
    assert job["cron"] is None


def test_interval_job_with_start_at_first_fires_at_start(api):
    with travel("2026-05-01T10:00:00Z"):
        job = create(api, interval_seconds=60, start_at="2026-05-02T00:00:00+02:00")
    assert job["start_at"] == "2026-05-01T22:00:00Z"
    assert job["next_run_at"] == "2026-05-01T22:00:00Z"


def test_run_at_job_accepts_any_offset_and_answers_in_utc(api):
    with travel("2026-05-01T10:00:00Z"):
        job = create(
            api,
            run_at="2026-06-01T09:30:00.250000+05:30",
            target={"type": "task", "name": "echo", "kwargs": {"a": 1}},
        )
    assert job["run_at"] == "2026-06-01T04:00:00.250000Z"
    assert job["next_run_at"] == "2026-06-01T04:00:00.250000Z"
    assert job["trigger_type"] == "run_at"
    # A task target without timeout_seconds gets the default of 300 s, like HTTP's 30 s.
    assert job["target"] == {
        "type": "task",
        "name": "echo",
        "kwargs": {"a": 1},
        "timeout_seconds": 300,
    }


def test_task_target_timeout_is_kept(api):
    target = {"type": "task", "name": "noop", "kwargs": {}, "timeout_seconds": 3600}
    job = create(api, interval_seconds=60, target=target)
    assert job["target"] == target


def test_http_target_fields_are_kept(api):
    target = {
        "type": "http",
        "url": "https://example.com/x",
        "method": "put",
        "headers": {"X-Token": "abc"},
        "body": {"hello": ["world"]},
        "timeout_seconds": 300,
    }
    job = create(api, cron="* * * * *", target=target)
    # X-Token's value is write-only: stored as given, shown as "***".
    assert job["target"] == {**target, "method": "PUT", "headers": {"X-Token": "***"}}
    assert Job.objects.get(pk=job["id"]).target["headers"] == {"X-Token": "abc"}
    assert Job.objects.get(pk=job["id"]).target["method"] == "PUT"


def test_list_detail_filters_and_pagination(api):
    a = create(api, name="Alpha nightly", cron="0 0 * * *")
    b = create(api, name="beta hourly", cron="0 * * * *", paused=True)
    c = create(api, name="gamma NIGHTLY", interval_seconds=60)
    listed = api.get(JOBS).json()
    assert {j["id"] for j in listed["results"]} == {a["id"], b["id"], c["id"]}
    assert listed["next"] is None
    page = api.get(f"{JOBS}?limit=2").json()
    assert len(page["results"]) == 2 and page["next"]
    rest = api.get(page["next"]).json()
    assert len(rest["results"]) == 1
    assert {j["id"] for j in page["results"] + rest["results"]} == {a["id"], b["id"], c["id"]}
    assert [j["id"] for j in api.get(f"{JOBS}?paused=true").json()["results"]] == [b["id"]]
    assert {j["id"] for j in api.get(f"{JOBS}?paused=false").json()["results"]} == {a["id"], c["id"]}
    assert {j["id"] for j in api.get(f"{JOBS}?name=nightly").json()["results"]} == {a["id"], c["id"]}
    detail = api.get(f"{JOBS}{a['id']}/")
    # The detail is the created job plus its health figures (the list leaves them out).
    shown = detail.json()
    assert detail.status_code == 200 and set(shown.pop("health")) >= {"consecutive_failures", "last_24h"}
    assert shown == a | {"updated_at": shown["updated_at"]}


def test_patch_rename_keeps_schedule(api):
    with travel("2026-03-07T12:00:00Z"):
        job = create(api, cron="30 2 * * *", timezone="America/New_York")
        response = api.patch(f"{JOBS}{job['id']}/", {"name": "renamed", "priority": 7}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["name"] == "renamed" and response.json()["priority"] == 7
    assert response.json()["next_run_at"] == "2026-03-08T07:00:00Z"


def test_patch_interval_on_a_cron_job_replaces_the_trigger(api):
    with travel("2026-03-07T12:00:00Z"):
        job = create(api, cron="30 2 * * *")
        response = api.patch(f"{JOBS}{job['id']}", {"interval_seconds": 60}, format="json")
    assert response.status_code == 200, response.content
    data = response.json()
    assert data["cron"] is None and data["interval_seconds"] == 60 and data["trigger_type"] == "interval"
    assert data["next_run_at"] == "2026-03-07T12:01:00Z"
    stored = Job.objects.get(pk=job["id"])
    assert stored.cron_expr == "" and stored.interval_seconds == 60 and stored.run_at is None


def test_patch_cron_on_an_interval_job_and_zone_change(api):
    with travel("2026-01-10T12:00:00Z"):
        job = create(api, interval_seconds=60)
        data = api.patch(f"{JOBS}{job['id']}", {"cron": "0 9 * * *"}, format="json").json()
        assert data["interval_seconds"] is None and data["next_run_at"] == "2026-01-11T09:00:00Z"
        data = api.patch(f"{JOBS}{job['id']}", {"timezone": "Asia/Tokyo"}, format="json").json()
        # 09:00 JST = 00:00Z; 2026-01-11 00:00Z is the first after 12:00Z on the 10th.
        assert data["next_run_at"] == "2026-01-11T00:00:00Z"


def test_patch_paused_routes_through_pause_and_resume(api):
    with travel("2026-01-10T12:00:00Z"):
        job = create(api, cron="*/10 * * * *")
        assert api.patch(f"{JOBS}{job['id']}", {"paused": True}, format="json").json()["paused"] is True
    with travel("2026-01-10T13:05:00Z"):
        data = api.patch(f"{JOBS}{job['id']}", {"paused": False}, format="json").json()
    assert data["paused"] is False
    # The slots that fell while paused are not fired: the next run is the next future slot.
    assert data["next_run_at"] == "2026-01-10T13:10:00Z"
    assert JobRun.objects.filter(job_id=job["id"]).count() == 0


def test_delete_removes_job_and_runs(api):
    job = create(api, cron="* * * * *")
    assert api.post(f"{JOBS}{job['id']}/trigger").status_code == 201
    assert JobRun.objects.filter(job_id=job["id"]).count() == 1
    assert api.delete(f"{JOBS}{job['id']}").status_code == 204
    assert api.get(f"{JOBS}{job['id']}/").status_code == 404
    assert not Job.objects.filter(pk=job["id"]).exists()
    assert JobRun.objects.filter(job_id=job["id"]).count() == 0


@pytest.fixture
def paused_job(api):
    """A */10 job created at 12:00Z and paused; 'now' moves to 13:05Z for the resume."""
    with travel("2026-01-10T12:00:00Z"):
        job = create(api, cron="*/10 * * * *", max_catch_up=4)
        assert job["next_run_at"] == "2026-01-10T12:10:00Z"
        response = api.post(f"{JOBS}{job['id']}/pause/")
        assert response.status_code == 200 and response.json()["paused"] is True
    return job


def resume(api, job, payload=None):
    with travel("2026-01-10T13:05:00Z"):
        return api.post(f"{JOBS}{job['id']}/resume", payload, format="json")


def test_resume_without_catch_up_goes_to_the_next_future_slot(api, paused_job):
    response = resume(api, paused_job)
    assert response.status_code == 200, response.content
    assert response.json()["paused"] is False
    assert response.json()["next_run_at"] == "2026-01-10T13:10:00Z"
    assert JobRun.objects.filter(job_id=paused_job["id"]).count() == 0


def test_resume_latest_queues_exactly_one_catch_up_run(api, paused_job):
    response = resume(api, paused_job, {"catch_up": "latest"})
    assert response.status_code == 200, response.content
    assert response.json()["next_run_at"] == "2026-01-10T13:10:00Z"
    runs = list(JobRun.objects.filter(job_id=paused_job["id"]))
    assert len(runs) == 1
    assert runs[0].trigger == "catch_up" and format_utc(runs[0].scheduled_at) == "2026-01-10T13:00:00Z"


def test_resume_all_queues_one_per_missed_slot_capped(api, paused_job):
    response = resume(api, paused_job, {"catch_up": "all"})
    assert response.status_code == 200, response.content
    runs = JobRun.objects.filter(job_id=paused_job["id"]).order_by("scheduled_at")
    # Six slots fell (12:10 .. 13:00); max_catch_up=4 keeps the oldest four.
    assert [format_utc(r.scheduled_at) for r in runs] == [
        "2026-01-10T12:10:00Z",
        "2026-01-10T12:20:00Z",
        "2026-01-10T12:30:00Z",
        "2026-01-10T12:40:00Z",
    ]
    assert {r.trigger for r in runs} == {"catch_up"}


def test_resume_all_uncapped(api):
    with travel("2026-01-10T12:00:00Z"):
        job = create(api, cron="*/10 * * * *")
        api.post(f"{JOBS}{job['id']}/pause")
    resume(api, job, {"catch_up": "all"})
    # 12:10, 12:20, ..., 13:00.
    assert JobRun.objects.filter(job_id=job["id"], trigger="catch_up").count() == 6


@pytest.mark.parametrize("payload", [{"catch_up": "some"}, {"catch_up": 1}, {"catchup": "all"}])
def test_resume_bad_catch_up_is_400(api, paused_job, payload):
    response = resume(api, paused_job, payload)
    assert response.status_code == 400
    assert set(response.json()) & {"catch_up", "catchup"}
    assert Job.objects.get(pk=paused_job["id"]).paused is True


def test_trigger_creates_a_manual_run(api):
    job = create(api, cron="0 0 1 1 *")
    response = api.post(f"{JOBS}{job['id']}/trigger/")
    assert response.status_code == 201, response.content
    data = response.json()
    assert data["job_id"] == job["id"]
    assert data["run"] == f"/api/v1/runs/{job['id']}/{data['scheduled_at']}/"
    run = JobRun.objects.get(job_id=job["id"])
    assert run.trigger == "manual" and run.status == "queued"
    assert format_utc(run.scheduled_at) == data["scheduled_at"]
    assert target_of(run) == job["target"]
    # The link is the runs API's detail path of that very run.
    assert api.get(data["run"]).json()["trigger"] == "manual"


def test_backfill_inserts_one_run_per_slot_once(api):
    job = create(api, cron="0 * * * *")
    window = {"start": "2026-01-01T00:00:00Z", "end": "2026-01-01T05:00:00Z"}
    with travel("2026-01-02T00:00:00Z"):
        first = api.post(f"{JOBS}{job['id']}/backfill", window, format="json")
    assert first.status_code == 200, first.content
    assert first.json()["created"] == 6
    assert first.json()["scheduled_at"][0] == "2026-01-01T00:00:00Z"
    assert first.json()["scheduled_at"][-1] == "2026-01-01T05:00:00Z"
    with travel("2026-01-02T00:00:00Z"):
        second = api.post(f"{JOBS}{job['id']}/backfill/", window, format="json")
    assert second.status_code == 200 and second.json()["created"] == 0
    runs = JobRun.objects.filter(job_id=job["id"])
    assert runs.count() == 6 and {r.trigger for r in runs} == {"backfill"}


def test_backfill_fills_only_the_gap_and_a_dry_run_writes_nothing(api):
    """A minutely job ran, was paused 10:05..10:14, ran again: the backfill is exactly the gap."""
    with travel("2026-01-01T09:00:00Z"):
        job = create(api, cron="* * * * *", overlap_policy="skip")
    ran = [parse_utc("2026-01-01T10:00:00Z") + timedelta(minutes=k) for k in range(20) if not 5 <= k < 15]
    enqueue_runs([run_for(Job.objects.get(pk=job["id"]), scheduled_at=t, trigger="schedule") for t in ran])
    JobRunRow.objects.filter(job_id=job["id"]).update(status="succeeded")
    window = {"start": "2026-01-01T10:00:00Z", "end": "2026-01-01T10:19:00Z"}
    gap = [f"2026-01-01T10:{m:02d}:00Z" for m in range(5, 15)]
    with travel("2026-01-02T00:00:00Z"):
        dry = api.post(f"{JOBS}{job['id']}/backfill", {**window, "dry_run": True}, format="json")
        assert dry.status_code == 200, dry.content
        assert dry.json() == {
            "job_id": job["id"],
            "dry_run": True,
            "created": 0,
            "scheduled_at": gap,
            "already_present": 10,
            "capped": False,
        }
        assert JobRun.objects.filter(job_id=job["id"]).count() == 10
        real = api.post(f"{JOBS}{job['id']}/backfill", window, format="json").json()
        assert (real["dry_run"], real["created"], real["scheduled_at"], real["already_present"]) == (
            False,
            10,
            gap,
            10,
        )
        again = api.post(f"{JOBS}{job['id']}/backfill", window, format="json").json()
        assert (again["created"], again["already_present"]) == (0, 20)
    keys = list(JobRun.objects.filter(job_id=job["id"]).values_list("scheduled_at", flat=True))
    assert len(keys) == len(set(keys)) == 20
    assert JobRun.objects.filter(job_id=job["id"], trigger="backfill").count() == 10


def test_backfill_dry_run_over_the_cap_lists_the_first_slots(api):
    job = create(api, cron="* * * * *")
    window = {"start": "2026-01-01T00:00:00Z", "end": "2026-01-02T00:00:00Z", "dry_run": True}
    with travel("2026-01-10T00:00:00Z"):
        data = api.post(f"{JOBS}{job['id']}/backfill", window, format="json").json()
    assert (data["capped"], len(data["scheduled_at"]), data["scheduled_at"][0]) == (
        True,
        1000,
        "2026-01-01T00:00:00Z",
    )
    assert not JobRun.objects.filter(job_id=job["id"]).exists()


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"start": "2026-01-02T00:00:00Z", "end": "2026-01-01T00:00:00Z"}, "end"),
        ({"start": "2026-01-01T00:00:00Z"}, "end"),
        ({"end": "2026-01-01T00:00:00Z"}, "start"),
        ({"start": "yesterday", "end": "2026-01-01T00:00:00Z"}, "start"),
        # 1,441 minutely slots: over the backfill cap.
        ({"start": "2026-01-01T00:00:00Z", "end": "2026-01-02T00:00:00Z"}, "end"),
        ({"start": "2026-01-01T00:00:00Z", "end": "2026-01-01T01:00:00Z", "extra": 1}, "extra"),
        ({"start": "2026-01-01T00:00:00Z", "end": "2026-01-01T01:00:00Z", "dry_run": "yes"}, "dry_run"),
        # Future slots would run early and take the keys of the real runs.
        ({"start": "2026-01-09T00:00:00Z", "end": "2026-01-10T00:10:00Z"}, "end"),
        # Older than RUN_RETENTION_DAYS: the runs would be dropped with their partition.
        ({"start": "2025-11-01T00:00:00Z", "end": "2025-11-01T00:10:00Z"}, "start"),
        ({"start": "0001-01-01T00:00:00Z", "end": "0001-01-01T00:10:00Z"}, "start"),
    ],
)
def test_backfill_bad_input_is_400_and_inserts_nothing(api, payload, field):
    job = create(api, cron="* * * * *")
    with travel("2026-01-10T00:00:00Z"):
        response = api.post(f"{JOBS}{job['id']}/backfill", payload, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()
    assert JobRun.objects.filter(job_id=job["id"]).count() == 0


def test_backfill_of_a_one_time_job_is_400(api):
    job = create(api, run_at="2099-01-01T00:00:00Z")
    response = api.post(
        f"{JOBS}{job['id']}/backfill", {"start": "2026-01-01T00:00:00Z", "end": "2026-01-02T00:00:00Z"}
    )
    assert response.status_code == 400 and "start" in response.json()


def test_misfires_endpoint_lists_rows(api):
    job = create(api, cron="*/5 * * * *", misfire_policy="catch_up")
    stored = Job.objects.get(pk=job["id"])
    first = datetime(2026, 1, 1, tzinfo=UTC)
    stored.misfires.create(
        partition_id=stored.partition_id,
        policy="catch_up",
        missed_count=3,
        first_missed_at=first,
        last_missed_at=first + timedelta(minutes=10),
        runs_created=3,
    )
    response = api.get(f"{JOBS}{job['id']}/misfires")
    assert response.status_code == 200
    (row,) = response.json()["results"]
    assert row["policy"] == "catch_up" and row["missed_count"] == 3 and row["runs_created"] == 3
    assert (
        row["first_missed_at"] == "2026-01-01T00:00:00Z" and row["last_missed_at"] == "2026-01-01T00:10:00Z"
    )
    assert row["detected_at"].endswith("Z")
    assert api.get(f"{JOBS}{job['id']}/").json()["misfires"]["count"] == 1


def test_every_path_works_with_and_without_trailing_slash(api):
    job = create(api, cron="* * * * *")
    base = f"{JOBS}{job['id']}"
    for path in ("/api/v1/jobs", "/api/v1/jobs/", base, f"{base}/", f"{base}/preview", f"{base}/preview/"):
        assert api.get(path).status_code == 200, path
    for path in (f"{base}/misfires", f"{base}/misfires/"):
        assert api.get(path).status_code == 200, path
    for path in (f"{base}/pause", f"{base}/pause/", f"{base}/resume", f"{base}/resume/"):
        assert api.post(path).status_code == 200, path
    for path in ("/api/v1/schedules/preview?cron=@hourly", "/api/v1/schedules/preview/?cron=@hourly"):
        assert api.get(path).status_code == 200, path
    assert (
        api.post(
            "/api/v1/jobs", {"name": "no slash", "cron": "@daily", "target": HOOK}, format="json"
        ).status_code
        == 201
    )
    assert api.patch(base, {"name": "x"}, format="json").status_code == 200
    assert api.delete(base).status_code == 204


def test_health_needs_no_auth(db):
    client = APIClient()
    for path in ("/api/v1/health", "/api/v1/health/"):
        response = client.get(path)
        assert response.status_code == 200
        data = response.json()
        assert data["status"] == "ok" and data["database"] == "ok"
        assert parse_utc(data["time"]) and data["time"].endswith("Z")


def test_openapi_schema_lists_the_job_paths(db):
    client = APIClient()
    response = client.get("/api/schema/")
    assert response.status_code == 200
    text = response.content.decode()
    for path in (
        "/api/v1/jobs/:",
        "/api/v1/jobs/{id}/:",
        "/api/v1/jobs/{id}/pause/:",
        "/api/v1/jobs/{id}/resume/:",
        "/api/v1/jobs/{id}/trigger/:",
        "/api/v1/jobs/{id}/backfill/:",
        "/api/v1/jobs/{id}/preview/:",
        "/api/v1/jobs/{id}/misfires/:",
        "/api/v1/schedules/preview/:",
        "/api/v1/health/:",
    ):
        assert path in text, path
    assert "bearer" in text
    assert client.get("/api/docs/").status_code == 200


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_health_is_503_degraded_when_the_database_is_down(tmp_path):
    """A real WSGI server process whose DATABASE_URL points at a closed port."""
    port, dead_db = free_port(), free_port()
    serve = (
        "import django, sys; django.setup();"
        "from wsgiref.simple_server import make_server;"
        "from django.core.wsgi import get_wsgi_application;"
        f"make_server('127.0.0.1', {port}, get_wsgi_application()).serve_forever()"
    )
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "scheduler_project.settings",
        "DATABASE_URL": f"postgres://nobody@127.0.0.1:{dead_db}/nothing",
    }
    log = open(tmp_path / "server.log", "wb")
    proc = subprocess.Popen([sys.executable, "-c", serve], cwd=ROOT, env=env, stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                response = requests.get(f"http://127.0.0.1:{port}/api/v1/health", timeout=5)
                break
            except requests.ConnectionError:
                assert proc.poll() is None and time.monotonic() < deadline, (
                    tmp_path / "server.log"
                ).read_text()
                time.sleep(0.1)
        assert response.status_code == 503
        data = response.json()
        assert data["status"] == "degraded" and data["database"].startswith("error")
        assert data["time"].endswith("Z")
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()


def test_backfill_of_an_interval_job_before_its_anchor_stays_on_the_grid(api):
    with travel("2026-05-01T10:00:30Z"):
        job = create(api, interval_seconds=3600)
        assert job["next_run_at"] == "2026-05-01T11:00:30Z"
        response = api.post(
            f"{JOBS}{job['id']}/backfill",
            {"start": "2026-04-30T00:00:00Z", "end": "2026-04-30T03:00:00Z"},
            format="json",
        )
    assert response.status_code == 200, response.content
    assert response.json()["scheduled_at"] == [
        "2026-04-30T00:00:30Z",
        "2026-04-30T01:00:30Z",
        "2026-04-30T02:00:30Z",
    ]


def test_patch_that_echoes_an_unchanged_past_run_at_is_accepted(api):
    with travel("2026-01-01T00:00:00Z"):
        job = create(api, run_at="2026-01-02T00:00:00Z")
    with travel("2026-01-03T00:00:00Z"):
        response = api.patch(
            f"{JOBS}{job['id']}", {"name": "renamed", "run_at": job["run_at"]}, format="json"
        )
        assert response.status_code == 200, response.content
        moved = api.patch(f"{JOBS}{job['id']}", {"run_at": "2026-01-02T12:00:00Z"}, format="json")
        assert moved.status_code == 400 and "run_at" in moved.json()
