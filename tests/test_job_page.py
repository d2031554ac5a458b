"""The job's admin page as an operator's workplace: pause / resume (with catch-up) /
trigger with a confirmation that says what will happen, recent runs and ledger
occurrences inline, API names as labels. Django test client against the real database;
the browser half is in test_console_browser.py."""

from __future__ import annotations

import html
import re
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.utils import timezone

from jobs import services
from jobs.admin.display import in_zone
from jobs.models import Job
from runs.models import JobRun, JobRunRow

HOOK = {"type": "http", "url": "https://example.com/hook"}
NY = ZoneInfo("America/New_York")


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def next_nine_ny(now: datetime) -> datetime:
    """The first 09:00 New York wall time strictly after `now` (computed here, not by the app)."""
    at = now.astimezone(NY).replace(hour=9, minute=0, second=0, microsecond=0)
    while at <= now:
        at = (at + timedelta(days=1)).replace(hour=9)
    return at


def paused_three_slots_ago(tenant) -> tuple[Job, list[datetime], datetime]:
    job = services.create_job(
        tenant=tenant,
        fields=dict(name="morning report", cron_expr="0 9 * * *", time_zone="America/New_York", target=HOOK),
    )
    services.pause_job(job=job)
    upcoming = next_nine_ny(timezone.now())
    fell = [(upcoming - timedelta(days=d)).replace(hour=9) for d in (3, 2, 1)]  # wall-clock days
    # As if created and paused four days ago: the ledger speaks only for the job's lifetime.
    since = fell[0] - timedelta(days=1)
    Job.objects.filter(pk=job.pk).update(next_run_at=fell[0], created_at=since, schedule_since=since)
    job.refresh_from_db()
    return job, fell, upcoming


def text(response) -> str:
    assert response.status_code == 200, response.status_code
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", response.content.decode()))


def test_resume_confirmation_spells_out_each_catch_up_choice_and_does_it(admin_client, tenant):
    job, fell, upcoming = paused_three_slots_ago(tenant)
    url = f"/admin/jobs/job/{job.pk}/operate/resume/"
    page = text(admin_client.get(url))
    nxt = in_zone(upcoming, "America/New_York")
    assert f"Resume: next run {nxt}" in page
    assert "3 slots fell while paused and will not run." in page
    latest = in_zone(fell[-1], "America/New_York")
    assert f"of the 3 slots that fell while paused, the latest ({latest}) runs now and 2 will not run" in page
    assert "3 slots fell while paused: 3 runs queued now" in page
    assert Job.objects.get(pk=job.pk).paused  # a GET changes nothing

    response = admin_client.post(url, {"catch_up": "latest"})
    assert response.status_code == 302 and response["Location"] == f"/admin/jobs/job/{job.pk}/change/"
    job.refresh_from_db()
    assert not job.paused and job.next_run_at == upcoming
    runs = list(JobRun.objects.filter(job_id=job.pk).values_list("scheduled_at", "trigger"))
    assert runs == [(fell[-1], "catch_up")]


def test_pause_and_trigger_from_the_job_page_then_runs_show_inline(admin_client, tenant):
    job = services.create_job(tenant=tenant, fields=dict(name="poller", interval_seconds=3600, target=HOOK))
    change = f"/admin/jobs/job/{job.pk}/change/"
    page = admin_client.get(change).content.decode()
    assert f'href="/admin/jobs/job/{job.pk}/operate/pause/"' in page
    assert f'href="/admin/jobs/job/{job.pk}/operate/trigger/"' in page
    assert "No runs yet." in page

    confirm = text(admin_client.get(f"/admin/jobs/job/{job.pk}/operate/pause/"))
    assert f"Pause: the next slot, {in_zone(job.next_run_at, 'UTC')}" in confirm
    assert admin_client.post(f"/admin/jobs/job/{job.pk}/operate/pause/").status_code == 302
    assert Job.objects.get(pk=job.pk).paused

    confirm = text(admin_client.get(f"/admin/jobs/job/{job.pk}/operate/trigger/"))
    assert "Trigger now: one manual run is queued" in confirm and "The job stays paused." in confirm
    assert admin_client.post(f"/admin/jobs/job/{job.pk}/operate/trigger/").status_code == 302
    run = JobRun.objects.get(job_id=job.pk)
    assert run.trigger == "manual"
    JobRunRow.objects.filter(pk=run.pk).update(
        status="dead",
        attempt=3,
        started_at=run.scheduled_at,
        finished_at=run.scheduled_at + timedelta(seconds=2.5),
        last_error="HTTP 503 from target " + "x" * 300,
    )

    page = admin_client.get(change).content.decode()
    assert f'href="/admin/jobs/job/{job.pk}/operate/resume/"' in page
    row = re.search(rf'<tr data-run="{run.pk}">(.*?)</tr>', page, re.S).group(1)
    assert f'href="/admin/runs/jobrun/{run.pk}/change/"' in row
    assert ">dead<" in row and "<td>manual</td>" in row and "<td>3</td>" in row and "2.5 s" in row
    assert "HTTP 503 from target" in row and "x" * 300 not in row  # an excerpt
    assert f'href="/admin/runs/jobrun/?job={job.pk}"' in page
    assert re.search(r"last outcome:.*?>dead<", page, re.S | re.I)
    # The pre-filtered runs list the link leads to.
    listed = admin_client.get(f"/admin/runs/jobrun/?job={job.pk}")
    assert [r.pk for r in listed.context["cl"].result_list] == [run.pk]


