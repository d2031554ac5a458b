"""Calendar forms: L, LW, nW in day-of-month, nL and n#k in day-of-week.

Differential tests against independent implementations: cronsim's own aware iteration
(which applies Debian cron's DST rule itself) for the forms it knows, and croniter for
nW (cronsim 2.8 lacks it), over random zones and starts.
"""

from __future__ import annotations

import calendar
from datetime import UTC, date, datetime, timedelta

import pytest
from croniter import croniter
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


# The oracle: the expression's wall times from a brute-force calendar written here from
# the forms' definitions (not cronsim, which jobs/schedule/cron_calendar.py is built on), mapped
# to instants by Debian cron's DST rule, also written here. cronsim's own aware iteration
# was the oracle before; it departs from that rule at a gap at midnight (America/Santiago,
# "0 * ... 7#1": it drops 01:00, the first hour after the gap) and at a 30-minute overlap
# (Australia/Lord_Howe: it fires the repeated 01:30 of an elapsed-time job once).
_DAY_NAMES = {name: n for n, name in enumerate(["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"])}


def _values(text: str, low: int, high: int) -> list[int]:
    """Minutes, hours or months: *, */n, a-b, n, and lists of them."""
    out: set[int] = set()
    for part in text.split(","):
        if part == "*":
            out |= set(range(low, high + 1))
        elif part.startswith("*/"):
            out |= set(range(low, high + 1, int(part[2:])))
        elif "-" in part:
            first, last = map(int, part.split("-"))
            out |= set(range(first, last + 1))
        else:
            out.add(int(part))
    return sorted(out)


def _weekday(text: str) -> int:
    """0-7 or a name; Sunday is 0 (and 7)."""
    return _DAY_NAMES[text] if text in _DAY_NAMES else int(text) % 7


def _dom_matches(day: date, text: str) -> bool:
    last = calendar.monthrange(day.year, day.month)[1]
    last_weekday = last - max(0, date(day.year, day.month, last).weekday() - 4)  # Sat -1, Sun -2
    wanted = {"L": last, "LW": last_weekday}
    return any(
        day.day == wanted.get(part, None) or day.day == (int(part) if part.isdigit() else 0)
        for part in text.upper().split(",")
    )


def _dow_matches(day: date, text: str) -> bool:
    weekday = (day.weekday() + 1) % 7  # Sunday 0
    last = calendar.monthrange(day.year, day.month)[1]
    for part in text.upper().split(","):
        if part.endswith("L"):  # the last such weekday of the month
            if weekday == _weekday(part[:-1]) and day.day + 7 > last:
                return True
        elif "#" in part:  # the k-th such weekday of the month
            name, k = part.split("#")
            if weekday == _weekday(name) and (day.day - 1) // 7 + 1 == int(k):
                return True
        elif weekday == _weekday(part):
            return True
    return False


def _debian_instants(wall: datetime, zone, *, fixed_time: bool) -> list[datetime]:
    """The instants a matching local wall time fires at under Debian cron's rule: a
    fixed-time job at the first instance of a repeated time and just after a gap; an
    elapsed-time job at every real instance, none in a gap."""
    readings = sorted({wall.replace(tzinfo=zone, fold=fold).astimezone(UTC) for fold in (0, 1)})
    real = [t for t in readings if t.astimezone(zone).replace(tzinfo=None) == wall]
    if real:
        return real[:1] if fixed_time else real
    if not fixed_time:
        return []
    moment = readings[0]  # before the gap: walk to the first instant past it
    while moment.astimezone(zone).replace(tzinfo=None) <= wall:
        moment += timedelta(minutes=1)
    return [moment]


