"""The load forecast: how many runs fall due in each step of a window, computed from the
schedules, not from runs (docs/decisions/0068-load-forecast.md).

A job's due slots are the ones the scheduler will fire: the slot it waits for
(`next_run_at`), then every later fire time of its schedule (jobs.schedule: its zone,
its DST policy, its `H` seed), up to `end_at`. A paused job fires nothing, and neither
does a finished one (no `next_run_at`). A run counts at its slot: jitter moves its
start, not its slot (`scheduled_at`).

Cost: jobs that share a schedule share its fire times. The database groups the rows by
(schedule, next_run_at, end_at, tenant); `H` expressions are expanded per job (the id
seeds the hash) and merge with every job that expands the same; interval jobs merge by
(interval, phase). The fire times of each distinct grid are computed once, and each
group adds one range of its grid (a difference array), so the cost is the grids' slots
plus the groups, not jobs x slots (`make bench` measures it at 100k and 1M jobs).
"""

from __future__ import annotations

import re
import threading
import time
from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.contrib.postgres.aggregates import ArrayAgg
from django.db.models import Count, Q

from jobs import schedule
from jobs.models import Job
from jobs.rules.job import JobInvalid

DEFAULT_SPAN = timedelta(hours=24)
DEFAULT_STEP_SECONDS = 60
# One request computes at most a week's fire times, in at most a week of minutes: the
# cost of a forecast is bounded by its window, whatever the caller asks.
MAX_SPAN = timedelta(days=7)
MAX_STEPS = 10_080
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(9999, 1, 1, tzinfo=UTC)
SPIKES = 5
# A spike is a step holding more than this many times the window's mean per step and at
# least half the busiest step's runs: the walls, not the steady background beside them.
SPIKE_FACTOR = 2.0
CAUSES_PER_SPIKE = 10
ZONES_PER_CAUSE = 5
# How long the console reuses a forecast (the dashboard refreshes every 15 s).
CACHE_SECONDS = 60

_US = timedelta(microseconds=1)
# The grid of a cron job is its fire times in the window: at most one a minute, plus a
# repeated hour when a DST overlap fires `both` instances.
_EXTRA_SLOTS = 200
_STEP_MINUTE = re.compile(r"^(?:\*|0|0-59)/(\d+)$")


def _us(moment: datetime) -> int:
    """Microseconds since the Unix epoch: exact integer arithmetic for the whole window."""
    return (moment - EARLIEST) // _US


def _moment(us: int) -> datetime:
    return EARLIEST + us * _US


