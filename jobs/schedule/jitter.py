"""Start jitter: a run's `not_before` is its slot plus a stable per-(job, slot) offset.

The slot (`scheduled_at`), and with it the run key, the unique index, the ledger and
the compare-and-set advance, never moves: only the earliest start does. 100k jobs on
`0 * * * *` with `jitter_seconds=600` are all dispatched for 09:00 but start spread
over 09:00-09:10, which is what spares their targets (and our claim query) the herd.

Pure functions, no database: the scheduler plans with them before it locks anything.
"""

from __future__ import annotations

import hashlib
import itertools
from datetime import datetime, timedelta
from uuid import UUID

from jobs import schedule
from runs.keys import format_utc

# One day: a bound for one-time jobs (no gap) and sparse schedules; the column is an
# integer and a start more than a day after its slot is a different schedule.
JITTER_MAX_SECONDS = 86_400
# "Shortest gap" of a cron schedule: the smallest distance between its next
# GAP_SAMPLE fire times after now (docs/decisions/0012-jitter.md). Fifty covers two days of
# an hourly job, seven weeks of a daily one, a year of a weekly one.
GAP_SAMPLE = 50
# Offsets have millisecond resolution: whole seconds would stack a 30 s window's
# 100k jobs into 31 bursts.
_STEPS_PER_SECOND = 1_000


def offset(*, job_id: UUID | str, scheduled_at: datetime, jitter_seconds: int) -> timedelta:
    """The stable start offset of one slot, uniform in [0, jitter_seconds].

    sha256 of the run key, so every scheduler node (and every call) agrees without
    storing anything, and neighbouring slots of one job get unrelated offsets.
    """
    if jitter_seconds <= 0:
        return timedelta(0)
    key = f"{job_id}/{format_utc(scheduled_at)}".encode()
    draw = int.from_bytes(hashlib.sha256(key).digest()[:8], "big")
    # 2**64 draws modulo at most 8.6e7 steps: the bias is below 1e-11.
    steps = draw % (jitter_seconds * _STEPS_PER_SECOND + 1)
    return timedelta(milliseconds=steps)


def not_before(*, job_id: UUID | str, scheduled_at: datetime, jitter_seconds: int) -> datetime:
    return scheduled_at + offset(job_id=job_id, scheduled_at=scheduled_at, jitter_seconds=jitter_seconds)


def shortest_gap(
    *,
    cron: str | None,
    timezone: str,
    interval_seconds: int | None,
    job_id: UUID | str | None,
    now: datetime,
    dst_policy: dict | None = None,
) -> int | None:
    """Whole seconds between the closest two fire times, or None when there is no gap.

    Interval jobs: the interval. Cron: the smallest distance among the next GAP_SAMPLE
    fire times after `now` (in the job's zone, DST rules included). One-time jobs, and
    cron schedules with fewer than two fire times in the search horizon: None.
    """
    if interval_seconds:
        return interval_seconds
    if not cron:
        return None
    times = schedule.fire_times(
        cron=cron,
        timezone=timezone,
        interval_seconds=None,
        run_at=None,
        anchor=now,
        after=now,
        job_id=job_id,
        count=GAP_SAMPLE,
        # `both` fires a repeated wall time twice, an hour (or 30 minutes) apart.
        dst_policy=dst_policy,
    )
    gaps = [(b.utc - a.utc) // timedelta(seconds=1) for a, b in itertools.pairwise(times)]
    return min(gaps) if gaps else None
