"""What a job-page button will do, in words, before the operator confirms it.

Read-only: it runs the same slot arithmetic the services run (jobs.dispatch.planning), on the
database clock, so "next run 09:00 EST tomorrow; 3 slots fell while paused and will
not run" is what resume_job then does. The services re-read the job under a lock;
a slot that falls between the confirmation and the click is handled by them, not here.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from jobs.admin.display import in_zone, relative
from jobs.dispatch.planning import latest_slot, missed_slots, next_slot
from jobs.models import Job

OPERATIONS = ("pause", "resume", "trigger")
CATCH_UP_CHOICES = (
    ("none", "None: only future slots run"),
    ("latest", "Latest: one run for the latest slot that fell while paused"),
    ("all", "All: one run per slot that fell while paused (at most max catch-up)"),
)


@dataclass(frozen=True)
class OperationPlan:
    """What pausing, resuming or triggering a job will do, said before it is done."""

    operation: str
    summary: str  # the headline: "Resume: next run 09:00 EST tomorrow; ..."
    details: list[str]


def when(moment: datetime | None, job: Job, *, now: datetime) -> str:
    if moment is None:
        return "never (the schedule has no further slot)"
    return f"{in_zone(moment, job.time_zone)} ({relative(moment, now=now)})"


def plan(*, job: Job, operation: str, catch_up: str = "none", now: datetime) -> OperationPlan:
    if operation == "pause":
        return _pause(job, now)
    if operation == "resume":
        return _resume(job, catch_up, now)
    if operation == "trigger":
        return _trigger(job, now)
    raise ValueError(f"unknown operation {operation!r}")


def _count(n: int, exact: bool, word: str) -> str:
    return f"{'at least ' if not exact else ''}{n} {word}{'' if n == 1 else 's'}"


def _pause(job: Job, now: datetime) -> OperationPlan:
    if job.paused:
        return OperationPlan("pause", "Pause: the job is already paused; nothing changes.", [])
    details = ["No slot fires while the job is paused; Resume decides whether the missed ones run."]
    if job.next_run_at is not None and job.next_run_at <= now:
        missed = missed_slots(job, first=job.next_run_at, now=now)
        details.append(
            f"{_count(missed.count, missed.count_exact, 'slot')} already due and not dispatched "
            "will be recorded as missed (a misfire) and will not run."
        )
    nxt = job.next_run_at if job.next_run_at and job.next_run_at > now else None
    nxt = nxt or (next_slot(job, after=now, anchor=job.next_run_at) if job.next_run_at else None)
    return OperationPlan("pause", f"Pause: the next slot, {when(nxt, job, now=now)}, will not run.", details)


def _resume(job: Job, catch_up: str, now: datetime) -> OperationPlan:
    if not job.paused:
        return OperationPlan("resume", "Resume: the job is not paused; nothing changes.", [])
    due = job.next_run_at is not None and job.next_run_at <= now
    nxt = next_slot(job, after=now, anchor=job.next_run_at) if due else job.next_run_at
    head = f"Resume: next run {when(nxt, job, now=now)}"
    if not due:
        return OperationPlan("resume", f"{head}; no slot fell while paused.", [])
    missed = missed_slots(job, first=job.next_run_at, now=now)
    fell = _count(missed.count, missed.count_exact, "slot")
    if catch_up == "latest":
        latest = latest_slot(job, since=job.next_run_at, until=now)
        rest = missed.count - 1
        tail = (
            f"; of the {fell} that fell while paused, the latest ({in_zone(latest, job.time_zone)}) runs now"
        )
        tail += f" and {rest} will not run" if rest else ""
    elif catch_up == "all":
        queued = min(missed.count, job.max_catch_up)
        skipped = missed.count - queued
        tail = f"; {fell} fell while paused: {queued} run{'' if queued == 1 else 's'} queued now"
        tail += f", {skipped} beyond max catch-up ({job.max_catch_up}) will not run" if skipped else ""
    else:
        tail = f"; {fell} fell while paused and will not run"
    return OperationPlan(
        "resume", head + tail + ".", [f"Paused slots: {_span(missed.first, missed.last, job)}."]
    )


def _span(first: datetime, last: datetime, job: Job) -> str:
    if first == last:
        return in_zone(first, job.time_zone)
    return f"{in_zone(first, job.time_zone)} to {in_zone(last, job.time_zone)}"


def _trigger(job: Job, now: datetime) -> OperationPlan:
    details = ["A manual run has its own run key; the schedule is not moved."]
    if job.overlap_policy != "allow":
        details.append(
            f"Overlap policy {job.overlap_policy}: the executor starts it only when no other run "
            "of this job is running."
        )
    if job.paused:
        details.append("The job stays paused.")
    nxt = job.next_run_at if not job.paused else None
    summary = f"Trigger now: one manual run is queued at {in_zone(now + timedelta(0), job.time_zone)}"
    summary += f"; the next scheduled run stays {when(nxt, job, now=now)}." if nxt else "."
    return OperationPlan("trigger", summary, details)
