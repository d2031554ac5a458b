"""Table tests for jobs.schedule (pure: no Django, no database)."""

from __future__ import annotations

import itertools
import time
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter
from cronsim import CronSim

from jobs.schedule import (
    FireTime,
    ScheduleError,
    expand_cron,
    fire_times,
    is_fixed_time,
    load_zone,
    next_cron_time,
    next_fire_time,
    next_interval_time,
    validate_cron,
)

pytestmark: list[pytest.MarkDecorator] = []

UTC = UTC
NY = "America/New_York"


def z(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def cron_times(
    expr: str, tz: str, after: datetime, until: datetime, job_id: str | None = None
) -> list[FireTime]:
    return fire_times(
        cron=expr,
        timezone=tz,
        interval_seconds=None,
        run_at=None,
        anchor=None,
        after=after,
        until=until,
        job_id=job_id,
    )


def utcs(expr: str, tz: str, after: datetime, until: datetime) -> list[datetime]:
    return [f.utc for f in cron_times(expr, tz, after, until)]


# ---------------------------------------------------------------------------
# DST tables.  (expr, zone, window start, window end, expected UTC fire times)
# ---------------------------------------------------------------------------

DST_TABLE = [
    # New York spring forward, 2026-03-08 02:00 EST -> 03:00 EDT (07:00Z).
    (
        "30 2 * * *",
        NY,
        z(2026, 3, 7),
        z(2026, 3, 10),
        [z(2026, 3, 7, 7, 30), z(2026, 3, 8, 7, 0), z(2026, 3, 9, 6, 30)],
    ),
    ("0 2,3 * * *", NY, z(2026, 3, 8, 0), z(2026, 3, 8, 23), [z(2026, 3, 8, 7, 0)]),
    (
        "0 * * * *",
        NY,
        z(2026, 3, 8, 5, 30),
        z(2026, 3, 8, 8, 0),
        [z(2026, 3, 8, 6, 0), z(2026, 3, 8, 7, 0), z(2026, 3, 8, 8, 0)],
    ),
    ("*/20 2 * * *", NY, z(2026, 3, 8, 0), z(2026, 3, 9, 0), []),
    # New York fall back, 2026-11-01 02:00 EDT -> 01:00 EST (06:00Z).
    ("30 1 * * *", NY, z(2026, 11, 1, 0), z(2026, 11, 2, 0), [z(2026, 11, 1, 5, 30)]),
    (
        "0 * * * *",
        NY,
        z(2026, 11, 1, 4, 30),
        z(2026, 11, 1, 7, 0),
        [z(2026, 11, 1, 5, 0), z(2026, 11, 1, 6, 0), z(2026, 11, 1, 7, 0)],
    ),
    (
        "*/20 1 * * *",
        NY,
        z(2026, 11, 1, 0),
        z(2026, 11, 2, 0),
        [
            z(2026, 11, 1, 5, 0),
            z(2026, 11, 1, 5, 20),
            z(2026, 11, 1, 5, 40),
            z(2026, 11, 1, 6, 0),
            z(2026, 11, 1, 6, 20),
            z(2026, 11, 1, 6, 40),
        ],
    ),
    # London spring forward, 2026-03-29 01:00 GMT -> 02:00 BST (01:00Z).
    (
        "30 1 * * *",
        "Europe/London",
        z(2026, 3, 28),
        z(2026, 3, 31),
        [z(2026, 3, 28, 1, 30), z(2026, 3, 29, 1, 0), z(2026, 3, 30, 0, 30)],
    ),
    (
        "30 * * * *",
        "Europe/London",
        z(2026, 3, 29, 0),
        z(2026, 3, 29, 2),
        [z(2026, 3, 29, 0, 30), z(2026, 3, 29, 1, 30)],
    ),
    # London fall back, 2026-10-25 02:00 BST -> 01:00 GMT (01:00Z).
    (
        "30 1 * * *",
        "Europe/London",
        z(2026, 10, 24, 12),
        z(2026, 10, 26, 12),
        [z(2026, 10, 25, 0, 30), z(2026, 10, 26, 1, 30)],
    ),
    (
        "0 * * * *",
        "Europe/London",
        z(2026, 10, 24, 23, 30),
        z(2026, 10, 25, 2),
        [z(2026, 10, 25, 0), z(2026, 10, 25, 1), z(2026, 10, 25, 2)],
    ),
    # Lord Howe falls back 30 minutes on 2026-04-05: 02:00 +11 -> 01:30 +1030
    # (15:00Z on 04-04), so 01:30-01:59 happens twice.
    ("45 1 * * *", "Australia/Lord_Howe", z(2026, 4, 4), z(2026, 4, 5), [z(2026, 4, 4, 14, 45)]),
    (
        "*/15 1 * * *",
        "Australia/Lord_Howe",
        z(2026, 4, 4),
        z(2026, 4, 5),
        [
            z(2026, 4, 4, 14, 0),
            z(2026, 4, 4, 14, 15),
            z(2026, 4, 4, 14, 30),
            z(2026, 4, 4, 14, 45),
            z(2026, 4, 4, 15, 0),
            z(2026, 4, 4, 15, 15),
        ],
    ),
    # 02:00 is not inside the overlap: it exists once, after the fall back.
    ("0 2 * * *", "Australia/Lord_Howe", z(2026, 4, 4), z(2026, 4, 5), [z(2026, 4, 4, 15, 30)]),
    # Lord Howe springs forward 30 minutes on 2026-10-04: 02:00 +1030 ->
    # 02:30 +11 (15:30Z on 10-03).
    ("15 2 * * *", "Australia/Lord_Howe", z(2026, 10, 3), z(2026, 10, 4, 12), [z(2026, 10, 3, 15, 30)]),
    (
        "*/15 2 * * *",
        "Australia/Lord_Howe",
        z(2026, 10, 3),
        z(2026, 10, 4, 12),
        [z(2026, 10, 3, 15, 30), z(2026, 10, 3, 15, 45)],
    ),
    # Santiago moves clocks at midnight: 2026-09-06 00:00 -04 -> 01:00 -03.
    (
        "0 0 * * *",
        "America/Santiago",
        z(2026, 9, 5),
        z(2026, 9, 7, 12),
        [z(2026, 9, 5, 4), z(2026, 9, 6, 4), z(2026, 9, 7, 3)],
    ),
    # ... and 2026-04-05 00:00 -03 -> 23:00 -04 (on 04-04).
    # 23:30 happens at 02:30Z (-03) and 03:30Z (-04); fixed-time takes the first.
    (
        "30 23 * * *",
        "America/Santiago",
        z(2026, 4, 4, 12),
        z(2026, 4, 6, 12),
        [z(2026, 4, 5, 2, 30), z(2026, 4, 6, 3, 30)],
    ),
    # No DST at all.
    (
        "30 2 * * *",
        "Asia/Tokyo",
        z(2026, 3, 7),
        z(2026, 3, 10),
        [z(2026, 3, 7, 17, 30), z(2026, 3, 8, 17, 30), z(2026, 3, 9, 17, 30)],
    ),
]


@pytest.mark.parametrize(("expr", "tz", "after", "until", "expected"), DST_TABLE)
def test_dst_table(expr: str, tz: str, after: datetime, until: datetime, expected: list[datetime]) -> None:
    got = utcs(expr, tz, after, until)
    assert got == expected
    assert all(t.tzinfo is UTC for t in got)


def test_lord_howe_transition_dates_are_what_the_table_assumes() -> None:
    zone = ZoneInfo("Australia/Lord_Howe")

    def offset(t: datetime) -> timedelta:
        return t.astimezone(zone).utcoffset()  # type: ignore[return-value]

    assert offset(z(2026, 4, 4, 14, 59)) == timedelta(hours=11)
    assert offset(z(2026, 4, 4, 15, 0)) == timedelta(hours=10, minutes=30)
    assert offset(z(2026, 10, 3, 15, 29)) == timedelta(hours=10, minutes=30)
    assert offset(z(2026, 10, 3, 15, 30)) == timedelta(hours=11)


def test_gap_and_overlap_notes() -> None:
    (gap,) = cron_times("30 2 * * *", NY, z(2026, 3, 8), z(2026, 3, 8, 12))
    assert gap.note == "DST gap: 02:30 does not exist on 2026-03-08; policy 'shift': fired at 03:00, 07:00Z"
    assert gap.local == datetime(2026, 3, 8, 3, 0, tzinfo=ZoneInfo(NY))

    (first,) = cron_times("30 1 * * *", NY, z(2026, 11, 1), z(2026, 11, 1, 12))
    assert first.note == (
        "DST overlap: 01:30 happens twice on 2026-11-01; policy 'first': fired at the first, 05:30Z"
    )

    hourly = cron_times("0 * * * *", NY, z(2026, 11, 1, 4, 30), z(2026, 11, 1, 7))
    assert [f.note for f in hourly] == [
        "DST overlap: 01:00 happens twice on 2026-11-01; policy 'both': fired at both, this is the first, "
        "05:00Z",
        "DST overlap: 01:00 happens twice on 2026-11-01; policy 'both': fired at both, this is the second, "
        "06:00Z",
        None,
    ]
    plain = cron_times("0 12 * * *", NY, z(2026, 6, 1), z(2026, 6, 2))
    assert [f.note for f in plain] == [None]


def test_after_inside_overlap_does_not_refire_or_skip() -> None:
    # Scheduler restarts in the middle of the repeated hour.
    # First 01:30 EDT (05:30Z) already fired: fixed-time job waits a day.
    assert next_cron_time("30 1 * * *", NY, z(2026, 11, 1, 5, 45)) == z(2026, 11, 2, 6, 30)
    # Elapsed-time job: 01:40 EDT is next, then the repeated 01:00 EST.
    assert utcs("*/20 1 * * *", NY, z(2026, 11, 1, 5, 30), z(2026, 11, 1, 6, 30)) == [
        z(2026, 11, 1, 5, 40),
        z(2026, 11, 1, 6, 0),
        z(2026, 11, 1, 6, 20),
    ]
    # Already in the second half: only second instances remain.
    assert utcs("*/20 1 * * *", NY, z(2026, 11, 1, 6, 5), z(2026, 11, 1, 7)) == [
        z(2026, 11, 1, 6, 20),
        z(2026, 11, 1, 6, 40),
    ]


def test_after_is_exclusive() -> None:
    assert next_cron_time("30 2 * * *", NY, z(2026, 3, 8, 7)) == z(2026, 3, 9, 6, 30)
    assert next_cron_time("0 * * * *", "UTC", z(2026, 1, 1, 5)) == z(2026, 1, 1, 6)
    assert next_cron_time("0 * * * *", "UTC", z(2026, 1, 1, 4, 59, 59, 999999)) == z(2026, 1, 1, 5)


def test_croniter_double_fires_fixed_time_job_in_fall_back_hour() -> None:
    # Why croniter is not used for iteration: in the repeated 01:00-02:00 hour
    # it fires the fixed-time job `30 1 * * *` twice (05:30Z *and* 06:30Z),
    # whereas Debian/Vixie cron - and our contract - fire it once.
    start = z(2026, 11, 1, 0).astimezone(ZoneInfo(NY))
    it = croniter("30 1 * * *", start)
    got = [it.get_next(datetime).astimezone(UTC) for _ in range(2)]
    assert got == [z(2026, 11, 1, 5, 30), z(2026, 11, 1, 6, 30)]
    assert next_cron_time("30 1 * * *", NY, z(2026, 11, 1, 5, 30)) == z(2026, 11, 2, 6, 30)


@pytest.mark.parametrize(
    ("expr", "tz", "after", "until", "expected"),
    [row for row in DST_TABLE if row[1] != "Australia/Lord_Howe"],
)
def test_cronsim_aware_iteration_agrees_outside_lord_howe(
    expr: str, tz: str, after: datetime, until: datetime, expected: list[datetime]
) -> None:
    # Documents where cronsim's own DST handling is right: everywhere in the
    # table except Lord Howe's 30-minute shift (see the next test).
    it = CronSim(expr, after.astimezone(ZoneInfo(tz)))
    got = []
    for t in it:
        if t.astimezone(UTC) > until:
            break
        got.append(t.astimezone(UTC))
    assert got == expected


def _cronsim_aware(expr: str, tz: str, after: datetime, until: datetime) -> list[datetime]:
    out = []
    for t in CronSim(expr, after.astimezone(ZoneInfo(tz))):
        if t.astimezone(UTC) > until:
            break
        out.append(t.astimezone(UTC))
    return out


def test_cronsim_aware_iteration_is_wrong_for_lord_howe() -> None:
    # Lord Howe falls back 30 minutes (02:00 +11 -> 01:30 +1030 at 15:00Z).
    # cronsim's own aware iteration drops the second 01:30 of an elapsed-time
    # job and the (single, post-transition) 02:00 of `0 */2 * * *`.  This is
    # why we use cronsim only as a naive calendar and map wall times ourselves.
    tz, after, until = "Australia/Lord_Howe", z(2026, 4, 4, 12), z(2026, 4, 4, 17)
    assert z(2026, 4, 4, 15, 0) not in _cronsim_aware("30 * * * *", tz, after, until)
    assert utcs("30 * * * *", tz, after, until) == [
        z(2026, 4, 4, 12, 30),
        z(2026, 4, 4, 13, 30),
        z(2026, 4, 4, 14, 30),
        z(2026, 4, 4, 15, 0),
        z(2026, 4, 4, 16, 0),
        z(2026, 4, 4, 17, 0),
    ]
    assert _cronsim_aware("0 */2 * * *", tz, after, until) == [z(2026, 4, 4, 13)]
    assert utcs("0 */2 * * *", tz, after, until) == [z(2026, 4, 4, 13), z(2026, 4, 4, 15, 30)]


# ---------------------------------------------------------------------------
# Calendar features
# ---------------------------------------------------------------------------


def test_leap_day() -> None:
    assert next_cron_time("0 0 29 2 *", "UTC", z(2026, 1, 1)) == z(2028, 2, 29)
    local = next_cron_time("0 0 29 2 *", "Asia/Tokyo", z(2026, 1, 1))
    assert local == z(2028, 2, 28, 15)
    # 2100 is not a leap year: 8-year wait is still inside the horizon.
    assert next_cron_time("0 0 29 2 *", "UTC", z(2096, 3, 1)) == z(2104, 2, 29)


def test_end_of_time_is_none_not_an_error() -> None:
    assert next_cron_time("0 0 1 1 *", "UTC", z(9999, 6, 1)) is None
    assert next_cron_time("0 0 * * *", "Pacific/Kiritimati", z(9999, 12, 31)) is None
    assert next_cron_time("0 0 1 1 *", "America/Los_Angeles", z(1, 1, 1, 1)) is None


def test_whole_day_gap_is_bounded() -> None:
    # Pacific/Apia skipped 2011-12-30 entirely; elapsed jobs walk past it.
    assert next_cron_time("*/7 * * * *", "Pacific/Apia", z(2011, 12, 30, 9, 58)) == z(2011, 12, 30, 10)
    # Fixed-time slot in the missing day fires at the first instant after it
    # (00:00 on 12-31, 10:00Z); the zone is then +14.
    got = cron_times("30 12 * * *", "Pacific/Apia", z(2011, 12, 29, 12), z(2011, 12, 31, 12))
    assert [f.utc for f in got] == [z(2011, 12, 29, 22, 30), z(2011, 12, 30, 10), z(2011, 12, 30, 22, 30)]
    assert got[1].note == (
        "DST gap: 12:30 does not exist on 2011-12-30; policy 'shift': fired at 00:00, 10:00Z"
    )


def test_day_31_skips_short_months() -> None:
    got = utcs("0 0 31 * *", "UTC", z(2026, 1, 1), z(2026, 12, 31, 23))
    assert [t.month for t in got] == [1, 3, 5, 7, 8, 10, 12]


@pytest.mark.parametrize("expr", ["0 0 30 2 *", "0 0 31 4 *", "0 0 31 2,4,6,9,11 *"])
def test_expressions_that_never_fire_are_invalid(expr: str) -> None:
    with pytest.raises(ScheduleError, match="can never fire"):
        validate_cron(expr)
    with pytest.raises(ScheduleError, match="can never fire"):
        next_cron_time(expr, "UTC", z(2026, 1, 1))


def test_day_or_weekday_is_or_when_both_restricted() -> None:
    # Vixie cron: both restricted -> either may match, so this is valid.
    validate_cron("0 0 30 2 MON")
    assert next_cron_time("0 0 30 2 MON", "UTC", z(2026, 1, 1)) == z(2026, 2, 2)


@pytest.mark.parametrize(
    ("alias", "expanded"),
    [
        ("@hourly", "0 * * * *"),
        ("@daily", "0 0 * * *"),
        ("@midnight", "0 0 * * *"),
        ("@weekly", "0 0 * * 0"),
        ("@monthly", "0 0 1 * *"),
        ("@yearly", "0 0 1 1 *"),
        ("@annually", "0 0 1 1 *"),
        ("@DAILY", "0 0 * * *"),
    ],
)
def test_aliases(alias: str, expanded: str) -> None:
    assert expand_cron(alias, None) == expanded


def test_alias_fire_times() -> None:
    assert next_cron_time("@weekly", "UTC", z(2026, 1, 1)) == z(2026, 1, 4)  # Sunday
    assert next_cron_time("@monthly", NY, z(2026, 1, 15)) == z(2026, 2, 1, 5)


def test_names() -> None:
    got = utcs("0 9 * * MON-FRI", "UTC", z(2026, 1, 1), z(2026, 1, 8))
    assert [t.day for t in got] == [1, 2, 5, 6, 7]  # 2026-01-01 is a Thursday
    assert next_cron_time("0 0 1 JAN *", "UTC", z(2026, 1, 1)) == z(2027, 1, 1)
    assert next_cron_time("0 0 * * sun", "UTC", z(2026, 1, 1)) == z(2026, 1, 4)
    assert next_cron_time("0 0 * * 7", "UTC", z(2026, 1, 1)) == z(2026, 1, 4)


def test_fixed_time_classification() -> None:
    assert is_fixed_time("30 2 * * *")
    assert is_fixed_time("0 2,3 * * *")
    assert is_fixed_time("@daily")
    assert is_fixed_time("H H * * *")
    assert not is_fixed_time("0 * * * *")
    assert not is_fixed_time("*/20 1 * * *")
    assert not is_fixed_time("*/5 * * * *")
    assert not is_fixed_time("H * * * *")
    assert not is_fixed_time("@hourly")


# ---------------------------------------------------------------------------
# H (hashed) fields
# ---------------------------------------------------------------------------


def test_hash_is_stable_and_spread() -> None:
    ids = [str(uuid.UUID(int=i * 7919 + 1)) for i in range(1000)]
    minutes = Counter(int(expand_cron("H * * * *", i).split()[0]) for i in ids)
    assert len(minutes) >= 55
    assert max(minutes.values()) < 45  # expected ~17 per minute
    for job_id in ids[:20]:
        assert expand_cron("H * * * *", job_id) == expand_cron("H * * * *", job_id)
    # UUID objects and their (any-case) string form hash the same.
    u = uuid.UUID(ids[3])
    assert expand_cron("H * * * *", u) == expand_cron("H * * * *", ids[3].upper())


def test_hash_value_is_pinned_across_processes() -> None:
    # sha256-based, so this must never change between releases or processes;
    # if it does, every H job in production would move.
    assert expand_cron("H * * * *", "job-1") == "59 * * * *"


def test_hash_without_job_id_uses_expression_text() -> None:
    assert expand_cron("H H * * *", None) == expand_cron("H  H * * *", None)
    assert expand_cron("H * * * *", None) != "H * * * *"


def test_hash_ranges_and_steps() -> None:
    for i in range(300):
        job = f"job-{i}"
        minute, hour, dom, month, dow = expand_cron("H(0-29) H H H H", job).split()
        assert 0 <= int(minute) <= 29
        assert 0 <= int(hour) <= 23
        assert 1 <= int(dom) <= 28
        assert 1 <= int(month) <= 12
        assert 0 <= int(dow) <= 6
        stepped = [int(v) for v in expand_cron("H/15 * * * *", job).split()[0].split(",")]
        assert len(stepped) == 4
        assert 0 <= stepped[0] < 15
        assert [b - a for a, b in itertools.pairwise(stepped)] == [15, 15, 15]
        ranged = [int(v) for v in expand_cron("H(10-40)/10 * * * *", job).split()[0].split(",")]
        assert 10 <= ranged[0] < 20 and all(10 <= v <= 40 for v in ranged)


def test_hash_fields_are_independent() -> None:
    pairs = {tuple(expand_cron("H H * * *", f"j{i}").split()[:2]) for i in range(200)}
    assert len(pairs) > 150


def test_hashed_job_fire_times() -> None:
    expanded = expand_cron("H * * * *", "job-1")
    minute = int(expanded.split()[0])
    got = next_cron_time("H * * * *", "UTC", z(2026, 1, 1), job_id="job-1")
    assert got == z(2026, 1, 1, 0, minute)


# ---------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("* * *", "expected 5 fields"),
        ("* * * * * *", "expected 5 fields"),
        ("foo", "expected 5 fields"),
        ("", "empty"),
        ("61 * * * *", "minute value 61 is out of range 0-59"),
        ("0 24 * * *", "hour value 24 is out of range 0-23"),
        ("0 0 0 * *", "day-of-month value 0 is out of range 1-31"),
        ("0 0 * 13 *", "month value 13 is out of range 1-12"),
        ("0 0 * * 8", "day-of-week value 8 is out of range 0-7"),
        ("*/0 * * * *", "step must be at least 1"),
        ("5-1 * * * *", "backwards"),
        ("0 0 * * FRI-MON", "backwards"),
        ("0 0 * JAN-FOO *", "not a number"),
        ("0 0 * * JAN", "not a number"),
        ("0 0 L-2 * *", "not a number"),  # L is a calendar form now; offsets from it are not
        ("a b c d e", "not a number"),
        ("1,,2 * * * *", "empty list item"),
        ("H(30-70) * * * *", "must lie within 0-59"),
        ("H(9-3) * * * *", "must lie within"),
        ("@reboot", "unknown alias"),
    ],
)
def test_bad_expressions(expr: str, message: str) -> None:
    with pytest.raises(ScheduleError, match=message) as info:
        validate_cron(expr)
    assert str(info.value).startswith(("Invalid cron expression", "Cron expression"))


