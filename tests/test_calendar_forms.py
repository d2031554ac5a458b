"""Calendar forms (issue 11 item 2): L, LW, nW in day-of-month, nL and n#k in day-of-week.

Differential tests against independent implementations: cronsim's own aware iteration
(which applies Debian cron's DST rule itself) for the forms it knows, and croniter for
nW (cronsim 2.8 lacks it), over random zones and starts.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from croniter import croniter
from cronsim import CronSim
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from jobs.schedule import ScheduleError, fire_times, load_zone, validate_cron
from runs.keys import parse_utc
from tests.support.admin_form import job_form_data

ZONES = [
    "Pacific/Chatham",
    "America/Santiago",
    "Australia/Lord_Howe",
    "America/New_York",
    "Europe/London",
    "UTC",
    "Asia/Kolkata",
]
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# Our search stops at 10 years ("never"); compare only what both sides reach well inside it.
WITHIN = timedelta(days=366 * 9)
COUNT = 6


def ours(expr: str, tz: str, after: datetime, count: int = COUNT) -> list[datetime]:
    times = fire_times(
        cron=expr, timezone=tz, interval_seconds=None, run_at=None, anchor=None, after=after, count=count
    )
    return [f.utc for f in times]


def starts() -> st.SearchStrategy[datetime]:
    return st.integers(0, 15 * 365 * 86400).map(
        lambda s: datetime(2020, 1, 1, tzinfo=UTC) + timedelta(seconds=s)
    )


# Hours and minutes around the zones' transitions (00:00-03:45 local), so DST meets the forms.
MINUTES = st.sampled_from(["0", "30", "45", "*/30", "15,45"])
HOURS = st.sampled_from(["0", "1", "2", "3", "9", "23", "*", "1-3"])
MONTHS = st.sampled_from(["*", "*", "2", "3,4,9,10,11"])
DOM_FORMS = st.sampled_from(["L", "LW", "L,15", "LW,1", "l"])
DOW_FORMS = st.sampled_from(["5L", "1#2", "FRI#5", "0L", "7#1", "1#1,5L", "SAT#3", "friL"])


@st.composite
def cronsim_exprs(draw: st.DrawFn) -> str:
    minute, hour, month = draw(MINUTES), draw(HOURS), draw(MONTHS)
    shape = draw(st.sampled_from(["dom", "dow", "both"]))
    dom = draw(DOM_FORMS) if shape != "dow" else "*"
    dow = draw(DOW_FORMS) if shape != "dom" else "*"
    return f"{minute} {hour} {dom} {month} {dow}"


def _cronsim_form(expr: str) -> str:
    # cronsim reads only a number before L; the weekday names are ours to translate.
    return expr.upper().replace("FRIL", "5L").replace("FRI#", "5#").replace("SAT#", "6#")


def _exists(moment: datetime) -> bool:
    """Whether an aware local wall time happens at all (is not in a spring-forward gap)."""
    wall = moment.replace(tzinfo=None)
    return moment.astimezone(UTC).astimezone(moment.tzinfo).replace(tzinfo=None) == wall


@example(expr="*/30 0 * 3,4,9,10,11 7#1", tz="America/Santiago", after=datetime(2026, 9, 1, tzinfo=UTC))
@SETTINGS
@given(expr=cronsim_exprs(), tz=st.sampled_from(ZONES), after=starts())
def test_l_and_hash_forms_match_cronsim_across_zones(expr: str, tz: str, after: datetime) -> None:
    zone = load_zone(tz)
    reference = CronSim(_cronsim_form(expr), after.astimezone(zone))
    expected = []
    for moment in reference:
        if not _exists(moment):
            # cronsim's aware iteration (elapsed-time jobs: the minute or hour starts with
            # `*`) yields wall times inside a spring-forward gap; Debian cron, and we, skip
            # them (hypothesis found '*/30 0 * 3,4,9,10,11 7#1' in America/Santiago).
            continue
        moment = moment.astimezone(UTC)
        if moment > after + WITHIN or len(expected) == COUNT:
            break
        expected.append(moment)
    got = [t for t in ours(expr, tz, after) if t <= after + WITHIN]
    assert got == expected


@st.composite
def nearest_exprs(draw: st.DrawFn) -> str:
    # Days every month has: for 29-31 croniter moves to the month's last day where we (like
    # a plain "31") do not fire in a month without that day (DECISIONS; worked examples below).
    day = draw(st.one_of(st.sampled_from([1, 2, 27, 28]), st.integers(1, 28)))
    # Daytime hours: no zone here changes its offset between 04:00 and 22:00 local, so
    # croniter's naive calendar and ours must agree instant for instant.
    minute, hour = draw(st.sampled_from(["0", "30", "*/20"])), draw(st.sampled_from(["9", "12", "4-6", "22"]))
    month = draw(st.sampled_from(["*", "*", "1,4,6", "3-5"]))
    return f"{minute} {hour} {day}W {month} *"


@SETTINGS
@given(expr=nearest_exprs(), tz=st.sampled_from(ZONES), after=starts())
def test_nearest_weekday_matches_croniter_across_zones(expr: str, tz: str, after: datetime) -> None:
    zone = load_zone(tz)
    reference = croniter(expr, after.astimezone(zone).replace(tzinfo=None))
    expected = [reference.get_next(datetime).replace(tzinfo=zone).astimezone(UTC) for _ in range(COUNT)]
    expected = [t for t in expected if t <= after + WITHIN]
    got = [t for t in ours(expr, tz, after) if t <= after + WITHIN]
    assert got == expected


# --------------------------------------------------------------------------
# Worked examples (2026), checked against a calendar by hand
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "tz", "after", "expected_local_dates"),
    [
        ("0 9 L * *", "UTC", "2026-01-01T00:00:00Z", ["2026-01-31", "2026-02-28", "2026-03-31"]),
        ("0 9 L 2 *", "UTC", "2027-03-01T00:00:00Z", ["2028-02-29", "2029-02-28"]),
        # 2026-01-31 is a Saturday, 2026-05-31 a Sunday.
        ("0 9 LW 1,5 *", "UTC", "2026-01-01T00:00:00Z", ["2026-01-30", "2026-05-29", "2027-01-29"]),
        # 2026-02-15 is a Sunday -> Monday 16th; 2026-08-01 a Saturday -> Monday 3rd (1W stays in month).
        ("0 9 15W 2 *", "UTC", "2026-01-01T00:00:00Z", ["2026-02-16"]),
        ("0 9 1W 8 *", "UTC", "2026-01-01T00:00:00Z", ["2026-08-03"]),
        # 2026-05-31 is a Sunday: 31W moves back to Friday the 29th; April has no 31st.
        ("0 9 31W 4,5 *", "UTC", "2026-01-01T00:00:00Z", ["2026-05-29"]),
        ("0 9 * * 5L", "Europe/London", "2026-01-01T00:00:00Z", ["2026-01-30", "2026-02-27", "2026-03-27"]),
        (
            "0 9 * * 1#2",
            "America/New_York",
            "2026-01-01T00:00:00Z",
            ["2026-01-12", "2026-02-09", "2026-03-09"],
        ),
    ],
)
def test_worked_examples(expr: str, tz: str, after: str, expected_local_dates: list[str]) -> None:
    got = fire_times(
        cron=expr,
        timezone=tz,
        interval_seconds=None,
        run_at=None,
        anchor=None,
        after=parse_utc(after),
        count=len(expected_local_dates),
    )
    assert [f.local.date().isoformat() for f in got] == expected_local_dates
    assert all(f.local.hour == 9 for f in got)


def test_calendar_forms_follow_the_dst_policy() -> None:
    # Last Sunday of October in London is the fall-back day: 01:30 happens twice.
    got = fire_times(
        cron="30 1 * 10 0L",
        timezone="Europe/London",
        interval_seconds=None,
        run_at=None,
        anchor=None,
        after=parse_utc("2026-10-01T00:00:00Z"),
        count=2,
        dst_policy={"repeated": "both"},
    )
    assert [f.utc for f in got] == [parse_utc("2026-10-25T00:30:00Z"), parse_utc("2026-10-25T01:30:00Z")]


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("0 0 30W 2 *", "can never fire"),
        ("0 0 31W 4,6,9,11 *", "can never fire"),
        ("0 0 32W * *", "out of range"),
        ("0 0 0W * *", "out of range"),
        ("0 0 * * L", "needs a weekday"),
        ("0 0 * * 1#6", "must be 1-5"),
        ("0 0 * * 1#0", "must be 1-5"),
        ("0 0 * * 8L", "out of range"),
        ("0 0 * * XYZ#1", "not a number"),
        ("0 0 L-2 * *", "not a number"),
        ("0 0 5L * *", "not a number"),
        ("0 0 LW/2 * *", "not a number"),
        ("0 0 * * 5L/2", "not a number"),
        ("0 L * * *", "not a number"),
        ("0 0 * L *", "not a number"),
        # A fifth Monday in February needs a leap year starting on a Monday: 2044, past the horizon.
        ("0 0 * 2 1#5", "does not fire within"),
    ],
)
def test_forms_that_cannot_fire_or_parse_are_refused(expr: str, message: str) -> None:
    with pytest.raises(ScheduleError, match=message):
        validate_cron(expr, "UTC")


@pytest.mark.parametrize("expr", ["0 0 L * *", "0 0 LW * *", "0 0 15W * *", "0 0 * * 5L", "0 0 * * 1#2"])
def test_api_accepts_the_forms(api, expr: str) -> None:
    body = {"name": "c", "cron": expr, "target": {"type": "http", "url": "https://example.com/hook"}}
    response = api.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.content


@pytest.mark.parametrize("expr", ["0 0 30W 2 *", "0 0 * * L", "0 0 * * 1#6", "0 0 L 2 * 1"])
def test_api_refuses_bad_forms_naming_cron(api, expr: str) -> None:
    body = {"name": "c", "cron": expr, "target": {"type": "http", "url": "https://example.com/hook"}}
    response = api.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 400, response.content
    assert list(response.json()) == ["cron"]


@pytest.mark.parametrize(("expr", "message"), [("0 0 30W 2 *", "can never fire"), ("0 0 * * 1#9", "1-5")])
def test_admin_form_refuses_bad_forms_on_the_cron_field(
    admin_client, settings, tenant, expr, message
) -> None:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    data = job_form_data(tenant, cron_expr=expr, dst_policy="")
    response = admin_client.post("/admin/jobs/job/add/", data)
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert list(errors) == ["cron_expr"] and message in str(errors["cron_expr"])
