"""Backfill from the job page: the form, the dry run's list, the confirmation, and bad
windows as 400s naming the field. Django's test client against the real database; the
browser half is in test_console_browser.py. Expected slots are written out here, not
computed by the app."""

from __future__ import annotations

import re
from urllib.parse import parse_qs, urlsplit

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from jobs import services
from jobs.models import AuditEntry
from runs.keys import format_utc, parse_utc
from runs.models import JobRun
from tests.support.clock import travel
from tests.support.runsapi import make_job, make_run

NOW = "2026-01-10T12:30:00Z"
NY = "America/New_York"
# 00:00 to 05:00 New York wall time on 2026-01-10 (EST, UTC-5): six hourly slots.
WINDOW = {"start": "2026-01-10T00:00", "end": "2026-01-10T05:00", "zone": NY}
SLOTS = [f"2026-01-10T{h:02d}:00:00Z" for h in range(5, 11)]
PRESENT = ["2026-01-10T06:00:00Z", "2026-01-10T08:00:00Z"]
MISSING = [s for s in SLOTS if s not in PRESENT]


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def hourly(tenant):
    """An hourly New York job whose 06:00Z and 08:00Z slots already ran."""
    with travel("2026-01-01T00:00:00Z"):
        job = make_job(tenant, "hourly ny", interval_seconds=None, cron_expr="0 * * * *", time_zone=NY)
    for at in PRESENT:
        make_run(job, parse_utc(at), status="succeeded")
    return job


def url(job) -> str:
    return f"/admin/jobs/job/{job.pk}/backfill/"


def listed(page: str, section: str) -> list[str]:
    block = re.search(rf'id="cronyard-backfill-{section}">(.*?)</section>', page, re.S).group(1)
    return re.findall(r'<li data-slot="([^"]+)">', block)


def writes(job) -> tuple[int, int]:
    return (
        JobRun.objects.filter(job_id=job.pk).count(),
        AuditEntry.objects.filter(job_id=job.pk, action="backfill").count(),
    )


def test_the_form_and_its_preview_write_nothing(admin_client, hourly):
    before = writes(hourly)
    with travel(NOW):
        form = admin_client.get(url(hourly))
        assert form.status_code == 200
        page = form.content.decode()
        # The last 24 h in the job's zone to start from; the zone is said, not assumed.
        assert 'value="2026-01-09T07:30:00"' in page and 'value="2026-01-10T07:30:00"' in page
        assert f'<option value="{NY}" selected>{NY} (the job&#x27;s zone)</option>' in page
        assert 'id="cronyard-backfill-plan"' not in page
        preview = admin_client.get(url(hourly), {**WINDOW, "preview": "Preview"})
    assert preview.status_code == 200
    page = preview.content.decode()
    assert listed(page, "missing") == MISSING
    assert listed(page, "present") == PRESENT
    assert "4 slots would get a run" in page and "2 already have a run and are skipped" in page
    assert 'value="Backfill 4 runs"' in page
    assert writes(hourly) == before


def test_the_preview_reads_the_windows_runs_once(admin_client, hourly):
    """The plan's read of the window's runs carries their ids and statuses: the page lists
    the present slots, linked to their runs, without reading the runs again."""
    with travel(NOW), CaptureQueriesContext(connection) as queries:
        page = admin_client.get(url(hourly), {**WINDOW, "preview": "Preview"}).content.decode()
    reads = [q["sql"] for q in queries if q["sql"].startswith('SELECT "runs".')]
    assert len(reads) == 1, reads
    runs = dict(JobRun.objects.filter(job_id=hourly.pk).values_list("scheduled_at", "pk"))
    for at in PRESENT:
        assert f"/admin/runs/jobrun/{runs[parse_utc(at)]}/change/" in page
    assert listed(page, "present") == PRESENT and page.count(">succeeded<") == 2


def test_confirm_creates_exactly_the_previewed_runs_audited_under_the_operator(admin_client, hourly):
    with travel(NOW):
        preview = admin_client.get(url(hourly), {**WINDOW, "preview": "Preview"}).content.decode()
        response = admin_client.post(url(hourly), WINDOW)
    assert response.status_code == 302 and response["Location"] == f"/admin/jobs/job/{hourly.pk}/change/"
    created = JobRun.objects.filter(job_id=hourly.pk, trigger="backfill").order_by("scheduled_at")
    assert [format_utc(r.scheduled_at) for r in created] == listed(preview, "missing") == MISSING
    assert JobRun.objects.filter(job_id=hourly.pk).count() == len(SLOTS)
    (entry,) = AuditEntry.objects.filter(job_id=hourly.pk, action="backfill")
    assert entry.actor == "admin:admin" and entry.changes["created"] == 4

    # The message on the job's page links to the runs it made.
    page = admin_client.get(response["Location"]).content.decode()
    message = re.search(r'<li class="success">(.*?)</li>', page, re.S).group(1)
    assert "Backfilled 4 runs (2026-01-10 00:00:00 EST to 2026-01-10 05:00:00 EST)" in message
    link = re.search(r'href="([^"]+)"', message).group(1).replace("&amp;", "&")
    assert urlsplit(link).path == "/admin/runs/jobrun/"
    assert parse_qs(urlsplit(link).query) == {"job": [str(hourly.pk)], "trigger__exact": ["backfill"]}
    runs = admin_client.get(link).context["cl"].result_list
    assert sorted(r.pk for r in runs) == sorted(r.pk for r in created)

    # A second confirmation finds nothing to do and says so.
    with travel(NOW):
        again = admin_client.post(url(hourly), WINDOW, follow=True)
    assert "Nothing backfilled" in again.content.decode()
    assert JobRun.objects.filter(job_id=hourly.pk).count() == len(SLOTS)


