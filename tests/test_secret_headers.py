"""Secret header values are write-only: "***" in every API answer and the admin, kept
when "***" is sent back, absent from logs and the audit log, yet sent to the target."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

import pytest

from jobs.models import AuditEntry, Job
from runs.models import JobRun
from runs.selectors import target_of
from runs.target_secrets import redact_target
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
    assert target_of(JobRun.objects.get(job_id=job_id))["headers"]["X-Signed-By"] == SECRETS["X-Signed-By"]

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
        f"/admin/jobs/job/{job.pk}/edit/",
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


# --- through the real web server: what a client of the API meets -----------------------


@pytest.fixture
def http_api(web_server, transactional_db):
    """A tenant's API over HTTP against gunicorn (committed rows: transactional_db)."""
    import requests

    from jobs import tenant_services

    _, token = tenant_services.create_tenant(slug="sealed", name="Sealed")
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {token}"

    def call(method: str, path: str, body: dict | None = None) -> requests.Response:
        return session.request(method, web_server.url + path, json=body, timeout=30)

    return call


SIG = "SIGSECRET3"


def sealed_target(url: str = "https://hooks.example.com/run", **extra) -> dict:
    headers = {"X-Sig": SIG, "Authorization": "Bearer sealed-auth-1", "X-Team": "blue"}
    return {"type": "http", "url": url, "headers": headers, "secret_headers": ["X-Sig"], **extra}


@pytest.mark.parametrize("marking", [{}, {"secret_headers": []}], ids=["marking-omitted", "marking-emptied"])
def test_sending_back_stars_without_the_marking_keeps_the_header_secret(http_api, marking):
    created = http_api(
        "POST", "/api/v1/jobs/", {"name": "sig", "interval_seconds": 60, "target": sealed_target()}
    )
    assert created.status_code == 201, created.text
    job = created.json()["id"]
    sent_back = {
        "type": "http",
        "url": "https://hooks.example.com/run",
        "headers": {"X-Sig": "***"},
        **marking,
    }
    patched = http_api("PATCH", f"/api/v1/jobs/{job}/", {"target": sent_back})
    assert patched.status_code == 200, patched.text
    answers = [patched, http_api("GET", f"/api/v1/jobs/{job}/"), http_api("GET", "/api/v1/audit/")]
    for answer in answers:
        assert SIG not in answer.text, answer.url
    assert answers[1].json()["target"]["headers"] == {"X-Sig": "***"}
    # Kept, and still what the executor sends.
    assert Job.objects.get(pk=job).target["headers"] == {"X-Sig": SIG}
    assert SIG not in json.dumps(list(AuditEntry.objects.values_list("changes", flat=True)))
    # A newly typed value without the marking is the client's choice: it is then plain.
    retyped = http_api("PATCH", f"/api/v1/jobs/{job}/", {"target": {**sent_back, "headers": {"X-Sig": "v2"}}})
    assert retyped.status_code == 200 and retyped.json()["target"]["headers"] == {"X-Sig": "v2"}


@pytest.mark.parametrize(
    "url",
    [
        "https://elsewhere.example.net/run",  # another host
        "https://hooks.example.com:8443/run",  # another port
        "http://hooks.example.com/run",  # another scheme
    ],
)
def test_a_secret_does_not_follow_the_target_to_another_origin(http_api, url):
    created = http_api(
        "POST", "/api/v1/jobs/", {"name": "o", "interval_seconds": 60, "target": sealed_target()}
    )
    job = created.json()["id"]
    before = Job.objects.get(pk=job).target
    moved = {**created.json()["target"], "url": url}
    refused = http_api("PATCH", f"/api/v1/jobs/{job}/", {"target": moved})
    assert refused.status_code == 400, refused.text
    problems = " ".join(refused.json()["target"])
    assert "headers.X-Sig" in problems and "headers.Authorization" in problems
    assert Job.objects.get(pk=job).target == before  # nothing written
    # Sending the secrets again moves the target.
    again = {**moved, "headers": {"X-Sig": "new-sig", "Authorization": "Bearer new", "X-Team": "blue"}}
    assert http_api("PATCH", f"/api/v1/jobs/{job}/", {"target": again}).status_code == 200
    assert Job.objects.get(pk=job).target["url"] == url


def test_stars_keep_the_secrets_at_the_same_origin(http_api):
    target = sealed_target("https://svc:url-pass-9@hooks.example.com/run?token=q-tok-8&team=blue")
    created = http_api("POST", "/api/v1/jobs/", {"name": "same", "interval_seconds": 60, "target": target})
    read = created.json()["target"]
    assert "url-pass-9" not in created.text and "q-tok-8" not in created.text
    # Another path on the same origin, the URL's credentials sent back as read.
    read["url"] = read["url"].replace("/run?", "/v2/run?")
    patched = http_api("PATCH", f"/api/v1/jobs/{created.json()['id']}/", {"target": read})
    assert patched.status_code == 200, patched.text
    stored = Job.objects.get(pk=created.json()["id"]).target
    assert stored["url"] == "https://svc:url-pass-9@hooks.example.com/v2/run?token=q-tok-8&team=blue"
    assert stored["headers"]["Authorization"] == "Bearer sealed-auth-1"
    # The same URL credentials sent to another host are refused, naming the URL.
    read["url"] = read["url"].replace("hooks.example.com", "elsewhere.example.net")
    read["headers"] = {"X-Team": "blue"}
    refused = http_api("PATCH", f"/api/v1/jobs/{created.json()['id']}/", {"target": read})
    assert refused.status_code == 400 and any(p.startswith("url:") for p in refused.json()["target"])


def test_the_migration_redacts_what_the_audit_log_already_holds(api, tenant):
    """Entries written while "***" could drop a header's marking hold its value in clear;
    the data migration redacts them and gives the job and its runs the marking back."""
    import importlib

    from django.apps import apps
    from django.db import connection

    from jobs import audit, services

    migration = importlib.import_module("jobs.migrations.0013_redact_audit_secrets")
    job = services.create_job(tenant=tenant, fields=dict(name="old", interval_seconds=60, target=target()))
    unmarked = {**target(), "secret_headers": []}  # what the old write path stored
    Job.objects.filter(pk=job.pk).update(target=unmarked)
    job.refresh_from_db()
    # A run of that time carried its own copy of the target (runs 0018 came later).
    make_dead_run(job, datetime(2026, 3, 8, 7, tzinfo=UTC), target=unmarked, target_version=None)
    audit.record(
        actor="tenant:old", action="update", job=job, changes={"target": [redact_target(target()), unmarked]}
    )
    assert SECRETS["X-Signed-By"] in json.dumps(list(AuditEntry.objects.values_list("changes", flat=True)))

    with connection.schema_editor() as editor:
        migration.redact(apps, editor)

    assert_no_secret(json.dumps(list(AuditEntry.objects.values_list("changes", flat=True))), "the audit log")
    shown = api.get(f"/api/v1/jobs/{job.pk}/").json()["target"]["headers"]
    assert shown["X-Signed-By"] == "***"
    run = api.get(f"/api/v1/runs/{job.pk}/2026-03-08T07:00:00Z/").json()
    assert run["target"]["headers"]["X-Signed-By"] == "***"
    # Still sent: the stored value is untouched.
    assert Job.objects.get(pk=job.pk).target["headers"]["X-Signed-By"] == SECRETS["X-Signed-By"]
