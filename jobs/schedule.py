"""Fire-time computation for Cronyard jobs (pure Python, no Django): the public functions.

Three trigger kinds exist: ``cron`` (5-field expressions evaluated in the job's
IANA zone), ``interval_seconds`` (elapsed time, DST-free, anchored) and
``run_at`` (one shot).  Every datetime coming in must be aware; every
datetime going out is in ``datetime.timezone.utc``.

Callers use this module; the parts live beside it:

* jobs/cron.py: cron syntax (aliases, fields, ``H`` hashing, calendar forms);
* jobs/cron_calendar.py: which naive wall times an expanded expression matches;
* jobs/dst.py: zones from tzdata, the per-job DST policy and the bounded walk from
  wall times to instants.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from uuid import UUID

from jobs.cron import ScheduleError, compile_cron, expand_cron, invalid, is_fixed_time
from jobs.dst import DST_MISSING, DST_REPEATED, dst_policy_for, effective_dst_policy, load_zone, next_cron

__all__ = [
    "DST_MISSING",
    "DST_REPEATED",
    "FireTime",
    "ScheduleError",
    "dst_policy_for",
    "expand_cron",
    "fire_times",
    "is_fixed_time",
    "load_zone",
    "next_cron_time",
    "next_fire_time",
    "next_interval_time",
    "validate_cron",
]


@dataclass(frozen=True)
class FireTime:
    # Compare and store ``utc``.  ``local == utc`` is False inside a DST
    # overlap even for the same instant (PEP 495 inter-zone rule).
    utc: datetime  # aware, UTC
    local: datetime  # aware, in the job's zone
    note: str | None  # DST remark for previews, None for ordinary slots


def _require_aware(value: datetime, name: str) -> datetime:
    # TypeError rather than ScheduleError: a naive datetime is a programming
    # error in the caller, not something a user typed.
    if not isinstance(value, datetime):
        raise TypeError(f"{name} must be a datetime, got {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise TypeError(f"{name} must be timezone-aware")
    return value


def validate_cron(
    expr: str,
    tz: str = "UTC",
    job_id: str | UUID | None = None,
    dst_policy: Mapping[str, str | None] | None = None,
) -> None:
    """Raise ScheduleError for bad syntax, an unknown zone, or a dead expression."""
    zone = load_zone(tz)
    compiled = compile_cron(expr, job_id)
    policy = effective_dst_policy(dst_policy, fixed_time=compiled.fixed_time)
    now = datetime.now(UTC)
    if next_cron(compiled, zone, now, policy) is None:
        raise invalid(expr, "it does not fire within the next 10 years")


def next_cron_time(
    expr: str,
    tz: str,
    after: datetime,
    job_id: str | UUID | None = None,
    dst_policy: Mapping[str, str | None] | None = None,
) -> datetime | None:
    """First fire time strictly after ``after`` (UTC), or None within the horizon."""
    _require_aware(after, "after")
    compiled = compile_cron(expr, job_id)
    policy = effective_dst_policy(dst_policy, fixed_time=compiled.fixed_time)
    found = next_cron(compiled, load_zone(tz), after, policy)
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
    compiled = compile_cron(cron, job_id)
    policy = effective_dst_policy(dst_policy, fixed_time=compiled.fixed_time)
    cursor = after.astimezone(UTC)
    while True:
        found = next_cron(compiled, zone, cursor, policy)
        if found is None or not emit(*found):
            return out
        cursor = found[0]
