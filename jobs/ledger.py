"""The occurrence ledger: every due slot of a job, each with exactly one outcome.

"Why didn't job X run at T?" is answered from three sources, none of which stores a
row per slot that did not run:

* run rows are the `fired` slots (any status; a run the overlap policy skipped is
  `skipped` with `overlap_skip` or `buffer_full`; one whose start the tenant's rate
  limit deferred is `fired` with `rate_limited`);
* `SlotRange` rows are the slots that got no run and why (`paused`, `misfire_skip`,
  ...), one row per range, expanded on read with the schedule copied into the row;
* the job's current schedule, from the moment it took effect (`schedule_since`),
  supplies the slots nothing was recorded for: `pending` from `next_run_at` on (and
  `overdue` once late by SCHEDULER_OVERDUE_ALERT_SECONDS), `skipped`/`paused` while
  the job is paused.

Only that third source is bounded by the job's life as it is now (created_at,
start_at, end_at, retention): runs and ranges are what happened, so a later start_at
or a backfill of a window before the job existed never hides them.

A page merges the first `limit + 1` keys after the cursor from each source, so its
cost is bounded by the page size, not by the length of the job's history.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.conf import settings

from jobs.dispatch.planning import schedule_columns, slots_between
from jobs.models import Job, SlotRange, SlotReason
from runs.models import JobRun

_TICK = timedelta(microseconds=1)
# Overlap skips are run rows with status skipped; the job's policy at dispatch says which.
_OVERLAP_REASON = {"skip": "overlap_skip", "buffer_one": "buffer_full"}
RATE_LIMITED = "rate_limited"


@dataclass(frozen=True)
class Occurrence:
    scheduled_at: datetime
    outcome: str  # fired | skipped | missed | pending
    reason: str | None
    run: JobRun | None = None


# A window is clamped to this range: nothing in Cronyard predates the Unix epoch, so
# `from=0001-01-01T00:00:00Z` means "from the beginning" (and `to` of that day, an empty
# window) instead of overflowing the window's arithmetic at the ends of the calendar.
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(9999, 12, 31, tzinfo=UTC)


def window(*, start: datetime | None, end: datetime | None, now: datetime) -> tuple[datetime, datetime]:
    """[from, to) of a request: `to` defaults to now (included), `from` to 24 h before `to`;
    both clamped to [EARLIEST, LATEST]."""
    end = _clamp(end) if end is not None else now + _TICK
    start = _clamp(start) if start is not None else end - timedelta(days=1)
    return start, end


def _clamp(moment: datetime) -> datetime:
    return min(max(moment, EARLIEST), LATEST)


def life_start(job: Job, *, now: datetime) -> datetime:
    """Oldest instant of the job's computed slots: creation or start_at, and no older than retention."""
    oldest = now - timedelta(days=settings.RUN_RETENTION_DAYS)
    return max(t for t in (job.created_at, job.start_at, oldest) if t is not None)


def occurrences(
    *, job: Job, start: datetime, end: datetime, now: datetime, after: datetime | None, limit: int
) -> tuple[list[Occurrence], bool]:
    """Up to `limit` occurrences in [start, end) after the cursor `after`, and whether more follow."""
    lo = max(start - _TICK, after or start - _TICK)  # exclusive
    hi = end - _TICK  # inclusive
    if hi <= lo:
        return [], False
    want = limit + 1

    runs = {
        r.scheduled_at: r
        for r in JobRun.objects.filter(
            partition_id=job.partition_id, job_id=job.id, scheduled_at__gt=lo, scheduled_at__lte=hi
        )
        .order_by("scheduled_at")
        .only("job_id", "scheduled_at", "status", "attempt", "trigger", "overlap_policy", "rate_limited_to")[
            :want
        ]
    }
    # Slots nobody recorded are computed from the current schedule, within the job's
    # life as it is now and due by now.
    era_start = max(lo, life_start(job, now=now) - _TICK, (job.schedule_since or job.created_at) - _TICK)
    due = min(hi, now, job.end_at or hi)
    current = slots_between(job, after=era_start, until=due, limit=want) if era_start < due else []

    # Ranges can only contribute keys up to the furthest key the page can still need.
    keys = sorted({*runs, *current})
    horizon = keys[want - 1] if len(keys) >= want else min(hi, now)
    ranged: dict[datetime, SlotRange] = {}
    since = job.schedule_since or job.created_at
    for rng in SlotRange.objects.filter(job=job, last_at__gt=lo, first_at__lte=horizon).order_by("first_at")[
        :want
    ]:
        until = min(horizon, rng.last_at)
        if rng.first_at > since:
            # Recorded under the current schedule (every schedule edit moves
            # schedule_since past its ranges): its slots are the current slots within its
            # bounds, already enumerated above, and `current` covers up to the horizon.
            inside = current[bisect_left(current, rng.first_at) : bisect_right(current, until)]
        else:
            inside = slots_between(
                _schedule_of(job, rng), after=max(lo, rng.first_at - _TICK), until=until, limit=want
            )
        for t in inside:
            ranged.setdefault(t, rng)

    page = sorted({*runs, *current, *ranged})[:want]
    out = [_classify(job, t, runs.get(t), ranged.get(t), now=now) for t in page[:limit]]
    return out, len(page) > limit


def _classify(
    job: Job, at: datetime, run: JobRun | None, rng: SlotRange | None, *, now: datetime
) -> Occurrence:
    if run is not None:
        if run.status == "skipped":
            return Occurrence(at, "skipped", _OVERLAP_REASON.get(run.overlap_policy, "overlap_skip"), run)
        if run.rate_limited_to is not None:
            # Fired, but its start was pushed to a later minute by the tenant's
            # max_runs_per_minute (jobs/dispatch/rate_limits.py); the run's dispatch_note says when.
            return Occurrence(at, "fired", RATE_LIMITED, run)
        return Occurrence(at, "fired", None, run)
    if rng is not None:
        return Occurrence(at, rng.outcome, rng.reason)
    if job.next_run_at is not None and at >= job.next_run_at:
        if job.paused:
            return Occurrence(at, "skipped", SlotReason.PAUSED)
        late = (now - at).total_seconds() > settings.SCHEDULER_OVERDUE_ALERT_SECONDS
        return Occurrence(at, "pending", "overdue" if late else None)
    # Behind next_run_at with nothing recorded: the ledger cannot say why (it does not
    # guess); every path that moves next_run_at past a slot records a run or a range.
    return Occurrence(at, "missed", None)


def _schedule_of(job: Job, rng: SlotRange) -> Job:
    """A transient job carrying the schedule a range was recorded with (for slot arithmetic)."""
    return Job(id=job.id, next_run_at=rng.anchor, **schedule_columns(rng))
