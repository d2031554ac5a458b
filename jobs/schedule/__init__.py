"""Fire-time computation for Cronyard jobs (pure Python, no Django): the public functions.

Three trigger kinds exist: ``cron`` (5-field expressions evaluated in the job's
IANA zone), ``interval_seconds`` (elapsed time, DST-free, anchored) and
``run_at`` (one shot).  Every datetime coming in must be aware; every
datetime going out is in ``datetime.timezone.utc``.

Callers use this module; the parts live beside it:

* jobs/schedule/cron.py: cron syntax (aliases, fields, ``H`` hashing, calendar forms);
* jobs/schedule/cron_calendar.py: which naive wall times an expanded expression matches;
* jobs/schedule/dst.py: zones from tzdata, the per-job DST policy and the bounded walk from
  wall times to instants.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Required, TypedDict, Unpack
from uuid import UUID
from zoneinfo import ZoneInfo

from jobs.schedule.cron import Compiled, ScheduleError, compile_cron, expand_cron, invalid, is_fixed_time
from jobs.schedule.dst import (
    DST_MISSING,
    DST_REPEATED,
    DstPolicy,
    dst_policy_for,
    effective_dst_policy,
    fixed_offset_instants,
    instances_of_wall,
    load_zone,
    next_cron,
)

__all__ = [
    "DST_MISSING",
    "DST_REPEATED",
    "FireTime",
    "ScheduleError",
    "Trigger",
    "dst_policy_for",
    "expand_cron",
    "fire_times",
    "is_fixed_time",
    "load_zone",
    "next_cron_time",
    "next_fire_time",
    "next_interval_time",
    "validate_cron",
    "wall_instants",
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
    """First fire time strictly after ``after`` (UTC), or None within the horizon.

    Cached: at the top of the hour thousands of due jobs share an expression, a zone and
    a DST policy (every `0 9 * * *` in Europe/Berlin), and they all ask for the slot
    after the same instant. The job id only matters to `H` (it seeds the hash), so
    without an `H` the expression is compiled unseeded (one cache entry for the group
    instead of one per job) and the search itself is cached on (expanded expression,
    zone, policy, instant). Uncached, this was 40 % of the scheduler's time at 100k due
    realistic jobs (docs/decisions/0029-dispatch-hot-path.md).
    """
    _require_aware(after, "after")
    compiled = compile_cron(expr, job_id if "H" in expr.upper() else None)
    try:
        key = tuple(sorted((dst_policy or {}).items()))
        hash(key)
    except (AttributeError, TypeError):
        # Not a flat mapping of strings: effective_dst_policy says what is wrong.
        key = None
    if key is None:
        policy = effective_dst_policy(dst_policy, fixed_time=compiled.fixed_time)
        found = next_cron(compiled, load_zone(tz), after, policy)
        return found[0] if found else None
    return _cron_after(compiled, tz, key, after)


@functools.lru_cache(maxsize=8192)
def _cron_after(compiled: Compiled, zone: str, policy: tuple, after: datetime) -> datetime | None:
    # Pure, so caching is safe.
    found = next_cron(
        compiled, load_zone(zone), after, effective_dst_policy(dict(policy), fixed_time=compiled.fixed_time)
    )
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


class Trigger(TypedDict, total=False):
    """One trigger: the keyword arguments `fire_times` and `next_fire_time` share."""

    cron: Required[str | None]
    timezone: Required[str]
    interval_seconds: Required[int | None]
    run_at: Required[datetime | None]
    anchor: Required[datetime | None]
    job_id: str | UUID | None
    dst_policy: Mapping[str, str | None] | None


def next_fire_time(*, after: datetime, **trigger: Unpack[Trigger]) -> datetime | None:
    """Next fire time strictly after ``after`` (UTC), or None: the first of `fire_times`.

    ``dst_policy`` applies to cron only: interval and one-time triggers are DST-free.
    """
    first = next(_fire_instants(after, **trigger), None)
    return first[0] if first else None


def wall_instants(wall: datetime, zone: str) -> tuple[datetime, ...]:
    """The UTC instants a naive wall time shows in ``zone``: none inside a DST gap, two
    inside an overlap (earliest first), else one. For times people type (a backfill's
    window), read by the same tzdata rules the schedule fires by."""
    if wall.tzinfo is not None:
        raise ValueError("wall must be naive (a wall-clock reading)")
    return instances_of_wall(load_zone(zone), wall)


def fire_times(
    *,
    after: datetime,
    count: int | None = None,
    until: datetime | None = None,
    limit: int = 10_000,
    **trigger: Unpack[Trigger],
) -> list[FireTime]:
    """Successive fire times strictly after ``after``.

    Stops after ``count`` items, at the first fire time later than ``until``
    (``until`` itself is included), or after ``limit`` items, whichever
    comes first.
    """
    if until is not None:
        _require_aware(until, "until")
    instants = _fire_instants(after, until=until, **trigger)
    zone = load_zone(trigger["timezone"])
    cap = limit if count is None else min(count, limit)
    out: list[FireTime] = []
    for instant, note in itertools.islice(instants, max(cap, 0)):
        if until is not None and instant > until:
            break
        out.append(FireTime(instant, instant.astimezone(zone), note))
    return out


def _fire_instants(
    after: datetime,
    *,
    until: datetime | None = None,
    cron: str | None,
    timezone: str,
    interval_seconds: int | None,
    run_at: datetime | None,
    anchor: datetime | None,
    job_id: str | UUID | None = None,
    dst_policy: Mapping[str, str | None] | None = None,
) -> Iterator[tuple[datetime, str | None]]:
    """(UTC instant, DST note) of every fire time strictly after ``after``, in order:
    the one path from a trigger to its fire times (`next_fire_time` takes the first,
    `fire_times` a list), so the slot the scheduler dispatches is the first one every
    preview and the ledger list.

    The arguments are judged here, before the first item is asked for. `until` is a
    hint (`fire_times` stops there): a short span in a zone that keeps its offset is
    walked in one pass instead of one search per slot.
    """
    _require_aware(after, "after")
    kind = _trigger_kind(cron, interval_seconds, run_at)
    if kind == "run_at":
        assert run_at is not None
        _require_aware(run_at, "run_at")
        return iter([(run_at.astimezone(UTC), None)] if run_at > after else [])
    if kind == "interval_seconds":
        assert interval_seconds is not None
        if anchor is None:
            raise ScheduleError("Interval jobs need an anchor time")
        return _interval_instants(interval_seconds, anchor, after)
    assert cron is not None
    compiled = compile_cron(cron, job_id)
    policy = effective_dst_policy(dst_policy, fixed_time=compiled.fixed_time)
    return _cron_instants(compiled, load_zone(timezone), after.astimezone(UTC), policy, until)


def _interval_instants(
    interval_seconds: int, anchor: datetime, after: datetime
) -> Iterator[tuple[datetime, None]]:
    step = timedelta(seconds=_check_interval(interval_seconds))
    try:
        instant = next_interval_time(interval_seconds, anchor, after)
        while True:
            yield instant, None
            instant += step
    except OverflowError:
        return  # ran past datetime.max: the schedule simply ends there


def _cron_instants(
    compiled: Compiled, zone: ZoneInfo, cursor: datetime, policy: DstPolicy, until: datetime | None = None
) -> Iterator[tuple[datetime, str | None]]:
    fast = fixed_offset_instants(compiled, zone, cursor, until) if until is not None else None
    for instant in fast or ():
        yield instant, None
        cursor = instant
    # Past `until` (or all along, when the offset changes nearby): one search per slot.
    while (found := next_cron(compiled, zone, cursor, policy)) is not None:
        yield found
        cursor = found[0]
