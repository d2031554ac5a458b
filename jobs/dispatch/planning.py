"""Slot arithmetic and dispatch plans: pure functions of a job and an instant, no writes.

The scheduler plans a batch with these before it locks anything; the services use
them to decide what a resume, an edit or a backfill means; the occurrence ledger
expands recorded ranges with them. Nothing here touches the database.
"""

from __future__ import annotations

from collections.abc import Mapping
from copy import copy
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.conf import settings

from jobs import schedule
from jobs.models import Job, Misfire, MisfirePolicy, SlotOutcome, SlotRange, SlotReason
from jobs.schedule import jitter
from runs.rows import NewRun


@dataclass(slots=True)
class DueJob:
    """The columns of a job that planning and the run snapshot read, as the dispatch read returns them.

    The scheduler plans from these rather than ORM instances: building 500 Job models
    per batch (from_db, init signals, field conversions) was a fifth of its time at
    100k due jobs (docs/decisions/0029-dispatch-hot-path.md). Every function here takes a Job or a DueJob.
    """

    id: UUID
    tenant_id: int
    partition_id: int
    name: str
    cron_expr: str
    time_zone: str
    interval_seconds: int | None
    run_at: datetime | None
    dst_policy: dict
    # The version of the job's target its runs reference (jobs.models.JobTarget): the
    # dispatch neither reads nor copies the target itself.
    target_version: int
    misfire_policy: str
    max_catch_up: int
    overlap_policy: str
    max_attempts: int
    retry_backoff_seconds: int
    retry_backoff_cap_seconds: int
    lease_seconds: int
    priority: int
    jitter_seconds: int
    # The job's own misfire threshold (None: the global one; starting_deadline below).
    starting_deadline_seconds: int | None
    next_run_at: datetime | None
    start_at: datetime | None
    end_at: datetime | None
    updated_at: datetime
    # The tenant's dispatch rate limit (jobs/dispatch/rate_limits.py; None: unlimited), read with
    # the job so that a batch of unlimited tenants costs no statement more.
    tenant_max_runs_per_minute: int | None = None


# The jobs columns of a DueJob, in order (the tenant's limit comes from a join).
DUE_JOB_COLUMNS = tuple(DueJob.__dataclass_fields__)[:-1]


# A misfire's missed slots are counted one by one up to this many (about 20 ms of
# cron arithmetic); past it the count is recorded as a lower bound. Interval jobs
# are counted exactly by arithmetic. This is what keeps a week-old backlog from
# turning one dispatch batch into minutes of enumeration.
MISFIRE_COUNT_CAP = 1_000
_TICK = timedelta(microseconds=1)
# Triggers whose runs start at their jittered offset. Manual runs, backfills and
# replays were asked for by an operator, now: they start at once (not_before = now).
JITTERED_TRIGGERS = frozenset({"schedule", "catch_up"})


def starting_deadline(job: Job | DueJob, *, default: timedelta | None = None) -> timedelta:
    """How late a slot of `job` may be found and still fire as scheduled; later is a misfire.

    The job's `starting_deadline_seconds` (Kubernetes' startingDeadlineSeconds) when set,
    else `default` (a scheduler's own threshold), else SCHEDULER_MISFIRE_THRESHOLD_SECONDS.
    The one reading of that rule: the scheduler's misfire decision, the edit preview and
    the on-time rate of job health all ask here.
    """
    if job.starting_deadline_seconds is not None:
        return timedelta(seconds=job.starting_deadline_seconds)
    if default is not None:
        return default
    return timedelta(seconds=settings.SCHEDULER_MISFIRE_THRESHOLD_SECONDS)


def next_slot(job: Job | DueJob, *, after: datetime, anchor: datetime | None = None) -> datetime | None:
    """The job's first fire time strictly after `after`, inside [start_at, end_at]."""
    if job.start_at and job.start_at > after:
        after = job.start_at - timedelta(microseconds=1)
        anchor = anchor or job.start_at
    if (
        job.cron_expr
        and job.interval_seconds is None
        and job.run_at is None
        and after.utcoffset() is not None
    ):
        moment = schedule.next_cron_time(job.cron_expr, job.time_zone, after, job.id, job.dst_policy)
    else:
        moment = schedule.next_fire_time(
            cron=job.cron_expr or None,
            timezone=job.time_zone,
            interval_seconds=job.interval_seconds,
            run_at=job.run_at,
            anchor=anchor or job.next_run_at or after,
            after=after,
            job_id=job.id,
            dst_policy=job.dst_policy,
        )
    if moment is not None and job.end_at and moment > job.end_at:
        return None
    return moment


