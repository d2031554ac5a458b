"""Seeded runs of one job with known start lateness, and the health figures they must
give, computed here independently of jobs/health.py (statistics.quantiles, the same
linear interpolation between closest ranks as PostgreSQL's percentile_cont), for the
API test and the job page's browser test."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.db import transaction

from jobs.dispatch import planning
from jobs.models import Job, Misfire
from runs.enqueue import enqueue_runs
from runs.models import JobRunRow

THRESHOLD = 60  # SCHEDULER_MISFIRE_THRESHOLD_SECONDS, the default the tests run with

# Start lateness (s) of the schedule's started runs, by how long ago their slot was.
IN_24H = {10: 0.5, 40: 1.25, 90: 3.0, 150: 75.0, 300: 2.0, 600: 10.0, 900: 59.5}
IN_7D_ONLY = {60 * 30: 4.0, 60 * 50: 0.1, 60 * 100: 200.0, 60 * 140: 6.5}
OLDER = {60 * 24 * 8: 900.0}  # outside both windows


@dataclass(frozen=True)
class Window:
    slots: int
    on_time: int
    rate: float
    p50: float
    p99: float


@dataclass(frozen=True)
class Seeded:
    last_success_at: datetime
    last_failure_at: datetime
    consecutive_failures: int
    misfires: int
    last_24h: Window
    last_7d: Window


def _window(lateness: list[float], *, unstarted_late: int, threshold: int) -> Window:
    cuts = statistics.quantiles(lateness, n=100, method="inclusive")
    slots = len(lateness) + unstarted_late
    on_time = sum(1 for late in lateness if late <= threshold)
    return Window(slots=slots, on_time=on_time, rate=round(on_time / slots, 4), p50=cuts[49], p99=cuts[98])


def seed(job: Job, *, consecutive_failures: int = 4) -> Seeded:
    """Runs of `job` (whole-minute slots, minutes before now) and its health columns.

    The on-time figures are judged against the job's starting_deadline_seconds when set
    (more than 5 s: the newest slot, 5 s old, must stay undecided), else THRESHOLD."""
    threshold = job.starting_deadline_seconds or THRESHOLD
    assert threshold > 5
    top = datetime.now(UTC).replace(second=0, microsecond=0)

    def ago(minutes: int) -> datetime:
        return top - timedelta(minutes=minutes)

    started = {**IN_24H, **IN_7D_ONLY, **OLDER}
    rows = {ago(m): ("schedule", "succeeded", timedelta(seconds=late)) for m, late in started.items()}
    rows[ago(30)] = ("catch_up", "dead", None)  # never started, threshold long past: a late slot
    rows[ago(20)] = ("schedule", "skipped", None)  # the overlap policy's: not a slot that ran late
    rows[ago(25)] = ("manual", "succeeded", timedelta(seconds=500))  # not a schedule slot
    rows[ago(35)] = ("schedule", "cancelled", None)  # cancelled before it started
    just_now = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=5)
    rows[just_now] = ("schedule", "queued", None)  # its threshold has not passed yet: not counted
    rows[ago(60 * 40)] = ("replay", "succeeded", timedelta(seconds=3000))  # a replay: not counted
    with transaction.atomic():
        enqueue_runs(
            [
                planning.run_for(job, scheduled_at=slot, trigger=trigger, overlap_check=False)
                for slot, (trigger, _, _) in rows.items()
            ]
        )
    for slot, (_, status, late) in rows.items():
        start = slot + late if late is not None else None
        finish = start + timedelta(seconds=2) if start is not None else None
        JobRunRow.objects.filter(job_id=job.id, scheduled_at=slot).update(
            status=status, started_at=start, finished_at=finish if status != "queued" else None
        )
    newest_success = max(slot for slot, (_, status, _) in rows.items() if status == "succeeded")
    success_at = newest_success + rows[newest_success][2] + timedelta(seconds=2)
    failure_at = top - timedelta(minutes=3)
    Job.objects.filter(pk=job.pk).update(
        consecutive_failures=consecutive_failures,
        last_failure_at=failure_at,
        # The row's copy is older than the newest succeeded run: the run's finish wins.
        last_success_at=top - timedelta(days=3),
        last_outcome="failed",
    )
    for n in range(2):
        Misfire.objects.create(
            job=job,
            partition_id=job.partition_id,
            policy="run_once",
            missed_count=3 + n,
            first_missed_at=ago(500 + n),
            last_missed_at=ago(400 + n),
            runs_created=1,
        )
    day = list(IN_24H.values())
    return Seeded(
        last_success_at=success_at,
        last_failure_at=failure_at,
        consecutive_failures=consecutive_failures,
        misfires=2,
        last_24h=_window(day, unstarted_late=1, threshold=threshold),
        last_7d=_window(day + list(IN_7D_ONLY.values()), unstarted_late=1, threshold=threshold),
    )