def test_expression_must_be_string() -> None:
    with pytest.raises(ScheduleError):
        expand_cron(None, None)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["Mars/Olympus", "utc", "America", "../etc/passwd", "localtime"])
def test_unknown_zone(name: str) -> None:
    with pytest.raises(ScheduleError, match=f"Unknown time zone '{name}'"):
        load_zone(name)
    with pytest.raises(ScheduleError, match="Unknown time zone"):
        validate_cron("0 0 * * *", name)


def test_empty_zone() -> None:
    with pytest.raises(ScheduleError, match="Time zone is required"):
        load_zone("")


def test_load_zone_ok() -> None:
    # The zone comes from the tzdata package (ZoneInfo.from_file), so compare behaviour.
    zone = load_zone("Europe/London")
    assert zone.key == "Europe/London"
    assert datetime(2026, 7, 1, 12, tzinfo=UTC).astimezone(zone).utcoffset() == timedelta(hours=1)


# Zones come from the tzdata package only (docs/decisions/0006-zones-from-tzdata.md):
# names the host's /usr/share/zoneinfo resolves but the tzdata package does not list
# (leap-second "right/" zones, "posix/" copies, paths, placeholders) would make a
# schedule depend on the machine.
@pytest.mark.parametrize(
    "name",
    [
        "right/America/New_York",
        "right/UTC",
        "posix/Europe/Paris",
        "posix/UTC",
        "../etc",
        "../../../../etc/localtime",
        "/etc/localtime",
        "/usr/share/zoneinfo/UTC",
        "Europe/London/../Paris",
        "Factory",
        "localtime",
        "posixrules",
        "leapseconds",
        "zone.tab",
        "tzdata.zi",
    ],
)
def test_host_only_zone_names_are_refused(name: str) -> None:
    with pytest.raises(ScheduleError, match="Unknown time zone"):
        load_zone(name)
    with pytest.raises(ScheduleError, match="Unknown time zone"):
        validate_cron("30 2 * * *", name)