def slots_between(job: Job | DueJob, *, after: datetime, until: datetime, limit: int) -> list[datetime]:
    """Fire times in (after, until], oldest first, at most `limit` (misfires, backfill)."""
    anchor = job.next_run_at or job.start_at or after
    if job.interval_seconds and anchor > after:
        # An interval grid extends backwards too (backfill before the anchor): move the
        # anchor back by whole steps to at or before `after`, so the slots stay on it.
        step = timedelta(seconds=job.interval_seconds)
        anchor -= -((after - anchor) // step) * step
    times = schedule.fire_times(
        cron=job.cron_expr or None,
        timezone=job.time_zone,
        interval_seconds=job.interval_seconds,
        run_at=job.run_at,
        anchor=anchor,
        after=after,
        job_id=job.id,
        until=until,
        limit=limit,
        dst_policy=job.dst_policy,
    )
    out = [t.utc for t in times]
    if job.start_at:
        out = [t for t in out if t >= job.start_at]
    if job.end_at:
        out = [t for t in out if t <= job.end_at]
    return out


# Growing look-back windows for latest_slot: dense schedules are found in the first,
# sparse ones (yearly) in the last, and no window holds an unbounded number of slots.
_LOOKBACK = (timedelta(hours=1), timedelta(days=1), timedelta(days=32), timedelta(days=366))


def latest_slot(job: Job | DueJob, *, since: datetime, until: datetime) -> datetime:
    """The last fire time in [since, until]; `since` is itself a slot (the job's next_run_at)."""
    if job.interval_seconds:
        step = timedelta(seconds=job.interval_seconds)
        until = min(until, job.end_at) if job.end_at else until
        return since + max(0, (until - since) // step) * step
    for window in _LOOKBACK:
        after = max(since - timedelta(microseconds=1), until - window)
        slots = slots_between(job, after=after, until=until, limit=1_000_000)
        if slots:
            return slots[-1]
        if after < since:
            return since
    slots = slots_between(job, after=since - timedelta(microseconds=1), until=until, limit=1_000_000)
    return slots[-1] if slots else since


@dataclass(frozen=True)
class MissedSlots:
    """The slots in [first, now] a scheduler found unfired, in bounded arithmetic."""

    first: datetime
    last: datetime
    count: int
    count_exact: bool  # False: `count` is a lower bound (MISFIRE_COUNT_CAP reached)
    oldest: list[datetime]  # the oldest `want` slots, for catch_up


def missed_slots(job: Job | DueJob, *, first: datetime, now: datetime, want: int = 0) -> MissedSlots:
    """Describe the slots from `first` (itself a slot) to `now` without enumerating them all.

    Cost is bounded by max(want, MISFIRE_COUNT_CAP) slot computations for cron jobs and
    O(want) for interval jobs, however long the backlog.
    """
    if job.interval_seconds:
        step = timedelta(seconds=job.interval_seconds)
        last = latest_slot(job, since=first, until=now)
        count = (last - first) // step + 1
        return MissedSlots(first, last, count, True, [first + k * step for k in range(min(want, count))])
    cap = max(want, MISFIRE_COUNT_CAP)
    found = [first, *slots_between(job, after=first, until=now, limit=cap - 1)]
    if len(found) < cap:
        return MissedSlots(first, found[-1], len(found), True, found[:want])
    return MissedSlots(first, latest_slot(job, since=first, until=now), len(found), False, found[:want])


def run_for(job: Job | DueJob, *, scheduled_at: datetime, trigger: str, overlap_check: bool = True) -> NewRun:
    """The run row for one occurrence: its job's target version and the policies the executor needs.

    Scheduled and catch-up runs get `not_before = scheduled_at + offset` (jobs/schedule/jitter.py):
    a catch-up's slot is past, so a backlog after downtime is spread over the jitter
    window from the slot on, and whatever part of the window is over starts at once.
    """
    start = None
    if job.jitter_seconds and trigger in JITTERED_TRIGGERS:
        start = jitter.not_before(job_id=job.id, scheduled_at=scheduled_at, jitter_seconds=job.jitter_seconds)
    return NewRun(
        job_id=job.id,
        scheduled_at=scheduled_at,
        tenant_id=job.tenant_id,
        partition_id=job.partition_id,
        target_version=job.target_version,
        trigger=trigger,
        priority=job.priority,
        job_name=job.name,
        overlap_policy=job.overlap_policy,
        max_attempts=job.max_attempts,
        retry_backoff_seconds=job.retry_backoff_seconds,
        retry_backoff_cap_seconds=job.retry_backoff_cap_seconds,
        lease_seconds=job.lease_seconds,
        overlap_check=overlap_check,
        not_before=start,
    )


# The columns that define a job's slots. A ledger range copies them, so the slots it
# covers can be enumerated again with the schedule they belonged to.
SCHEDULE_COLUMNS = ("cron_expr", "time_zone", "interval_seconds", "run_at", "dst_policy")
# An edit of one of these restarts the job from its next future slot.
SCHEDULE_FIELDS = (*SCHEDULE_COLUMNS, "start_at", "end_at")


def schedule_columns(source: Job | DueJob | SlotRange) -> dict:
    return {name: getattr(source, name) for name in SCHEDULE_COLUMNS}


def slot_range(job: Job | DueJob, *, first: datetime, last: datetime, outcome: str, reason: str) -> SlotRange:
    """An unsaved ledger range of `job`'s slots in [first, last], with the job's schedule as it is now."""
    return SlotRange(
        job_id=job.id,
        partition_id=job.partition_id,
        first_at=first,
        last_at=last,
        outcome=outcome,
        reason=reason,
        anchor=job.next_run_at or first,
        **schedule_columns(job),
    )


def skipped_range(job: Job | DueJob, *, first: datetime, last: datetime, reason: str) -> SlotRange | None:
    if last < first:
        return None
    return slot_range(job, first=first, last=last, outcome=SlotOutcome.SKIPPED, reason=reason)


@dataclass
class Plan:
    job: Job | DueJob
    new_next: datetime | None
    runs: list[NewRun] = field(default_factory=list)
    misfire: Misfire | None = None
    ranges: list[SlotRange] = field(default_factory=list)  # ledger: slots this plan leaves unfired


def plan_job(job: Job | DueJob, *, now: datetime, threshold: timedelta | None = None) -> Plan:
    """Runs to create for a due job and its new next_run_at (pure: no writes).

    A slot later than the job's starting deadline (`threshold`: the scheduler's default
    for jobs without their own) is a misfire."""
    due = job.next_run_at
    assert due is not None
    if job.end_at is not None and due > job.end_at:
        return Plan(job=job, new_next=None)  # end_at moved before the pending slot
    if now - due <= starting_deadline(job, default=threshold):
        # On time (or a little late): fire exactly this slot. If more slots are
        # already due the job comes back in the next batch, one slot per batch, so
        # the overlap policy sees each earlier run when deciding the next.
        return Plan(
            job=job,
            new_next=next_slot(job, after=due, anchor=due),
            runs=[run_for(job, scheduled_at=due, trigger="schedule")],
        )
    return _plan_misfire(job, now=now)


def _plan_misfire(job: Job | DueJob, *, now: datetime) -> Plan:
    due = job.next_run_at
    assert due is not None
    policy = job.misfire_policy
    want = job.max_catch_up if policy == MisfirePolicy.CATCH_UP else 0
    missed = missed_slots(job, first=due, now=now, want=want)
    if policy == MisfirePolicy.SKIP:
        slots: list[datetime] = []
        unfired = skipped_range(job, first=due, last=missed.last, reason=SlotReason.MISFIRE_SKIP)
    elif policy == MisfirePolicy.CATCH_UP:
        slots = missed.oldest
        # Past the first max_catch_up slots; a microsecond on, as slots are whole seconds.
        unfired = skipped_range(
            job, first=slots[-1] + _TICK, last=missed.last, reason=SlotReason.CATCH_UP_LIMIT
        )
    else:  # run_once
        slots = [missed.last]
        unfired = skipped_range(job, first=due, last=missed.last - _TICK, reason=SlotReason.MISFIRE_COALESCED)
    # run_once's single run stands for the current occurrence, so the job's overlap
    # policy applies to it; a catch-up backlog was asked for run by run.
    overlap_check = policy == MisfirePolicy.RUN_ONCE
    runs = [run_for(job, scheduled_at=t, trigger="catch_up", overlap_check=overlap_check) for t in slots]
    misfire = Misfire(
        job_id=job.id,
        partition_id=job.partition_id,
        policy=policy,
        missed_count=missed.count,
        count_is_lower_bound=not missed.count_exact,
        first_missed_at=due,
        last_missed_at=missed.last,
        runs_created=len(runs),
    )
    return Plan(
        job=job,
        new_next=next_slot(job, after=now, anchor=due),
        runs=runs,
        misfire=misfire,
        ranges=[unfired] if unfired is not None else [],
    )


# --- what a pause, a resume or an edit does (jobs.services applies it) ----------------


@dataclass(frozen=True)
class SlotsLeft:
    """What pausing or resuming does with the slots already due and never dispatched."""

    range: SlotRange | None  # recorded as skipped (paused) in the ledger
    misfire: Misfire | None  # pausing: they fell while the job was active, a misfire
    next_run_at: datetime | None  # where the job goes next


def pause_slots(job: Job, *, now: datetime) -> SlotsLeft:
    """Slots already due when a job is paused fell while it was active (a scheduler
    outage or backlog): a misfire that creates no run, recorded so that a resume
    without catch-up cannot drop them silently and one with catch-up cannot fire them
    twice; the job moves past them."""
    if job.next_run_at is None or job.next_run_at > now:
        return SlotsLeft(None, None, job.next_run_at)
    missed = missed_slots(job, first=job.next_run_at, now=now)
    misfire = Misfire(
        job_id=job.id,
        partition_id=job.partition_id,
        policy=MisfirePolicy.SKIP,
        missed_count=missed.count,
        count_is_lower_bound=not missed.count_exact,
        first_missed_at=missed.first,
        last_missed_at=missed.last,
        runs_created=0,
    )
    unfired = skipped_range(job, first=missed.first, last=now, reason=SlotReason.PAUSED)
    return SlotsLeft(unfired, misfire, next_slot(job, after=now, anchor=job.next_run_at))


def resume_slots(job: Job, *, now: datetime) -> SlotsLeft:
    """Every slot that fell while the job was paused is skipped (those a catch-up queues
    have runs, which take precedence over a range); the next run is the next future slot."""
    if job.next_run_at is None or job.next_run_at > now:
        return SlotsLeft(None, None, job.next_run_at)
    unfired = skipped_range(job, first=job.next_run_at, last=now, reason=SlotReason.PAUSED)
    return SlotsLeft(unfired, None, next_slot(job, after=now, anchor=job.next_run_at))


@dataclass
class EditEffects:
    """What an edit does, decided before anything is written: jobs.services.update_job
    applies it, a dry run (jobs/edit_preview.py) reports it."""

    job: Job  # the row as the edit leaves it: a copy, the stored one untouched
    changed: Job  # the row after the field changes, before a pause or resume applies
    changes: dict[str, Any]  # the fields it sets (cleaned; `paused` apart)
    before: dict[str, Any]  # their values before
    schedule_changed: bool
    unfired: SlotRange | None  # a schedule change: the due slots it leaves behind
    pause: SlotsLeft | None  # the edit pauses the job (pause_job's meaning)
    resume: SlotsLeft | None  # the edit resumes it (resume_job's, without catch-up)

    @property
    def ranges(self) -> list[SlotRange]:
        """The ledger ranges the edit records, in the order it records them."""
        found = [self.unfired, self.pause and self.pause.range, self.resume and self.resume.range]
        return [r for r in found if r is not None]


def edit_effects(job: Job, changes: Mapping[str, Any], *, now: datetime) -> EditEffects:
    """What `changes` (cleaned by jobs.rules.edits.job_changes) do to `job`.

    A schedule change restarts from the next future slot; the slots already due under
    the old schedule are recorded as missed (`schedule_changed`, or skipped/`paused` for
    a paused job) with the schedule they belonged to, never fired (docs/CONTRACT.md,
    "Time and DST"). A change of `paused` has the meaning of pause/resume, applied after
    the other changes.
    """
    changes = dict(changes)
    paused = changes.pop("paused", None)
    after = copy(job)
    schedule_changed = any(
        name in SCHEDULE_FIELDS and getattr(job, name) != value for name, value in changes.items()
    )
    unfired = None
    if schedule_changed and job.next_run_at is not None and job.next_run_at <= now:
        outcome, reason = (
            (SlotOutcome.SKIPPED, SlotReason.PAUSED)
            if job.paused
            else (SlotOutcome.MISSED, SlotReason.SCHEDULE_CHANGED)
        )
        unfired = slot_range(job, first=job.next_run_at, last=now, outcome=outcome, reason=reason)
    for name, value in changes.items():
        setattr(after, name, value)
    if "target" in changes and changes["target"] != job.target:
        # The next immutable version (jobs.models.JobTarget): runs written before keep theirs.
        after.target_version = job.target_version + 1
    if schedule_changed:
        after.next_run_at = None
        after.next_run_at = next_slot(after, after=now, anchor=after.start_at or now.replace(microsecond=0))
        after.schedule_since = now
    final = copy(after)
    pause = resume = None
    if paused is True and not job.paused:
        pause = pause_slots(after, now=now)
        final.next_run_at, final.paused = pause.next_run_at, True
    elif paused is False and job.paused:
        resume = resume_slots(after, now=now)
        final.next_run_at, final.paused = resume.next_run_at, False
    return EditEffects(
        job=final,
        changed=after,
        changes=changes,
        before={name: getattr(job, name) for name in changes},
        schedule_changed=schedule_changed,
        unfired=unfired,
        pause=pause,
        resume=resume,
    )
