"""Operator writes to runs: replay and cancel. One transaction each, keyword-only.

Replay is a conditional UPDATE (`WHERE status IN ('dead', 'cancelled')`): two
operators replaying the same dead run at once queue it once, because the second
UPDATE waits for the first's row lock, re-checks the status and matches nothing.
Cancel locks the row, then writes; a running attempt it cuts short is fenced off,
since every executor write requires `status = 'running' AND attempt = n`.

Both write the table job_runs (JobRunRow), which holds every run they may change: a
run leaves it only when it succeeds (docs/decisions/0085-run-history.md). They read
through JobRun, every run, to say why a run is refused.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from django.db import connection, transaction
from django.utils import timezone

from jobs import audit
from jobs.models import AuditAction
from runs import open_floors, selectors
from runs.attempts import AttemptRecord
from runs.enqueue import notify_executors, oldest_slot
from runs.keys import run_key
from runs.models import JobRun, JobRunRow, RunColumns, RunHistoryRow, RunStatus, RunTrigger

log = logging.getLogger(__name__)

REPLAYABLE = (RunStatus.DEAD, RunStatus.CANCELLED)
CANCELLABLE = (RunStatus.QUEUED, RunStatus.RETRYING, RunStatus.RUNNING)


class RunNotFound(LookupError):
    pass


class RunConflict(Exception):
    """The run exists but its status does not allow the operation."""

    def __init__(self, *, operation: str, status: str, allowed: Iterable[str]):
        self.operation = operation
        self.status = status
        self.allowed = tuple(str(s) for s in allowed)
        super().__init__(f"cannot {operation} a {status} run (allowed for: {', '.join(self.allowed)})")


def delete_job_runs(*, partition_id: int, job_id: UUID) -> None:
    """Every run of a job, in the caller's transaction (jobs.services.delete_job, which
    holds the job's row lock). job_runs first: a success moving a run meanwhile commits
    before that DELETE goes on, and the next statement sees its row in run_history."""
    for model in (JobRunRow, RunHistoryRow):
        model.objects.filter(partition_id=partition_id, job_id=job_id)._raw_delete(model.objects.db)


@dataclass(frozen=True)
class BulkResult:
    done: list[int]
    ignored: int


def _replay_changes(now: datetime) -> dict:
    # attempt and the attempts history stay: the next claim makes it attempt + 1, and
    # the Idempotency-Key is the run key, which does not change.
    return {
        "status": RunStatus.QUEUED,
        "trigger": RunTrigger.REPLAY,
        "not_before": now,
        "finished_at": None,
        "lease_until": None,
        "owner": "",
    }


def _opened(runs: Iterable[RunColumns]) -> None:
    """Replayed runs are open again: their tenants' open floors must be no later than
    their slots (runs/open_floors.py), in the replay's transaction. On Citus before any
    statement of the transaction that spans shards: the write of the reference table
    tenants is refused after one (runs/enqueue.enqueue_runs)."""
    with connection.cursor() as cursor:
        open_floors.lower(cursor, ((run.tenant_id, run.scheduled_at) for run in runs))


def _cancel_changes(now: datetime, actor: str) -> dict:
    return {
        "status": RunStatus.CANCELLED,
        "finished_at": now,
        "lease_until": None,
        "last_error": f"cancelled by {actor}",
    }


def _keyed(job_id: UUID, scheduled_at: datetime, tenant_id: int | None, *, model=JobRun):
    qs = selectors.of_job(model.objects.filter(scheduled_at=scheduled_at), job_id=job_id)
    return qs.filter(tenant_id=tenant_id) if tenant_id is not None else qs


def _lock_by_ids(ids: list[int], *, statuses: Iterable[str], only: tuple[str, ...] = ()) -> list[JobRunRow]:
    """The runs among `ids` in `statuses`, row-locked one partition_id at a time (in
    order, so two bulk actions never deadlock): on Citus, FOR UPDATE runs only inside
    one shard. The ids are those of one admin page, so the statements are few."""
    eligible = JobRunRow.objects.filter(id__in=ids, status__in=statuses)
    rows: list[JobRunRow] = []
    for partition_id in sorted(set(eligible.values_list("partition_id", flat=True))):
        qs = eligible.filter(partition_id=partition_id).select_for_update().order_by("id")
        rows += qs.only(*only) if only else qs
    return sorted(rows, key=lambda run: run.id)


def _audit(run: RunColumns, *, actor: str, action: str, **changes) -> None:
    # The run's snapshot names its job and tenant; the job itself may be gone.
    audit.record(
        actor=actor,
        action=action,
        tenant_id=run.tenant_id,
        job_id=run.job_id,
        job_name=run.job_name,
        changes={"scheduled_at": run.scheduled_at, **changes},
    )


def plan_replay(*, job_id: UUID, scheduled_at: datetime, tenant_id: int | None = None) -> JobRun:
    """The run a replay would re-queue, read without writing (a dry run).
    Raises RunNotFound, RunConflict exactly as replay_run would."""
    run = _keyed(job_id, scheduled_at, tenant_id).first()
    if run is None:
        raise RunNotFound(run_key(job_id, scheduled_at))
    if run.status not in REPLAYABLE:
        raise RunConflict(operation="replay", status=run.status, allowed=REPLAYABLE)
    return run


def plan_replay_runs(*, ids: Iterable[int]) -> BulkResult:
    """Which of `ids` a bulk replay would re-queue (dead or cancelled), writing nothing."""
    ids = list(ids)
    done = list(
        JobRun.objects.filter(id__in=ids, status__in=REPLAYABLE).order_by("id").values_list("id", flat=True)
    )
    return BulkResult(done=done, ignored=len(ids) - len(done))


@transaction.atomic
def replay_run(
    *,
    job_id: UUID,
    scheduled_at: datetime,
    actor: str,
    tenant_id: int | None = None,
    now: datetime | None = None,
) -> JobRun:
    """Re-queue a dead or cancelled run under the same key. Raises RunNotFound, RunConflict."""
    qs = _keyed(job_id, scheduled_at, tenant_id)
    replayable = _keyed(job_id, scheduled_at, tenant_id, model=JobRunRow).filter(status__in=REPLAYABLE)
    # Before the update (see _opened), and whatever the run's status now: the update reads
    # afresh, and a run that was running here and dead there would be reopened with its
    # floor left above it. Lowering for a run the update then refuses does no harm.
    _opened(qs.only("tenant_id", "scheduled_at")[:1])
    if replayable.update(**_replay_changes(now or timezone.now())) == 0:
        current = qs.values_list("status", flat=True).first()
        if current is None:
            raise RunNotFound(run_key(job_id, scheduled_at))
        raise RunConflict(operation="replay", status=current, allowed=REPLAYABLE)
    run = qs.get()
    notify_executors(oldest=scheduled_at)
    _audit(run, actor=actor, action=AuditAction.REPLAY, attempts_before=run.attempt)
    log.info(
        "run replay: key=%s tenant_id=%s actor=%r attempt=%s", run.run_key, run.tenant_id, actor, run.attempt
    )
    return run


def _cancelled_entry(run: JobRunRow, *, now: datetime, actor: str) -> list:
    """History entry for the attempt a cancel cuts short: that attempt's own write will
    be fenced off, so without this the history would just stop."""
    started = run.started_at
    return AttemptRecord(
        attempt=run.attempt,
        owner=run.owner,
        started_at=started,
        finished_at=now,
        duration_ms=(now - started).total_seconds() * 1000 if started else None,
        outcome="cancelled",
        result_code=None,
        error=f"cancelled by {actor}",
        retry_in_s=None,
    ).to_stored()


def _cancel_locked(run: JobRunRow, *, now: datetime, actor: str) -> None:
    changes = _cancel_changes(now, actor)
    if run.status == RunStatus.RUNNING:
        changes["attempts"] = [*(run.attempts or []), _cancelled_entry(run, now=now, actor=actor)]
    # The row is locked; the status/attempt condition documents what the write assumes.
    JobRunRow.objects.filter(
        partition_id=run.partition_id,
        id=run.id,
        scheduled_at=run.scheduled_at,
        status=run.status,
        attempt=run.attempt,
    ).update(**changes)


@transaction.atomic
def cancel_run(
    *,
    job_id: UUID,
    scheduled_at: datetime,
    actor: str,
    tenant_id: int | None = None,
    now: datetime | None = None,
) -> JobRun:
    """Cancel a queued, retrying or running run. A running attempt finds out at its next
    heartbeat, whose fenced UPDATE no longer matches. Raises RunNotFound, RunConflict.

    The row is locked first (the executor claims with SKIP LOCKED and writes results
    with a status/attempt fence, so it never waits long on this lock nor overwrites).
    """
    now = now or timezone.now()
    qs = _keyed(job_id, scheduled_at, tenant_id)
    rows = _keyed(job_id, scheduled_at, tenant_id, model=JobRunRow)
    # The row lock names the run's partition_id: on Citus, FOR UPDATE runs only inside one shard.
    partition_id = qs.values_list("partition_id", flat=True).first()
    run = None if partition_id is None else rows.filter(partition_id=partition_id).select_for_update().first()
    if run is None:
        current = qs.values_list("status", flat=True).first()  # a success: in run_history
        if current is None:
            raise RunNotFound(run_key(job_id, scheduled_at))
        raise RunConflict(operation="cancel", status=current, allowed=CANCELLABLE)
    if run.status not in CANCELLABLE:
        raise RunConflict(operation="cancel", status=run.status, allowed=CANCELLABLE)
    _cancel_locked(run, now=now, actor=actor)
    _audit(run, actor=actor, action=AuditAction.CANCEL, status=[run.status, RunStatus.CANCELLED])
    run = qs.get()
    log.info(
        "run cancel: key=%s tenant_id=%s actor=%r attempt=%s", run.run_key, run.tenant_id, actor, run.attempt
    )
    return run


@transaction.atomic
def replay_runs(*, ids: Iterable[int], actor: str, now: datetime | None = None) -> BulkResult:
    """Bulk replay by surrogate id (admin); rows that are not dead/cancelled are ignored."""
    ids = list(ids)
    # Lock the eligible rows first so the ids reported are exactly the rows changed.
    rows = _lock_by_ids(
        ids, statuses=REPLAYABLE, only=("id", "scheduled_at", "job_id", "tenant_id", "job_name", "attempt")
    )
    locked = [run.id for run in rows]
    if locked:
        _opened(rows)  # before the update, which spans shards (see _opened)
        JobRunRow.objects.filter(id__in=locked, status__in=REPLAYABLE).update(
            **_replay_changes(now or timezone.now())
        )
        notify_executors(oldest=oldest_slot(rows))
    for run in rows:
        _audit(run, actor=actor, action=AuditAction.REPLAY, attempts_before=run.attempt)
    log.info("runs replay (bulk): actor=%r done=%d ignored=%d", actor, len(locked), len(ids) - len(locked))
    return BulkResult(done=locked, ignored=len(ids) - len(locked))


@transaction.atomic
def cancel_runs(*, ids: Iterable[int], actor: str, now: datetime | None = None) -> BulkResult:
    """Bulk cancel by surrogate id (admin); final runs are ignored."""
    now = now or timezone.now()
    ids = list(ids)
    locked = _lock_by_ids(ids, statuses=CANCELLABLE)
    for run in locked:
        _cancel_locked(run, now=now, actor=actor)
        _audit(run, actor=actor, action=AuditAction.CANCEL, status=[run.status, RunStatus.CANCELLED])
    done = [run.id for run in locked]
    log.info("runs cancel (bulk): actor=%r done=%d ignored=%d", actor, len(done), len(ids) - len(done))
    return BulkResult(done=done, ignored=len(ids) - len(done))