@pytest.mark.parametrize(("link", "canonical"), [("US/Eastern", NY), ("GB", "Europe/London"), ("UCT", "UTC")])
def test_backward_links_shipped_by_tzdata_are_accepted(link: str, canonical: str) -> None:
    after = datetime(2026, 1, 5, tzinfo=UTC)
    kwargs = dict(interval_seconds=None, run_at=None, anchor=None, after=after, count=3)
    assert [t.utc for t in fire_times(cron="30 2 * * *", timezone=link, **kwargs)] == [
        t.utc for t in fire_times(cron="30 2 * * *", timezone=canonical, **kwargs)
    ]


@pytest.mark.parametrize("name", ["america/new_york", "AMERICA/NEW_YORK", "us/eastern", "Europe/london"])
def test_case_variants_are_refused_with_the_right_spelling(name: str) -> None:
    with pytest.raises(ScheduleError, match="did you mean") as info:
        load_zone(name)
    assert load_zone(str(info.value).split("did you mean ")[1].strip("'?)"))


def test_new_york_fires_on_the_whole_minute() -> None:
    # With the leap-second zone this was 07:30:27Z; the tzdata zone has no leap seconds.
    times = fire_times(
        cron="30 2 * * *",
        timezone=NY,
        interval_seconds=None,
        run_at=None,
        anchor=None,
        after=datetime(2026, 1, 5, tzinfo=UTC),
        count=1,
    )
    assert times[0].utc == datetime(2026, 1, 5, 7, 30, tzinfo=UTC)