def test_a_window_in_utc_is_read_as_utc(admin_client, hourly):
    with travel(NOW):
        page = admin_client.get(
            url(hourly),
            {"start": "2026-01-10T07:00", "end": "2026-01-10T09:00", "zone": "UTC", "preview": "1"},
        ).content.decode()
    assert listed(page, "missing") == ["2026-01-10T07:00:00Z", "2026-01-10T09:00:00Z"]
    assert listed(page, "present") == ["2026-01-10T08:00:00Z"]


@pytest.mark.parametrize(
    ("window", "field", "words"),
    [
        (
            {"start": "2026-01-10T05:00", "end": "2026-01-10T00:00"},
            "end",
            "end must not be earlier than start",
        ),
        ({"start": "2026-01-10T00:00", "end": "2026-01-10T09:00"}, "end", "end is in the future"),
        ({"start": "2025-11-01T00:00", "end": "2025-11-01T05:00"}, "start", "RUN_RETENTION_DAYS"),
        ({"start": "yesterday", "end": "2026-01-10T05:00"}, "start", "Enter a date and time"),
        ({"start": "2026-01-10T00:00", "end": ""}, "end", "This field is required"),
        # New York skips 02:00-03:00 on 2026-03-08: that wall time is no instant at all.
        (
            {"start": "2026-03-08T02:30", "end": "2026-03-08T05:00"},
            "start",
            "does not exist in America/New_York",
        ),
        # The calendar's ends: moving them between zones overflows.
        ({"start": "0001-01-01T00:00", "end": "2026-01-10T05:00"}, "start", "between the years"),
        ({"start": "2026-01-10T00:00", "end": "9999-12-31T23:59"}, "end", "between the years"),
        ({"start": "0001-01-01T00:00:00Z", "end": "2026-01-10T05:00"}, "start", "between the years"),
        (
            {"start": "2026-01-10T00:00", "end": "2026-01-10T05:00", "zone": "Europe/Paris"},
            "zone",
            "valid choice",
        ),
    ],
)
def test_a_bad_window_is_a_400_naming_the_field_and_writes_nothing(
    admin_client, hourly, window, field, words
):
    data = {"zone": NY, **window}
    before = writes(hourly)
    with travel(NOW):
        preview = admin_client.get(url(hourly), {**data, "preview": "Preview"})
        confirm = admin_client.post(url(hourly), data)
    for response in (preview, confirm):
        assert response.status_code == 400, response.status_code
        page = response.content.decode()
        error = re.search(rf'<ul class="errorlist" id="cronyard-error-{field}">(.*?)</ul>', page, re.S).group(
            1
        )
        assert f"{field}: " in error and words in error, error
        assert 'id="cronyard-backfill-confirm"' not in page
    assert writes(hourly) == before


def test_too_wide_a_window_lists_the_first_slots_and_offers_no_backfill(admin_client, tenant):
    with travel("2026-01-01T00:00:00Z"):
        minutely = make_job(tenant, "minutely", interval_seconds=None, cron_expr="* * * * *")
    window = {"start": "2026-01-09T00:00", "end": "2026-01-10T00:00", "zone": "UTC"}
    with travel(NOW):
        preview = admin_client.get(url(minutely), {**window, "preview": "Preview"})
        confirm = admin_client.post(url(minutely), window)
    assert preview.status_code == 400
    page = preview.content.decode()
    assert "end: more than 1000 slots in the range have no run" in page
    assert len(listed(page, "missing")) == services.MAX_BACKFILL_RUNS
    assert 'id="cronyard-backfill-confirm"' not in page
    assert confirm.status_code == 400 and "more than 1000 slots" in confirm.content.decode()
    assert not JobRun.objects.filter(job_id=minutely.pk).exists()


def test_a_one_time_job_has_no_backfill_button_and_its_form_says_why(admin_client, tenant):
    once = make_job(tenant, "once", interval_seconds=None, run_at=parse_utc("2099-01-01T00:00:00Z"))
    assert (
        'id="cronyard-backfill"'
        not in admin_client.get(f"/admin/jobs/job/{once.pk}/change/").content.decode()
    )
    response = admin_client.get(url(once), {**WINDOW, "zone": "UTC", "preview": "1"})
    assert (
        response.status_code == 400 and "a one-time job has no slots to backfill" in response.content.decode()
    )


def test_backfill_needs_the_change_permission(client, hourly):
    from django.contrib.auth.models import Permission, User

    viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_job"))
    client.force_login(viewer)
    with travel(NOW):
        assert client.get(url(hourly)).status_code == 403
        assert client.get(url(hourly), {**WINDOW, "preview": "1"}).status_code == 403
        assert client.post(url(hourly), WINDOW).status_code == 403
    assert JobRun.objects.filter(job_id=hourly.pk).count() == len(PRESENT)
