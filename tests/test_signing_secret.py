"""A tenant's signing secret is write-only: shown once where it is made (the
`create_tenant` output, the console's message, the rotation's API answer) and on no other
surface: API answers, console pages at every permission level, the audit log, the admin's
history, logs, metrics. The headers the signature owns are reserved. (The signatures
themselves: tests/test_signed_calls.py.)"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from io import StringIO

import pytest
import requests
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission
from django.contrib.messages import get_messages
from django.core.management import call_command
from standardwebhooks.webhooks import Webhook

from jobs.models import AuditEntry, Job, Tenant
from runs.models import JobRun
from tests.support.runsapi import make_dead_run

pytestmark = pytest.mark.django_db(transaction=True)

SLOT = datetime(2026, 3, 8, 7, tzinfo=UTC)
ROTATE = "rotate_signing_secret"


def assert_no_secret(text: str, secrets: list[str], where: str) -> None:
    for n, secret in enumerate(secrets):
        # The key part too: a secret shown without its prefix is shown all the same.
        assert secret.removeprefix("whsec_") not in text, f"signing secret #{n} shown in {where}"


def messages_of(response) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def staff(django_user_model, name: str, *codenames: str):
    user = django_user_model.objects.create_user(name, password="pw", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    return user


def console_pages(tenant: Tenant, job_id: str, run: JobRun) -> list[str]:
    return [
        "/admin/",
        "/admin/jobs/tenant/",
        "/admin/jobs/tenant/?q=seal",
        "/admin/jobs/tenant/add/",
        f"/admin/jobs/tenant/{tenant.pk}/change/",
        f"/admin/jobs/tenant/{tenant.pk}/history/",
        "/admin/jobs/job/",
        f"/admin/jobs/job/{job_id}/change/",
        "/admin/jobs/auditentry/",
        "/admin/runs/jobrun/",
        f"/admin/runs/jobrun/{run.pk}/change/",
        "/admin/runs/deadrun/",
        "/admin/runs/jobrun/dashboard/",
    ]


def test_the_signing_secret_is_shown_once_and_on_no_other_surface(
    web_server, client, django_user_model, caplog
):
    caplog.set_level(logging.DEBUG)
    out = StringIO()
    call_command("create_tenant", "sealed", stdout=out)
    printed = out.getvalue().strip().splitlines()
    first = next(line for line in printed if line.startswith("signing secret: ")).removeprefix(
        "signing secret: "
    )
    tenant = Tenant.objects.get(slug="sealed")
    api = requests.Session()
    api.headers["Authorization"] = f"Bearer {printed[-1]}"
    base = web_server.url

    target = {"type": "http", "url": "https://hooks.example.com/run", "body": {"a": 1}}
    created = api.post(f"{base}/api/v1/jobs/", json={"name": "s", "interval_seconds": 60, "target": target})
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]
    run = make_dead_run(Job.objects.get(pk=job_id), SLOT)

    # Two rotations through the API: each answer shows its new secret, and only that.
    secrets = [first]
    for _ in range(2):
        answer = api.post(f"{base}/api/v1/signing-secret/rotate", timeout=30)
        assert answer.status_code == 200, answer.text
        assert_no_secret(answer.text, secrets, "a rotation's answer")
        secrets.append(answer.json()["secret"])
    assert Tenant.objects.get(pk=tenant.pk).signing_secret == secrets[-1]

    run_path = f"/api/v1/runs/{job_id}/2026-03-08T07:00:00Z/"
    reads = [
        f"/api/v1/jobs/{job_id}/",
        "/api/v1/jobs/",
        f"/api/v1/jobs/{job_id}/preview",
        f"/api/v1/jobs/{job_id}/occurrences",
        "/api/v1/runs/",
        run_path,
        "/api/v1/dead-letter/",
        "/api/v1/audit/",
        "/api/v1/tasks/",
        "/api/v1/health/",
        "/api/schema/",
    ]
    for path in reads:
        answer = api.get(base + path, timeout=30)
        assert answer.status_code == 200, (path, answer.text[:300])
        assert_no_secret(answer.text, secrets, path)
    metrics = requests.get(f"{base}/metrics", timeout=30)
    assert metrics.status_code == 200 and "cronyard_" in metrics.text
    assert_no_secret(metrics.text, secrets, "/metrics")

    # The console, at every permission level: every page answers without a secret.
    superuser = django_user_model.objects.create_superuser("root", password="pw")
    editor = staff(
        django_user_model,
        "editor",
        *("view_tenant", "change_tenant", "add_tenant", "view_job", "change_job"),
        *("view_jobrun", "view_deadrun", "view_auditentry"),
    )
    viewer = staff(
        django_user_model,
        "viewer",
        "view_tenant",
        "view_job",
        "view_jobrun",
        "view_deadrun",
        "view_auditentry",
    )
    pages = console_pages(tenant, job_id, run)

    def look_at_every_page() -> None:
        for user in (superuser, editor, viewer):
            client.force_login(user)
            for url in pages:
                response = client.get(url)
                # The viewer may not add a tenant; every other page opens.
                refused = user is viewer and url.endswith("/add/")
                assert response.status_code == (403 if refused else 200), (user.username, url)
                assert_no_secret(response.content.decode(), secrets, f"{url} for {user.username}")

    look_at_every_page()

    # The viewer is not offered the rotation, and posting it anyway changes nothing.
    client.force_login(viewer)
    assert ROTATE not in client.get("/admin/jobs/tenant/").content.decode()
    client.post("/admin/jobs/tenant/", {"action": ROTATE, ACTION_CHECKBOX_NAME: [tenant.pk]}, follow=True)
    assert Tenant.objects.get(pk=tenant.pk).signing_secret == secrets[-1]

    # The editor rotates from the console: the message shows the new secret, once.
    client.force_login(editor)
    response = client.post(
        "/admin/jobs/tenant/", {"action": ROTATE, ACTION_CHECKBOX_NAME: [tenant.pk]}, follow=True
    )
    (message,) = [m for m in messages_of(response) if m.startswith("Signing secret for sealed")]
    shown = message.rsplit(": ", 1)[1]
    assert shown == Tenant.objects.get(pk=tenant.pk).signing_secret
    assert_no_secret(message, secrets, "the rotation's message")
    secrets.append(shown)
    look_at_every_page()  # and never again

    history = list(LogEntry.objects.values_list("object_repr", "change_message"))
    assert ("sealed", "Rotated the signing secret.") in history
    assert_no_secret(str(history), secrets, "the console's history")
    assert_no_secret(
        str(list(AuditEntry.objects.values_list("changes", flat=True))), secrets, "the audit log"
    )
    assert "signing secret rotated: tenant=sealed actor='admin:editor'" in caplog.text
    assert_no_secret(caplog.text, secrets, "the logs")
    assert_no_secret("\n".join(str(r.args) for r in caplog.records), secrets, "log arguments")
    web_log = web_server.log_path.read_text(errors="replace")
    assert "signing secret rotated: tenant=sealed" in web_log
    assert_no_secret(web_log, secrets, "the web server's log")


def test_the_console_shows_a_new_tenants_secret_once(admin_client):
    form = {
        "slug": "initech", "name": "Initech", "max_concurrency": "5", "weight": "1",
        "max_runs_per_minute": "", "tokens-TOTAL_FORMS": "0", "tokens-INITIAL_FORMS": "0",
        "tokens-MIN_NUM_FORMS": "0", "tokens-MAX_NUM_FORMS": "1000",
    }  # fmt: skip
    response = admin_client.post("/admin/jobs/tenant/add/", form, follow=True)
    assert response.status_code == 200
    (message,) = [m for m in messages_of(response) if m.startswith("Signing secret for initech")]
    secret = message.rsplit(": ", 1)[1]
    tenant = Tenant.objects.get(slug="initech")
    assert secret == tenant.signing_secret
    Webhook(secret)  # a secret the specification's library takes
    assert any(m.startswith("New API token for initech") for m in messages_of(response))
    page = admin_client.get(f"/admin/jobs/tenant/{tenant.pk}/change/").content.decode()
    assert "shown once, when made or last rotated" in page
    assert_no_secret(page, [secret], "the new tenant's page")


@pytest.mark.parametrize("name", ["webhook-id", "Webhook-Timestamp", "WEBHOOK-SIGNATURE"])
def test_a_target_may_not_set_the_signature_headers(web_server, name):
    from jobs.tenant_services import create_tenant

    _, token = create_tenant(slug="forger")
    target = {"type": "http", "url": "https://example.com/hook", "headers": {name: "v1,forged"}}
    answer = requests.post(
        f"{web_server.url}/api/v1/jobs/",
        json={"name": "forged", "interval_seconds": 60, "target": target},
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )
    assert answer.status_code == 400, answer.text
    assert answer.json() == {"target": [f"headers: {name} is set by the executor and cannot be overridden."]}
    assert not Job.objects.exists()
