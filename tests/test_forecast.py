"""The load forecast (GET /api/v1/forecast): due runs per step from the schedules.

The decisive test drives the real scheduler step in-process, on a clock the test
moves, over the same window the forecast was asked about (a DST day included), and
compares the runs it created minute by minute with the forecast.
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest

from jobs.dispatch.scheduler import Scheduler
from jobs.models import Job
from runs.keys import format_utc, parse_utc
from runs.models import JobRun
from tests.support import clock
from tests.support.scheduler import in_process_schedulers

pytestmark = pytest.mark.django_db(transaction=True)

FORECAST = "/api/v1/forecast"
TASK = {"type": "task", "name": "noop"}
MINUTE = timedelta(minutes=1)


def create(api, **fields) -> dict:
    response = api.post("/api/v1/jobs/", {"name": "job", "target": TASK, **fields}, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def forecast(api, **query) -> dict:
    params = {k: format_utc(v) if isinstance(v, datetime) else v for k, v in query.items()}
    response = api.get(FORECAST, params)
    assert response.status_code == 200, response.content
    return response.json()


def nonzero(body: dict) -> dict[str, int]:
    """{step start: count} of the steps that have runs."""
    start, step = parse_utc(body["from"]), timedelta(seconds=body["step"])
    return {format_utc(start + i * step): n for i, n in enumerate(body["counts"]) if n}


# --- what it counts -----------------------------------------------------------------


def test_default_window_is_the_next_24_hours_by_minute(api):
    with clock.travel("2026-06-01T10:17:31Z"):
        create(api, cron="0 * * * *")
        body = forecast(api)
    assert (body["from"], body["to"], body["step"]) == ("2026-06-01T10:17:00Z", "2026-06-02T10:17:00Z", 60)
    assert len(body["counts"]) == 1440 and body["total"] == 24
    hours = [datetime(2026, 6, 1, 11, tzinfo=UTC) + timedelta(hours=h) for h in range(24)]
    assert nonzero(body) == {format_utc(t): 1 for t in hours}


def test_paused_one_time_interval_start_and_end_are_honoured(api):
    t0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
    with clock.travel("2026-06-01T11:00:00Z"):
        create(api, name="paused", cron="*/10 * * * *", paused=True)
        create(api, name="once", run_at="2026-06-01T12:30:00Z")
        create(api, name="once-later", run_at="2026-06-03T00:00:00Z")  # outside the window
        create(api, name="every 25 min", interval_seconds=1500)  # anchored at 11:00:00
        create(api, name="starts", cron="15 * * * *", start_at="2026-06-01T13:00:00Z")
        create(api, name="ends", cron="45 * * * *", end_at="2026-06-01T13:50:00Z")
        body = forecast(api, **{"from": t0, "to": t0 + timedelta(hours=3), "step": 300})
    assert body["step"] == 300 and len(body["counts"]) == 36
    expected = Counter({"2026-06-01T12:30:00Z": 1})  # the one-time job
    t = datetime(2026, 6, 1, 11, 0, tzinfo=UTC)
    while t < t0 + timedelta(hours=3):
        if t >= t0:
            expected[format_utc(t - timedelta(minutes=t.minute % 5))] += 1
        t += timedelta(seconds=1500)
    expected.update(["2026-06-01T13:15:00Z", "2026-06-01T14:15:00Z"])  # from start_at on
    expected.update(["2026-06-01T12:45:00Z", "2026-06-01T13:45:00Z"])  # until end_at
    assert nonzero(body) == dict(expected)


def test_another_tenants_jobs_are_not_counted(api, db):
    from rest_framework.test import APIClient

    from jobs.tenant_services import create_tenant

    _, other_token = create_tenant(slug="other", max_concurrency=1)
    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Bearer {other_token}")
    with clock.travel("2026-06-01T10:00:00Z"):
        create(other, cron="* * * * *")
        create(api, cron="0 12 * * *")
        assert forecast(api)["total"] == 1
        assert forecast(other)["total"] == 1439  # from 10:01 (the next minute) on


def test_spikes_name_their_schedules_and_how_to_spread_them(api):
    with clock.travel("2026-06-01T10:00:00Z"):
        for i in range(6):
            create(api, name=f"hourly-{i}", cron="0 * * * *", timezone="Europe/Berlin")
        for i in range(2):
            create(api, name=f"tokyo-{i}", cron="0 * * * *", timezone="Asia/Tokyo")
        for i in range(3):
            create(api, name=f"five-{i}", cron="*/5 * * * *")
        for i in range(4):
            create(api, name=f"hashed-{i}", cron="H * * * *")
        body = forecast(api)
    spikes = body["spikes"]
    assert spikes and len(spikes) <= 5
    assert [s["count"] for s in spikes] == sorted((s["count"] for s in spikes), reverse=True)
    top = spikes[0]
    # At :00 the eight hourly jobs and the three */5 ones (and any hashed one on minute 0).
    assert top["at"].endswith(":00:00Z") and top["count"] >= 11
    assert len({s["count"] for s in spikes}) == len(spikes)  # each count once ...
    assert (
        top["repeats"] == sum(1 for n in body["counts"] if n == top["count"]) >= 23
    )  # ... with its recurrences
    assert body["counts"][top["index"]] == top["count"]
    causes = {c["cron"]: c for c in top["causes"]}
    hourly = causes["0 * * * *"]  # counted by expression, whatever its zones
    assert (hourly["kind"], hourly["jobs"], hourly["runs"]) == ("cron", 8, 8)
    assert hourly["timezones"] == {"Europe/Berlin": 6, "Asia/Tokyo": 2}
    assert hourly["spread"]["suggestion"] == "H * * * *" and "minute 0" in hourly["spread"]["why"]
    five = causes["*/5 * * * *"]
    assert (
        five["jobs"] == 3
        and five["timezones"] == {"UTC": 3}
        and five["spread"]["suggestion"] == "H/5 * * * *"
    )
    assert all(c["spread"] is None for c in top["causes"] if c["cron"] == "H * * * *")
    assert top["other_runs"] == top["count"] - sum(c["runs"] for c in top["causes"])
    assert top["times_mean"] > 2


def test_a_flat_load_has_no_spikes(api):
    with clock.travel("2026-06-01T10:00:00Z"):
        create(api, interval_seconds=60)
        body = forecast(api)
    assert body["total"] == 1439 and body["spikes"] == []


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"from": "tomorrow"}, "from"),
        ({"to": "2026-06-01T10:00:00"}, "to"),  # no offset
        ({"step": "x"}, "step"),
        ({"step": "0"}, "step"),
        ({"step": "-60"}, "step"),
        ({"step": "604801"}, "step"),
        ({"from": "2026-06-02T00:00:00Z", "to": "2026-06-01T00:00:00Z"}, "to"),
        ({"from": "2026-06-01T00:00:00Z", "to": "2026-06-01T00:00:00Z"}, "to"),
        ({"from": "2026-06-01T00:00:00Z", "to": "2026-06-08T00:00:01Z"}, "to"),  # over 7 days
        (
            {"from": "2026-06-01T00:00:00Z", "to": "2026-06-08T00:00:00Z", "step": "59"},
            "step",
        ),  # 10,251 steps
        ({"from": "0001-01-01T00:00:00Z"}, "from"),
        ({"from": "9999-12-30T00:00:00Z"}, "from"),
        ({"to": "9999-12-31T00:00:00Z"}, "to"),
    ],
)
def test_bad_windows_are_400_naming_the_parameter(api, query, field):
    response = api.get(FORECAST, query)
    assert response.status_code == 400 and field in response.json(), response.content


def test_the_largest_window_is_answered(api):
    with clock.travel("2026-06-01T10:00:00Z"):
        create(api, cron="*/5 * * * *", timezone="Australia/Lord_Howe")
        body = forecast(api, **{"from": "2026-06-01T00:00:00Z", "to": "2026-06-08T00:00:00Z", "step": 60})
    # Every 5 minutes of the week after the job's first slot, 10:05.
    assert len(body["counts"]) == 10_080 and body["total"] == 7 * 288 - 121


# --- the forecast against what the scheduler then does --------------------------------


@pytest.fixture
def make_scheduler():
    """In-process schedulers on the test database; each test gives its own clock."""
    yield from in_process_schedulers(at=datetime.now(UTC))


def _drive(scheduler: Scheduler, now: list[datetime], *, job_ids: list, until: datetime) -> None:
    """Move the scheduler's clock from due slot to due slot and let it dispatch each."""
    while True:
        due = (
            Job.objects.filter(pk__in=job_ids, paused=False, next_run_at__isnull=False)
            .order_by("next_run_at")
            .values_list("next_run_at", flat=True)
            .first()
        )
        if due is None or due >= until:
            return
        now[0] = due
        scheduler.lease.tick_now()
        while scheduler.step():
            pass
        assert Job.objects.filter(pk__in=job_ids, paused=False, next_run_at__lte=due).count() == 0


