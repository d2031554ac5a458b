"""The audit log: every change through the API or the admin is recorded with who, when
and what, in the transaction of the change; GET /api/v1/audit/ and the admin list."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from rest_framework.test import APIClient

from jobs import services, tenant_services
from jobs.models import AuditEntry, Job
from runs.models import JobRun
from tests.support.admin_form import job_form_data
from tests.support.runsapi import make_dead_run, make_run

pytestmark = pytest.mark.django_db

SECRET = "Bearer do-not-leak-7f3a"
TARGET = {
    "type": "http",
    "url": "https://hooks.example.com/run",
    "headers": {"Authorization": SECRET, "X-Team": "blue"},
}


def entries(**filters) -> list[AuditEntry]:
    return list(AuditEntry.objects.filter(**filters).order_by("id"))


def actions(job_id) -> list[str]:
    return [e.action for e in entries(job_id=job_id)]


def test_every_api_action_is_recorded_with_the_tenant_and_token_prefix(api, tenant_and_token):
    tenant, token = tenant_and_token
    who = f"tenant:acme token:{token[:10]}"
    created = api.post(
        "/api/v1/jobs/", {"name": "audited", "interval_seconds": 3600, "target": TARGET}, format="json"
    )
    assert created.status_code == 201, created.content
    job_id = created.json()["id"]
    base = f"/api/v1/jobs/{job_id}"

    assert api.patch(base + "/", {"name": "renamed", "priority": 3}, format="json").status_code == 200
    assert api.post(base + "/pause").status_code == 200
    assert api.post(base + "/resume", {"catch_up": "latest"}, format="json").status_code == 200
    assert api.post(base + "/trigger").status_code == 201
    now = datetime.now(UTC)
    window = {
        "start": (now - timedelta(hours=3)).isoformat(),
        "end": (now - timedelta(minutes=1)).isoformat(),
    }
    dry = api.post(base + "/backfill", {**window, "dry_run": True}, format="json")
    assert dry.status_code == 200 and dry.json()["scheduled_at"], dry.content
    assert AuditEntry.objects.filter(action="backfill").count() == 0  # a dry run changes nothing
    real = api.post(base + "/backfill", window, format="json")
    assert real.status_code == 200 and real.json()["created"] >= 2, real.content

    job = Job.objects.get(pk=job_id)
    dead = make_dead_run(job, datetime(2026, 3, 8, 7, tzinfo=UTC), attempts=5)
    key = f"/api/v1/runs/{job_id}/2026-03-08T07:00:00Z"
    assert api.post(key + "/replay", {"dry_run": True}, format="json").status_code == 200
    assert AuditEntry.objects.filter(action="replay").count() == 0  # nor does a replay dry run
    assert api.post(key + "/replay").status_code == 200
    assert api.post(key + "/cancel").status_code == 200
    assert api.delete(base + "/").status_code == 204

    assert actions(job_id) == [
        "create", "update", "pause", "resume", "trigger", "backfill", "replay", "cancel", "delete",
    ]  # fmt: skip
    log = entries(job_id=job_id)
    assert {e.actor for e in log} == {who}
    assert {e.tenant_id for e in log} == {tenant.id}
    assert all(e.job_name in ("audited", "renamed") for e in log)
    by_action = {e.action: e.changes for e in log}
    assert by_action["update"] == {"name": ["audited", "renamed"], "priority": [0, 3]}
    assert by_action["pause"] == {"paused": [False, True]}
    assert by_action["resume"]["catch_up"] == "latest"
    assert by_action["backfill"]["created"] == real.json()["created"]
    assert by_action["replay"] == {"scheduled_at": "2026-03-08T07:00:00Z", "attempts_before": 5}
    assert by_action["cancel"]["status"] == ["queued", "cancelled"]
    assert by_action["create"]["target"]["headers"]["Authorization"] == "***"
    assert SECRET not in json.dumps([e.changes for e in log])
    assert dead.run_key  # the run the replay and cancel were about


def test_an_edit_of_a_secret_header_is_recorded_without_its_value(api):
    job_id = api.post(
        "/api/v1/jobs/", {"name": "s", "interval_seconds": 60, "target": TARGET}, format="json"
    ).json()["id"]
    new_target = {**TARGET, "headers": {"Authorization": "Bearer the-new-one-91c", "X-Team": "blue"}}
    assert api.patch(f"/api/v1/jobs/{job_id}/", {"target": new_target}, format="json").status_code == 200
    (edit,) = entries(job_id=job_id, action="update")
    old, new = edit.changes["target"]
    assert old["headers"]["Authorization"] == new["headers"]["Authorization"] == "***"
    assert "the-new-one" not in json.dumps(edit.changes) and "do-not-leak" not in json.dumps(edit.changes)
    # Sending back what was read ("***") changes nothing, so nothing is recorded.
    read = api.get(f"/api/v1/jobs/{job_id}/").json()["target"]
    assert api.patch(f"/api/v1/jobs/{job_id}/", {"target": read}, format="json").status_code == 200
    assert len(entries(job_id=job_id, action="update")) == 1


def test_audit_api_filters_paginates_and_is_tenant_scoped(api, tenant):
    jobs = [
        services.create_job(tenant=tenant, fields=dict(name=f"j{i}", interval_seconds=60, target=TARGET))
        for i in range(3)
    ]
    for job in jobs:
        assert api.post(f"/api/v1/jobs/{job.id}/pause").status_code == 200

    body = api.get("/api/v1/audit/", {"action": "pause"}).json()
    assert [e["job_id"] for e in body["results"]] == [str(j.id) for j in reversed(jobs)]  # newest first
    first = body["results"][0]
    assert set(first) == {"id", "at", "actor", "action", "job_id", "job_name", "changes"}
    assert first["at"].endswith("Z") and first["actor"].startswith("tenant:acme token:cy_")

    only = api.get("/api/v1/audit", {"job": str(jobs[0].id)}).json()["results"]
    assert [e["action"] for e in only] == ["pause", "create"]
    assert api.get("/api/v1/audit/", {"since": "2999-01-01T00:00:00Z"}).json()["results"] == []

    seen, url = [], "/api/v1/audit/?page_size=2"
    while url:
        page = api.get(url).json()
        seen += [e["id"] for e in page["results"]]
        url = page["next"]
    assert seen == sorted(AuditEntry.objects.values_list("id", flat=True), reverse=True) and len(seen) == 6

    for bad in ({"action": "explode"}, {"job": "nope"}, {"since": "yesterday"}, {"cursor": "zzz"}):
        response = api.get("/api/v1/audit/", bad)
        assert response.status_code == 400 and next(iter(bad)) in response.json(), (bad, response.content)

    _, other_token = tenant_services.create_tenant(slug="globex")
    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Bearer {other_token}")
    assert other.get("/api/v1/audit/").json()["results"] == []
    assert APIClient().get("/api/v1/audit/").status_code == 401


def test_a_failed_change_records_nothing(api):
    response = api.post(
        "/api/v1/jobs/", {"name": "bad", "cron": "0 0 30 2 *", "target": TARGET}, format="json"
    )
    assert response.status_code == 400
    assert AuditEntry.objects.count() == 0


CHANGELIST = "/admin/jobs/job/"


def admin_form(tenant, **overrides) -> dict:
    return job_form_data(tenant, **{"target": TARGET, **overrides})


def test_every_admin_action_is_recorded_with_the_admin_user(admin_client, tenant):
    assert admin_client.post(f"{CHANGELIST}add/", admin_form(tenant)).status_code == 302
    job = Job.objects.get()
    change = f"{CHANGELIST}{job.pk}/edit/"
    # The page shows "***" for the secret; posting the form back unchanged keeps it.
    page = admin_client.get(change).content.decode()
    shown = json.loads(admin_client.get(change).context["adminform"].form["target"].value())
    assert shown["headers"]["Authorization"] == "***" and SECRET not in page
    response = admin_client.post(change, admin_form(tenant, name="edited", target=json.dumps(shown)))
    assert response.status_code == 302, response.context["adminform"].form.errors
    job.refresh_from_db()
    assert job.name == "edited" and job.target["headers"]["Authorization"] == SECRET

    for action in ("pause_jobs", "resume_jobs", "trigger_now"):
        response = admin_client.post(CHANGELIST, {"action": action, ACTION_CHECKBOX_NAME: [job.pk]})
        assert response.status_code == 302
    dead = make_dead_run(job, datetime(2026, 3, 8, 7, tzinfo=UTC), attempts=2)
    queued = make_run(job, datetime(2026, 3, 8, 8, tzinfo=UTC))
    admin_client.post(
        "/admin/runs/deadrun/", {"action": "replay_selected_dry_run", ACTION_CHECKBOX_NAME: [dead.pk]}
    )
    assert JobRun.objects.get(pk=dead.pk).status == "dead"  # the dry run wrote nothing
    admin_client.post(
        "/admin/runs/deadrun/",
        {"action": "replay_selected", "confirmed": "yes", ACTION_CHECKBOX_NAME: [dead.pk]},
    )
    assert admin_client.post(f"/admin/runs/jobrun/{queued.pk}/cancel/").status_code == 302
    assert admin_client.post(f"{CHANGELIST}{job.pk}/delete/", {"post": "yes"}).status_code == 302

    log = entries(job_id=job.id)
    assert [e.action for e in log] == [
        "create", "update", "pause", "resume", "trigger", "replay", "cancel", "delete",
    ]  # fmt: skip
    assert {e.actor for e in log} == {"admin:admin"}
    assert log[1].changes == {"name": ["from admin", "edited"]}  # the untouched secret is no change
    assert log[3].changes["catch_up"] == "none"
    assert SECRET not in json.dumps([e.changes for e in log])

    # The read-only admin list, with its filters.
    listing = admin_client.get("/admin/jobs/auditentry/", {"action__exact": "pause"})
    assert listing.status_code == 200
    assert [e.action for e in listing.context["cl"].result_list] == ["pause"]
    detail = admin_client.get(f"/admin/jobs/auditentry/{log[0].pk}/change/")
    assert detail.status_code == 200 and SECRET not in detail.content.decode()
    assert admin_client.get("/admin/jobs/auditentry/add/").status_code == 403


def test_a_tenants_credentials_are_audited_without_the_credentials(api, tenant_and_token, admin_client):
    """Rotating the signing secret (API or console), issuing a token and revoking one name
    no job: each is an entry of the tenant, with the token's prefix, never a secret."""
    tenant, token = tenant_and_token
    rotated = api.post("/api/v1/signing-secret/rotate")
    assert rotated.status_code == 200, rotated.content
    admin_client.post("/admin/jobs/tenant/", {"action": "issue_new_token", ACTION_CHECKBOX_NAME: [tenant.pk]})
    admin_client.post(
        "/admin/jobs/tenant/", {"action": "rotate_signing_secret", ACTION_CHECKBOX_NAME: [tenant.pk]}
    )
    first = tenant.tokens.order_by("id").first()
    data = {
        "slug": tenant.slug, "name": tenant.name, "max_concurrency": "10", "weight": "1",
        "max_runs_per_minute": "", "tokens-TOTAL_FORMS": "2", "tokens-INITIAL_FORMS": "2",
        "tokens-MIN_NUM_FORMS": "0", "tokens-MAX_NUM_FORMS": "1000",
    }  # fmt: skip
    for i, row in enumerate(tenant.tokens.order_by("id")):
        data |= {f"tokens-{i}-id": str(row.pk), f"tokens-{i}-tenant": str(tenant.pk)}
    data["tokens-0-revoked"] = "on"
    saved = admin_client.post(f"/admin/jobs/tenant/{tenant.pk}/change/", data)
    assert saved.status_code == 302
    first.refresh_from_db()
    assert first.revoked
    assert api.get("/api/v1/jobs/").status_code == 401  # the revoked token is refused

    got = [(e.action, e.actor, e.job_id) for e in entries(tenant=tenant)]
    assert got == [
        ("rotate_secret", f"tenant:acme token:{token[:10]}", None),
        ("issue_token", "admin:admin", None),
        ("rotate_secret", "admin:admin", None),
        ("revoke_token", "admin:admin", None),
    ]
    issued = entries(tenant=tenant, action="issue_token")[0].changes
    assert issued["token_prefix"] == tenant.tokens.order_by("id").last().prefix
    assert entries(action="revoke_token")[0].changes == {
        "token_prefix": first.prefix,
        "revoked": [False, True],
    }
    tenant.refresh_from_db()
    everything = json.dumps([e.changes for e in entries(tenant=tenant)])
    for secret in (token, tenant.signing_secret, tenant.previous_signing_secret):
        assert secret not in everything
    # The console's list and the entry's page show an entry without a job.
    assert admin_client.get("/admin/jobs/auditentry/").status_code == 200
    entry = entries(action="rotate_secret")[0]
    assert "of tenant acme" in admin_client.get(f"/admin/jobs/auditentry/{entry.pk}/change/").content.decode()
