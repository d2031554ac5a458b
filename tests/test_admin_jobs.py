"""Jobs admin as a superuser: list, filters, search, actions, change page preview, validation."""

from __future__ import annotations

import pytest
from django.contrib.messages import get_messages
from rest_framework.test import APIClient

from jobs import services, tenant_services
from jobs.models import ApiToken, AuditEntry, Job, SchedulerNode
from runs.keys import format_utc, parse_utc
from runs.models import JobRun
from tests.support.admin_form import job_form_data as form_data
from tests.support.clock import travel

CHANGELIST = "/admin/jobs/job/"
HOOK = {"type": "http", "url": "https://example.com/hook"}


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    # admin_client creates a superuser per test; PBKDF2 would cost ~0.5 s each time.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def jobs(tenant):
    return {
        "nightly": services.create_job(
            tenant=tenant, fields=dict(name="nightly export", cron_expr="30 2 * * *", target=HOOK)
        ),
        "poll": services.create_job(
            tenant=tenant, fields=dict(name="poller", interval_seconds=60, target=HOOK)
        ),
        "once": services.create_job(
            tenant=tenant,
            fields=dict(name="one shot", run_at=parse_utc("2099-01-01T00:00:00Z"), target=HOOK, paused=True),
        ),
    }


def names(response) -> set[str]:
    assert response.status_code == 200
    return {job.name for job in response.context["cl"].result_list}


def messages_of(response) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def test_changelist_renders_columns_filters_and_search(admin_client, jobs):
    response = admin_client.get(CHANGELIST)
    assert names(response) == {"nightly export", "poller", "one shot"}
    html = response.content.decode()
    for text in ("By trigger type", "By paused", "By misfire policy", "30 2 * * *", "Every minute", "acme"):
        assert text in html, text
    assert names(admin_client.get(f"{CHANGELIST}?paused__exact=1")) == {"one shot"}
    assert names(admin_client.get(f"{CHANGELIST}?trigger=cron")) == {"nightly export"}
    assert names(admin_client.get(f"{CHANGELIST}?trigger=interval")) == {"poller"}
    assert names(admin_client.get(f"{CHANGELIST}?trigger=run_at")) == {"one shot"}
    assert names(admin_client.get(f"{CHANGELIST}?q=poll")) == {"poller"}
    assert names(admin_client.get(f"{CHANGELIST}?q=30+2")) == {"nightly export"}
    assert names(admin_client.get(f"{CHANGELIST}?q={jobs['once'].id}")) == {"one shot"}


def run_action(admin_client, action: str, *job_list):
    return admin_client.post(
        CHANGELIST,
        {"action": action, "_selected_action": [str(j.pk) for j in job_list]},
        follow=True,
    )


def test_pause_and_resume_actions(admin_client, jobs):
    response = run_action(admin_client, "pause_jobs", jobs["nightly"], jobs["poll"])
    assert "Paused 2 job(s)." in messages_of(response)
    assert Job.objects.filter(paused=True).count() == 3
    response = run_action(admin_client, "resume_jobs", jobs["nightly"], jobs["once"])
    assert "Resumed 2 job(s)." in messages_of(response)
    assert set(Job.objects.filter(paused=True).values_list("name", flat=True)) == {"poller"}
    assert JobRun.objects.count() == 0


def test_trigger_now_action_queues_manual_runs(admin_client, jobs):
    response = run_action(admin_client, "trigger_now", jobs["nightly"], jobs["once"])
    assert "Queued a manual run for 2 job(s)." in messages_of(response)
    runs = JobRun.objects.all()
    assert {r.job_id for r in runs} == {jobs["nightly"].id, jobs["once"].id}
    assert {r.trigger for r in runs} == {"manual"}


def test_change_page_shows_the_next_fire_times(admin_client, tenant):
    with travel("2026-03-07T12:00:00Z"):
        job = services.create_job(
            tenant=tenant,
            fields=dict(name="ny", cron_expr="30 2 * * *", time_zone="America/New_York", target=HOOK),
        )
        pages = {view: admin_client.get(f"{CHANGELIST}{job.pk}/{view}/") for view in ("change", "edit")}
    for view, response in pages.items():
        assert response.status_code == 200
        html = response.content.decode()
        assert "next fire times" in html.lower(), view
        assert "2026-03-08T07:00:00Z" in html and "2026-03-09T06:30:00Z" in html, view
        assert "DST gap" in html, view
    # The job's page shows them on its wall clock too; the edit form previews as you type.
    assert "2026-03-08 03:00:00 EDT" in pages["change"].content.decode()
    assert "Live preview" in pages["edit"].content.decode()


