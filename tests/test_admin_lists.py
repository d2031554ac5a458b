"""Lists an operator scans: the jobs list (state, next run in the job's zone, last run)
and the runs list (filter by job, job names instead of ids)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest

from jobs.admin.display import relative
from jobs.models import Job
from tests.support.runsapi import make_dead_run, make_job, make_run, minute_slots

pytestmark = pytest.mark.django_db


def row_of(html: str, name: str) -> str:
    rows = re.findall(r"<tr>.*?</tr>", html, re.S)
    found = [r for r in rows if f">{name}</a>" in r]
    assert len(found) == 1, (name, rows)
    return found[0]


def test_jobs_list_state_next_run_in_zone_and_last_run(admin_client, tenant):
    active = make_job(
        tenant, "ny report", cron_expr="0 9 * * *", interval_seconds=None, time_zone="America/New_York"
    )
    make_job(tenant, "paused one", paused=True)
    make_dead_run(active, minute_slots(1)[0] - timedelta(minutes=3))
    html = admin_client.get("/admin/jobs/job/").content.decode()

    active_row, paused_row = row_of(html, "ny report"), row_of(html, "paused one")
    # A neutral word, not Django's red "no" icon for a job that is simply running.
    assert "icon-no" not in active_row and "icon-yes" not in paused_row
    assert ">active</span>" in active_row and ">paused</span>" in paused_row

    # Next run on New York's wall clock to the second (09:00:00 EST or EDT), with a relative
    # time, and the UTC instant and the relative time on hover.
    active.refresh_from_db()
    assert re.search(
        r">\d{4}-\d\d-\d\d 09:00:00 E[SD]T</time> <span class=\"cronyard-relative\">\(in \d+ (h|min)\)",
        active_row,
    ), active_row
    assert f'title="{active.next_run_at.strftime("%Y-%m-%dT%H:%M:%SZ")} · in ' in active_row

    # Last run: its status badge and its slot by the same rule, how long ago on hover.
    assert re.search(
        r'class="cronyard-status"[^>]*>dead</span> <time class="cy-moment" datetime="[^"]+Z" '
        r'title="[^"]+Z · [34] min ago"[^>]*>\d{4}-\d\d-\d\d \d\d:\d\d:00 E[SD]T</time>',
        active_row,
    ), active_row
    assert "—" in paused_row  # never ran


def test_relative_times():
    now = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
    assert relative(now + timedelta(minutes=4, seconds=10), now=now) == "in 4 min"
    assert relative(now - timedelta(hours=3, minutes=5), now=now) == "3 h ago"
    assert relative(now + timedelta(seconds=30), now=now) == "in 30 s"
    assert relative(now + timedelta(days=2, hours=1), now=now) == "in 2 d"
    assert relative(now, now=now) == "now"


def test_runs_list_filters_by_job_and_names_it(admin_client, tenant):
    alpha, beta = make_job(tenant, "alpha-report"), make_job(tenant, "beta-sync")
    slots = minute_slots(3)
    a_run = make_run(alpha, slots[0])
    make_run(alpha, slots[1])
    make_run(beta, slots[2])

    response = admin_client.get("/admin/runs/jobrun/", {"job": str(alpha.pk)})
    html = response.content.decode()
    assert response.status_code == 200
    assert html.count('class="action-select"') == 2
    listed = re.findall(r"<tr>.*?</tr>", html.split("<tbody>")[1].split("</tbody>")[0], re.S)
    assert len(listed) == 2 and all("alpha-report" in r and "beta-sync" not in r for r in listed), listed
    # The sidebar offers the jobs by name and marks the chosen one.
    assert re.search(
        r'<li class="selected">\s*<a href="\?job=' + str(alpha.pk) + r'"[^>]*>alpha-report</a>', html
    )

    # A bad id is not a 500: the admin's "invalid filter" redirect.
    assert admin_client.get("/admin/runs/jobrun/", {"job": "nope"}).status_code == 302

    page = admin_client.get(f"/admin/runs/jobrun/{a_run.pk}/change/").content.decode()
    title = re.search(r"<h1>(.*?)</h1>", page, re.S).group(1)
    assert title.startswith("Run of alpha-report at ") and str(alpha.pk) not in title
    assert re.search(
        r'<a href="/admin/jobs/job/' + str(alpha.pk) + r'/change/" title="[^"]+">alpha-report</a>', page
    )
    assert Job.objects.count() == 2


def test_view_only_staff_cannot_issue_tenant_tokens(client, tenant):
    """A token is the tenant's whole API: issuing one needs the change permission, like
    rotating the signing secret."""
    from django.contrib.auth.models import Permission, User

    from jobs.models import ApiToken

    viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_tenant"))
    client.force_login(viewer)
    listed = client.get("/admin/jobs/tenant/")
    assert listed.status_code == 200
    assert b'value="issue_new_token"' not in listed.content
    before = ApiToken.objects.count()
    client.post("/admin/jobs/tenant/", {"action": "issue_new_token", "_selected_action": [tenant.pk]})
    assert ApiToken.objects.count() == before
