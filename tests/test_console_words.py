"""The console speaks one way on every page: one rule for a moment (the job's zone, or
UTC without a job, to the second with the zone's abbreviation; the UTC instant and the
relative time on hover), one for a duration, human column labels, page titles an
operator would write, one label per API value, and audit changes by the API's names."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib import admin
from django.db import models

from jobs import services
from jobs.admin.base import ReadOnlyAdmin
from jobs.admin.display import in_zone, moment_html
from jobs.api.serializers import JobSerializer
from jobs.models import AuditEntry, Job, Misfire, SchedulerNode
from runs.models import ExecutorNode
from tests.support.admin_form import job_form_data
from tests.support.runsapi import make_dead_run, make_job, make_run, minute_slots

pytestmark = pytest.mark.django_db

# A moment by the rule: "2026-12-07 09:00:05 EST" (a zone abbreviation may be "+03").
MOMENT = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d (?:[A-Z]{2,5}|[+-]\d\d(?:\d\d)?)"
# Django's own date format ("Dec. 4, 2026, 4:59 p.m."), which no page may show.
DJANGO_DATE = re.compile(
    r"\b(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)\w*\.? \d{1,2}, \d{4}|[ap]\.m\."
)


def body(response) -> str:
    assert response.status_code == 200, (response.status_code, response.content[:300])
    return response.content.decode()


def main(page: str) -> str:
    """The page without its sidebar of filters (whose labels are Django's own)."""
    return page.split('<div id="content-main"', 1)[-1].split('<nav id="changelist-filter"', 1)[0]


def headers(page: str) -> list[str]:
    """A list's column headings, as text."""
    head = page.split('<table id="result_list">', 1)[1].split("</thead>", 1)[0]
    texts = re.findall(r'<div class="text">(?:<a [^>]*>|<span>)?(.*?)(?:</a>|</span>)?</div>', head)
    return [t.strip() for t in texts if t.strip()]


# --- the rules themselves -------------------------------------------------------------


def test_a_moment_is_the_wall_time_to_the_second_with_its_zone():
    winter = datetime(2026, 12, 7, 14, 0, 5, tzinfo=UTC)
    assert in_zone(winter, "America/New_York") == "2026-12-07 09:00:05 EST"
    assert in_zone(winter) == "2026-12-07 14:00:05 UTC"  # no job: UTC
    html = str(moment_html(winter, now=winter - timedelta(minutes=4), zone="Europe/Berlin"))
    assert ">2026-12-07 15:00:05 CET</time>" in html
    # On hover: the instant as the API writes it, and how far it is.
    assert 'datetime="2026-12-07T14:00:05Z"' in html and 'title="2026-12-07T14:00:05Z · in 4 min"' in html
    assert moment_html(None, now=winter) == "—"


@pytest.mark.parametrize(
    "seconds, text",
    [
        (0.0002, "0.2 ms"),
        (0.85, "850 ms"),
        (12.44, "12.4 s"),
        (185, "3 min 5 s"),
        (180, "3 min"),
        (7800, "2 h 10 min"),
        (93600, "1 d 2 h"),
        (None, "—"),
    ],
)
def test_one_way_to_show_a_duration(seconds, text):
    from jobs.admin.display import duration_text

    assert duration_text(seconds) == text


def _read_only_shown(model_admin, model) -> set[str]:
    """The names a page shows read-only: list columns, read-only fields, and on a
    read-only admin every field of its object page."""
    names = set(getattr(model_admin, "list_display", ())) | set(model_admin.readonly_fields)
    if isinstance(model_admin, ReadOnlyAdmin):
        names |= set(model_admin.fields or ())
        for _, options in model_admin.fieldsets or ():
            names |= set(options["fields"])
        if not (model_admin.fields or model_admin.fieldsets):
            names |= {f.name for f in model._meta.fields}  # Django's view page shows them all
    return names


def test_no_console_page_leaves_a_moment_to_djangos_date_format():
    """A DateTimeField named in a list, a read-only field or an inline would be shown in
    Django's "Dec. 4, 2026, 4:59 p.m.": every one goes through the rule (moment_column)."""
    raw = []
    for model, model_admin in admin.site._registry.items():
        if model._meta.app_label not in ("jobs", "runs"):
            continue
        pages = [(model, model_admin), *((i.model, i(model, admin.site)) for i in model_admin.inlines)]
        for shown_model, shown_admin in pages:
            datetimes = {f.name for f in shown_model._meta.fields if isinstance(f, models.DateTimeField)}
            names = _read_only_shown(shown_admin, shown_model)
            if isinstance(shown_admin, admin.options.InlineModelAdmin):
                names |= set(shown_admin.fields or ())
            raw += [f"{type(shown_admin).__name__}.{f}" for f in sorted(names & datetimes)]
            if getattr(shown_admin, "date_hierarchy", None):
                raw.append(f"{type(shown_admin).__name__}.date_hierarchy")
    assert not raw, raw


# --- each page -----------------------------------------------------------------------


@pytest.fixture
def pages(tenant):
    ny = make_job(
        tenant, "ny-report", cron_expr="0 9 * * *", interval_seconds=None, time_zone="America/New_York"
    )
    once = make_job(tenant, "one-shot", interval_seconds=None, run_at=datetime.now(UTC) + timedelta(days=2))
    slots = minute_slots(3)
    dead = make_dead_run(ny, slots[0], attempts=2, finished_at=slots[0] + timedelta(seconds=185))
    done = make_run(
        ny,
        slots[1],
        status="succeeded",
        started_at=slots[1],
        finished_at=slots[1] + timedelta(milliseconds=850),
    )
    Misfire.objects.create(
        job=ny, partition_id=ny.partition_id, policy="run_once", missed_count=2,
        first_missed_at=slots[2], last_missed_at=slots[1], runs_created=1,
    )  # fmt: skip
    now = datetime.now(UTC)
    SchedulerNode.objects.create(node_id="s-1", hostname="h", pid=1, started_at=now, heartbeat_at=now)
    ExecutorNode.objects.create(
        node_id="e-1", hostname="h", pid=2, concurrency=4, started_at=now, heartbeat_at=now, last_claim_at=now
    )
    services.update_job(job=ny, changes={"cron_expr": "5 9 * * *"}, actor="admin:setup")
    return {"ny": ny, "once": once, "dead": dead, "done": done}


LISTS = {
    "/admin/jobs/job/": "Jobs",
    "/admin/runs/jobrun/": "Runs",
    "/admin/runs/deadrun/": "Dead-letter queue",
    "/admin/jobs/misfire/": "Misfires",
    "/admin/jobs/auditentry/": "Audit log",
    "/admin/jobs/tenant/": "Tenants",
    "/admin/jobs/schedulernode/": "Scheduler nodes",
    "/admin/runs/executornode/": "Executor nodes",
}


@pytest.mark.parametrize("url, title", LISTS.items())
def test_every_list_has_a_title_human_columns_and_moments_by_the_rule(admin_client, pages, url, title):
    page = body(admin_client.get(url))
    assert re.search(rf"<h1>{re.escape(title)}</h1>", page), re.findall(r"<h1>.*?</h1>", page)
    assert f"<title>{title} |" in page
    assert not re.search(r"Select [\w -]+ to (change|view)", page)
    # The app and the model are not both "Jobs": the section, then the page.
    crumbs = re.search(r'<div class="breadcrumbs">(.*?)</div>', page, re.S).group(1)
    assert "Jobs &rsaquo; Jobs" not in re.sub(
        r"<[^>]+>|\s+", lambda m: " " if m.group().isspace() else "", crumbs
    )
    # Human column labels: no field name (`started_at`, `retry_in_s`) as a heading.
    for heading in headers(page):
        assert "_" not in heading, (url, heading)
    assert not DJANGO_DATE.search(main(page)), DJANGO_DATE.search(main(page))


def test_the_run_page_shows_moments_durations_and_attempts_by_the_rule(admin_client, pages):
    dead = pages["dead"]
    page = body(admin_client.get(f"/admin/runs/jobrun/{dead.pk}/change/"))
    slot = in_zone(dead.scheduled_at, "America/New_York")
    assert f"<h1>Run of ny-report at {slot}</h1>" in page
    assert not DJANGO_DATE.search(page), DJANGO_DATE.search(page)
    # Started, finished, created, not before: the job's zone to the second, UTC on hover.
    for label in ("Started", "Finished", "Created", "Not before"):
        field = re.search(rf"<label>{label}:</label>\s*<div class=\"readonly\">(.*?)</div>", page, re.S)
        assert field, label
        assert re.search(r">\d{4}-\d\d-\d\d \d\d:\d\d:\d\d E[SD]T</time>", field.group(1)), (
            label,
            field.group(1),
        )
    assert re.search(r"<label>Ran for:</label>\s*<div class=\"readonly\">3 min 5 s</div>", page)
    # The attempts table: human headings, durations and moments by the rules.
    table = page.split('<table class="attempts">', 1)[1].split("</table>", 1)[0]
    heads = re.findall(r"<th>(.*?)</th>", table)
    assert heads == [
        "attempt", "executor", "started", "finished", "duration",
        "outcome", "result code", "error", "retry in",
    ]  # fmt: skip
    assert "<td>1.0 s</td>" in table and "1000.0" not in table
    assert ">2026-03-08 03:00:00 EDT</time>" in table  # 07:00Z in New York, after spring forward
    # The list: the run's length in the same words.
    listed = body(admin_client.get("/admin/runs/jobrun/", {"job": str(pages["ny"].pk)}))
    assert "· ran 850 ms" in listed and "took" not in listed


def test_the_misfire_audit_and_node_lists_show_moments_to_the_second(admin_client, pages):
    misfires = main(body(admin_client.get("/admin/jobs/misfire/")))
    # The missed slots in the job's zone.
    assert len(re.findall(rf">{MOMENT}</time>", misfires)) == 3
    assert re.search(r" E[SD]T</time>", misfires)
    audit = main(body(admin_client.get("/admin/jobs/auditentry/")))
    stamps = re.findall(r">(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) UTC</time>", audit)
    assert len(stamps) == AuditEntry.objects.count() >= 3  # UTC: an entry outlives its job
    for url in ("/admin/jobs/schedulernode/", "/admin/runs/executornode/"):
        assert (
            len(re.findall(r">\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC</time>", body(admin_client.get(url)))) == 2
        )


def test_the_dashboard_and_the_home_page_use_the_rules(admin_client, pages):
    dashboard = body(admin_client.get("/admin/runs/jobrun/dashboard/?refresh=0"))
    assert not DJANGO_DATE.search(dashboard)
    assert re.search(r"As of <time[^>]*>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC</time>", dashboard)
    executor = re.search(r'<tr data-executor="e-1".*?</tr>', dashboard, re.S).group()
    assert re.search(r">\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC</time>", executor)
    assert re.search(r"<td>\d+(\.\d)? (ms|s)</td>", executor)  # heartbeat age, by the duration rule
    # Recent changes name the API's fields.
    audit = dashboard.split('id="audit"', 1)[1].split("</section>", 1)[0]
    assert "Edit: cron" in audit and "cron_expr" not in audit

    home = body(admin_client.get("/admin/"))
    assert "None available" not in home and "Recent actions" not in home
    recent = home.split('id="recent-changes-module"', 1)[1].split("</div>", 1)[0]
    assert "Edit: ny-report</a> (cron)" in recent
    assert re.search(r">\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC</time> · admin:setup", recent)
    # The sections are named, not "Jobs" and "Jobs".
    assert "Scheduling" in home and "Runs and executors" in home


# --- one label per API value ---------------------------------------------------------


def test_trigger_kinds_and_actions_have_one_label_everywhere(admin_client, pages, api):
    jobs = body(admin_client.get("/admin/jobs/job/"))
    once_row = re.search(r"<tr>(?:(?!</tr>).)*one-shot(?:(?!</tr>).)*</tr>", jobs, re.S).group()
    assert '<td class="field-trigger_type">One time</td>' in once_row
    assert re.search(r'<a href="\?trigger=run_at"[^>]*>One time</a>', jobs)  # the filter says the same
    # The API keeps its value and says what the console shows for it.
    schema = api.get("/api/schema/", {"format": "json"}).json()
    trigger = schema["components"]["schemas"]["Job"]["properties"]["trigger_type"]
    assert "`run_at` (shown in the console as 'One time')" in trigger["description"]
    assert ["cron", "interval", "run_at"] in [s.get("enum") for s in schema["components"]["schemas"].values()]
    from jobs.models import TriggerType

    assert [t.label for t in TriggerType] == ["Cron", "Interval", "One time"]
    audit = main(body(admin_client.get("/admin/jobs/auditentry/")))
    assert re.search(r"Edit <code[^>]*>update</code>", audit)
    assert "`update` 'Edit'" in json.dumps(schema)


def test_the_audit_actions_console_labels_are_one_sentence_in_the_schema(api):
    """The audit entry's `action` and the list's `action` filter say the same words, from
    one place in the code (two copies drift the day an action is added)."""
    from pathlib import Path

    from jobs.models import AuditAction

    schema = api.get("/api/schema/", {"format": "json"}).json()
    field = schema["components"]["schemas"]["AuditEntry"]["properties"]["action"]["description"]
    (parameter,) = [
        p["description"]
        for p in schema["paths"]["/api/v1/audit/"]["get"]["parameters"]
        if p["name"] == "action"
    ]
    sentence = "Shown in the console as: " + ", ".join(f"`{a.value}` {a.label!r}" for a in AuditAction)
    assert sentence in field and sentence in parameter
    root = Path(__file__).resolve().parent.parent
    written = [
        str(path.relative_to(root))
        for package in ("jobs", "runs")
        for path in (root / package).rglob("*.py")
        for line in path.read_text().splitlines()
        if '"Shown in the console as' in line
    ]
    assert written == ["jobs/api/audit.py"], written


# --- audit changes by the API's field names -----------------------------------------


def test_the_api_names_of_job_fields_are_the_serializers():
    """The mapping has one home (jobs.models.API_FIELD_NAMES) and the serializer's
    `source=` attributes agree with it; no API name is another field's column."""
    from jobs.models import API_FIELD_NAMES

    sources = {
        field.source: name
        for name, field in JobSerializer().fields.items()
        if not field.read_only and field.source != name
    }
    assert sources == API_FIELD_NAMES
    assert not set(API_FIELD_NAMES.values()) & set(API_FIELD_NAMES)


def test_audit_changes_use_the_apis_field_names_new_and_old(api, admin_client, tenant):
    job = api.post(
        "/api/v1/jobs/",
        {"name": "named", "cron": "0 * * * *", "timezone": "UTC", "target": {"type": "task", "name": "noop"}},
        format="json",
    ).json()
    assert (
        api.patch(
            f"/api/v1/jobs/{job['id']}/", {"cron": "5 * * * *", "timezone": "Europe/Berlin"}, format="json"
        ).status_code
        == 200
    )
    # An entry as written before the log used the API's names: read by them too.
    old = AuditEntry.objects.create(
        tenant=tenant, job_id=job["id"], job_name="named", actor="system", action="update",
        changes={"cron_expr": ["1 * * * *", "2 * * * *"], "time_zone": ["UTC", "Asia/Tokyo"]},
    )  # fmt: skip
    stored = {e.action: e.changes for e in AuditEntry.objects.filter(job_id=job["id"]).exclude(pk=old.pk)}
    assert {"cron", "timezone"} <= set(stored["create"]) and "cron_expr" not in stored["create"]
    assert stored["update"] == {"cron": ["0 * * * *", "5 * * * *"], "timezone": ["UTC", "Europe/Berlin"]}

    listed = api.get("/api/v1/audit/", {"job": job["id"]}).json()["results"]
    assert listed[0]["changes"] == {"cron": ["1 * * * *", "2 * * * *"], "timezone": ["UTC", "Asia/Tokyo"]}
    assert all("cron_expr" not in json.dumps(e["changes"]) for e in listed)
    page = body(admin_client.get(f"/admin/jobs/auditentry/{old.pk}/change/"))
    assert "&quot;cron&quot;" in page and "cron_expr" not in page and "time_zone" not in page
    assert "<h1>Edit of named by system, " in page


# --- the job form asks only for the chosen trigger kind's fields --------------------


def _form(admin_client, job) -> str:
    return body(admin_client.get(f"/admin/jobs/job/{job.pk}/edit/"))


def test_the_job_form_offers_the_trigger_kinds_with_their_fields(admin_client, tenant):
    job = make_job(tenant, "every-minute", interval_seconds=60)
    page = _form(admin_client, job)
    # The kinds by the console's labels, this job's checked, the fields of each kind
    # from the rules (jobs.rules.job), and the script that hides the others.
    assert re.search(r'<input type="radio" name="trigger_kind" value="interval"[^>]*checked', page)
    assert " One time</label>" in page
    assert "data-kind-fields=" in page and "&quot;interval&quot;: [&quot;interval_seconds&quot;]" in page
    assert re.search(r'<script src="/static/jobs/trigger_kind\.js"', page)


def _saved(admin_client, url: str, tenant, **fields) -> None:
    """Post the job form; it must save (a redirect), else its errors are the failure."""
    response = admin_client.post(url, job_form_data(tenant, **fields))
    errors = re.findall(r'<ul class="errorlist[^>]*>.*?</ul>', response.content.decode())
    assert response.status_code == 302, errors


def test_the_job_form_reads_only_the_chosen_kinds_fields(admin_client, tenant):
    """Hidden inputs of another kind are not read: an interval job saved with a nonsense
    zone keeps its zone; a kind switched to cron clears the interval still in its input,
    as a PATCH naming one trigger does."""
    job = make_job(tenant, "every-minute", interval_seconds=60, time_zone="Asia/Tokyo")
    url = f"/admin/jobs/job/{job.pk}/edit/"
    _saved(
        admin_client, url, tenant, name="every-minute", trigger_kind="interval", cron_expr="not cron",
        time_zone="Mars/Base", interval_seconds="120", dst_policy_0="last",
    )  # fmt: skip
    job.refresh_from_db()
    assert (job.interval_seconds, job.cron_expr, job.time_zone, job.dst_policy) == (120, "", "Asia/Tokyo", {})

    _saved(
        admin_client, url, tenant, name="every-minute", trigger_kind="cron", cron_expr="0 9 * * *",
        time_zone="Europe/Berlin", interval_seconds="120", run_at_0="junk",
    )  # fmt: skip
    job.refresh_from_db()
    assert (job.cron_expr, job.interval_seconds, job.run_at, job.time_zone) == (
        "0 9 * * *", None, None, "Europe/Berlin",
    )  # fmt: skip
    (edit,) = AuditEntry.objects.filter(job_id=job.pk, action="update").order_by("-id")[:1]
    assert edit.changes["cron"] == ["", "0 9 * * *"] and edit.changes["interval_seconds"] == [120, None]


def test_a_new_one_time_job_from_the_form_ignores_the_cron_fields(admin_client, tenant):
    at = (datetime.now(UTC) + timedelta(days=1)).replace(microsecond=0)
    _saved(
        admin_client, "/admin/jobs/job/add/", tenant, name="once", trigger_kind="run_at",
        cron_expr="*/5 * * * *", time_zone="Nowhere/Zone",
        run_at_0=at.strftime("%Y-%m-%d"), run_at_1=at.strftime("%H:%M:%S"),
    )  # fmt: skip
    (job,) = Job.objects.filter(name="once")
    assert (job.trigger_type, job.cron_expr, job.time_zone, job.run_at) == ("run_at", "", "UTC", at)


def test_the_dead_letter_queue_counts_runs_not_queues(admin_client, tenant):
    job = make_job(tenant, "nightly")
    for minute in (1, 2):
        make_dead_run(job, datetime(2026, 3, 8, 7, minute, tzinfo=UTC), attempts=2)
    page = body(admin_client.get("/admin/runs/deadrun/"))
    assert "2 dead runs in the queue" in page and "2 dead-letter queue" not in page
