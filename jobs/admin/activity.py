"""A job's recent activity for its admin page: runs, last outcome, ledger occurrences.

Reads only, each bounded: runs come from the (job_id, scheduled_at) index of each
day partition, occurrences from jobs.ledger in a window that widens until it holds
enough slots (a minutely job needs minutes, a weekly one weeks).
"""

from __future__ import annotations

from datetime import timedelta

from jobs import ledger
from jobs.admin.display import duration_between
from jobs.models import Job
from runs.models import JobRun
from scheduler_project import db

RECENT_RUNS = 20
RECENT_OCCURRENCES = 12
EXCERPT_CHARS = 100
# Windows tried in turn; each ledger page is bounded by PAGE slots whatever the window.
_WINDOWS = (
    timedelta(minutes=15),
    timedelta(hours=3),
    timedelta(days=1),
    timedelta(days=7),
    timedelta(days=30),
)
_PAGE = 400
_FINISHED = ("succeeded", "dead", "skipped", "cancelled")


def recent_runs(*, job: Job, limit: int = RECENT_RUNS) -> list[JobRun]:
    return list(
        JobRun.objects.filter(partition_id=job.partition_id, job_id=job.id)
        .order_by("-scheduled_at")
        .only(
            "id",
            "job_id",
            "scheduled_at",
            "status",
            "trigger",
            "attempt",
            "started_at",
            "finished_at",
            "last_error",
        )[:limit]
    )


def last_finished(*, job: Job) -> JobRun | None:
    """The newest run (by slot) with a final status."""
    return (
        JobRun.objects.filter(
            partition_id=job.partition_id, job_id=job.id, status__in=_FINISHED, finished_at__isnull=False
        )
        .order_by("-scheduled_at")
        .only("id", "job_id", "scheduled_at", "status", "finished_at", "last_error")
        .first()
    )


def duration(run: JobRun) -> str:
    return duration_between(run.started_at, run.finished_at)


def excerpt(text: str | None) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= EXCERPT_CHARS else text[: EXCERPT_CHARS - 1] + "…"


def recent_occurrences(*, job: Job, limit: int = RECENT_OCCURRENCES) -> list[ledger.Occurrence]:
    """The job's latest due slots, newest first, each with its one outcome."""
    now = db.now()
    end = now + timedelta(microseconds=1)
    found: list[ledger.Occurrence] = []
    for window in _WINDOWS:
        items, more = ledger.occurrences(
            job=job, start=now - window, end=end, now=now, after=None, limit=_PAGE
        )
        if more:
            break  # this window holds more than a page: the previous (smaller) one is the newest we have
        found = items
        if len(found) >= limit:
            break
    return list(reversed(found[-limit:]))
