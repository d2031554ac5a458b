"""Writes to jobs and tenants. Each function is one transaction; arguments are keyword-only.

Slot arithmetic lives in jobs/dispatch/planning.py; what these functions decide about slots
that will never run is recorded as ledger ranges (jobs/ledger.py reads them).

`create_job` and `update_job` own what a create or an edit means (defaults, the
PATCH rules, jobs.rules.job on the merged state: jobs/rules/edits.py) and raise JobInvalid
with field-level messages; the API serializers and the admin form only parse shapes.
"""

from __future__ import annotations

import uuid
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import transaction

from jobs import audit
from jobs.dispatch import planning
from jobs.dispatch.planning import latest_slot, next_slot, run_for, slots_between
from jobs.models import AuditAction, Job, JobTarget, Tenant
from jobs.rules import edits
from runs import services as run_services
from runs.enqueue import enqueue_runs, notify_executors, oldest_slot
from runs.models import JobRun
from scheduler_project import db

MAX_BACKFILL_RUNS = 1000
# Slots one backfill request may examine (a retention window of a minutely job is
# 43,200): bounds the enumeration, which runs before any transaction opens.
MAX_BACKFILL_SCAN = 50_000
BACKFILL_CAPPED = (
    f"more than {MAX_BACKFILL_RUNS} slots in the range have no run; backfill a shorter range "
    "(a dry run lists the first ones)"
)


class ServiceError(ValueError):
    """A request that is well-formed but cannot be done now (e.g. backfill of a run_at job)."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field
        self.message = message


def partition_for(job_id: UUID) -> int:
    """Stable across processes and releases: crc32 of the id's bytes."""
    return zlib.crc32(job_id.bytes) % settings.SCHEDULER_PARTITIONS


def _locked(job: Job) -> Job:
    """The job re-read under a row lock. partition_id in the filter makes it one shard's
    statement on Citus, which runs FOR UPDATE only inside a single shard."""
    return Job.objects.select_for_update().get(partition_id=job.partition_id, pk=job.pk)


def create_job(
    *,
    tenant: Tenant,
    fields: Mapping[str, Any],
    actor: str = audit.SYSTEM,
    id: UUID | None = None,  # the column's name; the admin chose it before validating
    now: datetime | None = None,
) -> Job:
    """Validate `fields` over the defaults and create the job; raises JobInvalid.

    The validation (a bounded cron search) runs before the transaction opens; the
    insert and its audit entry are one transaction.
    """
    now = now or db.now()
    job_id = id or uuid.uuid4()
    values = edits.new_job_values(fields, job_id=job_id, now=now)
    return _insert_job(tenant=tenant, job_id=job_id, values=values, actor=actor, now=now)


@transaction.atomic
def _insert_job(*, tenant: Tenant, job_id: UUID, values: dict, actor: str, now: datetime) -> Job:
    job = Job(tenant=tenant, id=job_id, **values)
    job.partition_id = partition_for(job.id)
    job.next_run_at = None
    # Whole seconds: an interval job's slots are anchor + k*interval, and an anchor
    # with microseconds would put every run key at an odd instant.
    job.next_run_at = next_slot(job, after=now, anchor=job.start_at or now.replace(microsecond=0))
    job.schedule_since = now
    job.save(force_insert=True)
    JobTarget.current(job).save(force_insert=True)
    audit.record(actor=actor, action=AuditAction.CREATE, job=job, changes=audit.snapshot(values))
    return job


@transaction.atomic
def update_job(
    *, job: Job, changes: Mapping[str, Any], actor: str = audit.SYSTEM, now: datetime | None = None
) -> Job:
    """Apply an edit (PATCH semantics, jobs/rules/edits.py) to the locked row; raises JobInvalid.

    The rules are judged on the locked row, not on the caller's copy: an edit that was
    valid against a stale read (a jitter another edit raised meanwhile) is refused.
    What the edit does to the job's slots is jobs.dispatch.planning.edit_effects (a
    dry run reports the same): a schedule change restarts from the next future slot,
    the slots that fell before it took effect are recorded in the ledger, never fired;
    a change of `paused` has the meaning of pause/resume, applied after the others.
    """
    now = now or db.now()
    job = _locked(job)
    clean = edits.job_changes(job, changes, now=now)
    effects = planning.edit_effects(job, clean, now=now)
    if effects.changes:
        _apply_changes(job=job, effects=effects, actor=actor)
    if effects.pause is not None:
        _pause_locked(job=job, actor=actor, now=now)
    elif effects.resume is not None:
        _resume_locked(job=job, catch_up="none", actor=actor, now=now)
    return job