@dataclass(frozen=True)
class Window:
    """[start, end) cut into steps of `step_seconds`; the last step may be shorter."""

    start: datetime
    end: datetime
    step_seconds: int

    @property
    def steps(self) -> int:
        return -(-(self.end - self.start) // timedelta(seconds=self.step_seconds))

    def step_start(self, index: int) -> datetime:
        return self.start + index * timedelta(seconds=self.step_seconds)

    def index_of(self, moment: datetime) -> int | None:
        """The step holding `moment`, or None outside the window."""
        if not self.start <= moment < self.end:
            return None
        return (moment - self.start) // timedelta(seconds=self.step_seconds)


def window(
    *, start: datetime | None, end: datetime | None, step_seconds: int | None, now: datetime
) -> Window:
    """The window of a request; raises JobInvalid naming `from`, `to` or `step`.

    Default: the next 24 h by minute, from the start of the current step (steps are
    aligned on the Unix epoch, so minutes start at :00). With only `to`, the 24 h
    before it; with only `from`, the 24 h after it.
    """
    step = DEFAULT_STEP_SECONDS if step_seconds is None else step_seconds
    errors: dict[str, list[str]] = {}
    longest = int(MAX_SPAN.total_seconds())
    if not 1 <= step <= longest:
        errors["step"] = [f"Seconds per step, 1..{longest}."]
    for name, value in (("from", start), ("to", end)):
        if value is not None and not EARLIEST <= value <= LATEST:
            errors[name] = [f"Must lie between {EARLIEST:%Y-%m-%d} and {LATEST:%Y-%m-%d}."]
    if errors:
        raise JobInvalid(errors)
    if start is None and end is None:
        aligned = _us(now) - _us(now) % (step * 1_000_000)
        start = _moment(aligned)
    if start is None:
        start = end - DEFAULT_SPAN
    if end is None:
        end = start + DEFAULT_SPAN
    if end <= start:
        raise JobInvalid({"to": ["Must be later than from."]})
    if end - start > MAX_SPAN:
        raise JobInvalid({"to": [f"The window may span at most {MAX_SPAN.days} days."]})
    if end > LATEST:
        raise JobInvalid({"to": [f"Must lie between {EARLIEST:%Y-%m-%d} and {LATEST:%Y-%m-%d}."]})
    result = Window(start=start, end=end, step_seconds=step)
    if result.steps > MAX_STEPS:
        raise JobInvalid(
            {
                "step": [
                    f"The window holds {result.steps} steps of {step} s; at most {MAX_STEPS}: "
                    "use a longer step or a shorter window."
                ]
            }
        )
    return result


@dataclass(frozen=True)
class Spread:
    """How the jobs of one expression could stop firing together."""

    suggestion: str  # the expression to use instead
    why: str


def spread_for(cron: str) -> Spread | None:
    """A fixed minute that `H` would spread, or a shared `*/N` phase that `H/N` would."""
    try:
        text = schedule.expand_cron(cron) if cron.strip().startswith("@") else " ".join(cron.split())
    except schedule.ScheduleError:
        return None
    parts = text.split(" ")
    if len(parts) != 5 or "H" in parts[0].upper():
        return None
    rest = " ".join(parts[1:])
    if parts[0].isdigit():
        return Spread(
            suggestion=f"H {rest}",
            why=f"every job on it fires at minute {int(parts[0])}; H gives each job its own minute "
            "(from its id), the rest of the schedule unchanged",
        )
    step = _STEP_MINUTE.match(parts[0])
    if step:
        n = int(step.group(1))
        return Spread(
            suggestion=f"H/{n} {rest}",
            why=f"every job on it fires at the same minutes (0, {n}, {2 * n}, ...); H/{n} gives each "
            f"job its own offset within the {n} minutes",
        )
    return None


@dataclass(frozen=True)
class Cause:
    """The jobs of one expression (or interval, or the one-time jobs) due in a spike's step."""

    kind: str  # cron | interval | one_time
    cron: str | None  # as written
    interval_seconds: int | None
    jobs: int
    runs: int
    timezones: dict[str, int]  # cron: its jobs per zone, the largest first (at most ZONES_PER_CAUSE)
    spread: Spread | None


@dataclass(frozen=True)
class Spike:
    index: int
    at: datetime
    count: int
    times_mean: float  # count / the window's mean per step
    causes: list[Cause]
    other_runs: int  # runs of the step from causes beyond the listed ones
    repeats: int  # steps of the window holding this same count, this one included


@dataclass(frozen=True)
class Forecast:
    window: Window
    counts: list[int]
    spikes: list[Spike]
    # Per tenant id, when asked for (the console's staff view); empty otherwise.
    by_tenant: dict[int, list[int]] = field(default_factory=dict)
    seconds: float = 0.0  # time taken to compute it

    @property
    def total(self) -> int:
        return sum(self.counts)

    def spike_at(self, moment: datetime) -> Spike | None:
        """The spike whose count the step of `moment` holds (a recurring one counts at every step)."""
        index = self.window.index_of(moment)
        if index is None:
            return None
        return next((s for s in self.spikes if s.count == self.counts[index]), None)


# --- computing it ----------------------------------------------------------------


@dataclass(slots=True)
class _Member:
    """`n` jobs of one grid, due from `lo` to `hi` (µs, inclusive)."""

    lo: int
    hi: int
    first: int  # their next_run_at: it fires even when it is not on the grid
    n: int
    tenant: int
    cause: tuple


@dataclass
class _Grid:
    times: Sequence[int] = ()  # µs instants in the window, ascending
    members: dict[tuple, _Member] = field(default_factory=dict)

    def add(self, *, lo: int, hi: int, first: int, n: int, tenant: int, cause: tuple) -> None:
        key = (lo, hi, first, tenant, cause)
        member = self.members.get(key)
        if member is None:
            self.members[key] = _Member(lo, hi, first, n, tenant, cause)
        else:
            member.n += n


# What decides a job's due slots in a window: its schedule from the slot it waits for
# (`next_run_at`; a one-time job's is its `run_at`) up to `end_at`. `start_at` has had
# its say already: `next_run_at` is never before it.
_COLUMNS = ("tenant_id", "cron_expr", "time_zone", "dst_policy", "interval_seconds", "next_run_at", "end_at")


def _rows(window: Window, tenant_id: int | None):
    """(job ids or None, *_COLUMNS, count): the jobs grouped by everything that decides
    their slots, with the ids where `H` makes them matter (the id seeds the hash).

    A job ended before its next slot is left to the arithmetic (it adds nothing), and
    `h` is matched as two plain LIKEs rather than ILIKE: the planner has statistics for
    the column, not for upper(column), and with them it groups by hash in memory
    instead of sorting 100k rows on disk.
    """
    jobs = Job.objects.filter(paused=False, next_run_at__isnull=False, next_run_at__lt=window.end)
    jobs = jobs.exclude(end_at__lt=window.start).order_by()
    if tenant_id is not None:
        jobs = jobs.filter(tenant_id=tenant_id)
    hashed = Q(cron_expr__contains="H") | Q(cron_expr__contains="h")
    for row in jobs.exclude(hashed).values_list(*_COLUMNS).annotate(n=Count("*")):
        yield (None, *row)
    for ids, *row in (
        jobs.filter(hashed).values_list(*_COLUMNS).annotate(ids=ArrayAgg("id")).values_list("ids", *_COLUMNS)
    ):
        yield (ids, *row, len(ids))


def compute(*, window: Window, tenant_id: int | None = None, by_tenant: bool = False) -> Forecast:
    """The forecast of `window` for one tenant (or all of them: the console's staff view)."""
    began = time.perf_counter()
    start, end = _us(window.start), _us(window.end)
    step = window.step_seconds * 1_000_000
    grids: dict[tuple, _Grid] = {}
    points = _Grid()  # one-time jobs, and slots off their grid: only their first slot
    policies: dict[tuple, Any] = {}
    for ids, tenant, cron, zone, dst, interval, next_run_at, end_at, n in _rows(window, tenant_id):
        first = _us(next_run_at)
        hi = min(end - 1, _us(end_at)) if end_at is not None else end - 1
        if not cron:
            if interval:
                period = interval * 1_000_000
                grid = grids.setdefault(("interval", period, first % period), _Grid())
                grid.add(
                    lo=max(start, first),
                    hi=hi,
                    first=first,
                    n=n,
                    tenant=tenant,
                    cause=("interval", None, None, interval),
                )
            else:
                points.add(
                    lo=first, hi=hi, first=first, n=n, tenant=tenant, cause=("one_time", None, None, None)
                )
            continue
        cause = ("cron", cron, zone, None)
        for job_id in ids or (None,):
            try:
                expanded = schedule.expand_cron(cron, job_id)
                key = (expanded, zone, tuple(sorted((dst or {}).items())))
                policy = policies.get(key)
                if policy is None:
                    policy = policies[key] = schedule.dst_policy_for(expanded, dst)
            except (schedule.ScheduleError, AttributeError, TypeError):
                break  # a stored schedule the scheduler cannot fire either
            grid = grids.setdefault(("cron", expanded, zone, policy), _Grid())
            grid.add(lo=max(start, first), hi=hi, first=first, n=1 if ids else n, tenant=tenant, cause=cause)

    counts = [0] * window.steps
    tenants: dict[int, list[int]] = {}
    for grid_key, grid in grids.items():
        grid.times = _grid_times(grid_key, window, start, end)
        for m in _add_grid(grid, counts, tenants if by_tenant else None, start, step, window.steps):
            # Its first slot is not on the schedule (set by hand, or the schedule
            # changed under it): the scheduler fires it all the same.
            points.add(lo=m.first, hi=m.hi, first=m.first, n=m.n, tenant=m.tenant, cause=m.cause)
    for point in points.members.values():
        if start <= point.first < end and point.first <= point.hi:
            index = (point.first - start) // step
            counts[index] += point.n
            if by_tenant:
                tenants.setdefault(point.tenant, [0] * window.steps)[index] += point.n
    spikes = _spikes(window, counts, grids, points, start, step)
    return Forecast(
        window=window, counts=counts, spikes=spikes, by_tenant=tenants, seconds=time.perf_counter() - began
    )


def _grid_times(grid_key: tuple, window: Window, start: int, end: int) -> Sequence[int]:
    if grid_key[0] == "interval":
        _, period, phase = grid_key
        return range(start + (phase - start) % period, end, period)
    _, expanded, zone, policy = grid_key
    minutes = int((window.end - window.start) / timedelta(minutes=1)) + _EXTRA_SLOTS
    try:
        times = schedule.fire_times(
            cron=expanded,
            timezone=zone,
            interval_seconds=None,
            run_at=None,
            anchor=None,
            after=window.start - _US,
            until=window.end - _US,
            limit=minutes,
            dst_policy={"repeated": policy.repeated, "missing": policy.missing},
        )
    except schedule.ScheduleError:
        return ()
    return [_us(t.utc) for t in times]


def _add_grid(
    grid: _Grid, counts: list[int], tenants: dict[int, list[int]] | None, start: int, step: int, steps: int
) -> list[_Member]:
    """Add a grid's due runs to the counts (and per tenant); return the members whose
    first slot is not on the grid."""
    times = grid.times
    off_grid: list[_Member] = []
    for m in grid.members.values():
        i = bisect_left(times, m.lo)
        j = bisect_right(times, m.hi)
        if m.first >= start and (i >= len(times) or times[i] != m.first):
            off_grid.append(m)
        if i >= j:
            continue
        series = tenants.setdefault(m.tenant, [0] * steps) if tenants is not None else None
        n = m.n
        for t in times[i:j]:
            index = (t - start) // step
            counts[index] += n
            if series is not None:
                series[index] += n
    return off_grid


def _spikes(
    window: Window, counts: list[int], grids: dict[tuple, _Grid], points: _Grid, start: int, step: int
) -> list[Spike]:
    total = sum(counts)
    if not total:
        return []
    mean = total / len(counts)
    floor = max(SPIKE_FACTOR * mean, max(counts) / 2)
    # A wall at every top of the hour is 24 equal steps: each count once (its first
    # step), with how often it recurs, so the list reaches the next largest.
    repeats = Counter(counts)
    first: dict[int, int] = {}
    for i, n in enumerate(counts):
        if n > SPIKE_FACTOR * mean and n >= floor:
            first.setdefault(n, i)
    chosen = sorted(first.items(), reverse=True)[:SPIKES]
    return [_spike(window, i, n, mean, grids, points, start, step, repeats[n]) for n, i in chosen]


def _spike(
    window: Window,
    index: int,
    count: int,
    mean: float,
    grids: dict[tuple, _Grid],
    points: _Grid,
    start: int,
    step: int,
    repeats: int,
) -> Spike:
    """Which schedules the runs of one step come from (a second pass over the groups)."""
    lo = start + index * step
    hi = lo + step  # exclusive
    # (kind, expression or interval) -> [jobs, runs, {zone: jobs}]: counts by expression,
    # whatever zones it is written in (a wall is one expression in a dozen zones).
    by_cause: dict[tuple, list] = {}

    def tally(cause: tuple, jobs: int, runs: int) -> None:
        kind, cron, zone, interval = cause
        entry = by_cause.setdefault((kind, cron, interval), [0, 0, Counter()])
        entry[0] += jobs
        entry[1] += runs
        if zone:
            entry[2][zone] += jobs

    for grid in grids.values():
        a, b = bisect_left(grid.times, lo), bisect_left(grid.times, hi)
        if a == b:
            continue
        for m in grid.members.values():
            i = max(a, bisect_left(grid.times, m.lo))
            j = min(b, bisect_right(grid.times, m.hi))
            if i < j:
                tally(m.cause, m.n, m.n * (j - i))
    for point in points.members.values():
        if lo <= point.first < hi and point.first <= point.hi:
            tally(point.cause, point.n, point.n)
    ranked = sorted(by_cause.items(), key=lambda item: (-item[1][1], str(item[0])))
    causes = [
        Cause(
            kind=kind,
            cron=cron,
            interval_seconds=interval,
            jobs=jobs,
            runs=runs,
            timezones=dict(sorted(zones.items(), key=lambda z: (-z[1], z[0]))[:ZONES_PER_CAUSE]),
            spread=spread_for(cron) if cron else None,
        )
        for (kind, cron, interval), (jobs, runs, zones) in ranked[:CAUSES_PER_SPIKE]
    ]
    return Spike(
        index=index,
        at=window.step_start(index),
        count=count,
        times_mean=round(count / mean, 1),
        causes=causes,
        other_runs=count - sum(c.runs for c in causes),
        repeats=repeats,
    )


# --- the console's copy ---------------------------------------------------------

_cache: dict[tuple, tuple[float, Forecast]] = {}
_cache_lock = threading.Lock()


def recent(*, now: datetime, tenant_id: int | None = None, by_tenant: bool = False) -> Forecast:
    """The default window's forecast as the console shows it: computed at most once a
    minute per (tenant, view) in this process, so the dashboard's refresh and every job
    page do not each compute it again."""
    win = window(start=None, end=None, step_seconds=None, now=now)
    key = (win, tenant_id, by_tenant)
    with _cache_lock:
        hit = _cache.get(key)
        if hit is not None and time.monotonic() - hit[0] < CACHE_SECONDS:
            return hit[1]
    result = compute(window=win, tenant_id=tenant_id, by_tenant=by_tenant)
    with _cache_lock:
        for stale in [k for k, (at, _) in _cache.items() if time.monotonic() - at >= CACHE_SECONDS]:
            del _cache[stale]
        _cache[key] = (time.monotonic(), result)
    return result
