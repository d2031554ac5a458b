"""Zones and DST: which real instants a matching wall time fires at, under the job's policy.

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

cronsim is used only as a *naive* wall-clock calendar (jobs/schedule/cron_calendar.py).
Mapping those wall times to instants is done here with zoneinfo's ``fold`` instead
of relying on cronsim's aware iteration: that keeps the DST rules explicit,
testable, and - most importantly - every search is bounded by a step count and a
horizon so no expression/zone can hang a worker.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from importlib import resources
from zoneinfo import ZoneInfo

from jobs.schedule import cron_calendar
from jobs.schedule.cron import Compiled, ScheduleError, is_fixed_time

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

# Keys the tzdata package ships that do not name a place: "Factory" is the
# "local time zone must be set" placeholder (abbreviation -00). Hosts also have
# localtime, posixrules, right/... and posix/..., but those are not in tzdata's
# list and so are refused anyway.
_REJECTED_ZONE_KEYS = frozenset({"localtime", "posixrules", "Factory"})


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
# Zones (tzdata only)
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


# --------------------------------------------------------------------------
# Wall clock -> instants
# --------------------------------------------------------------------------


def _offset(zone: ZoneInfo, instant: datetime) -> timedelta:
    return instant.astimezone(zone).utcoffset()  # type: ignore[return-value]


def _wall_of(zone: ZoneInfo, instant: datetime) -> datetime:
    return instant.astimezone(zone).replace(tzinfo=None)


def instances_of_wall(zone: ZoneInfo, wall: datetime) -> tuple[datetime, ...]:
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
    instances = instances_of_wall(zone, wall)
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
    compiled: Compiled, zone: ZoneInfo, after: datetime, policy: DstPolicy
) -> tuple[datetime, str | None] | None:
    """First fire time strictly after `after` under `policy` (bounded search)."""
    start_wall = _wall_of(zone, after)
    horizon = start_wall + HORIZON
    best: tuple[datetime, str | None] | None = None
    skipped: tuple[datetime, str] | None = None  # first gap slot the policy skipped

    walls = cron_calendar.walls(compiled.expanded, start_wall)
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
    compiled: Compiled, zone: ZoneInfo, after: datetime, start_wall: datetime, policy: DstPolicy
) -> tuple[datetime, str | None] | None:
    before = _offset(zone, after)
    if _offset(zone, after + _MAX_OVERLAP) >= before:
        return None
    transition = _transition_after(zone, after, after + _MAX_OVERLAP)
    new_offset = _offset(zone, transition)
    repeat_start = (transition + new_offset).replace(tzinfo=None)
    repeat_end = min((transition + before).replace(tzinfo=None), start_wall)
    walls = cron_calendar.walls(compiled.expanded, repeat_start - _ONE_SECOND)
    for _ in range(MAX_STEPS):
        wall = next(walls, None)
        if wall is None or wall > repeat_end:
            return None
        instant = (wall - new_offset).replace(tzinfo=UTC)
        if instant > after and _wall_of(zone, instant) == wall:
            return instant, _overlap_note(wall, instances_of_wall(zone, wall), instant, policy)
    return None


# tzdata holds no two offset changes of one zone within two days of each other (since
# 1970), so a zone whose offset, sampled hourly, never changes over a span keeps it
# throughout. Spans are short (a forecast window): longer ones search slot by slot.
_OFFSET_SAMPLE = timedelta(hours=1)
_FAST_SPAN = timedelta(days=8)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@functools.lru_cache(maxsize=4096)
def _constant_offset(zone: ZoneInfo, lo: datetime, hi: datetime) -> timedelta | None:
    """The zone's offset if it is the same at every hour of [lo, hi] (whole hours), else None."""
    offset = _offset(zone, lo)
    moment = lo
    while moment < hi:
        moment += _OFFSET_SAMPLE
        if _offset(zone, moment) != offset:
            return None
    return offset


def fixed_offset_instants(
    compiled: Compiled, zone: ZoneInfo, after: datetime, until: datetime
) -> Iterator[datetime] | None:
    """Every fire time in (after, until], or None when the zone changes its offset
    around the span (or the span is long): then the caller searches slot by slot.

    With one offset there is no gap and no overlap, so every matching wall time is
    exactly one instant whatever the policy: `_next_in_zone` without its DST cases, and
    one walk of the calendar for the span instead of one search per slot (a forecast's
    day of `*/5` in a dozen zones was 3,456 searches). The offset must hold from 25 h
    before `after` (a wall time after it may have had its first instance before it: a
    repeated one) to 25 h past `until` (as far as `_repeat_after_fallback` looks).
    """
    after, until = after.astimezone(UTC), until.astimezone(UTC)
    if after < _EPOCH + _MAX_OVERLAP or not after < until <= after + _FAST_SPAN:
        return None
    hour = timedelta(hours=1)
    lo = after - _MAX_OVERLAP
    lo -= (lo - _EPOCH) % hour
    hi = until + _MAX_OVERLAP
    hi += -(hi - _EPOCH) % hour
    offset = _constant_offset(zone, lo, hi)
    if offset is None:
        return None
    end_wall = (until + offset).replace(tzinfo=None)

    def instants() -> Iterator[datetime]:
        for wall in cron_calendar.walls(compiled.expanded, (after + offset).replace(tzinfo=None)):
            if wall > end_wall:
                return
            yield (wall - offset).replace(tzinfo=UTC)

    return instants()


def next_cron(
    compiled: Compiled, zone: ZoneInfo, after: datetime, policy: DstPolicy
) -> tuple[datetime, str | None] | None:
    """(first fire time strictly after `after`, DST note) under `policy`; None if there is none."""
    after = after.astimezone(UTC)
    try:
        return _next_in_zone(compiled, zone, after, policy)
    except OverflowError:
        # Searching past datetime.max (year 9999): nothing can fire there.
        return None