WINDOWS = {
    # New York springs forward at 07:00Z: 02:00-03:00 EDT does not exist.
    "spring forward": ("2026-03-08T03:00:00Z", "2026-03-08T11:00:00Z"),
    # New York falls back at 06:00Z (01:00-02:00 happens twice); London is on its own rules.
    "fall back": ("2026-11-01T03:00:00Z", "2026-11-01T09:00:00Z"),
}


@pytest.mark.parametrize("day", sorted(WINDOWS))
def test_the_forecast_is_what_the_scheduler_then_creates(api, make_scheduler, day):
    start, end = (parse_utc(t) for t in WINDOWS[day])
    ny = "America/New_York"
    jobs = [
        {"cron": "30 2 * * *", "timezone": ny},  # fixed-time: shifted out of the gap
        {"cron": "30 1 * * *", "timezone": ny, "dst_policy": {"repeated": "both"}},
        {"cron": "0 * * * *", "timezone": ny},  # elapsed-time
        {"cron": "*/20 1,2 * * *", "timezone": ny, "dst_policy": {"missing": "shift"}},
        {"cron": "*/15 * * * *", "timezone": "Europe/London"},
        {"cron": "H * * * *", "timezone": ny},
        {"cron": "H * * * *", "timezone": ny},
        {"cron": "H/30 * * * *", "timezone": "Australia/Lord_Howe"},
        {"cron": "45 * * * *", "timezone": ny, "jitter_seconds": 600},  # jitter moves starts, not slots
        {"interval_seconds": 1260},
        {"interval_seconds": 420, "end_at": format_utc(start + timedelta(hours=2, minutes=3))},
        {"cron": "10 * * * *", "start_at": format_utc(start + timedelta(hours=3))},
        {"run_at": format_utc(start + timedelta(hours=1, minutes=7))},
        {"cron": "*/10 * * * *", "paused": True},
    ]
    with clock.travel(start - timedelta(minutes=30)):
        ids = [create(api, name=f"j{i}", **fields)["id"] for i, fields in enumerate(jobs)]
    with clock.travel(start):
        body = forecast(api, **{"from": start, "to": end, "step": 60})
    assert body["total"] > 60

    now = [start]
    _drive(make_scheduler(node_id="forecast", clock=lambda: now[0]), now, job_ids=ids, until=end)
    created = Counter(
        format_utc(at.replace(second=0))
        for at in JobRun.objects.filter(job_id__in=ids, scheduled_at__gte=start, scheduled_at__lt=end)
        .exclude(trigger="manual")
        .values_list("scheduled_at", flat=True)
    )
    assert JobRun.objects.filter(job_id__in=ids, trigger="catch_up").count() == 0
    assert nonzero(body) == dict(created)
    if day == "spring forward":
        # 02:30 New York does not exist that day: the fixed-time job fired at 03:00 EDT.
        assert JobRun.objects.filter(job_id=ids[0], scheduled_at="2026-03-08T07:00:00Z").exists()
    else:
        # 01:30 happened twice and the job asked for both.
        fired = JobRun.objects.filter(job_id=ids[1]).values_list("scheduled_at", flat=True)
        assert sorted(fired) == [parse_utc("2026-11-01T05:30:00Z"), parse_utc("2026-11-01T06:30:00Z")]