def test_naive_datetimes_are_type_errors() -> None:
    naive = datetime(2026, 1, 1)
    with pytest.raises(TypeError):
        next_cron_time("* * * * *", "UTC", naive)
    with pytest.raises(TypeError):
        next_interval_time(60, naive, z(2026, 1, 1))
    with pytest.raises(TypeError):
        next_interval_time(60, z(2026, 1, 1), naive)
    with pytest.raises(TypeError):
        next_fire_time(
            cron=None, timezone="UTC", interval_seconds=None, run_at=naive, anchor=None, after=z(2026, 1, 1)
        )


# ---------------------------------------------------------------------------
# interval_seconds and run_at
# ---------------------------------------------------------------------------


def test_interval_anchoring() -> None:
    anchor = z(2026, 1, 1, 0, 0, 7)
    assert next_interval_time(60, anchor, z(2026, 1, 1, 0, 10)) == z(2026, 1, 1, 0, 10, 7)
    assert next_interval_time(60, anchor, z(2026, 1, 1, 0, 10, 7)) == z(2026, 1, 1, 0, 11, 7)
    # Anchor in the future: the anchor itself is the first fire time (k = 0).
    assert next_interval_time(60, anchor, z(2025, 12, 31)) == anchor
    # Exactly at the anchor: strictly after, so k = 1.
    assert next_interval_time(60, anchor, anchor) == anchor + timedelta(minutes=1)
    # Non-UTC anchor comes back as UTC.
    tokyo = anchor.astimezone(ZoneInfo("Asia/Tokyo"))
    out = next_interval_time(3600, tokyo, z(2026, 1, 1, 5))
    assert out == z(2026, 1, 1, 5, 0, 7) and out.tzinfo is UTC


