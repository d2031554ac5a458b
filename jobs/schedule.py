"""Fire-time computation for Cronyard jobs (pure Python, no Django).

Three trigger kinds exist: ``cron`` (5-field expressions evaluated in the job's
IANA zone), ``interval_seconds`` (elapsed time, DST-free, anchored) and
``run_at`` (one shot).  Every datetime coming in must be aware; every
datetime going out is in ``datetime.timezone.utc``.

DST handling follows Debian/Vixie cron:

* A *fixed-time* job (neither the minute nor the hour field starts with ``*``)
  fires once per wall-clock slot.  A slot inside a spring-forward gap fires at
  the first instant after the gap (merged with any slot already there); a slot
  inside a fall-back overlap fires at its first instance only.
* An *elapsed-time* job fires at every real instant whose local wall time
  matches, so gap slots do not exist and overlap slots fire twice.

cronsim is used only as a *naive* wall-clock calendar (which local wall times
match the expression).  Mapping those wall times to instants is done here with
zoneinfo's ``fold`` instead of relying on cronsim's aware iteration: that keeps
the DST rules explicit, testable, and - most importantly - every search is
bounded by a step count and a horizon so no expression/zone can hang a worker.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from importlib import resources
from uuid import UUID
from zoneinfo import ZoneInfo

from cronsim import CronSim, CronSimError

__all__ = [
    "FireTime",
    "ScheduleError",
    "expand_cron",
    "fire_times",
    "is_fixed_time",
    "load_zone",
    "next_cron_time",
    "next_fire_time",
    "next_interval_time",
    "validate_cron",
]


# Leap-day-only expressions can legitimately wait 8 years (2096 -> 2104), so the
# horizon must exceed that; anything further out is treated as "never".
HORIZON = timedelta(days=366 * 10)
# Upper bound on wall-clock candidates inspected per search.  The worst
# legitimate case is skipping a whole-day gap (Pacific/Apia 2011) minute by
# minute: 1,440 candidates.
MAX_STEPS = 5_000
# Largest backward clock jump we look ahead for (typical overlaps are 1 h,
# Lord Howe 30 min; historic zone changes went up to a day).
_MAX_OVERLAP = timedelta(hours=25)
_ONE_SECOND = timedelta(seconds=1)

_FIELD_NAMES = ("minute", "hour", "day-of-month", "month", "day-of-week")
# (min, max) accepted in each field; day-of-week accepts 7 as Sunday.
_FIELD_RANGES = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 7))
# Default H ranges: day-of-month stops at 28 so a hashed day exists in every
# month, day-of-week at 6 so Sunday is not twice as likely (0 and 7).
_HASH_RANGES = ((0, 59), (0, 23), (1, 28), (1, 12), (0, 6))
_MONTH_NAMES = {
    name: i + 1 for i, name in enumerate("JAN FEB MAR APR MAY JUN JUL AUG SEP OCT NOV DEC".split())
}
_DOW_NAMES = {name: i for i, name in enumerate("SUN MON TUE WED THU FRI SAT".split())}
_NAMES: tuple[dict[str, int], ...] = ({}, {}, {}, _MONTH_NAMES, _DOW_NAMES)
_DAYS_IN_MONTH = (0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
# Days every year has: what a hashed day-of-month may choose (February counts 28).
_DAYS_EVERY_YEAR = (0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
_DAY, _MONTH = 2, 3

_ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

_HASH_RE = re.compile(r"^H(?:\((\d+)-(\d+)\))?(?:/(\d+))?$")
_TERM_RE = re.compile(r"^(\*|[0-9A-Z]+(?:-[0-9A-Z]+)?)(?:/(\d+))?$")
# Keys the tzdata package ships that do not name a place: "Factory" is the
# "local time zone must be set" placeholder (abbreviation -00). Hosts also have
# localtime, posixrules, right/... and posix/..., but those are not in tzdata's
# list and so are refused anyway.
_REJECTED_ZONE_KEYS = frozenset({"localtime", "posixrules", "Factory"})


class ScheduleError(ValueError):
    """A schedule cannot be used; the message is shown to users as-is."""


@dataclass(frozen=True)
class FireTime:
    # Compare and store ``utc``.  ``local == utc`` is False inside a DST
    # overlap even for the same instant (PEP 495 inter-zone rule).
    utc: datetime  # aware, UTC
    local: datetime  # aware, in the job's zone
    note: str | None  # DST remark for previews, None for ordinary slots


# --------------------------------------------------------------------------
# Zones and argument checks
# --------------------------------------------------------------------------


@functools.cache
def _zone_keys() -> dict[str, str]:
    """casefolded key -> key, for every zone in the tzdata package (canonical names
    and the backward-compatible links it ships), minus the placeholders above.

    Built from tzdata's own list, not zoneinfo.available_timezones() nor the host's
    /usr/share/zoneinfo: those differ between machines (right/..., posix/...,
    localtime), and a job must mean the same thing on every host.
    """
    text = resources.files("tzdata").joinpath("zones").read_text(encoding="utf-8")
    keys = {line.strip() for line in text.splitlines() if line.strip()} - _REJECTED_ZONE_KEYS
    return {key.casefold(): key for key in keys}


@functools.lru_cache(maxsize=1024)
def _load_zone_cached(name: str) -> ZoneInfo:
    # From the tzdata package, not ZoneInfo(name): that reads the host's tz
    # database first, whose rules (and version) vary by machine.
    with resources.files("tzdata.zoneinfo").joinpath(*name.split("/")).open("rb") as data:
        return ZoneInfo.from_file(data, key=name)


def load_zone(name: str) -> ZoneInfo:
    """Return the IANA zone called ``name`` (exact spelling) or raise ScheduleError.

    The one door for zone names: only keys listed by the tzdata package are
    accepted, and their rules come from that package.
    """
    if not isinstance(name, str) or not name.strip():
        raise ScheduleError("Time zone is required (e.g. 'UTC' or 'Europe/London')")
    key = _zone_keys().get(name.casefold())
    if key is None:
        raise ScheduleError(f"Unknown time zone {name!r}")
    if key != name:
        # Refused rather than silently rewritten: the stored name is what the user sent.
        raise ScheduleError(f"Unknown time zone {name!r} (did you mean {key!r}?)")
    return _load_zone_cached(key)


def _require_aware(value: datetime, name: str) -> datetime:
    # TypeError rather than ScheduleError: a naive datetime is a programming
    # error in the caller, not something a user typed.
    if not isinstance(value, datetime):
        raise TypeError(f"{name} must be a datetime, got {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise TypeError(f"{name} must be timezone-aware")
    return value


# --------------------------------------------------------------------------
# Expansion: aliases and H -> plain 5-field expression
# --------------------------------------------------------------------------


def _invalid(expr: str, reason: str) -> ScheduleError:
    return ScheduleError(f"Invalid cron expression {expr!r}: {reason}")


def _hash_value(seed: str, field: int, occurrence: int) -> int:
    # hashlib, not hash(): the value must be identical in every process and
    # across restarts (PYTHONHASHSEED), otherwise jobs would move around.
    digest = hashlib.sha256(f"{seed}\x1f{field}\x1f{occurrence}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def _parse_value(expr: str, field: int, token: str) -> int:
    names = _NAMES[field]
    if token in names:
        return names[token]
    if not token.isdigit():
        raise _invalid(expr, f"{_FIELD_NAMES[field]} value {token!r} is not a number")
    value = int(token)
    lo, hi = _FIELD_RANGES[field]
    if not lo <= value <= hi:
        raise _invalid(expr, f"{_FIELD_NAMES[field]} value {value} is out of range {lo}-{hi}")
    return value


def _check_step(expr: str, field: int, step_text: str | None) -> int:
    if step_text is None:
        return 1
    step = int(step_text)
    if step < 1:
        raise _invalid(expr, f"{_FIELD_NAMES[field]} step must be at least 1")
    return step


def _hash_range(expr: str, field: int, match: re.Match[str]) -> tuple[int, int]:
    lo, hi = _HASH_RANGES[field]
    if match.group(1) is not None:
        lo, hi = int(match.group(1)), int(match.group(2))
        flo, fhi = _FIELD_RANGES[field]
        if not (flo <= lo <= hi <= fhi):
            raise _invalid(
                expr,
                f"{_FIELD_NAMES[field]} range H({lo}-{hi}) must lie within {flo}-{fhi}",
            )
    return lo, hi


@dataclass(frozen=True)
class _HashRule:
    """What a hashed term of one field may choose, so that no job id gets a value that
    never fires while another id gets one that does (issue 8 item 7)."""

    cap: int | None = None  # highest value allowed (day-of-month: shortest selected month)
    allowed: frozenset[int] | None = None  # a choice must contain one of these (months)
    why: str = ""


def _expand_hash(
    expr: str, field: int, match: re.Match[str], seed: str, occurrence: int, rule: _HashRule
) -> list[int]:
    lo, hi = _hash_range(expr, field, match)
    step = _check_step(expr, field, match.group(3))
    if rule.cap is not None:
        hi = min(hi, rule.cap)
    span = hi - lo + 1
    # Every choice the hash can make, in hash order. Jenkins semantics for a step: the
    # hash picks the offset of the first run inside one step, then the job repeats
    # every `step` up to the end of the range. Without restrictions choices[h % n] is
    # the classic `lo + h % span` (or `lo + h % min(step, span)`), so ids keep their values.
    if match.group(3) is None:
        choices = [[value] for value in range(lo, hi + 1)]
    else:
        choices = [list(range(start, hi + 1, step)) for start in range(lo, lo + min(step, max(span, 0)))]
    if rule.allowed is not None:
        choices = [c for c in choices if rule.allowed.intersection(c)]
    if not choices:
        raise _invalid(expr, f"{_FIELD_NAMES[field]} {match.group(0)} {rule.why}")
    return choices[_hash_value(seed, field, occurrence) % len(choices)]


def _field_values(
    expr: str, field: int, text: str, seed: str, rule: _HashRule | None = None
) -> tuple[str, set[int]]:
    """Return the field rewritten without H, and the set of values it matches."""
    out_terms: list[str] = []
    values: set[int] = set()
    hash_occurrence = 0
    for term in text.split(","):
        if not term:
            raise _invalid(expr, f"empty list item in {_FIELD_NAMES[field]} field")
        hashed = _HASH_RE.match(term)
        if hashed:
            picked = _expand_hash(expr, field, hashed, seed, hash_occurrence, rule or _HashRule())
            hash_occurrence += 1
            out_terms.append(",".join(str(v) for v in picked))
            values.update(picked)
            continue
        plain = _TERM_RE.match(term)
        if not plain:
            raise _invalid(expr, f"cannot parse {_FIELD_NAMES[field]} field item {term!r}")
        base, step_text = plain.group(1), plain.group(2)
        step = _check_step(expr, field, step_text)
        lo, hi = _FIELD_RANGES[field]
        if base == "*":
            start, end = lo, hi
        elif "-" in base:
            first, last = base.split("-", 1)
            start = _parse_value(expr, field, first)
            end = _parse_value(expr, field, last)
            if end < start:
                raise _invalid(
                    expr,
                    f"{_FIELD_NAMES[field]} range {base} is backwards (wrap-around ranges are not supported)",
                )
        else:
            start = _parse_value(expr, field, base)
            # "5/15" means 5, 20, 35, ... (cronsim/Vixie extension); a bare
            # number without a step matches only itself.
            end = hi if step_text is not None else start
        values.update(range(start, end + 1, step))
        out_terms.append(term)
    return ",".join(out_terms), values


def _possible_months(expr: str, text: str) -> set[int]:
    """Every month the month field can select for some job id (a hashed term: its whole range)."""
    months: set[int] = set()
    for term in text.split(","):
        hashed = _HASH_RE.match(term)
        if hashed:
            lo, hi = _hash_range(expr, _MONTH, hashed)
            months.update(range(lo, hi + 1))
        else:
            months.update(_field_values(expr, _MONTH, term, "")[1])
    return months


def _hash_rules(expr: str, parts: list[str]) -> dict[int, _HashRule]:
    """The id-independence rules for hashed day-of-month and month terms.

    * A hashed day-of-month only chooses days that exist in every month the month field
      can select, in every year (February: 28): `H(29-31) 4` chooses 29 or 30, and
      `H(29-31) 2` is refused for every id.
    * When day-of-month has no hashed term and is ANDed with the month (Vixie: one of
      day-of-month / day-of-week starts with "*"), a hashed month only chooses months in
      which one of those days exists (`31 H *` never chooses April).
    """
    rules: dict[int, _HashRule] = {}
    day_terms = parts[_DAY].split(",")
    if any(_HASH_RE.match(term) for term in day_terms):
        shortest = min(_DAYS_EVERY_YEAR[m] for m in _possible_months(expr, parts[_MONTH]))
        rules[_DAY] = _HashRule(
            cap=shortest,
            why=f"has no day that exists in every selected month (the shortest has {shortest} days)",
        )
    elif parts[_DAY].startswith("*") or parts[4].startswith("*"):
        days = _field_values(expr, _DAY, parts[_DAY], "")[1]
        rules[_MONTH] = _HashRule(
            allowed=frozenset(m for m in range(1, 13) if any(d <= _DAYS_IN_MONTH[m] for d in days)),
            why="has no month in which the day-of-month exists",
        )
    return rules


@dataclass(frozen=True)
class _Compiled:
    expanded: str
    fixed_time: bool


def _normalize_seed(job_id: str | UUID | None, expr: str) -> str:
    if job_id is None:
        # Previews have no job yet: hash the expression so the preview is at
        # least stable for a given text.
        return " ".join(expr.split())
    if isinstance(job_id, UUID):
        return str(job_id)
    text = str(job_id)
    try:
        # The same job id may arrive as a UUID or as a string in any case.
        return str(UUID(text))
    except ValueError:
        return text


@functools.lru_cache(maxsize=16_384)
def _expand_cached(expr: str, seed: str) -> tuple[str, bool]:
    """Return (expanded expression, can_fire)."""
    text = " ".join(expr.split())
    if not text:
        raise ScheduleError("Cron expression is empty")
    if text.startswith("@"):
        alias = _ALIASES.get(text.lower())
        if alias is None:
            known = ", ".join(sorted(_ALIASES))
            raise _invalid(expr, f"unknown alias (known: {known})")
        text = alias
    parts = text.upper().split(" ")
    if len(parts) != 5:
        raise _invalid(
            expr,
            f"expected 5 fields (minute hour day-of-month month day-of-week) or an @alias, got {len(parts)}",
        )
    fields: list[str] = []
    value_sets: list[set[int]] = []
    rules = _hash_rules(expr, parts)
    for index, part in enumerate(parts):
        rewritten, values = _field_values(expr, index, part, seed, rules.get(index))
        fields.append(rewritten)
        value_sets.append(values)
    expanded = " ".join(fields)

    # Vixie cron ANDs day-of-month and day-of-week when either starts with
    # "*", otherwise ORs them; only the AND case can be unsatisfiable.
    days, months = value_sets[2], value_sets[3]
    day_and = fields[2].startswith("*") or fields[4].startswith("*")
    can_fire = not day_and or any(day <= _DAYS_IN_MONTH[month] for day in days for month in months)
    try:
        CronSim(expanded, datetime(2000, 1, 1))
    except CronSimError as exc:
        if can_fire:
            raise _invalid(expr, str(exc)) from None
    return expanded, can_fire


def expand_cron(expr: str, job_id: str | UUID | None = None) -> str:
    """Expand aliases and ``H`` into a plain 5-field expression.

    Raises ScheduleError on syntax errors, a wrong field count or values out
    of range.  An expression that parses but can never fire is returned as-is;
    ``validate_cron`` rejects it.
    """
    if not isinstance(expr, str):
        raise ScheduleError("Cron expression must be a string")
    return _expand_cached(expr, _normalize_seed(job_id, expr))[0]


def _fixed_time(expanded: str) -> bool:
    minute, hour = expanded.split(" ", 2)[:2]
    return not minute.startswith("*") and not hour.startswith("*")


def is_fixed_time(expr: str) -> bool:
    """True when DST treats the job as fixed-time (Vixie cron's rule).

    Decided on the expanded expression; H never expands to "*", so the
    answer does not depend on the job id.
    """
    return _fixed_time(expand_cron(expr, None))


def _compile(expr: str, job_id: str | UUID | None) -> _Compiled:
    if not isinstance(expr, str):
        raise ScheduleError("Cron expression must be a string")
    expanded, can_fire = _expand_cached(expr, _normalize_seed(job_id, expr))
    if not can_fire:
        raise _invalid(expr, "it can never fire (that day does not exist in the selected months)")
    return _compiled_for(expanded)


@functools.lru_cache(maxsize=16_384)
def _compiled_for(expanded: str) -> _Compiled:
    return _Compiled(expanded, _fixed_time(expanded))


# --------------------------------------------------------------------------
# Wall clock -> instants
# --------------------------------------------------------------------------


def _walls(expanded: str, after_wall: datetime) -> Iterator[datetime]:
    """Naive local wall times matching ``expanded``, strictly after ``after_wall``."""
    # A naive start makes cronsim a pure calendar: no DST logic of its own.
    return CronSim(expanded, after_wall)


def _offset(zone: ZoneInfo, instant: datetime) -> timedelta:
    return instant.astimezone(zone).utcoffset()  # type: ignore[return-value]


def _wall_of(zone: ZoneInfo, instant: datetime) -> datetime:
    return instant.astimezone(zone).replace(tzinfo=None)


def _instances(zone: ZoneInfo, wall: datetime) -> tuple[datetime, ...]:
    """All real UTC instants showing ``wall``: 0 (gap), 1, or 2 (overlap)."""
    found: list[datetime] = []
    for fold in (0, 1):
        instant = wall.replace(tzinfo=zone, fold=fold).astimezone(UTC)
        # Round-trip check instead of trusting fold semantics blindly:
        # imaginary times convert but do not come back.
        if _wall_of(zone, instant) == wall and instant not in found:
            found.append(instant)
    found.sort()
    return tuple(found)


def _transition_after(zone: ZoneInfo, lo: datetime, hi: datetime) -> datetime:
    """First instant in (lo, hi] whose offset differs from lo's (one change assumed)."""
    base = _offset(zone, lo)
    lo_s, hi_s = 0, int((hi - lo).total_seconds())
    while hi_s - lo_s > 1:
        mid = (lo_s + hi_s) // 2
        if _offset(zone, lo + timedelta(seconds=mid)) == base:
            lo_s = mid
        else:
            hi_s = mid
    return lo + timedelta(seconds=hi_s)


def _gap_end(zone: ZoneInfo, wall: datetime) -> datetime:
    # For an imaginary wall, fold=1 lands before the transition and fold=0
    # after it (PEP 495), so the transition is bracketed by the two.
    a = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
    b = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
    lo, hi = min(a, b), max(a, b)
    if lo == hi:
        return lo
    return _transition_after(zone, lo, hi)


def _fmt(wall: datetime) -> str:
    return wall.strftime("%H:%M") if wall.second == 0 else wall.strftime("%H:%M:%S")


def _next_fixed(compiled: _Compiled, zone: ZoneInfo, after: datetime) -> tuple[datetime, str | None] | None:
    start_wall = _wall_of(zone, after)
    horizon = start_wall + HORIZON
    walls = _walls(compiled.expanded, start_wall)
    for _ in range(MAX_STEPS):
        wall = next(walls, None)
        if wall is None or wall > horizon:
            return None
        instances = _instances(zone, wall)
        note: str | None = None
        if not instances:
            fired = _gap_end(zone, wall)
            note = f"DST gap: {_fmt(wall)} does not exist, fired at {_fmt(_wall_of(zone, fired))}"
        else:
            fired = instances[0]
            if len(instances) > 1:
                note = f"DST overlap: first of two {_fmt(wall)}"
        # Walls after `after`'s wall can still map to instants <= after when
        # `after` sits in the second half of an overlap (first instance is
        # already past) or a gap slot was merged into `after` itself.
        if fired > after:
            return fired, note
    return None


def _overlap_note(zone: ZoneInfo, wall: datetime, instant: datetime, first: bool) -> str:
    label = "first" if first else "second"
    abbr = instant.astimezone(zone).tzname()
    return f"DST overlap: {label} {_fmt(wall)} ({abbr})"


def _next_elapsed(compiled: _Compiled, zone: ZoneInfo, after: datetime) -> tuple[datetime, str | None] | None:
    start_wall = _wall_of(zone, after)
    horizon = start_wall + HORIZON
    best: tuple[datetime, str | None] | None = None

    walls = _walls(compiled.expanded, start_wall)
    for _ in range(MAX_STEPS):
        wall = next(walls, None)
        if wall is None or wall > horizon:
            break
        instances = _instances(zone, wall)
        later = [i for i in instances if i > after]
        if not later:
            continue  # gap slot, or first instance already passed
        fired = later[0]
        note = None
        if len(instances) > 1:
            note = _overlap_note(zone, wall, fired, first=fired == instances[0])
        best = (fired, note)
        break

    # The forward wall walk cannot see walls *earlier* than `after`'s wall
    # that the clock will show again after an imminent fall-back.
    repeat = _repeat_after_fallback(compiled, zone, after, start_wall)
    if repeat is not None and (best is None or repeat[0] < best[0]):
        best = repeat
    return best


def _repeat_after_fallback(
    compiled: _Compiled, zone: ZoneInfo, after: datetime, start_wall: datetime
) -> tuple[datetime, str | None] | None:
    before = _offset(zone, after)
    if _offset(zone, after + _MAX_OVERLAP) >= before:
        return None
    transition = _transition_after(zone, after, after + _MAX_OVERLAP)
    new_offset = _offset(zone, transition)
    repeat_start = (transition + new_offset).replace(tzinfo=None)
    repeat_end = min((transition + before).replace(tzinfo=None), start_wall)
    walls = _walls(compiled.expanded, repeat_start - _ONE_SECOND)
    for _ in range(MAX_STEPS):
        wall = next(walls, None)
        if wall is None or wall > repeat_end:
            return None
        instant = (wall - new_offset).replace(tzinfo=UTC)
        if instant > after and _wall_of(zone, instant) == wall:
            return instant, _overlap_note(zone, wall, instant, first=False)
    return None


def _next_cron(compiled: _Compiled, zone: ZoneInfo, after: datetime) -> tuple[datetime, str | None] | None:
    after = after.astimezone(UTC)
    try:
        if compiled.fixed_time:
            return _next_fixed(compiled, zone, after)
        return _next_elapsed(compiled, zone, after)
    except OverflowError:
        # Searching past datetime.max (year 9999): nothing can fire there.
        return None


# --------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------


def validate_cron(expr: str, tz: str = "UTC", job_id: str | UUID | None = None) -> None:
    """Raise ScheduleError for bad syntax, an unknown zone, or a dead expression."""
    zone = load_zone(tz)
    compiled = _compile(expr, job_id)
    now = datetime.now(UTC)
    if _next_cron(compiled, zone, now) is None:
        raise _invalid(expr, "it does not fire within the next 10 years")


def next_cron_time(expr: str, tz: str, after: datetime, job_id: str | UUID | None = None) -> datetime | None:
    """First fire time strictly after ``after`` (UTC), or None within the horizon."""
    _require_aware(after, "after")
    found = _next_cron(_compile(expr, job_id), load_zone(tz), after)
    return found[0] if found else None


def _check_interval(interval_seconds: int) -> int:
    if isinstance(interval_seconds, bool) or not isinstance(interval_seconds, int):
        raise ScheduleError("Interval must be a whole number of seconds")
    if interval_seconds <= 0:
        raise ScheduleError("Interval must be at least 1 second")
    return interval_seconds


def next_interval_time(interval_seconds: int, anchor: datetime, after: datetime) -> datetime:
    """Smallest ``anchor + k * interval`` (k >= 0) strictly after ``after``."""
    step = timedelta(seconds=_check_interval(interval_seconds))
    _require_aware(anchor, "anchor")
    _require_aware(after, "after")
    anchor = anchor.astimezone(UTC)
    if anchor > after:
        return anchor
    # timedelta floor division is exact integer microsecond arithmetic, so
    # long-running jobs do not drift the way float seconds would.
    k = (after - anchor) // step + 1
    return anchor + k * step


def _trigger_kind(cron: str | None, interval_seconds: int | None, run_at: datetime | None) -> str:
    set_ = [
        name
        for name, value in (
            ("cron", cron),
            ("interval_seconds", interval_seconds),
            ("run_at", run_at),
        )
        if value is not None
    ]
    if len(set_) != 1:
        raise ScheduleError(
            "Exactly one of cron, interval_seconds or run_at must be set"
            + (f" (got {', '.join(set_)})" if set_ else "")
        )
    return set_[0]


def next_fire_time(
    *,
    cron: str | None,
    timezone: str,
    interval_seconds: int | None,
    run_at: datetime | None,
    anchor: datetime | None,
    after: datetime,
    job_id: str | UUID | None = None,
) -> datetime | None:
    """Next fire time strictly after ``after`` for any trigger kind (UTC)."""
    _require_aware(after, "after")
    kind = _trigger_kind(cron, interval_seconds, run_at)
    if kind == "cron":
        assert cron is not None
        return next_cron_time(cron, timezone, after, job_id)
    if kind == "interval_seconds":
        assert interval_seconds is not None
        if anchor is None:
            raise ScheduleError("Interval jobs need an anchor time")
        return next_interval_time(interval_seconds, anchor, after)
    assert run_at is not None
    _require_aware(run_at, "run_at")
    return run_at.astimezone(UTC) if run_at > after else None


def fire_times(
    *,
    cron: str | None,
    timezone: str,
    interval_seconds: int | None,
    run_at: datetime | None,
    anchor: datetime | None,
    after: datetime,
    job_id: str | UUID | None = None,
    count: int | None = None,
    until: datetime | None = None,
    limit: int = 10_000,
) -> list[FireTime]:
    """Successive fire times strictly after ``after``.

    Stops after ``count`` items, at the first fire time later than ``until``
    (``until`` itself is included), or after ``limit`` items, whichever
    comes first.
    """
    _require_aware(after, "after")
    if until is not None:
        _require_aware(until, "until")
    kind = _trigger_kind(cron, interval_seconds, run_at)
    zone = load_zone(timezone)
    cap = limit if count is None else min(count, limit)
    out: list[FireTime] = []
    if cap <= 0:
        return out

    def emit(instant: datetime, note: str | None) -> bool:
        if until is not None and instant > until:
            return False
        out.append(FireTime(instant, instant.astimezone(zone), note))
        return len(out) < cap

    if kind == "run_at":
        assert run_at is not None
        _require_aware(run_at, "run_at")
        if run_at > after:
            emit(run_at.astimezone(UTC), None)
        return out

    if kind == "interval_seconds":
        assert interval_seconds is not None
        if anchor is None:
            raise ScheduleError("Interval jobs need an anchor time")
        step = timedelta(seconds=_check_interval(interval_seconds))
        try:
            instant = next_interval_time(interval_seconds, anchor, after)
            while emit(instant, None):
                instant += step
        except OverflowError:
            pass  # ran past datetime.max: the list simply ends there
        return out

    assert cron is not None
    compiled = _compile(cron, job_id)
    cursor = after.astimezone(UTC)
    while True:
        found = _next_cron(compiled, zone, cursor)
        if found is None or not emit(*found):
            return out
        cursor = found[0]