def test_live_preview_endpoint(admin_client, db):
    response = admin_client.get(
        "/admin/jobs/job/preview/", {"cron_expr": "0 9 * * *", "time_zone": "Asia/Tokyo"}
    )
    assert response.status_code == 200
    data = response.json()
    assert len(data["fire_times"]) == 5 and all(t["utc"].endswith("T00:00:00Z") for t in data["fire_times"])
    bad = admin_client.get("/admin/jobs/job/preview/", {"cron_expr": "0 0 30 2 *", "time_zone": "UTC"})
    assert bad.status_code == 400 and "never fire" in bad.json()["error"]


def test_add_form_rejects_a_bad_cron_and_writes_nothing(admin_client, tenant):
    response = admin_client.post(f"{CHANGELIST}add/", form_data(tenant, cron_expr="0 0 30 2 *"))
    assert response.status_code == 200
    assert "can never fire" in response.content.decode()
    assert "cron_expr" in response.context["adminform"].form.errors
    assert Job.objects.count() == 0


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"cron_expr": "", "interval_seconds": ""}, "cron_expr"),
        ({"interval_seconds": "60"}, "cron_expr"),
        ({"time_zone": "Mars/Base"}, "time_zone"),
        ({"target": '{"type": "http", "url": "http://127.0.0.1/"}'}, "target"),
        ({"target": '{"type": "smtp"}'}, "target"),
        ({"priority": "12"}, "priority"),
        ({"lease_seconds": "2"}, "lease_seconds"),
        ({"cron_expr": "", "interval_seconds": "0"}, "interval_seconds"),
        ({"cron_expr": "", "run_at_0": "2001-01-01", "run_at_1": "00:00:00"}, "run_at"),
        ({"starting_deadline_seconds": "0"}, "starting_deadline_seconds"),
        ({"starting_deadline_seconds": "604801"}, "starting_deadline_seconds"),
    ],
)
def test_add_form_applies_the_api_rules(admin_client, tenant, overrides, field):
    response = admin_client.post(f"{CHANGELIST}add/", form_data(tenant, **overrides))
    assert response.status_code == 200
    assert field in response.context["adminform"].form.errors, response.context["adminform"].form.errors
    assert Job.objects.count() == 0


def test_add_form_creates_through_the_services(admin_client, tenant):
    with travel("2026-03-07T12:00:00Z"):
        response = admin_client.post(
            f"{CHANGELIST}add/",
            form_data(
                tenant,
                cron_expr="30 2 * * *",
                time_zone="America/New_York",
                target=' {"type": "http", "url": "https://example.com/hook"}',
            ),
        )
    assert response.status_code == 302, response.context["adminform"].form.errors
    job = Job.objects.get()
    assert format_utc(job.next_run_at) == "2026-03-08T07:00:00Z"
    assert job.partition_id == services.partition_for(job.id)
    assert job.target["method"] == "POST" and job.target["timeout_seconds"] == 30


def test_change_form_edit_recomputes_next_run(admin_client, tenant):
    with travel("2026-01-10T12:00:00Z"):
        job = services.create_job(
            tenant=tenant, fields=dict(name="edit me", cron_expr="0 9 * * *", target=HOOK)
        )
        response = admin_client.post(
            f"{CHANGELIST}{job.pk}/change/",
            form_data(tenant, name="edited", cron_expr="", interval_seconds="600", overlap_policy="allow"),
        )
    assert response.status_code == 302, response.context["adminform"].form.errors
    job.refresh_from_db()
    assert job.name == "edited" and job.cron_expr == "" and job.interval_seconds == 600
    assert job.overlap_policy == "allow"
    assert format_utc(job.next_run_at) == "2026-01-10T12:10:00Z"


def test_change_form_sets_and_clears_the_starting_deadline(admin_client, tenant):
    job = services.create_job(
        tenant=tenant, fields=dict(name="deadline", cron_expr="*/5 * * * *", target=HOOK)
    )
    url = f"{CHANGELIST}{job.pk}/edit/"
    page = admin_client.get(url).content.decode()
    assert "startingDeadlineSeconds" in page and "SCHEDULER_MISFIRE_THRESHOLD_SECONDS (60 s)" in page
    response = admin_client.post(url, form_data(tenant, name="deadline", starting_deadline_seconds="45"))
    assert response.status_code == 302, response.context["adminform"].form.errors
    assert Job.objects.get(pk=job.pk).starting_deadline_seconds == 45
    response = admin_client.post(url, form_data(tenant, name="deadline", starting_deadline_seconds=""))
    assert response.status_code == 302, response.context["adminform"].form.errors
    assert Job.objects.get(pk=job.pk).starting_deadline_seconds is None
    changes = AuditEntry.objects.filter(job_id=job.pk, action="update").order_by("id")
    assert [e.changes for e in changes] == [
        {"starting_deadline_seconds": [None, 45]},
        {"starting_deadline_seconds": [45, None]},
    ]


