"""PATCH /api/v1/jobs/{id}/?dry_run=true: what an edit would do, and nothing written.

Each answer is checked against what the real PATCH then does (same clock): the job it
leaves, its audit entry, its ledger ranges, its fire times, and what the scheduler
does with the slots already past.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.forms.models import model_to_dict

from jobs.models import AuditEntry, Job, Misfire, SlotRange
from runs.keys import format_utc, parse_utc
from runs.models import JobRun
from tests.support import clock
from tests.support.scheduler import in_process_schedulers, make_job

pytestmark = pytest.mark.django_db(transaction=True)

T = datetime(2026, 6, 1, 12, 0, 30, tzinfo=UTC)
MINUTE = timedelta(minutes=1)
HOOK = {"type": "http", "url": "https://example.com/hook", "headers": {"Authorization": "Bearer s3cret"}}


@pytest.fixture
def make_scheduler():
    yield from in_process_schedulers(at=T)


def url(job) -> str:
    return f"/api/v1/jobs/{job.id if hasattr(job, 'id') else job}/"


def state(job_id) -> dict:
    """Everything an edit could write: the row, its audit entries, ranges and misfires."""
    row = Job.objects.get(pk=job_id)
    return {
        "row": {**model_to_dict(row), "updated_at": row.updated_at, "schedule_since": row.schedule_since},
        "audit": list(AuditEntry.objects.filter(job_id=job_id).values_list("id", flat=True)),
        "ranges": list(SlotRange.objects.filter(job_id=job_id).values_list("id", flat=True)),
        "misfires": list(Misfire.objects.filter(job_id=job_id).values_list("id", flat=True)),
        "runs": JobRun.objects.filter(job_id=job_id).count(),
    }


def dry(api, job, body: dict, **query):
    return api.patch(
        url(job) + "?" + "&".join(f"{k}={v}" for k, v in {"dry_run": "true", **query}.items()),
        body,
        format="json",
    )


def overdue_job(tenant, **fields) -> Job:
    """A minutely job whose scheduler stopped ten minutes ago (slots due, not dispatched)."""
    job = make_job(tenant, next_run_at=T.replace(second=0) - 10 * MINUTE, target=HOOK, **fields)
    Job.objects.filter(pk=job.pk).update(
        created_at=T - timedelta(hours=1), schedule_since=T - timedelta(hours=1)
    )
    job.refresh_from_db()
    return job


EDITS = [
    {"cron": "*/5 * * * *"},
    {"cron": "*/5 * * * *", "timezone": "Asia/Kolkata"},
    {"interval_seconds": 420},
    {"paused": True},
    {"name": "renamed", "priority": 7},
    {"misfire_policy": "catch_up", "max_catch_up": 3},
    {"end_at": "2026-06-01T13:00:00Z"},
    {"starting_deadline_seconds": 900},
    {"target": {**HOOK, "headers": {"Authorization": "***"}, "body": "changed"}},
]


@pytest.mark.parametrize("body", EDITS, ids=lambda b: ",".join(b))
def test_a_dry_run_writes_nothing_and_says_what_the_patch_then_does(api, tenant, body):
    job = overdue_job(tenant)
    with clock.travel(T):
        before = state(job.id)
        answer = dry(api, job, body)
        assert answer.status_code == 200, answer.content
        assert state(job.id) == before, "a dry run wrote something"
        preview = answer.json()
        real = api.patch(url(job), body, format="json")
        assert real.status_code == 200, real.content
    assert preview["dry_run"] is True
    # The job as the change leaves it: the PATCH's own answer, field for field.
    assert preview["job"] == real.json()
    assert preview["next_run_at"] == {
        "before": format_utc(job.next_run_at),
        "after": real.json()["next_run_at"],
    }
    # The audit entry it records (an edit of fields; a pause is its own action).
    entries = AuditEntry.objects.filter(job_id=job.id, action="update").values_list("changes", flat=True)
    assert list(entries) == ([preview["changes"]] if preview["changes"] else [])
    assert "s3cret" not in answer.content.decode()
    # The ledger ranges it records.
    new_ranges = SlotRange.objects.filter(job_id=job.id).exclude(id__in=before["ranges"]).order_by("id")
    assert preview["ledger_ranges"] == [
        {
            "first_at": format_utc(r.first_at),
            "last_at": format_utc(r.last_at),
            "outcome": r.outcome,
            "reason": r.reason,
        }
        for r in new_ranges
    ]
    # Its fire times: the first ones after the change are the job's preview afterwards.
    with clock.travel(T):
        after = api.get(url(job) + "preview", {"count": 20}).json()["fire_times"]
    shown = preview["fire_times"]["after"]["times"]
    future = [t["utc"] for t in after if parse_utc(t["utc"]) >= T]
    assert shown[: len(future)] == future[: len(shown)]


def test_changing_the_minute_lists_the_slots_added_and_removed(api, tenant):
    with clock.travel("2026-06-01T10:00:00Z"):
        job = api.post(
            "/api/v1/jobs/", {"name": "hourly", "cron": "0 * * * *", "target": HOOK}, format="json"
        )
        job_id = job.json()["id"]
        answer = dry(api, job_id, {"cron": "30 * * * *"}).json()
    times = answer["fire_times"]
    assert (times["from"], times["to"], times["truncated"]) == (
        "2026-06-01T10:00:00Z",
        "2026-06-08T10:00:00Z",
        False,
    )
    assert times["before"]["count"] == times["removed"]["count"] == 168  # a week of hours, 11:00 on
    assert times["after"]["count"] == times["added"]["count"] == 168
    assert len(times["added"]["times"]) == 100  # capped list, full count
    assert times["removed"]["times"][0] == "2026-06-01T11:00:00Z"
    assert times["added"]["times"][0] == "2026-06-01T10:30:00Z"
    assert answer["schedule_changed"] is True and answer["ledger_ranges"] == []
    assert answer["due_now"] == {
        "due": False,
        "because_of_edit": False,
        "note": "No: an edit never fires a past slot; the next run is 2026-06-01T10:30:00Z.",
    }
    assert answer["past_slots"]["rule"] == "none" and answer["past_slots"]["will_run"] == 0
    assert answer["changes"] == {"cron": ["0 * * * *", "30 * * * *"]}  # the API's field names


def test_a_dense_interval_is_compared_over_part_of_the_week(api, tenant):
    with clock.travel("2026-06-01T10:00:00Z"):
        job = api.post(
            "/api/v1/jobs/", {"name": "fast", "interval_seconds": 10, "target": HOOK}, format="json"
        )
        answer = dry(api, job.json()["id"], {"interval_seconds": 15}).json()
    times = answer["fire_times"]
    assert times["truncated"] is True and times["before"]["count"] <= 20_000
    assert parse_utc(times["to"]) < parse_utc("2026-06-08T10:00:00Z")


def test_a_schedule_change_leaves_the_due_slots_missed(api, tenant):
    job = overdue_job(tenant)
    with clock.travel(T):
        answer = dry(api, job, {"cron": "0 0 * * *"}).json()
    past = answer["past_slots"]
    assert (past["count"], past["will_run"], past["rule"]) == (11, 0, "schedule_changed")
    assert (past["first"], past["last"]) == ("2026-06-01T11:50:00Z", "2026-06-01T12:00:00Z")
    assert answer["ledger_ranges"] == [
        {
            "first_at": "2026-06-01T11:50:00Z",
            "last_at": format_utc(T),
            "outcome": "missed",
            "reason": "schedule_changed",
        }
    ]
    assert answer["job"]["next_run_at"] == "2026-06-02T00:00:00Z" and answer["due_now"]["due"] is False


@pytest.mark.parametrize(
    ("body", "will_run"),
    [
        ({"misfire_policy": "catch_up", "max_catch_up": 3}, 3),
        ({"misfire_policy": "skip"}, 0),
        ({"priority": 1}, 1),
    ],
)
def test_the_misfire_rules_are_what_the_scheduler_then_does(api, tenant, make_scheduler, body, will_run):
    job = overdue_job(tenant)
    with clock.travel(T):
        answer = dry(api, job, body).json()
        assert api.patch(url(job), body, format="json").status_code == 200
    past = answer["past_slots"]
    assert (past["count"], past["rule"], past["will_run"]) == (11, "misfire_policy", will_run)
    assert answer["due_now"]["due"] is True and answer["due_now"]["because_of_edit"] is False
    scheduler = make_scheduler(node_id="preview")
    scheduler.lease.tick_now()
    while scheduler.step():
        pass
    assert JobRun.objects.filter(job_id=job.id, trigger="catch_up").count() == will_run


def test_a_longer_starting_deadline_fires_the_late_slots_as_scheduled(api, tenant, make_scheduler):
    job = overdue_job(tenant)  # its oldest due slot is 630 s late: a misfire under the global 60 s
    body = {"starting_deadline_seconds": 900}
    with clock.travel(T):
        answer = dry(api, job, body).json()
        assert api.patch(url(job), body, format="json").status_code == 200
    past = answer["past_slots"]
    assert (past["count"], past["rule"], past["will_run"]) == (11, "on_time", 11)
    assert answer["changes"] == {"starting_deadline_seconds": [None, 900]}
    scheduler = make_scheduler(node_id="preview")
    scheduler.lease.tick_now()
    while scheduler.step():
        pass
    assert JobRun.objects.filter(job_id=job.id, trigger="schedule").count() == 11
    assert not Misfire.objects.filter(job_id=job.id).exists()


def test_pausing_an_overdue_job_records_a_misfire_and_a_paused_range(api, tenant):
    job = overdue_job(tenant)
    with clock.travel(T):
        answer = dry(api, job, {"paused": True}).json()
    assert answer["past_slots"]["rule"] == "paused" and answer["past_slots"]["will_run"] == 0
    assert [(r["outcome"], r["reason"]) for r in answer["ledger_ranges"]] == [("skipped", "paused")]
    assert answer["fire_times"]["after"]["count"] == 0 and answer["fire_times"]["removed"]["count"] > 0
    assert answer["due_now"]["note"] == "No: the job is paused after the edit."
    assert answer["changes"] == {}  # a pause is its own audit action, not a field diff


BAD = [
    {"cron": "0 0 30 2 *"},
    {"timezone": "Mars/Olympus"},
    {"intervall_seconds": 60},
    {"interval_seconds": "60"},
    {"cron": "* * * * *", "interval_seconds": 60},
    {"jitter_seconds": 4000, "cron": "0 * * * *"},
    {"target": {**HOOK, "url": "https://other.example.com/", "headers": {"Authorization": "***"}}},
    {"start_at": "2026-06-02T00:00:00"},
    {"end_at": "2020-01-01T00:00:00Z"},
]


@pytest.mark.parametrize("body", BAD, ids=lambda b: ",".join(b))
def test_a_dry_run_refuses_what_the_patch_refuses_with_the_same_answer(api, tenant, body):
    job = overdue_job(tenant)
    with clock.travel(T):
        before = state(job.id)
        preview = dry(api, job, body)
        real = api.patch(url(job), body, format="json")
        assert state(job.id) == before
    assert preview.status_code == real.status_code == 400, (preview.content, real.content)
    assert preview.json() == real.json()


@pytest.mark.parametrize("value", ["maybe", "", "2"])
def test_a_bad_dry_run_flag_is_a_400_naming_it(api, tenant, value):
    job = overdue_job(tenant)
    before = state(job.id)
    response = dry(api, job, {"name": "x"}, dry_run=value)
    assert response.status_code == 400 and "dry_run" in response.json(), response.content
    assert state(job.id) == before


def test_another_tenants_job_is_a_404_even_dry(api, tenant, db):
    from jobs.tenant_services import create_tenant

    other, _ = create_tenant(slug="other", max_concurrency=1)
    job = make_job(other, next_run_at=T)
    assert dry(api, job, {"name": "x"}).status_code == 404


# --- the console's "Preview changes" (the admin endpoint behind it) -------------------


def test_the_change_forms_preview_is_the_api_dry_run(admin_client, api, tenant):
    from jobs import services
    from tests.support.admin_form import job_form_data

    with clock.travel("2026-06-01T10:00:00Z"):
        job = services.create_job(
            tenant=tenant, fields=dict(name="hourly", cron_expr="0 * * * *", target=HOOK)
        )
        before = state(job.id)
        form = job_form_data(tenant, name="hourly", cron_expr="30 * * * *", target={**HOOK, "method": "POST"})
        panel = admin_client.post(f"/admin/jobs/job/{job.pk}/edit-preview/", form)
        dry_run = dry(api, job, {"cron": "30 * * * *"}).json()
        assert state(job.id) == before
    assert panel.status_code == 200, panel.content
    body = panel.json()
    for key in ("due_now", "past_slots", "ledger_ranges", "schedule_changed", "next_run_at", "changes"):
        assert body[key] == dry_run[key], key
    panel_times, api_times = body["fire_times"], dry_run["fire_times"]
    for key in ("from", "to", "truncated"):
        assert panel_times[key] == api_times[key]
    for key in ("before", "after", "added", "removed"):  # the panel lists 50, the API 100
        assert panel_times[key]["count"] == api_times[key]["count"]
        assert panel_times[key]["times"] == api_times[key]["times"][:50]
    assert body["before_list"][0] == {
        "utc": "2026-06-01T11:00:00Z",
        "local": "2026-06-01 11:00:00 UTC",
        "mark": "removed",
    }
    assert body["after_list"][0] == {
        "utc": "2026-06-01T10:30:00Z",
        "local": "2026-06-01 10:30:00 UTC",
        "mark": "added",
    }
    assert len(body["after_list"]) == 50 and body["fire_times"]["after"]["count"] == 168


def test_the_change_forms_preview_refuses_what_save_refuses(admin_client, tenant):
    from jobs import services
    from tests.support.admin_form import job_form_data

    job = services.create_job(tenant=tenant, fields=dict(name="hourly", cron_expr="0 * * * *", target=HOOK))
    before = state(job.id)
    response = admin_client.post(
        f"/admin/jobs/job/{job.pk}/edit-preview/", job_form_data(tenant, cron_expr="61 * * * *")
    )
    assert response.status_code == 400 and "cron_expr" in response.json()["errors"]
    assert admin_client.get(f"/admin/jobs/job/{job.pk}/edit-preview/").status_code == 405
    assert state(job.id) == before