def test_recent_occurrences_come_from_the_ledger(admin_client, tenant):
    job, fell, _ = paused_three_slots_ago(tenant)
    services.resume_job(job=job, catch_up="latest")
    page = admin_client.get(f"/admin/jobs/job/{job.pk}/change/").content.decode()
    table = re.search(r'<table class="cronyard-occurrences">(.*?)</table>', page, re.S).group(1)
    outcomes = re.findall(r'<tr data-outcome="(\w+)"><td><time class="cy-moment" datetime="([^"]+)"', table)
    assert outcomes[:3] == [
        ("fired", fell[2].astimezone(ZoneInfo("UTC")).strftime("%Y-%m-%dT%H:%M:%SZ")),
        ("skipped", fell[1].astimezone(ZoneInfo("UTC")).strftime("%Y-%m-%dT%H:%M:%SZ")),
        ("skipped", fell[0].astimezone(ZoneInfo("UTC")).strftime("%Y-%m-%dT%H:%M:%SZ")),
    ]


def test_labels_are_the_api_names_and_a_bad_choice_is_a_400(admin_client, tenant):
    job = services.create_job(tenant=tenant, fields=dict(name="nightly", cron_expr="30 2 * * *", target=HOOK))
    page = admin_client.get(f"/admin/jobs/job/{job.pk}/edit/").content.decode()
    assert re.search(r'<label[^>]*for="id_cron_expr"[^>]*>cron:</label>', page)
    assert re.search(r'<label[^>]*for="id_time_zone"[^>]*>timezone:</label>', page)
    services.pause_job(job=job)
    response = admin_client.post(f"/admin/jobs/job/{job.pk}/operate/resume/", {"catch_up": "some"})
    assert response.status_code == 400 and b"catch_up" in response.content
    assert Job.objects.get(pk=job.pk).paused
    assert admin_client.get(f"/admin/jobs/job/{job.pk}/operate/explode/").status_code == 404


SECRET_TARGET = {
    "type": "http",
    "url": "https://svc:url-password-1@hooks.example.com/run?token=query-token-2&team=blue",
    "headers": {"Authorization": "Bearer header-secret-3", "X-Team": "blue"},
}
SECRETS = ("url-password-1", "query-token-2", "header-secret-3")
BUTTONS = ("cronyard-edit", "cronyard-pause", "cronyard-trigger", "cronyard-backfill", "cronyard-delete")


