"""Property tests for jobs.schedule across zones with awkward DST rules.

The oracle below is deliberately dumb and independent of the implementation:
it scans every UTC minute of a window, reads the local wall clock, and applies
the Vixie-cron rules directly (no fold arithmetic, no bisection).
"""

from __future__ import annotations

import itertools
import random
import time
import uuid
from datetime import UTC, datetime, timedelta
from functools import cache
from zoneinfo import ZoneInfo

import pytest
from cronsim import CronSim
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from jobs.schedule import (
    ScheduleError,
    expand_cron,
    fire_times,
    is_fixed_time,
    load_zone,
    next_cron_time,
    validate_cron,
)

pytestmark: list[pytest.MarkDecorator] = []

UTC = UTC
ZONES = [
    "Pacific/Chatham",
    "America/Santiago",
    "Australia/Lord_Howe",
    "America/New_York",
    "Europe/London",
    "UTC",
    "Asia/Kolkata",
]
MINUTE = timedelta(minutes=1)
SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


# ---------------------------------------------------------------------------
# Strategies
# ---------------------------------------------------------------------------


def _field(lo: int, hi: int, hot: list[int]) -> st.SearchStrategy[str]:
    # Bias numbers towards values near DST transitions so the properties
    # actually meet gaps and overlaps, not just ordinary hours.
    number = st.one_of(st.sampled_from(hot), st.integers(lo, hi)) if hot else st.integers(lo, hi)
    value = number.map(str)
    span = st.tuples(st.integers(lo, hi), st.integers(lo, hi)).map(lambda ab: f"{min(ab)}-{max(ab)}")
    step = st.integers(1, max(1, (hi - lo) // 2)).map(lambda s: f"*/{s}")
    span_step = st.tuples(span, st.integers(1, 10)).map(lambda t: f"{t[0]}/{t[1]}")
    item = st.one_of(value, span, span_step)
    listed = st.lists(item, min_size=2, max_size=3).map(",".join)
    return st.one_of(st.just("*"), value, span, step, span_step, listed)


MINUTES = _field(0, 59, [0, 15, 30, 45, 59])
HOURS = _field(0, 23, [0, 1, 2, 3, 23])
DOMS = st.one_of(st.just("*"), st.just("*"), _field(1, 31, [1, 28, 29, 30, 31]))
MONTHS = st.one_of(st.just("*"), st.just("*"), _field(1, 12, [2, 3, 4, 9, 10, 11]))
DOWS = st.one_of(st.just("*"), st.just("*"), _field(0, 7, [0, 6, 7]))

# Dense expressions (day fields '*') so a 2-day oracle window has fire times.
DENSE_EXPRS = st.tuples(MINUTES, HOURS).map(lambda mh: f"{mh[0]} {mh[1]} * * *")
ANY_EXPRS = st.tuples(MINUTES, HOURS, DOMS, MONTHS, DOWS).map(" ".join)


@cache
def _transitions(tz: str) -> list[datetime]:
    """Offset changes of ``tz`` between 2020 and 2035 (6-hour scan + bisection)."""
    zone = load_zone(tz)
    out: list[datetime] = []
    t = datetime(2020, 1, 1, tzinfo=UTC)
    offset = t.astimezone(zone).utcoffset()
    while t.year < 2036:
        nxt = t + timedelta(hours=6)
        new = nxt.astimezone(zone).utcoffset()
        if new != offset:
            lo, hi = t, nxt
            while hi - lo > timedelta(seconds=1):
                mid = lo + (hi - lo) / 2
                if mid.astimezone(zone).utcoffset() == offset:
                    lo = mid
                else:
                    hi = mid
            out.append(hi)
        t, offset = nxt, new
    return out


@st.composite
def zone_and_start(draw: st.DrawFn, near_transition: bool) -> tuple[str, datetime]:
    tz = draw(st.sampled_from(ZONES))
    transitions = _transitions(tz)
    if near_transition and transitions:
        base = draw(st.sampled_from(transitions))
        delta = draw(st.integers(-36 * 3600, 12 * 3600))
        start = base + timedelta(seconds=delta)
    else:
        start = datetime(2020, 1, 1, tzinfo=UTC) + timedelta(seconds=draw(st.integers(0, 16 * 365 * 86400)))
    return tz, start


def _compiles(expr: str) -> bool:
    try:
        next_cron_time(expr, "UTC", datetime(2024, 1, 1, tzinfo=UTC))
    except ScheduleError:
        return False
    return True


# ---------------------------------------------------------------------------
# Oracle
# ---------------------------------------------------------------------------


def _wall(zone: ZoneInfo, t: datetime) -> datetime:
    return t.astimezone(zone).replace(tzinfo=None)


def _matching_walls(expanded: str, lo: datetime, hi: datetime) -> set[datetime]:
    out = set()
    for w in CronSim(expanded, lo):
        if w > hi:
            break
        out.add(w)
    return out


def _oracle(expr: str, tz: str, after: datetime, until: datetime) -> list[datetime]:
    zone = load_zone(tz)
    expanded = expand_cron(expr, None)
    # Scan a margin around the window so gap slots and first instances that
    # belong to the window are seen.
    first = (after - timedelta(hours=26)).replace(second=0, microsecond=0)
    minutes = [first + i * MINUTE for i in range(int((until - first) / MINUTE) + 26 * 60)]
    walls = [_wall(zone, t) for t in minutes]
    matching = _matching_walls(expanded, min(walls) - MINUTE, max(walls))
    if not is_fixed_time(expr):
        fired = [t for t, w in zip(minutes, walls, strict=True) if w in matching]
    else:
        first_seen: dict[datetime, datetime] = {}
        for t, w in zip(minutes, walls, strict=True):
            first_seen.setdefault(w, t)
        # Forward jumps of the wall clock: (instant, wall just before, wall at).
        jumps = [
            (t, prev, w)
            for (_, prev), (t, w) in itertools.pairwise(zip(minutes, walls, strict=True))
            if w - prev > MINUTE
        ]
        fired_set = set()
        for slot in matching:
            if slot in first_seen:
                fired_set.add(first_seen[slot])  # first instance only
                continue
            for t, prev, w in jumps:
                if prev < slot < w:
                    fired_set.add(t)  # gap: first instant after it
        fired = sorted(fired_set)
    return [t for t in fired if after < t <= until]


def _ours(expr: str, tz: str, after: datetime, until: datetime | None = None, count: int | None = None):
    return fire_times(
        cron=expr,
        timezone=tz,
        interval_seconds=None,
        run_at=None,
        anchor=None,
        after=after,
        until=until,
        count=count,
    )


# ---------------------------------------------------------------------------
# Properties
# ---------------------------------------------------------------------------


@SETTINGS
@given(expr=DENSE_EXPRS, zs=zone_and_start(near_transition=True))
def test_matches_bruteforce_oracle_near_transitions(expr: str, zs: tuple[str, datetime]) -> None:
    tz, after = zs
    until = after + timedelta(hours=40)
    got = [f.utc for f in _ours(expr, tz, after, until)]
    assert got == _oracle(expr, tz, after, until)


@SETTINGS
@given(expr=ANY_EXPRS, zs=st.booleans().flatmap(lambda near: zone_and_start(near_transition=near)))
def test_fire_times_increase_and_match(expr: str, zs: tuple[str, datetime]) -> None:
    assume(_compiles(expr))
    tz, after = zs
    zone = load_zone(tz)
    expanded = expand_cron(expr, None)
    fixed = is_fixed_time(expr)
    got = _ours(expr, tz, after, count=25)
    assert got, "a valid expression fires within the horizon"
    previous = after
    for f in got:
        assert f.utc > previous  # strictly increasing, strictly after `after`
        previous = f.utc
        assert f.utc.tzinfo is UTC
        # Not `f.local == f.utc`: PEP 495 makes inter-zone == False for
        # times inside an overlap, even when they are the same instant.
        assert f.local.astimezone(UTC) == f.utc and f.local.tzinfo is zone
        wall = f.local.replace(tzinfo=None)
        if next(CronSim(expanded, wall - timedelta(seconds=1))) == wall:
            continue
        # Not a match: must be a fixed-time slot shifted out of a gap, i.e.
        # the clock jumped forward right at this instant over a matching slot.
        assert fixed, f"elapsed-time job fired off-schedule at {f}"
        before = _wall(zone, f.utc - timedelta(seconds=1)) + timedelta(seconds=1)
        assert before < wall, "fire time is not the first instant after a gap"
        slot = next(CronSim(expanded, before - timedelta(seconds=1)))
        assert before <= slot < wall
        assert f.note is not None and f.note.startswith("DST gap")
    if fixed:
        local_walls = [f.local.replace(tzinfo=None) for f in got]
        assert len(local_walls) == len(set(local_walls)), "fixed-time job fired twice at one wall time"


POLICIES = st.sampled_from(
    [None, {"repeated": "last"}, {"repeated": "both"}, {"missing": "skip"}, {"missing": "shift"}]
)


@SETTINGS
@given(
    expr=ANY_EXPRS,
    zs=st.booleans().flatmap(lambda near: zone_and_start(near_transition=near)),
    span=st.integers(1, 2 * 24 * 60),
    policy=POLICIES,
)
def test_a_window_read_at_once_is_the_slot_by_slot_walk(expr, zs, span, policy) -> None:
    """`fire_times(until=...)` walks a short window in one pass when the zone keeps its
    offset (the load forecast asks for a week of minutes): the same instants and notes
    as the search the scheduler does one slot at a time."""
    assume(_compiles(expr))
    tz, after = zs
    until = after + timedelta(minutes=span)
    windowed = fire_times(
        cron=expr, timezone=tz, interval_seconds=None, run_at=None, anchor=None,
        after=after, until=until, limit=20_000, dst_policy=policy,
    )  # fmt: skip
    walked, cursor = [], after
    while len(walked) < 20_000:
        (step,) = fire_times(
            cron=expr, timezone=tz, interval_seconds=None, run_at=None, anchor=None,
            after=cursor, count=1, dst_policy=policy,
        ) or (None,)  # fmt: skip
        if step is None or step.utc > until:
            break
        walked.append(step)
        cursor = step.utc
    assert [(f.utc, f.note) for f in windowed] == [(f.utc, f.note) for f in walked]


@SETTINGS
@given(expr=DENSE_EXPRS, zs=zone_and_start(near_transition=True))
def test_fixed_time_never_repeats_a_wall_time(expr: str, zs: tuple[str, datetime]) -> None:
    tz, after = zs
    assume(is_fixed_time(expr))
    got = _ours(expr, tz, after, until=after + timedelta(hours=48))
    local_walls = [f.local.replace(tzinfo=None) for f in got]
    assert len(local_walls) == len(set(local_walls))


@SETTINGS
@given(expr=ANY_EXPRS, zs=zone_and_start(near_transition=False), job=st.text(max_size=8))
def test_every_search_terminates_quickly(expr: str, zs: tuple[str, datetime], job: str) -> None:
    tz, after = zs
    hashed = expr.replace("0", "H", 1) if expr.startswith("0 ") else expr
    for candidate in (expr, hashed):
        start = time.perf_counter()
        try:
            result = next_cron_time(candidate, tz, after, job_id=job or None)
        except ScheduleError:
            continue  # e.g. "0 0 31 2 *": rejected, which is also an answer
        assert time.perf_counter() - start < 1.0
        assert result is None or result > after


@SETTINGS
@given(
    job=st.text(min_size=1, max_size=40),
    expr=st.sampled_from(
        ["H * * * *", "H H * * *", "H(0-29) H(9-17) * * 1-5", "H/15 * * * *", "H H H * *", "H H * * H"]
    ),
)
def test_hash_is_deterministic_and_in_range(job: str, expr: str) -> None:
    expanded = expand_cron(expr, job)
    assert expanded == expand_cron(expr, job)
    assert "H" not in expanded
    minute, hour, dom, _month, dow = expanded.split()
    assert all(0 <= int(v) <= 59 for v in minute.split(","))
    if expr.startswith("H(0-29)"):
        assert 0 <= int(minute) <= 29 and 9 <= int(hour) <= 17
    if dom != "*":
        assert 1 <= int(dom) <= 28
    if dow not in ("*", "1-5"):
        assert 0 <= int(dow) <= 6


# `1 0 H(29-31) 4 *` must not be accepted for some job ids and refused for
# others (day 31 never comes in April). Whether an expression is valid must not depend
# on the id; a hashed term only chooses values that can fire.
ID_SENSITIVE_EXPRS = [
    "1 0 H(29-31) 4 *",
    "0 0 H(29-31) 2 *",
    "0 0 H(30-31) 2,4 *",
    "0 0 H(29-31)/5 4 *",
    "0 0 H(28-31) H *",
    "0 0 31 H *",
    "0 0 31 H(4-6) *",
    "0 0 31 H(4-6)/3 *",
    "0 0 30,31 H(2-4) *",
    "0 0 H(29-31) 4 MON",
    "H H H(1-31) H *",
]


def _outcome(expr: str, job_id: uuid.UUID) -> str:
    try:
        validate_cron(expr, "UTC", job_id)
    except ScheduleError as exc:
        return f"refused: {exc}"
    return "accepted"


@SETTINGS
@given(expr=st.sampled_from(ID_SENSITIVE_EXPRS), ids=st.lists(st.uuids(version=4), min_size=30, max_size=30))
def test_validity_does_not_depend_on_the_job_id(expr: str, ids: list[uuid.UUID]) -> None:
    assert len({_outcome(expr, job_id) for job_id in ids}) == 1


@pytest.mark.parametrize("expr", ID_SENSITIVE_EXPRS)
def test_every_accepted_id_fires_and_the_answer_is_the_same_for_all(expr: str) -> None:
    ids = [uuid.UUID(int=random.Random(f"{expr}{i}").getrandbits(128), version=4) for i in range(200)]
    outcomes = {_outcome(expr, job_id) for job_id in ids}
    assert len(outcomes) == 1, outcomes
    if outcomes == {"accepted"}:
        after = datetime(2026, 1, 1, tzinfo=UTC)
        assert all(next_cron_time(expr, "UTC", after, job_id) is not None for job_id in ids)


def test_hashed_day_chooses_only_days_every_selected_month_has() -> None:
    days = {expand_cron("1 0 H(29-31) 4 *", uuid.uuid4()).split()[2] for _ in range(300)}
    assert days == {"29", "30"}
    months = {expand_cron("0 0 31 H *", uuid.uuid4()).split()[3] for _ in range(300)}
    assert months == {"1", "3", "5", "7", "8", "10", "12"}
    with pytest.raises(ScheduleError, match="no day that exists in every selected month"):
        validate_cron("0 0 H(29-31) 2 *", "UTC", uuid.uuid4())