def _apply_changes(*, job: Job, effects: planning.EditEffects, actor: str) -> None:
    versioned = effects.changed.target_version != job.target_version
    for name in (*effects.changes, "next_run_at", "schedule_since", "target_version"):
        setattr(job, name, getattr(effects.changed, name))
    if versioned:
        JobTarget.current(job).save(force_insert=True)
    job.save()
    if effects.unfired is not None:
        effects.unfired.save()
    diff = audit.field_diff(before=effects.before, after=effects.changes)
    if diff:
        audit.record(actor=actor, action=AuditAction.UPDATE, job=job, changes=diff)


@transaction.atomic
def pause_job(*, job: Job, actor: str = audit.SYSTEM, now: datetime | None = None) -> Job:
    """Pause; slots that were already due and never dispatched are recorded, not lost.

    Such slots fell while the job was active (a scheduler outage or backlog), so they
    are misfires; a resume's catch_up covers only the slots that fall while paused.
    They are recorded with runs_created 0 and the job moves past them, so a resume
    without catch_up cannot drop them silently and one with catch_up cannot fire
    them twice.
    """
    job = _locked(job)
    if not job.paused:
        _pause_locked(job=job, actor=actor, now=now or db.now())
    return job


def _pause_locked(*, job: Job, actor: str, now: datetime) -> None:
    fields = ["paused", "updated_at"]
    left = planning.pause_slots(job, now=now)
    if left.misfire is not None and left.range is not None:
        left.misfire.save()
        left.range.save()
        job.next_run_at = left.next_run_at
        fields.append("next_run_at")
    job.paused = True
    job.save(update_fields=fields)
    audit.record(actor=actor, action=AuditAction.PAUSE, job=job, changes={"paused": [False, True]})


@transaction.atomic
def resume_job(
    *, job: Job, catch_up: str = "none", actor: str = audit.SYSTEM, now: datetime | None = None
) -> Job:
    """Unpause. Without catch_up the next run is the next future slot.

    catch_up="latest" queues one run for the latest slot that fell while paused,
    "all" one per slot (at most max_catch_up), both marked trigger=catch_up.
    """
    job = _locked(job)
    if job.paused:
        _resume_locked(job=job, catch_up=catch_up, actor=actor, now=now or db.now())
    return job


def _resume_locked(*, job: Job, catch_up: str, actor: str, now: datetime) -> None:
    missed: list[datetime] = []
    if catch_up != "none" and job.next_run_at is not None and job.next_run_at <= now:
        if catch_up == "latest":
            # Not the last of the first max_catch_up slots: the latest one before now.
            missed = [latest_slot(job, since=job.next_run_at, until=now)]
        else:
            after = job.next_run_at - timedelta(microseconds=1)
            missed = slots_between(job, after=after, until=now, limit=job.max_catch_up)
    if missed:
        enqueue_runs([run_for(job, scheduled_at=t, trigger="catch_up", overlap_check=False) for t in missed])
        notify_executors(oldest=min(missed))
    left = planning.resume_slots(job, now=now)
    if left.range is not None:
        # The ledger: every slot that fell while paused is skipped, except those the
        # catch-up just queued (run rows take precedence over a range).
        left.range.save()
        job.next_run_at = left.next_run_at
    job.paused = False
    job.save(update_fields=["paused", "next_run_at", "updated_at"])
    audit.record(
        actor=actor,
        action=AuditAction.RESUME,
        job=job,
        changes={"paused": [True, False], "catch_up": catch_up, "runs_queued": len(missed)},
    )


@transaction.atomic
def delete_job(*, job: Job, actor: str = audit.SYSTEM) -> None:
    # Lock the job first: a scheduler batch holding it may be inserting a run right
    # now, which a runs DELETE issued before that batch commits would not see.
    Job.objects.select_for_update().filter(partition_id=job.partition_id, pk=job.pk).first()
    # Runs have no database FK (the tables are partitioned); one statement per table.
    run_services.delete_job_runs(partition_id=job.partition_id, job_id=job.pk)
    job.misfires.all().delete()
    JobTarget.objects.filter(partition_id=job.partition_id, job_id=job.pk).delete()
    if Job.objects.filter(partition_id=job.partition_id, pk=job.pk).delete()[0]:
        audit.record(actor=actor, action=AuditAction.DELETE, job=job, changes={})