def debian_reference(expr: str, tz: str, after: datetime, count: int = COUNT) -> list[datetime]:
    """The first `count` instants after `after` (within WITHIN) from the brute-force oracle."""
    minute, hour, dom, month, dow = expr.split()
    zone = load_zone(tz)
    minutes, hours, months = _values(minute, 0, 59), _values(hour, 0, 23), _values(month, 1, 12)
    fixed_time = not (minute.startswith("*") or hour.startswith("*"))

    def day_matches(day: date) -> bool:
        if day.month not in months:
            return False
        if dom == "*" or dow == "*":  # Vixie: one restricted field decides, both restricted: either
            return (dom == "*" or _dom_matches(day, dom)) and (dow == "*" or _dow_matches(day, dow))
        return _dom_matches(day, dom) or _dow_matches(day, dow)

    found: set[datetime] = set()
    day, stop = (
        (after.astimezone(zone) - timedelta(days=1)).date(),
        (after + WITHIN).date() + timedelta(days=2),
    )
    while day <= stop:
        if day_matches(day):
            for h in hours:
                for m in minutes:
                    wall = datetime(day.year, day.month, day.day, h, m)
                    found.update(t for t in _debian_instants(wall, zone, fixed_time=fixed_time) if t > after)
            if len(found) >= count:
                # Shifted and repeated times can land past the next day's first ones: a
                # day more settles the order.
                stop = min(stop, day + timedelta(days=1))
        day += timedelta(days=1)
    return [t for t in sorted(found)[:count] if t <= after + WITHIN]


@example(expr="*/30 0 * 3,4,9,10,11 7#1", tz="America/Santiago", after=datetime(2026, 9, 1, tzinfo=UTC))
# cronsim's aware iteration got these two wrong (see above); ours must not.
@example(expr="0 * * 3,4,9,10,11 7#1", tz="America/Santiago", after=datetime(2020, 8, 1, tzinfo=UTC))
@example(expr="30 * * * 7#1", tz="Australia/Lord_Howe", after=datetime(2020, 3, 15, tzinfo=UTC))
@SETTINGS
@given(expr=cronsim_exprs(), tz=st.sampled_from(ZONES), after=starts())
def test_l_and_hash_forms_match_a_brute_force_calendar_across_zones(
    expr: str, tz: str, after: datetime
) -> None:
    got = [t for t in ours(expr, tz, after) if t <= after + WITHIN]
    assert got == debian_reference(expr, tz, after)


def test_the_brute_force_oracle_knows_the_forms() -> None:
    # Worked by hand (2026): the oracle itself, on dates from a calendar.
    utc = "UTC"
    start = datetime(2026, 1, 1, tzinfo=UTC)
    assert debian_reference("0 9 L * *", utc, start, 2) == [z9("2026-01-31"), z9("2026-02-28")]
    assert debian_reference("0 9 LW 5 *", utc, start, 1) == [z9("2026-05-29")]  # 31st is a Sunday
    assert debian_reference("0 9 * * 5L", utc, start, 2) == [z9("2026-01-30"), z9("2026-02-27")]
    assert debian_reference("0 9 * * 1#2", utc, start, 2) == [z9("2026-01-12"), z9("2026-02-09")]
    assert debian_reference("0 9 * * SAT#3", utc, start, 1) == [z9("2026-01-17")]
    # Both restricted: either matches (Vixie).
    assert debian_reference("0 9 15 1 1#1", utc, start, 2) == [z9("2026-01-05"), z9("2026-01-15")]
    # New York 2026-03-08: 02:30 does not exist; 2026-11-01: 01:30 happens twice.
    ny = "America/New_York"
    assert debian_reference("30 2 * 3 0", ny, start, 2)[1] == parse_utc("2026-03-08T07:00:00Z")
    assert debian_reference("30 * * 11 0#1", ny, datetime(2026, 11, 1, 4, tzinfo=UTC), 3) == [
        parse_utc("2026-11-01T04:30:00Z"),
        parse_utc("2026-11-01T05:30:00Z"),
        parse_utc("2026-11-01T06:30:00Z"),
    ]


def z9(day: str) -> datetime:
    return parse_utc(f"{day}T09:00:00Z")


@st.composite
def nearest_exprs(draw: st.DrawFn) -> str:
    # Days every month has: for 29-31 croniter moves to the month's last day where we (like
    # a plain "31") do not fire in a month without that day (docs/decisions/0009-calendar-forms.md;
    # worked examples below).
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
