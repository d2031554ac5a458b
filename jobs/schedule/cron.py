"""Cron syntax: a 5-field expression (or an @alias) in, a plain cronsim expression out.

What this module owns: aliases, field parsing and ranges, names (JAN, MON), steps,
Jenkins-style ``H`` hashing with its id-independence rules, and the calendar forms
``L``, ``LW``, ``nW`` (day-of-month) and ``5L``, ``1#2`` (day-of-week) as syntax.
Which wall times an expanded expression matches is jobs/schedule/cron_calendar.py; which
instants those wall times are in a zone is jobs/schedule/dst.py; callers use jobs/schedule/__init__.py.
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from cronsim import CronSimError

from jobs.schedule.cron_calendar import Calendar


class ScheduleError(ValueError):
    """A schedule cannot be used; the message is shown to users as-is.

    Defined here, in the lowest of the schedule modules, because cron parsing, zone
    loading and the public functions all raise it; callers use ``schedule.ScheduleError``.
    """


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
_DOW_SPECIAL_RE = re.compile(r"^([0-9A-Z]+)(?:(L)|#(\d+))$")
# A stand-in "day" for L and LW in existence checks: every month has a last day
# (and a last weekday), and every month has a day 28.
_ALWAYS_EXISTS = 28
_TERM_RE = re.compile(r"^(\*|[0-9A-Z]+(?:-[0-9A-Z]+)?)(?:/(\d+))?$")


def invalid(expr: str, reason: str) -> ScheduleError:
    """The error for an unusable expression: it quotes the expression as the user wrote it."""
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
        raise invalid(expr, f"{_FIELD_NAMES[field]} value {token!r} is not a number")
    value = int(token)
    lo, hi = _FIELD_RANGES[field]
    if not lo <= value <= hi:
        raise invalid(expr, f"{_FIELD_NAMES[field]} value {value} is out of range {lo}-{hi}")
    return value


def _check_step(expr: str, field: int, step_text: str | None) -> int:
    if step_text is None:
        return 1
    step = int(step_text)
    if step < 1:
        raise invalid(expr, f"{_FIELD_NAMES[field]} step must be at least 1")
    return step


def _hash_range(expr: str, field: int, match: re.Match[str]) -> tuple[int, int]:
    lo, hi = _HASH_RANGES[field]
    if match.group(1) is not None:
        lo, hi = int(match.group(1)), int(match.group(2))
        flo, fhi = _FIELD_RANGES[field]
        if not (flo <= lo <= hi <= fhi):
            raise invalid(
                expr,
                f"{_FIELD_NAMES[field]} range H({lo}-{hi}) must lie within {flo}-{fhi}",
            )
    return lo, hi


@dataclass(frozen=True)
class _HashRule:
    """What a hashed term of one field may choose, so that no job id gets a value that
    never fires while another id gets one that does: whether an expression is accepted
    must not depend on the job id (docs/decisions/0007-hashed-values-independent-of-job-id.md)."""

    cap: int | None = None  # highest value allowed (day-of-month: shortest selected month)
    allowed: frozenset[int] | None = None  # a choice must contain one of these (months)
    why: str = ""


def _hash_choices(
    expr: str, field: int, match: re.Match[str], rule: _HashRule
) -> tuple[tuple[int, ...], ...]:
    """Every value set a hashed term may pick, in hash order (the same for every job id)."""
    lo, hi = _hash_range(expr, field, match)
    step = _check_step(expr, field, match.group(3))
    if rule.cap is not None:
        hi = min(hi, rule.cap)
    span = hi - lo + 1
    # Jenkins semantics for a step: the hash picks the offset of the first run inside
    # one step, then the job repeats every `step` up to the end of the range. Without
    # restrictions choices[h % n] is the classic `lo + h % span` (or
    # `lo + h % min(step, span)`), so ids keep their values.
    if match.group(3) is None:
        choices = [(value,) for value in range(lo, hi + 1)]
    else:
        choices = [tuple(range(start, hi + 1, step)) for start in range(lo, lo + min(step, max(span, 0)))]
    if rule.allowed is not None:
        choices = [c for c in choices if rule.allowed.intersection(c)]
    if not choices:
        raise invalid(expr, f"{_FIELD_NAMES[field]} {match.group(0)} {rule.why}")
    return tuple(choices)


@dataclass(frozen=True)
class _Term:
    """One item of a field's list, parsed: as written (rewritten for cronsim), or a
    hashed term with every choice it can make; the job id picks one (`_pick`)."""

    text: str
    values: frozenset[int]
    choices: tuple[tuple[int, ...], ...] = ()
    field: int = 0
    occurrence: int = 0  # the how-manieth hashed term of its field (seeds the hash)


def _field_terms(expr: str, field: int, text: str, rule: _HashRule | None = None) -> tuple[_Term, ...]:
    """A field parsed into its terms; what does not depend on the job id (all the syntax
    errors) is decided here, once per expression."""
    terms: list[_Term] = []
    hash_occurrence = 0
    for term in text.split(","):
        if not term:
            raise invalid(expr, f"empty list item in {_FIELD_NAMES[field]} field")
        hashed = _HASH_RE.match(term)
        if hashed:
            choices = _hash_choices(expr, field, hashed, rule or _HashRule())
            terms.append(_Term(term, frozenset(), choices, field, hash_occurrence))
            hash_occurrence += 1
            continue
        special = _special_term(expr, field, term)
        if special is not None:
            rewritten, exists = special
            terms.append(_Term(rewritten, frozenset(exists)))
            continue
        plain = _TERM_RE.match(term)
        if not plain:
            raise invalid(expr, f"cannot parse {_FIELD_NAMES[field]} field item {term!r}")
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
                raise invalid(
                    expr,
                    f"{_FIELD_NAMES[field]} range {base} is backwards (wrap-around ranges are not supported)",
                )
        else:
            start = _parse_value(expr, field, base)
            # "5/15" means 5, 20, 35, ... (cronsim/Vixie extension); a bare
            # number without a step matches only itself.
            end = hi if step_text is not None else start
        terms.append(_Term(term, frozenset(range(start, end + 1, step))))
    return tuple(terms)


@dataclass(frozen=True)
class _Field:
    """A field parsed; `fixed` is its (text, values) when no term is hashed: the same for every job."""

    terms: tuple[_Term, ...]
    fixed: tuple[str, frozenset[int]] | None


def _parse_field(expr: str, field: int, text: str, rule: _HashRule | None = None) -> _Field:
    terms = _field_terms(expr, field, text, rule)
    if any(term.choices for term in terms):
        return _Field(terms, None)
    return _Field(terms, (",".join(t.text for t in terms), frozenset().union(*(t.values for t in terms))))


def _pick(parsed: _Field, seed: str) -> tuple[str, frozenset[int] | set[int]]:
    """The field rewritten without H for the job `seed`, and the set of values it matches."""
    if parsed.fixed is not None:
        return parsed.fixed
    out_terms: list[str] = []
    values: set[int] = set()
    for term in parsed.terms:
        if term.choices:
            picked = term.choices[_hash_value(seed, term.field, term.occurrence) % len(term.choices)]
            out_terms.append(",".join(map(str, picked)))
            values.update(picked)
        else:
            out_terms.append(term.text)
            values.update(term.values)
    return ",".join(out_terms), values


def _field_values(
    expr: str, field: int, text: str, seed: str, rule: _HashRule | None = None
) -> tuple[str, frozenset[int] | set[int]]:
    """Return the field rewritten without H, and the set of values it matches."""
    return _pick(_parse_field(expr, field, text, rule), seed)


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
            raise invalid(expr, f"day-of-month {term}: day {day} is out of range 1-31")
        # A day a month does not have has no nearest weekday there (like a plain 31).
        return f"{day}W", {day}
    if field != 4:
        return None
    if term == "L":
        raise invalid(expr, "day-of-week L needs a weekday before it (5L = the last Friday)")
    match = _DOW_SPECIAL_RE.match(term)
    if match is None:
        return None
    weekday = _parse_value(expr, field, match.group(1))
    if match.group(2):
        # cronsim reads only a number before L; names are rewritten to it.
        return f"{weekday}L", set()
    nth = int(match.group(3))
    if not 1 <= nth <= 5:
        raise invalid(expr, f"day-of-week {term}: the occurrence after # must be 1-5 (got {nth})")
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
class Compiled:
    """An expression as the searches in jobs/schedule/dst.py use it (cached per expanded text)."""

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


@functools.lru_cache(maxsize=4096)
def _parsed(expr: str) -> tuple[_Field, ...]:
    """The five fields of an expression, parsed once whatever the job id.

    Hashing is per job, parsing per expression: the load forecast expands `H` for every
    job of a tenant (100k ids of a few expressions), which parsing per id made cost
    ~100 µs a job; picking is a sha256 per hashed term.
    """
    text = " ".join(expr.split())
    if not text:
        raise ScheduleError("Cron expression is empty")
    if text.startswith("@"):
        alias = _ALIASES.get(text.lower())
        if alias is None:
            known = ", ".join(sorted(_ALIASES))
            raise invalid(expr, f"unknown alias (known: {known})")
        text = alias
    parts = text.upper().split(" ")
    if len(parts) != 5:
        raise invalid(
            expr,
            f"expected 5 fields (minute hour day-of-month month day-of-week) or an @alias, got {len(parts)}",
        )
    rules = _hash_rules(expr, parts)
    return tuple(_parse_field(expr, index, part, rules.get(index)) for index, part in enumerate(parts))


@functools.lru_cache(maxsize=16_384)
def _calendar_problem(expanded: str) -> str | None:
    """What cronsim says is wrong with an expanded expression, or None (cached per text)."""
    try:
        Calendar(expanded, datetime(2000, 1, 1))
    except CronSimError as exc:
        return str(exc)
    return None


@functools.lru_cache(maxsize=16_384)
def _expand_cached(expr: str, seed: str) -> tuple[str, bool]:
    """Return (expanded expression, can_fire)."""
    picked = [field.fixed or _pick(field, seed) for field in _parsed(expr)]
    fields = [text for text, _ in picked]
    days, months = picked[_DAY][1], picked[_MONTH][1]
    expanded = " ".join(fields)

    # Vixie cron ANDs day-of-month and day-of-week when either starts with
    # "*", otherwise ORs them; only the AND case can be unsatisfiable.
    day_and = fields[2].startswith("*") or fields[4].startswith("*")
    can_fire = not day_and or any(day <= _DAYS_IN_MONTH[month] for day in days for month in months)
    problem = _calendar_problem(expanded)
    if problem is not None and can_fire:
        raise invalid(expr, problem)
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


def compile_cron(expr: str, job_id: str | UUID | None) -> Compiled:
    """The expression of job `job_id` ready for a search; ScheduleError if it can never fire."""
    if not isinstance(expr, str):
        raise ScheduleError("Cron expression must be a string")
    expanded, can_fire = _expand_cached(expr, _normalize_seed(job_id, expr))
    if not can_fire:
        raise invalid(expr, "it can never fire (that day does not exist in the selected months)")
    return _compiled_for(expanded)


@functools.lru_cache(maxsize=16_384)
def _compiled_for(expanded: str) -> Compiled:
    return Compiled(expanded, _fixed_time(expanded))