@transaction.atomic
def trigger_job(*, job: Job, actor: str = audit.SYSTEM, now: datetime | None = None) -> datetime:
    """Queue a manual run now and return its scheduled_at (the request time).

    If that instant is already an occurrence (a scheduled slot on a whole second, or
    a second trigger in the same microsecond) the manual run moves a microsecond on,
    so it neither replaces that run nor is silently dropped.
    """
    moment = now or db.now()
    if moment.microsecond == 0:
        # Cron and interval slots fall on whole seconds; a manual run never takes one.
        moment += timedelta(microseconds=1)
    while not enqueue_runs([run_for(job, scheduled_at=moment, trigger="manual", overlap_check=False)]):
        moment += timedelta(microseconds=1)
    notify_executors()
    audit.record(actor=actor, action=AuditAction.TRIGGER, job=job, changes={"scheduled_at": moment})
    return moment


@dataclass(frozen=True)
class PresentSlot:
    """A slot of a backfill's window that already has a run (any status): the backfill skips it."""

    scheduled_at: datetime
    run_id: int
    status: str


@dataclass(frozen=True)
class BackfillPlan:
    """What a backfill of [start, end] would do: the slots with no run row, and the rest."""

    missing: list[datetime]  # oldest first, at most MAX_BACKFILL_RUNS
    already_present: int  # slots in the range that already have a run (any status)
    capped: bool  # more slots are missing than one request may create
    present: list[PresentSlot]  # those slots with their runs, oldest first, at most MAX_BACKFILL_RUNS


def plan_backfill(*, job: Job, start: datetime, end: datetime) -> BackfillPlan:
    """The gaps of [start, end]: read-only, and done before any transaction opens.

    Only slots with no run row are planned, so a backfill never touches what ran,
    failed or was skipped, and a second identical request plans nothing.
    """
    if job.run_at is not None:
        raise ServiceError("start", "a one-time job has no slots to backfill")
    if end < start:
        raise ServiceError("end", "end must not be earlier than start.")
    now = db.now()
    if end > now:
        # A future slot queued now would run early and take the key of the real run.
        raise ServiceError("end", "backfill covers past slots only; end is in the future")
    oldest = now - timedelta(days=settings.RUN_RETENTION_DAYS)
    if start < oldest:
        raise ServiceError(
            "start",
            f"runs older than RUN_RETENTION_DAYS ({settings.RUN_RETENTION_DAYS}) would be dropped at once",
        )
    slots = slots_between(
        job, after=start - timedelta(microseconds=1), until=end, limit=MAX_BACKFILL_SCAN + 1
    )
    if len(slots) > MAX_BACKFILL_SCAN:
        raise ServiceError(
            "end", f"the range holds more than {MAX_BACKFILL_SCAN} slots; backfill a shorter range"
        )
    # partition_id first: the job's runs live in its one shard (on Citus, one shard read).
    # With each run's id and status, the console's preview lists them from this one read.
    present = {
        at: (pk, status)
        for at, pk, status in JobRun.objects.filter(
            partition_id=job.partition_id, job_id=job.id, scheduled_at__gte=start, scheduled_at__lte=end
        ).values_list("scheduled_at", "pk", "status")
    }
    missing = [t for t in slots if t not in present]
    return BackfillPlan(
        missing=missing[:MAX_BACKFILL_RUNS],
        already_present=len(slots) - len(missing),
        capped=len(missing) > MAX_BACKFILL_RUNS,
        present=[PresentSlot(t, *present[t]) for t in slots if t in present][:MAX_BACKFILL_RUNS],
    )


def backfill_job(
    *, job: Job, start: datetime, end: datetime, actor: str = audit.SYSTEM
) -> tuple[BackfillPlan, list[datetime]]:
    """Create a run for each gap in [start, end]; returns the plan and the slots created.

    One insert statement (ON CONFLICT DO NOTHING on the run key): a slot that got a
    run between the plan and the insert is left alone, so concurrent backfills and
    the scheduler never double a slot. The runs are queued at once; the executor's
    claim starts at most one run of a job at a time unless its overlap_policy is
    `allow`, so a backfill of a `skip` job runs its slots one after another.
    """
    plan = plan_backfill(job=job, start=start, end=end)
    if plan.capped:
        raise ServiceError("end", BACKFILL_CAPPED)
    with transaction.atomic():
        inserted = enqueue_runs(
            [run_for(job, scheduled_at=t, trigger="backfill", overlap_check=False) for t in plan.missing]
        )
        if inserted:
            notify_executors(oldest=oldest_slot(inserted))
            # Only a backfill that created runs changed anything (a dry run never gets here).
            audit.record(
                actor=actor,
                action=AuditAction.BACKFILL,
                job=job,
                changes={
                    "start": start,
                    "end": end,
                    "created": len(inserted),
                    "first": inserted[0].scheduled_at,
                    "last": inserted[-1].scheduled_at,
                },
            )
    return plan, [run.scheduled_at for run in inserted]
