"""Secret header values are write-only: "***" in every API answer and the admin, kept
when "***" is sent back, absent from logs and the audit log, yet sent to the target."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

import pytest

from jobs.models import AuditEntry, Job
from runs.models import JobRun
from tests.support.executor import wait_for, wait_status
from tests.support.runsapi import make_dead_run

pytestmark = pytest.mark.django_db

# One value per rule of docs/CONTRACT.md, "REST API"; each is unique so a leak names its rule.
SECRETS = {
    "Authorization": "Bearer sv-authorization-1",
    "Cookie": "sid=sv-cookie-2",
    "Proxy-Authorization": "Basic sv-proxy-3",
    "X-Access-Token": "sv-token-4",
    "X-Client-Secret": "sv-secret-5",
    "X-Api-Key": "sv-key-6",
    "X-DB-Password": "sv-password-7",
    "X-Signed-By": "sv-marked-8",  # secret only because the client marks it
}
PLAIN = {"X-Team": "blue-team-visible"}


def target(url: str = "https://hooks.example.com/run") -> dict:
    return {
        "type": "http",
        "url": url,
        "method": "POST",
        "headers": {**SECRETS, **PLAIN},
        "secret_headers": ["x-signed-by"],
    }


def assert_no_secret(text: str, where: str) -> None:
    for name, value in SECRETS.items():
        assert value not in text, f"{name} leaked in {where}"


def assert_masked(shown: dict) -> None:
    assert {name: shown["headers"][name] for name in SECRETS} == dict.fromkeys(SECRETS, "***")
    assert shown["headers"]["X-Team"] == PLAIN["X-Team"]
    assert shown["secret_headers"] == ["x-signed-by"]


def test_api_answers_mask_secrets_and_keep_them_when_sent_back(api, tenant, caplog):
    caplog.set_level(logging.DEBUG)
    created = api.post(
        "/api/v1/jobs/", {"name": "s", "interval_seconds": 60, "target": target()}, format="json"
    )
    assert created.status_code == 201, created.content
    job_id = created.json()["id"]
    assert_masked(created.json()["target"])
    answers = [created]
    answers.append(api.get(f"/api/v1/jobs/{job_id}/"))
    answers.append(api.get("/api/v1/jobs/"))
    assert_masked(answers[1].json()["target"])

    # Sending back what was read keeps every stored secret.
    read = answers[1].json()["target"]
    patched = api.patch(f"/api/v1/jobs/{job_id}/", {"target": read, "name": "t"}, format="json")
    assert patched.status_code == 200, patched.content
    answers.append(patched)
    stored = Job.objects.get(pk=job_id).target
    assert {name: stored["headers"][name] for name in SECRETS} == SECRETS

    # A newly typed value replaces the stored one; the others are kept.
    read["headers"]["X-Api-Key"] = "sv-new-key-9"
    answers.append(api.patch(f"/api/v1/jobs/{job_id}/", {"target": read}, format="json"))
    stored = Job.objects.get(pk=job_id).target
    assert stored["headers"]["X-Api-Key"] == "sv-new-key-9"
    assert stored["headers"]["Authorization"] == SECRETS["Authorization"]
    assert answers[-1].json()["target"]["headers"]["X-Api-Key"] == "***"

    # The runs API shows the run's snapshot masked, the marked header included.
    job = Job.objects.get(pk=job_id)
    make_dead_run(job, datetime(2026, 3, 8, 7, tzinfo=UTC))
    key = f"/api/v1/runs/{job_id}/2026-03-08T07:00:00Z/"
    answers += [api.get(key), api.get("/api/v1/dead-letter/"), api.get("/api/v1/runs/")]
    assert_masked(answers[-3].json()["target"])
    answers.append(api.post(key + "replay", {"dry_run": True}, format="json"))
    answers.append(api.post(key + "replay"))
    answers.append(api.get("/api/v1/audit/"))
    answers.append(api.get("/api/schema/"))
    assert JobRun.objects.get(job_id=job_id).target["headers"]["X-Signed-By"] == SECRETS["X-Signed-By"]

    for response in answers:
        assert response.status_code in (200, 201), response.content
        assert_no_secret(response.content.decode(), response.wsgi_request.path)
    assert_no_secret(json.dumps(list(AuditEntry.objects.values_list("changes", flat=True))), "the audit log")
    assert_no_secret(caplog.text, "the logs")
    assert_no_secret("\n".join(str(r.args) for r in caplog.records), "log arguments")


def test_secret_headers_must_be_a_list_of_header_names(api):
    bad = {**target(), "secret_headers": "X-Signed-By"}
    response = api.post("/api/v1/jobs/", {"name": "s", "interval_seconds": 60, "target": bad}, format="json")
    assert response.status_code == 400 and "target" in response.json()
    assert "secret_headers" in str(response.json()["target"])
    assert Job.objects.count() == 0


def test_admin_pages_mask_secrets(admin_client, tenant, settings):
    from jobs import services

    job = services.create_job(
        tenant=tenant, fields=dict(name="admin secrets", interval_seconds=60, target=target())
    )
    make_dead_run(job, datetime(2026, 3, 8, 7, tzinfo=UTC))
    run = JobRun.objects.get(job_id=job.id)
    pages = [
        f"/admin/jobs/job/{job.pk}/change/",
        "/admin/jobs/job/",
        f"/admin/runs/jobrun/{run.pk}/change/",
        f"/admin/runs/deadrun/{run.pk}/change/",
        "/admin/jobs/auditentry/",
        f"/admin/jobs/auditentry/{AuditEntry.objects.get().pk}/change/",
    ]
    for url in pages:
        response = admin_client.get(url)
        assert response.status_code == 200, url
        assert_no_secret(response.content.decode(), url)
    form = admin_client.get(pages[0]).context["adminform"].form
    assert_masked(json.loads(form["target"].value()))


@pytest.mark.processes
@pytest.mark.django_db(transaction=True)
def test_the_executor_still_sends_the_secrets(processes, http_target, api, settings):
    settings.SCHEDULER_ALLOW_PRIVATE_TARGETS = True
    created = api.post(
        "/api/v1/jobs/",
        {"name": "sends", "interval_seconds": 3600, "paused": True, "target": target(http_target.url("/s"))},
        format="json",
    )
    assert created.status_code == 201, created.content
    job_id = created.json()["id"]
    # Read it back masked and send it back: what the executor sends must be the real values.
    read = api.get(f"/api/v1/jobs/{job_id}/").json()["target"]
    assert api.patch(f"/api/v1/jobs/{job_id}/", {"target": read}, format="json").status_code == 200
    trigger = api.post(f"/api/v1/jobs/{job_id}/trigger").json()
    proc = processes.start("run_executor")
    run = JobRun.objects.get(job_id=job_id)
    wait_status((run.job_id, run.scheduled_at), "succeeded")
    (received,) = wait_for(lambda: http_target.received("/s"), what="the target's request")
    for name, value in {**SECRETS, **PLAIN}.items():
        assert received.headers[name.lower()] == value, name
    assert trigger["scheduled_at"]
    assert_no_secret(processes.log_of(proc), "the executor log")
    assert_no_secret(api.get(trigger["run"]).content.decode(), "the run detail")