def test_interval_is_dst_free() -> None:
    anchor = z(2026, 3, 8, 5, 0)  # midnight EST
    got = fire_times(
        cron=None, timezone=NY, interval_seconds=3600, run_at=None, anchor=anchor, after=anchor, count=3
    )
    assert [f.utc for f in got] == [z(2026, 3, 8, 6), z(2026, 3, 8, 7), z(2026, 3, 8, 8)]
    assert [f.local.hour for f in got] == [1, 3, 4]
    assert all(f.note is None for f in got)


def test_interval_no_drift_after_years() -> None:
    anchor = z(2020, 1, 1)
    got = next_interval_time(7, anchor, z(2035, 6, 1, 12, 0, 0, 1))
    assert (got - anchor) % timedelta(seconds=7) == timedelta(0)
    assert got - timedelta(seconds=7) <= z(2035, 6, 1, 12, 0, 0, 1) < got


@pytest.mark.parametrize("bad", [0, -5, 1.5, True])
def test_interval_must_be_positive_int(bad: object) -> None:
    with pytest.raises(ScheduleError):
        next_interval_time(bad, z(2026, 1, 1), z(2026, 1, 1))  # type: ignore[arg-type]


def test_run_at() -> None:
    when = z(2026, 5, 1, 12)
    kwargs = dict(cron=None, timezone="UTC", interval_seconds=None, anchor=None)
    assert next_fire_time(run_at=when, after=z(2026, 5, 1), **kwargs) == when  # type: ignore[arg-type]
    assert next_fire_time(run_at=when, after=when, **kwargs) is None  # type: ignore[arg-type]
    ny_when = when.astimezone(ZoneInfo(NY))
    out = next_fire_time(run_at=ny_when, after=z(2026, 5, 1), **kwargs)  # type: ignore[arg-type]
    assert out == when and out.tzinfo is UTC
    listed = fire_times(run_at=when, after=z(2026, 5, 1), count=5, **kwargs)  # type: ignore[arg-type]
    assert [f.utc for f in listed] == [when]