def test_change_form_cannot_move_a_job_to_another_tenant(admin_client, tenant, api):
    # Moving only the job would leave its runs with the old tenant, who could still
    # read and cancel them: the tenant is read-only after creation
    # (docs/decisions/0058-tenant-fixed-at-creation.md).
    other, other_token = tenant_services.create_tenant(slug="other")
    job = services.create_job(tenant=tenant, fields=dict(name="mine", cron_expr="0 9 * * *", target=HOOK))
    scheduled_at = services.trigger_job(job=job)
    response = admin_client.post(
        f"{CHANGELIST}{job.pk}/change/",
        form_data(other, name="renamed", cron_expr="0 9 * * *"),
    )
    assert response.status_code == 302, response.context["adminform"].form.errors
    job.refresh_from_db()
    assert job.name == "renamed"  # the rest of the edit went through
    (run,) = JobRun.objects.filter(job_id=job.pk)
    assert job.tenant_id == run.tenant_id == tenant.pk
    # Whoever does not own the job sees neither it nor its runs.
    outsider = APIClient()
    outsider.credentials(HTTP_AUTHORIZATION=f"Bearer {other_token}")
    run_path = f"/api/v1/runs/{job.pk}/{format_utc(scheduled_at)}/"
    assert outsider.get(f"/api/v1/jobs/{job.pk}/").status_code == 404
    assert outsider.get(run_path).status_code == 404
    assert outsider.post(f"{run_path}cancel").status_code == 404
    assert api.get(f"/api/v1/jobs/{job.pk}/").status_code == 200
    assert api.get(run_path).status_code == 200
    page = admin_client.get(f"{CHANGELIST}{job.pk}/edit/")
    assert "tenant" not in page.context["adminform"].form.fields


def test_tenant_admin_issue_token_shows_it_once_and_it_works(admin_client, tenant):
    response = admin_client.get("/admin/jobs/tenant/")
    assert response.status_code == 200 and "active tokens" in response.content.decode().lower()
    response = admin_client.post(
        "/admin/jobs/tenant/", {"action": "issue_new_token", "_selected_action": [tenant.pk]}, follow=True
    )
    (message,) = [m for m in messages_of(response) if "New API token" in m]
    token = message.rsplit(" ", 1)[-1]
    assert token.startswith("cy_")
    assert ApiToken.objects.filter(tenant=tenant).count() == 2
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    assert client.get("/api/v1/jobs/").status_code == 200


def test_misfire_and_node_admins_are_read_only_lists(admin_client, jobs):
    when = parse_utc("2026-01-01T00:00:00Z")
    jobs["nightly"].misfires.create(
        partition_id=jobs["nightly"].partition_id,
        policy="run_once",
        missed_count=4,
        first_missed_at=when,
        last_missed_at=when,
        runs_created=1,
    )
    SchedulerNode.objects.create(
        node_id="node-a", hostname="h", pid=1, started_at=when, heartbeat_at=when, partitions=[1, 2, 3]
    )
    response = admin_client.get("/admin/jobs/misfire/")
    assert response.status_code == 200 and "nightly export" in response.content.decode()
    response = admin_client.get("/admin/jobs/schedulernode/")
    assert response.status_code == 200 and "node-a" in response.content.decode()
    assert admin_client.get("/admin/jobs/misfire/add/").status_code == 403
    assert admin_client.get("/admin/jobs/schedulernode/add/").status_code == 403


def _nested_body(levels: int) -> str:
    return '{"type": "http", "url": "https://example.com/hook", "body": ' + "[" * levels + "]" * levels + "}"


@pytest.mark.parametrize(
    ("levels", "message"),
    [
        (33, "body: nested more than 32 levels deep; the limit is 32 levels."),
        (470, "nested more than 64 levels deep; the limit is 64 levels."),
        (100_000, "nested more than 64 levels deep; the limit is 64 levels."),
    ],
)
def test_add_form_refuses_a_target_nested_too_deep(admin_client, tenant, levels, message):
    admin_client.raise_request_exception = False  # a crash must show as the 500 a user would get
    response = admin_client.post(f"{CHANGELIST}add/", form_data(tenant, target=_nested_body(levels)))
    assert response.status_code == 200, response.content[:300]
    assert response.context["adminform"].form.errors["target"] == [message]
    assert Job.objects.count() == 0
