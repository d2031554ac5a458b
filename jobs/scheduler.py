"""The dispatch loop: turns due jobs of owned partitions into run rows, exactly once.

One step = one batch, one transaction (see jobs/leases.py for why this transaction,
not the partition lease, is what keeps firing exactly-once):

    fence (txn time + partitions our lease session holds right now)
    SELECT due jobs FOR UPDATE SKIP LOCKED ... LIMIT batch
    plan each job (normal slot or misfire policy) in Python
    CAS-advance next_run_at for all of them in one UPDATE
    INSERT the runs of the jobs whose CAS succeeded (ON CONFLICT DO NOTHING)
    record misfires, NOTIFY executors, COMMIT
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import DatabaseError, connection, transaction

from jobs import leases, services
from jobs.models import Job, Misfire, MisfirePolicy
from runs import partitions
from runs.queue import NewRun, enqueue_runs, notify_executors
from scheduler_project.loop import Loop

log = logging.getLogger(__name__)

# Missed slots are enumerated at most this far: a `* * * * *` job down for a year
# must not build 500k datetimes. Beyond it the misfire count is a lower bound.
MISFIRE_ENUMERATION_CAP = 10_000
MAINTENANCE_EVERY_SECONDS = 3600
SUMMARY_EVERY_SECONDS = 30


def make_node_id() -> str:
    return f"{socket.gethostname()[:60]}:{os.getpid()}:{secrets.token_hex(3)}"


@dataclass
class Plan:
    job: Job
    new_next: datetime | None
    runs: list[NewRun] = field(default_factory=list)
    misfire: Misfire | None = None


@dataclass(frozen=True)
class BatchResult:
    jobs: int = 0
    runs: int = 0
    inserted: int = 0
    skipped: int = 0
    misfires: int = 0
    stale: int = 0  # CAS refused (should stay 0: the rows were locked)
    still_due: bool = False
    full: bool = False


def plan_job(job: Job, *, now: datetime, threshold: timedelta) -> Plan:
    """Runs to create for a due job and its new next_run_at (pure: no writes)."""
    due = job.next_run_at
    assert due is not None
    if job.end_at is not None and due > job.end_at:
        return Plan(job=job, new_next=None)  # end_at moved before the pending slot
    if now - due <= threshold:
        # On time (or a little late): fire exactly this slot. If more slots are
        # already due the job comes back in the next batch, one slot per batch, so
        # the overlap policy sees each earlier run when deciding the next.
        return Plan(
            job=job,
            new_next=services.next_slot(job, after=due, anchor=due),
            runs=[services.run_for(job, scheduled_at=due, trigger="schedule")],
        )
    return _plan_misfire(job, now=now)


def _plan_misfire(job: Job, *, now: datetime) -> Plan:
    due = job.next_run_at
    cap = max(job.max_catch_up, MISFIRE_ENUMERATION_CAP)
    missed = [due, *services.slots_between(job, after=due, until=now, limit=cap - 1)]
    capped = len(missed) >= cap
    count = len(missed)
    last = missed[-1]
    if capped:
        last = services.latest_slot(job, since=due, until=now)
        if job.interval_seconds:
            count = int((last - due) / timedelta(seconds=job.interval_seconds)) + 1
    policy = job.misfire_policy
    if policy == MisfirePolicy.SKIP:
        slots: list[datetime] = []
    elif policy == MisfirePolicy.CATCH_UP:
        slots = missed[: job.max_catch_up]
    else:  # run_once
        slots = [last]
    # run_once's single run stands for the current occurrence, so the job's overlap
    # policy applies to it; a catch-up backlog was asked for run by run.
    overlap_check = policy == MisfirePolicy.RUN_ONCE
    runs = [
        services.run_for(job, scheduled_at=t, trigger="catch_up", overlap_check=overlap_check) for t in slots
    ]
    misfire = Misfire(
        job=job,
        policy=policy,
        missed_count=count,
        first_missed_at=due,
        last_missed_at=last,
        runs_created=len(runs),
    )
    if capped and not job.interval_seconds:
        log.warning("misfire job=%s: at least %d slots missed (enumeration capped)", job.id, count)
    return Plan(job=job, new_next=services.next_slot(job, after=now, anchor=due), runs=runs, misfire=misfire)


class Scheduler(Loop):
    def __init__(
        self,
        *,
        node_id: str | None = None,
        conninfo: str | None = None,
        batch_size: int | None = None,
        lease_seconds: float | None = None,
        partitions_count: int | None = None,
        misfire_threshold_seconds: float | None = None,
        poll_seconds: float | None = None,
        clock: Callable[[], datetime] | None = None,
        maintain_partitions: bool = True,
        heartbeat_thread: bool = True,
    ) -> None:
        super().__init__()
        self.node_id = node_id or make_node_id()
        self.batch_size = batch_size or settings.SCHEDULER_BATCH_SIZE
        self.lease_seconds = lease_seconds or settings.SCHEDULER_LEASE_SECONDS
        self.poll_seconds = poll_seconds if poll_seconds is not None else settings.SCHEDULER_POLL_SECONDS
        self.threshold = timedelta(
            seconds=misfire_threshold_seconds
            if misfire_threshold_seconds is not None
            else settings.SCHEDULER_MISFIRE_THRESHOLD_SECONDS
        )
        # None = the database's transaction time, which all nodes agree on.
        self.clock = clock
        self.maintain_partitions = maintain_partitions
        self.heartbeat_thread = heartbeat_thread
        self.lease = leases.LeaseManager(
            conninfo=conninfo or leases.conninfo_from_settings(connection.settings_dict),
            node_id=self.node_id,
            hostname=socket.gethostname()[:255],
            pid=os.getpid(),
            partitions=partitions_count or settings.SCHEDULER_PARTITIONS,
            lease_seconds=self.lease_seconds,
        )
        self._started = False
        self._next_maintenance = 0.0
        self._next_summary = time.monotonic() + SUMMARY_EVERY_SECONDS
        self._dispatched_since_summary = 0
        self._unusable_logged_generation = -1

    # -- Loop API ------------------------------------------------------------------

    def start(self) -> None:
        if not self._started:
            self.lease.start(thread=self.heartbeat_thread)
            self._started = True

    def step(self) -> bool:
        self.start()
        self._maybe_maintain()
        self._maybe_summary()
        snap = self.lease.snapshot
        if not snap.usable(now=time.monotonic(), lease_seconds=self.lease_seconds):
            if snap.owned or self._unusable_logged_generation != snap.generation:
                self._unusable_logged_generation = snap.generation
                log.info(
                    "not dispatching node=%s: %s",
                    self.node_id,
                    f"waiting for a fresh lease heartbeat (holds {len(snap.owned)} partitions)"
                    if snap.owned
                    else "waiting for its share of partitions",
                )
            return False
        connection.close_if_unusable_or_obsolete()
        try:
            result = self.dispatch(snap)
        except DatabaseError as exc:
            # E.g. the server killed a stalled transaction: nothing was committed.
            log.warning("dispatch failed node=%s: %s", self.node_id, exc)
            connection.close()
            return False
        self._dispatched_since_summary += result.inserted
        return result.full or result.still_due

    def run(self, *, once: bool = False) -> None:
        if not once:
            return super().run()
        # One pass: lease, dispatch while there is work, release.
        try:
            while not self.stopping.is_set() and self.step():
                pass
        finally:
            self.close()

    def close(self) -> None:
        if self._started:
            self.lease.close()
            self._started = False

    # -- dispatch --------------------------------------------------------------------

    def dispatch(self, snap: leases.LeaseSnapshot) -> BatchResult:
        started = time.monotonic()
        with transaction.atomic():
            with connection.cursor() as cursor:
                db_now, held = leases.fence(
                    cursor, session_pid=snap.session_pid, lease_seconds=self.lease_seconds
                )
            owned = sorted(held & snap.owned)
            if not owned:
                return BatchResult()
            now = self.clock() if self.clock else db_now
            jobs = list(
                Job.objects.select_for_update(skip_locked=True)
                .filter(partition_id__in=owned, paused=False, next_run_at__lte=now)
                .order_by("next_run_at")[: self.batch_size]
            )
            if not jobs:
                return BatchResult()
            plans = [self._plan(job, now) for job in jobs]
            with connection.cursor() as cursor:
                advanced = leases.advance_next_run(
                    cursor, [(p.job.id, p.new_next, p.job.next_run_at) for p in plans]
                )
            plans_ok = [p for p in plans if p.job.id in advanced]
            runs = [run for p in plans_ok for run in p.runs]
            inserted = enqueue_runs(runs)
            misfires = [p.misfire for p in plans_ok if p.misfire is not None]
            if misfires:
                Misfire.objects.bulk_create(misfires)
            if inserted:
                notify_executors()
        skipped = sum(1 for r in inserted if r.status == "skipped")
        result = BatchResult(
            jobs=len(jobs),
            runs=len(runs),
            inserted=len(inserted),
            skipped=skipped,
            misfires=len(misfires),
            stale=len(plans) - len(plans_ok),
            still_due=any(p.new_next is not None and p.new_next <= now for p in plans_ok),
            full=len(jobs) >= self.batch_size,
        )
        if result.stale:
            log.warning(
                "node=%s: %d jobs changed under a locked read (CAS refused)", self.node_id, result.stale
            )
        scheduled = [r.scheduled_at for r in runs]
        # One parseable line per batch; the process tests read these (session_pid
        # and db_now tie every dispatch to the lease session it ran under).
        log.debug(
            "batch node=%s session_pid=%s generation=%d db_now=%s partitions=%d jobs=%d runs=%d inserted=%d "
            "conflicts=%d skipped=%d misfires=%d stale=%d min_sched=%s max_sched=%s ms=%.1f",
            self.node_id,
            snap.session_pid,
            snap.generation,
            db_now.isoformat(),
            len(owned),
            result.jobs,
            result.runs,
            result.inserted,
            result.runs - result.inserted,
            skipped,
            result.misfires,
            result.stale,
            min(scheduled).isoformat() if scheduled else "-",
            max(scheduled).isoformat() if scheduled else "-",
            (time.monotonic() - started) * 1000,
        )
        return result

    def _plan(self, job: Job, now: datetime) -> Plan:
        try:
            return plan_job(job, now=now, threshold=self.threshold)
        except Exception:
            # One job whose schedule cannot be computed any more (e.g. a time zone
            # that vanished from tzdata) must not fail every batch of its partition
            # forever: it stops (next_run_at NULL; an edit recomputes it), loudly.
            log.exception("job=%s: cannot compute its schedule; it will not fire until edited", job.id)
            return Plan(job=job, new_next=None)

    # -- housekeeping ------------------------------------------------------------------

    def _maybe_maintain(self) -> None:
        if not self.maintain_partitions or time.monotonic() < self._next_maintenance:
            return
        self._next_maintenance = time.monotonic() + MAINTENANCE_EVERY_SECONDS
        try:
            with connection.cursor() as cursor:
                # maintain() serialises on a transaction lock; a try-lock first means
                # nodes that start together do not queue behind each other.
                if not leases.try_maintenance_lock(cursor):
                    return
                try:
                    partitions.maintain(retention_days=settings.RUN_RETENTION_DAYS)
                finally:
                    leases.maintenance_unlock(cursor)
        except DatabaseError as exc:
            log.warning("partition maintenance failed: %s", exc)
            connection.close()

    def _maybe_summary(self) -> None:
        if time.monotonic() < self._next_summary:
            return
        self._next_summary = time.monotonic() + SUMMARY_EVERY_SECONDS
        snap = self.lease.snapshot
        log.info(
            "summary node=%s dispatched=%d owned=%d live_nodes=%d session_pid=%s",
            self.node_id,
            self._dispatched_since_summary,
            len(snap.owned),
            len(self.lease.live_nodes),
            snap.session_pid,
        )
        self._dispatched_since_summary = 0