def test_next_fire_time_dispatch() -> None:
    after = z(2026, 1, 1, 0, 0, 30)
    assert next_fire_time(
        cron="* * * * *", timezone="UTC", interval_seconds=None, run_at=None, anchor=None, after=after
    ) == z(2026, 1, 1, 0, 1)
    assert next_fire_time(
        cron=None, timezone="UTC", interval_seconds=45, run_at=None, anchor=z(2026, 1, 1), after=after
    ) == z(2026, 1, 1, 0, 0, 45)


@pytest.mark.parametrize(
    ("trigger", "after"),
    [
        # the spring gap and the autumn overlap, under each policy, and an H expression
        (dict(cron="30 2 * * *", timezone=NY), z(2026, 3, 8, 5)),
        (dict(cron="30 1 * * *", timezone=NY, dst_policy={"repeated": "both"}), z(2026, 11, 1, 5, 31)),
        (dict(cron="30 2 * * *", timezone=NY, dst_policy={"missing": "skip"}), z(2026, 3, 8, 5)),
        (dict(cron="H H * * *", timezone="Europe/Berlin", job_id="job-7"), z(2026, 3, 29)),
        (dict(cron="0 0 1 1 *", timezone="UTC"), z(9999, 6, 1)),  # past datetime.max: None
        (dict(interval_seconds=3600, anchor=z(2026, 1, 1, 0, 0, 7)), z(2026, 1, 1, 5)),
        (dict(run_at=z(2026, 5, 1, 12)), z(2026, 5, 1)),
        (dict(run_at=z(2026, 5, 1, 12)), z(2026, 5, 1, 12)),  # past: None
    ],
)
def test_next_fire_time_is_the_first_of_fire_times(trigger: dict, after: datetime) -> None:
    kwargs = dict(cron=None, timezone="UTC", interval_seconds=None, run_at=None, anchor=None) | trigger
    first = fire_times(after=after, count=1, **kwargs)
    assert next_fire_time(after=after, **kwargs) == (first[0].utc if first else None)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(cron=None, interval_seconds=None, run_at=None),
        dict(cron="* * * * *", interval_seconds=60, run_at=None),
        dict(cron="* * * * *", interval_seconds=None, run_at=z(2026, 1, 2)),
    ],
)
def test_exactly_one_trigger(kwargs: dict[str, object]) -> None:
    with pytest.raises(ScheduleError, match="Exactly one"):
        next_fire_time(timezone="UTC", anchor=z(2026, 1, 1), after=z(2026, 1, 1), **kwargs)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------