def test_opening_a_job_shows_the_read_view_with_its_buttons(admin_client, tenant):
    job = services.create_job(
        tenant=tenant,
        fields=dict(
            name="nightly", cron_expr="0 9 * * *", time_zone="America/New_York", target=SECRET_TARGET
        ),
    )
    page = admin_client.get(f"/admin/jobs/job/{job.pk}/change/").content.decode()
    assert "adminform" not in admin_client.get(f"/admin/jobs/job/{job.pk}/change/").context
    assert "At 09:00 (America/New_York)" in page  # the schedule in words
    upcoming = next_nine_ny(timezone.now())
    assert in_zone(upcoming, "America/New_York") in page  # next fire times on the job's clock
    for panel in (
        "field-health_figures",
        "field-recent_runs",
        "field-recent_occurrences",
        "field-last_outcome",
    ):
        assert panel in page, panel
    for secret in SECRETS:
        assert secret not in page
    assert '"X-Team": "blue"' in html.unescape(page) and page.count("***") >= 3
    for button in BUTTONS:
        assert f'id="{button}"' in page, button
    assert f'href="/admin/jobs/job/{job.pk}/edit/"' in page
    assert f'href="/admin/jobs/job/{job.pk}/backfill/"' in page
    assert f'href="/admin/jobs/job/{job.pk}/history/"' in page
    assert "trigger <strong>Cron</strong>" in page  # the console's label of the API's value
    # An unset starting deadline reads as the threshold that applies, not as "none".
    assert "<th>starting deadline seconds</th><td>60 (SCHEDULER_MISFIRE_THRESHOLD_SECONDS)</td>" in page
    services.update_job(job=job, changes={"starting_deadline_seconds": 300})
    page = admin_client.get(f"/admin/jobs/job/{job.pk}/change/").content.decode()
    assert "<th>starting deadline seconds</th><td>300</td>" in page


def test_every_link_to_a_job_lands_on_its_read_view(admin_client, tenant):
    job = services.create_job(tenant=tenant, fields=dict(name="linked", interval_seconds=600, target=HOOK))
    read = f"/admin/jobs/job/{job.pk}/change/"
    assert f'href="{read}"' in admin_client.get("/admin/jobs/job/").content.decode()  # the list
    services.trigger_job(job=job, actor="admin:setup")
    run = JobRun.objects.get(job_id=job.pk)
    assert f'href="{read}"' in admin_client.get(f"/admin/runs/jobrun/{run.pk}/change/").content.decode()
    assert f'href="{read}"' in admin_client.get(f"/admin/jobs/job/{job.pk}/history/").content.decode()
    edit = admin_client.get(f"/admin/jobs/job/{job.pk}/edit/").content.decode()
    assert f'<a href="{read}">linked</a> &rsaquo; Edit' in edit  # the edit form's breadcrumbs
    # Save leads back to the job's page (Save and continue stays on the form).
    from tests.support.admin_form import job_form_data

    data = job_form_data(tenant, name="linked", cron_expr="", interval_seconds="900")
    response = admin_client.post(f"/admin/jobs/job/{job.pk}/edit/", data)
    assert response.status_code == 302 and response["Location"] == read
    assert Job.objects.get(pk=job.pk).interval_seconds == 900
    response = admin_client.post(f"/admin/jobs/job/{job.pk}/edit/", {**data, "_continue": "1"})
    assert response["Location"] == f"/admin/jobs/job/{job.pk}/edit/"
    # A form posted to the job's page (an older tab) still saves.
    response = admin_client.post(read, {**data, "interval_seconds": "1200"})
    assert response.status_code == 302 and Job.objects.get(pk=job.pk).interval_seconds == 1200
    added = admin_client.post("/admin/jobs/job/add/", job_form_data(tenant, name="fresh"))
    fresh = Job.objects.get(name="fresh")
    assert added["Location"] == f"/admin/jobs/job/{fresh.pk}/change/"


def test_a_view_only_user_reads_the_job_without_buttons_or_secrets(client, tenant):
    from django.contrib.auth.models import Permission, User

    viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_job"))
    client.force_login(viewer)
    job = services.create_job(
        tenant=tenant, fields=dict(name="guarded", interval_seconds=600, target=SECRET_TARGET)
    )
    page = text(client.get(f"/admin/jobs/job/{job.pk}/change/"))
    raw = client.get(f"/admin/jobs/job/{job.pk}/change/").content.decode()
    assert "Every 10 minutes" in page and '"X-Team": "blue"' in html.unescape(page)
    for secret in SECRETS:
        assert secret not in raw
    for button in BUTTONS:
        assert f'id="{button}"' not in raw, button
    assert 'id="cronyard-history"' in raw
    # Django's read-only form at edit/ shows the redacted target too, and nothing acts.
    form = client.get(f"/admin/jobs/job/{job.pk}/edit/").content.decode()
    assert "field-target_redacted" in form and all(secret not in form for secret in SECRETS)
    assert client.post(f"/admin/jobs/job/{job.pk}/operate/pause/").status_code == 403
    assert not Job.objects.get(pk=job.pk).paused
