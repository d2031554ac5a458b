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

A job's ``dst_policy`` (``{"repeated": "first"|"last"|"both", "missing":
"shift"|"skip"}``) overrides either half of that rule; an unset key keeps the
rule of the job's kind (fixed-time: first/shift, elapsed-time: both/skip).

Calendar forms: ``L``, ``LW`` and ``nW`` in day-of-month, ``5L`` and ``1#2`` in
day-of-week.  cronsim 2.8 knows all but ``nW``; ``_Calendar`` adds that one.

cronsim is used only as a *naive* wall-clock calendar (which local wall times
match the expression).  Mapping those wall times to instants is done here with
zoneinfo's ``fold`` instead of relying on cronsim's aware iteration: that keeps
the DST rules explicit, testable, and - most importantly - every search is
bounded by a step count and a horizon so no expression/zone can hang a worker.
"""

from __future__ import annotations

import calendar
import functools
import hashlib
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from importlib import resources
from uuid import UUID
from zoneinfo import ZoneInfo

from cronsim import CronSim, CronSimError
from cronsim.cronsim import Field

__all__ = [
    "DST_MISSING",
    "DST_REPEATED",
    "DstPolicy",
    "FireTime",
    "ScheduleError",
    "dst_policy_for",
    "effective_dst_policy",
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
# Calendar forms (Quartz syntax, as cronsim and croniter read it).
_DOM_SPECIAL_RE = re.compile(r"^(?:L|LW|(\d+)W)$")
_NEAREST_RE = re.compile(r"^(\d+)W$")
_DOW_SPECIAL_RE = re.compile(r"^([0-9A-Z]+)(?:(L)|#(\d+))$")
# A stand-in "day" for L and LW in existence checks: every month has a last day
# (and a last weekday), and every month has a day 28.
_ALWAYS_EXISTS = 28
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


DST_REPEATED = ("first", "last", "both")
DST_MISSING = ("shift", "skip")


@dataclass(frozen=True)
class DstPolicy:
    """What a slot does when its wall time happens twice (`repeated`) or not at all (`missing`)."""

    repeated: str  # first | last | both
    missing: str  # shift | skip


# Debian cron's rule per job kind: what an unset key of a job's dst_policy means.
_FIXED_DEFAULT = DstPolicy(repeated="first", missing="shift")
_ELAPSED_DEFAULT = DstPolicy(repeated="both", missing="skip")


def effective_dst_policy(policy: Mapping[str, str | None] | None, *, fixed_time: bool) -> DstPolicy:
    """The policy a job runs with: its explicit keys, the Debian rule of its kind for the rest."""
    base = _FIXED_DEFAULT if fixed_time else _ELAPSED_DEFAULT
    policy = policy or {}
    repeated = policy.get("repeated") or base.repeated
    missing = policy.get("missing") or base.missing
    if repeated not in DST_REPEATED:
        raise ScheduleError(f"dst_policy.repeated must be one of {', '.join(DST_REPEATED)}, not {repeated!r}")
    if missing not in DST_MISSING:
        raise ScheduleError(f"dst_policy.missing must be one of {', '.join(DST_MISSING)}, not {missing!r}")
    return DstPolicy(repeated=repeated, missing=missing)


def dst_policy_for(expr: str, policy: Mapping[str, str | None] | None) -> DstPolicy:
    """The effective policy of a cron expression (fixed-time or elapsed-time) with `policy`."""
    return effective_dst_policy(policy, fixed_time=is_fixed_time(expr))


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
        special = _special_term(expr, field, term)
        if special is not None:
            rewritten, exists = special
            out_terms.append(rewritten)
            values.update(exists)
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


def _special_term(expr: str, field: int, term: str) -> tuple[str, set[int]] | None:
    """A calendar form (L, LW, nW, nL, n#k): (term as cronsim reads it, days it needs).

    The returned day set is only used to decide whether the field can match in a
    month (a day-of-week form needs no particular day); None for an ordinary term.
    """
    if field == _DAY:
        match = _DOM_SPECIAL_RE.match(term)
        if match is None:
            return None
        if match.group(1) is None:
            return term, {_ALWAYS_EXISTS}
        day = int(match.group(1))
        if not 1 <= day <= 31:
            raise _invalid(expr, f"day-of-month {term}: day {day} is out of range 1-31")
        # A day a month does not have has no nearest weekday there (like a plain 31).
        return f"{day}W", {day}
    if field != 4:
        return None
    if term == "L":
        raise _invalid(expr, "day-of-week L needs a weekday before it (5L = the last Friday)")
    match = _DOW_SPECIAL_RE.match(term)
    if match is None:
        return None
    weekday = _parse_value(expr, field, match.group(1))
    if match.group(2):
        # cronsim reads only a number before L; names are rewritten to it.
        return f"{weekday}L", set()
    nth = int(match.group(3))
    if not 1 <= nth <= 5:
        raise _invalid(expr, f"day-of-week {term}: the occurrence after # must be 1-5 (got {nth})")
    return f"{weekday}#{nth}", set()


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
        _Calendar(expanded, datetime(2000, 1, 1))
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


@functools.lru_cache(maxsize=4096)
def _nearest_weekday(year: int, month: int, day: int) -> int | None:
    """The weekday (Mon-Fri) nearest to `day` inside the month; None if the month is shorter.

    Quartz rule: a Saturday moves back to Friday and a Sunday on to Monday, never
    across the month's edge (1W on a Saturday is Monday the 3rd, 31W on a Sunday is
    Friday the 29th).
    """
    first_weekday, last = calendar.monthrange(year, month)
    if day > last:
        return None
    weekday = (first_weekday + day - 1) % 7  # Monday = 0
    if weekday == 5:
        return day - 1 if day > 1 else day + 2
    if weekday == 6:
        return day + 1 if day < last else day - 2
    return day


class _Calendar(CronSim):
    """cronsim as a naive wall-clock calendar, plus `nW` in day-of-month.

    The nW terms are taken out of the expression before cronsim parses it (it
    refuses them) and matched here; everything else is cronsim's.
    """

    def __init__(self, expanded: str, start: datetime):
        parts = expanded.split(" ")
        dom_terms = parts[_DAY].split(",")
        nearest = frozenset(int(m.group(1)) for t in dom_terms if (m := _NEAREST_RE.match(t)))
        rest = [t for t in dom_terms if not _NEAREST_RE.match(t)]
        if nearest:
            # cronsim sees a stand-in ("L") and the rest of the field is parsed below:
            # its own "day 31 in February" check must not judge a field whose nW
            # terms can still fire.
            parts[_DAY] = "L"
        super().__init__(" ".join(parts), start)
        self.nearest = nearest
        if nearest:
            self.days = Field.DAY.parse(",".join(rest)) if rest else set()
            # AND/OR is decided on the field as written, not on what is left of it.
            self.day_and = dom_terms[0].startswith("*") or parts[4].startswith("*")

    def match_dom(self, d: date) -> bool:
        if super().match_dom(d):
            return True
        return any(_nearest_weekday(d.year, d.month, n) == d.day for n in self.nearest)


def _walls(expanded: str, after_wall: datetime) -> Iterator[datetime]:
    """Naive local wall times matching ``expanded``, strictly after ``after_wall``."""
    # A naive start makes cronsim a pure calendar: no DST logic of its own.
    return _Calendar(expanded, after_wall)


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


def _overlap_note(wall: datetime, instances: tuple[datetime, ...], fired: datetime, policy: DstPolicy) -> str:
    head = f"DST overlap: {_fmt(wall)} happens twice on {wall.date().isoformat()}; policy '{policy.repeated}'"
    which = "first" if fired == instances[0] else "second"
    if policy.repeated == "both":
        return f"{head}: fired at both, this is the {which}, {_fmt_utc(fired)}"
    return f"{head}: fired at the {which}, {_fmt_utc(fired)}"


def _gap_note(wall: datetime, policy: DstPolicy, fired: datetime | None, zone: ZoneInfo) -> str:
    head = f"DST gap: {_fmt(wall)} does not exist on {wall.date().isoformat()}; policy '{policy.missing}'"
    if fired is None:
        return f"{head}: that slot was not fired"
    return f"{head}: fired at {_fmt(_wall_of(zone, fired))}, {_fmt_utc(fired)}"


def _fmt_utc(instant: datetime) -> str:
    return _fmt(instant.astimezone(UTC).replace(tzinfo=None)) + "Z"


def _candidates(
    zone: ZoneInfo, wall: datetime, policy: DstPolicy
) -> list[tuple[datetime, str | None]] | None:
    """The instants a matching wall time fires at under `policy`, oldest first.

    None for a gap slot the policy skips (the caller notes it on the next fire time).
    """
    instances = _instances(zone, wall)
    if not instances:
        if policy.missing == "skip":
            return None
        fired = _gap_end(zone, wall)
        return [(fired, _gap_note(wall, policy, fired, zone))]
    if len(instances) == 1:
        return [(instances[0], None)]
    chosen = {"first": instances[:1], "last": instances[1:], "both": instances}[policy.repeated]
    return [(i, _overlap_note(wall, instances, i, policy)) for i in chosen]


def _next_in_zone(
    compiled: _Compiled, zone: ZoneInfo, after: datetime, policy: DstPolicy
) -> tuple[datetime, str | None] | None:
    """First fire time strictly after `after` under `policy` (bounded search)."""
    start_wall = _wall_of(zone, after)
    horizon = start_wall + HORIZON
    best: tuple[datetime, str | None] | None = None
    skipped: tuple[datetime, str] | None = None  # first gap slot the policy skipped

    walls = _walls(compiled.expanded, start_wall)
    for _ in range(MAX_STEPS):
        wall = next(walls, None)
        if wall is None or wall > horizon:
            break
        candidates = _candidates(zone, wall, policy)
        if candidates is None:
            if skipped is None:
                end = _gap_end(zone, wall)
                if end > after:
                    skipped = (end, _gap_note(wall, policy, None, zone))
            continue
        # Walls after `after`'s wall can still map to instants <= after: `after` sits
        # in the second half of an overlap (the first instance is past), or a gap slot
        # was merged into `after` itself. Within the walk, the first wall with a later
        # instant holds the earliest one (second instances of later walls come later).
        later = [c for c in candidates if c[0] > after]
        if later:
            best = later[0]
            break

    if policy.repeated != "first":
        # The forward wall walk cannot see walls *earlier* than `after`'s wall that the
        # clock will show again after an imminent fall-back.
        repeat = _repeat_after_fallback(compiled, zone, after, start_wall, policy)
        if repeat is not None and (best is None or repeat[0] < best[0]):
            best = repeat
    if best is not None and best[1] is None and skipped is not None and skipped[0] <= best[0]:
        # A skipped gap slot has no entry of its own: the next fire time says so.
        best = (best[0], skipped[1])
    return best


def _repeat_after_fallback(
    compiled: _Compiled, zone: ZoneInfo, after: datetime, start_wall: datetime, policy: DstPolicy
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
            return instant, _overlap_note(wall, _instances(zone, wall), instant, policy)
    return None


def _next_cron(
    compiled: _Compiled, zone: ZoneInfo, after: datetime, policy: DstPolicy
) -> tuple[datetime, str | None] | None:
    after = after.astimezone(UTC)
    try:
        return _next_in_zone(compiled, zone, after, policy)
    except OverflowError:
        # Searching past datetime.max (year 9999): nothing can fire there.
        return None


# --------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------


def validate_cron(
    expr: str,
    tz: str = "UTC",
    job_id: str | UUID | None = None,
    dst_policy: Mapping[str, str | None] | None = None,
) -> None:
    """Raise ScheduleError for bad syntax, an unknown zone, or a dead expression."""
    zone = load_zone(tz)
    compiled = _compile(expr, job_id)
    policy = effective_dst_policy(dst_policy, fixed_time=compiled.fixed_time)
    now = datetime.now(UTC)
    if _next_cron(compiled, zone, now, policy) is None:
        raise _invalid(expr, "it does not fire within the next 10 years")


def next_cron_time(
    expr: str,
    tz: str,
    after: datetime,
    job_id: str | UUID | None = None,
    dst_policy: Mapping[str, str | None] | None = None,
) -> datetime | None:
    """First fire time strictly after ``after`` (UTC), or None within the horizon."""
    _require_aware(after, "after")
    compiled = _compile(expr, job_id)
    policy = effective_dst_policy(dst_policy, fixed_time=compiled.fixed_time)
    found = _next_cron(compiled, load_zone(tz), after, policy)
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
    dst_policy: Mapping[str, str | None] | None = None,
) -> datetime | None:
    """Next fire time strictly after ``after`` for any trigger kind (UTC).

    ``dst_policy`` applies to cron only: interval and one-time triggers are DST-free.
    """
    _require_aware(after, "after")
    kind = _trigger_kind(cron, interval_seconds, run_at)
    if kind == "cron":
        assert cron is not None
        return next_cron_time(cron, timezone, after, job_id, dst_policy)
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
    dst_policy: Mapping[str, str | None] | None = None,
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
    policy = effective_dst_policy(dst_policy, fixed_time=compiled.fixed_time)
    cursor = after.astimezone(UTC)
    while True:
        found = _next_cron(compiled, zone, cursor, policy)
        if found is None or not emit(*found):
            return out
        cursor = found[0]