# fire_times stopping rules
# ---------------------------------------------------------------------------


def _every_minute(**kw: object) -> list[FireTime]:
    return fire_times(
        cron="* * * * *",
        timezone="UTC",
        interval_seconds=None,
        run_at=None,
        anchor=None,
        after=z(2026, 1, 1),
        **kw,
    )  # type: ignore[arg-type]


def test_fire_times_count_until_limit() -> None:
    assert len(_every_minute(count=5)) == 5
    assert _every_minute(count=0) == []
    until = _every_minute(until=z(2026, 1, 1, 0, 10))
    assert [f.utc.minute for f in until] == list(range(1, 11))  # until inclusive
    assert len(_every_minute(limit=7)) == 7
    assert len(_every_minute(count=50, limit=7)) == 7
    assert len(_every_minute()) == 10_000
    assert len(_every_minute(until=z(2026, 1, 1, 1), count=5)) == 5


def test_fire_times_local_is_in_job_zone() -> None:
    (f,) = fire_times(
        cron="0 9 * * *",
        timezone="Asia/Kolkata",
        interval_seconds=None,
        run_at=None,
        anchor=None,
        after=z(2026, 1, 1),
        count=1,
    )
    assert f.utc == z(2026, 1, 1, 3, 30)
    assert f.local.tzinfo.key == "Asia/Kolkata" and f.local.hour == 9


def test_next_cron_time_is_fast_enough_for_the_scheduler() -> None:
    exprs = ["*/5 * * * *", "30 2 * * *", "0 9 * * MON-FRI", "H * * * *", "@daily"]
    start = time.perf_counter()
    n = 0
    for i in range(400):
        for expr in exprs:
            next_cron_time(expr, NY, z(2026, 3, 1) + timedelta(minutes=i * 37), job_id=f"j{i}")
            n += 1
    per_call = (time.perf_counter() - start) / n
    assert per_call < 0.002  # generous: typically ~0.05 ms
