"""Replay takes dry_run (single run in the API, bulk in the dead-letter admin) and writes
nothing; a replayed run explains an attempt number past max_attempts."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.messages import get_messages

from jobs.models import AuditEntry
from runs.models import JobRun, JobRunRow
from tests.support.runsapi import attempt_entry, make_dead_run, make_job, make_run

pytestmark = pytest.mark.django_db

SLOT = datetime(2026, 3, 8, 7, tzinfo=UTC)


def path(run: JobRun) -> str:
    return f"/api/v1/runs/{run.job_id}/2026-03-08T07:00:00Z/"


def row_state(run: JobRun) -> tuple:
    fresh = JobRun.objects.get(pk=run.pk)
    return (fresh.status, fresh.attempt, fresh.trigger, fresh.not_before, fresh.finished_at, fresh.attempts)


def test_api_replay_dry_run_lists_the_run_and_writes_nothing(api, tenant):
    run = make_dead_run(make_job(tenant, "flaky"), SLOT, attempts=5)
    before, entries = row_state(run), AuditEntry.objects.count()
    response = api.post(path(run) + "replay", {"dry_run": True}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["dry_run"] is True
    (listed,) = body["would_replay"]
    assert listed["key"] == run.run_key and listed["status"] == "dead" and listed["attempt"] == 5
    assert row_state(run) == before and AuditEntry.objects.count() == entries

    # The real replay is the same request without the flag, and it is audited.
    assert api.post(path(run) + "replay", {"dry_run": False}, format="json").json()["status"] == "queued"
    assert AuditEntry.objects.filter(action="replay", job_id=run.job_id).count() == 1


def test_api_replay_dry_run_refuses_like_the_real_one(api, tenant):
    job = make_job(tenant, "rules")
    queued = make_run(job, SLOT)
    response = api.post(path(queued) + "replay", {"dry_run": True}, format="json")
    assert response.status_code == 409 and response.json()["status"] == "queued"
    missing = f"/api/v1/runs/{job.id}/2026-03-09T07:00:00Z/replay"
    assert api.post(missing, {"dry_run": True}, format="json").status_code == 404
    for body in ({"dry_run": "perhaps"}, {"dryrun": True}):
        response = api.post(path(queued) + "replay", body, format="json")
        assert response.status_code == 400 and set(response.json()) == set(body), response.content
    assert row_state(queued)[0] == "queued"


def test_attempts_past_max_attempts_are_explained(api, admin_client, tenant):
    job = make_job(tenant, "explained")
    run = make_dead_run(job, SLOT, attempts=5)
    assert api.get(path(run)).json()["attempt_note"] is None
    assert api.post(path(run) + "replay").status_code == 200
    body = api.get(path(run)).json()
    assert (body["attempt"], body["max_attempts"], body["attempt_note"]) == (
        5,
        5,
        "replayed after 5 attempts",
    )

    # The executor claims it: attempt 6 of 5, and it says why.
    JobRunRow.objects.filter(pk=run.pk).update(status="running", attempt=6)
    body = api.get(path(run)).json()
    assert (body["attempt"], body["attempt_note"]) == (6, "replayed after 5 attempts")
    listed = api.get("/api/v1/runs/").json()["results"][0]
    assert listed["attempt_note"] == "replayed after 5 attempts"
    page = admin_client.get("/admin/runs/jobrun/").content.decode()
    assert "6 / 5 (replayed after 5 attempts)" in page

    # Dead again at 6 and replayed once more: the note follows the latest replay.
    JobRunRow.objects.filter(pk=run.pk).update(
        status="dead", attempts=[*run.attempts, attempt_entry(6, "dead")]
    )
    assert api.post(path(run) + "replay").status_code == 200
    JobRunRow.objects.filter(pk=run.pk).update(status="running", attempt=7)
    assert api.get(path(run)).json()["attempt_note"] == "replayed after 6 attempts"


def test_admin_bulk_replay_dry_run_lists_and_writes_nothing(admin_client, tenant):
    job = make_job(tenant, "bulk")
    dead = make_dead_run(job, SLOT, attempts=2)
    queued = make_run(job, datetime(2026, 3, 8, 8, tzinfo=UTC))
    before = row_state(dead)
    response = admin_client.post(
        "/admin/runs/deadrun/",
        {"action": "replay_selected_dry_run", ACTION_CHECKBOX_NAME: [dead.pk, queued.pk]},
        follow=True,
    )
    (message,) = [str(m) for m in get_messages(response.wsgi_request)]
    assert "would replay 1 run(s)" in message and dead.run_key in message and "Nothing was changed" in message
    assert row_state(dead) == before and AuditEntry.objects.filter(action="replay").count() == 0


def test_schema_documents_the_new_endpoints_and_fields(api):
    schema = api.get("/api/schema/", HTTP_ACCEPT="application/json").json()
    assert "/api/v1/audit/" in schema["paths"]
    params = {p["name"] for p in schema["paths"]["/api/v1/audit/"]["get"]["parameters"]}
    assert {"job", "action", "since", "cursor"} <= params
    replay = schema["paths"]["/api/v1/runs/{job_id}/{scheduled_at}/replay"]["post"]
    assert "requestBody" in replay
    components = schema["components"]["schemas"]
    assert "dry_run" in components["ReplayRequest"]["properties"]
    assert "would_replay" in components["ReplayPlan"]["properties"]
    assert "attempt_note" in components["Run"]["properties"]
