"""The dispatch loop: turns due jobs of owned partitions into run rows, exactly once.

One step = one batch in two phases per group of owned partitions (see
jobs/dispatch/fencing.py for why the locking transaction, not the partition lease, is
what keeps firing exactly-once). A group is the partitions one Citus worker holds, so a
worker out of reach fails only its own batch (docs/decisions/0073-one-worker-down.md);
plain PostgreSQL has one group, all of them:

    read (autocommit, no locks): due jobs of owned partitions, on-time ones first
    plan each job in Python (normal slot or bounded misfire arithmetic), within a
        time budget: whatever is not planned in time waits for the next batch
    --- one short transaction (two when some jobs' runs are old enough to lower
        their tenant's open floor: those jobs go in a second one, _dispatch_group) ---
    fence (txn time + partitions our lease session holds right now)
    lock the planned rows FOR UPDATE SKIP LOCKED, only if unchanged since the read
    CAS-advance next_run_at for them in one UPDATE
    INSERT the runs of the jobs whose CAS succeeded (ON CONFLICT DO NOTHING)
    defer the excess of rate-limited tenants (jobs/dispatch/rate_limits.py; no statement if none)
    record misfires, NOTIFY executors, COMMIT

Planning is never done while rows are locked: a week-long backlog once made the
planning of one batch outlast idle_in_transaction_session_timeout, every batch was
killed and dispatch wedged for good. A batch that fails anyway halves the next one.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from django.conf import settings
from django.db import DatabaseError, connection, transaction

from jobs import health
from jobs.dispatch import fencing, partition_leases, rate_limits
from jobs.dispatch.planning import DueJob, Plan, plan_job
from jobs.models import Misfire, SlotRange
from runs import alerts, counters, day_partitions, open_floors
from runs.enqueue import enqueue_runs, notify_executors, oldest_slot
from runs.execution import breakers
from scheduler_project import db, liveness
from scheduler_project.citus import Placements, by_node, citus_installed, keep_worker_connections
from scheduler_project.db import raw_cursor
from scheduler_project.loop import Loop
from scheduler_project.outage import is_outage, unreachable_worker

log = logging.getLogger(__name__)

MAINTENANCE_EVERY_SECONDS = 3600
ALERT_SWEEP_EVERY_SECONDS = 5
# At close, pending alert deliveries get this long (the executor gives its own as long).
ALERT_CLOSE_SECONDS = 5.0
# Planning (outside any transaction) stops after this long and the batch goes with
# the jobs planned so far: on-time jobs of other partitions must not wait minutes
# behind a backlog of misfired ones. The first job of a batch is always planned.
PLAN_BUDGET_SECONDS = 1.0
SUMMARY_EVERY_SECONDS = 30
# Jobs per dispatch transaction when SCHEDULER_BATCH_SIZE is 0 (its default). On Citus a
# batch costs about a millisecond per shard each of its multi-shard statements touches
# (the insert, the overlap read) whatever its size, so larger batches amortise it:
# 10k due jobs dispatched at 2.7k runs/s with 500, 5.1k with 2000 (docs/decisions/0053-citus-dispatch.md).
BATCH_SIZE = 500
CITUS_BATCH_SIZE = 2000


# Waking this much after the next job's slot, never before it (see idle_seconds).
IDLE_MARGIN_SECONDS = 0.005


@dataclass(frozen=True)
class BatchResult:
    jobs: int = 0
    runs: int = 0
    inserted: int = 0
    skipped: int = 0
    misfires: int = 0
    changed: int = 0  # changed or locked by someone else between the read and the lock
    refused: int = 0  # CAS refused on a locked, unchanged row (must stay 0)
    still_due: bool = False
    full: bool = False


def _sum(*results: BatchResult) -> BatchResult:
    """Several batches' results as one."""
    return BatchResult(
        jobs=sum(r.jobs for r in results),
        runs=sum(r.runs for r in results),
        inserted=sum(r.inserted for r in results),
        skipped=sum(r.skipped for r in results),
        misfires=sum(r.misfires for r in results),
        changed=sum(r.changed for r in results),
        refused=sum(r.refused for r in results),
        still_due=any(r.still_due for r in results),
        full=any(r.full for r in results),
    )


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
        self.node_id = node_id or liveness.make_node_id()
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
        self.lease = partition_leases.LeaseManager(
            conninfo=conninfo or db.conninfo(connection.settings_dict),
            node_id=self.node_id,
            hostname=socket.gethostname()[:255],
            pid=os.getpid(),
            partitions=partitions_count or settings.SCHEDULER_PARTITIONS,
            lease_seconds=self.lease_seconds,
        )
        self._started = False
        self._next_maintenance = 0.0
        self._next_alert_sweep = 0.0
        # The one alert sender (runs/alerts.py) on a private event loop: the sweep only hands over.
        # The process's Prometheus counters (runs/counters.py), written every few seconds.
        self.tally = counters.Tally(self.node_id)
        self._next_counter_flush = 0.0
        self._alerts = alerts.BackgroundSender(alerts.Destination.from_settings(), tally=self.tally)
        self._next_summary = time.monotonic() + SUMMARY_EVERY_SECONDS
        self._dispatched_since_summary = 0
        self._unusable_logged_generation = -1
        # Jobs the next batch reads: halves after a failed batch, doubles back after a full one.
        self.batch_limit = self.batch_size
        # Set by a dispatch that found nothing due: when (monotonic) the next job is.
        self._next_due_mono: float | None = None
        # Which Citus worker holds each partition: batches are grouped by it.
        self.placements = Placements()
        self._citus: bool | None = None  # asked at the first dispatch
        # The connection keep_worker_connections was run on (a reconnect needs it again).
        self._kept_on: object | None = None

    # -- Loop API ------------------------------------------------------------------

    def start(self) -> None:
        if not self._started:
            self.lease.start(thread=self.heartbeat_thread)
            self._started = True

    def step(self) -> bool:
        self.start()
        self._maybe_maintain()
        self._maybe_sweep_alerts()
        self._maybe_summary()
        self._maybe_flush_counters()
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
            # E.g. the server killed a stalled transaction: the failed transaction
            # committed nothing. If the batch itself was the problem, a smaller one gets
            # through; down to one job, so a single poisonous job never blocks the rest
            # of its partition.
            self.batch_limit = max(1, self.batch_limit // 2)
            if not self._an_outage(exc):
                log.warning(
                    "dispatch failed node=%s: %s; the next batch takes at most %d jobs",
                    self.node_id,
                    str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__,
                    self.batch_limit,
                )
            connection.close()
            return False
        self.lease.outage.ok()
        if result.full and self.batch_limit < self.batch_size:
            self.batch_limit = min(self.batch_size, self.batch_limit * 2)
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
        self._alerts.close(timeout=ALERT_CLOSE_SECONDS)
        self._next_counter_flush = 0.0
        self._maybe_flush_counters()

    # -- dispatch --------------------------------------------------------------------

    def dispatch(self, snap: partition_leases.LeaseSnapshot) -> BatchResult:
        """One batch per worker holding owned partitions (one batch on plain PostgreSQL),
        so that a worker out of reach fails only its own partitions' batch."""
        if self._citus is None:
            # Here, not at start: the database may be down when the process starts.
            with connection.cursor() as cursor:
                self._citus = citus_installed(cursor)
        if not self.batch_size:
            self.batch_size = self.batch_limit = CITUS_BATCH_SIZE if self._citus else BATCH_SIZE
        if self._citus:
            self._keep_worker_connections()
        now = self.clock() if self.clock else db.now()
        results: list[BatchResult] = []
        next_dues: list[datetime | None] = []
        for node, partitions in self._groups(sorted(snap.owned)).items():
            try:
                result, whole = self._dispatch_group(snap, partitions, now)
            except DatabaseError as exc:
                if not self._worker_away(exc):
                    raise
                continue
            if node:
                self.lease.outage.reached([node])
            results.append(result)
            if whole and not (result.full or result.still_due):
                next_dues.append(self._next_due(partitions, now))
        # The idle wait ends at the earliest next job of the groups that have nothing
        # due; a group set aside or failed has no say (the poll finds it again).
        known = [d for d in next_dues if d is not None]
        nxt = min(known) if known else None
        self._next_due_mono = None if nxt is None else time.monotonic() + (nxt - now).total_seconds()
        return _sum(*results)

    def _keep_worker_connections(self) -> None:
        """Citus: let this session keep the worker connections a batch opens, once per
        connection, outside any transaction (docs/decisions/0083-dispatch-keeps-worker-connections.md)."""
        connection.ensure_connection()
        if connection.connection is self._kept_on:
            return
        with connection.cursor() as cursor:
            keep_worker_connections(cursor)
        self._kept_on = connection.connection

    def _groups(self, owned: list[int]) -> dict[str, list[int]]:
        """The owned partitions by the Citus worker holding them ('': plain PostgreSQL,
        one group, no statement), without the workers the outage log sets aside now.

        The batch limit is per group: it bounds a transaction (its locks, its time under
        idle_in_transaction_session_timeout, the halving after a failure), and each
        group's statements touch only its worker's shards, so a group of 2,000 jobs
        costs what a batch of 2,000 always did; a step with k workers dispatches up to
        k batches. Dividing the limit by the workers would shrink each batch and lose
        the per-statement amortisation CITUS_BATCH_SIZE is for."""
        if not owned:
            return {}
        with connection.wrap_database_errors, connection.cursor() as cursor:
            groups = by_node(self.placements.read(cursor, owned))
        aside = self.lease.outage.set_aside([node for node in groups if node])
        return {node: partitions for node, partitions in groups.items() if node not in aside}

    def _worker_away(self, exc: DatabaseError) -> bool:
        """Whether a group's batch failed because the coordinator could not reach a
        Citus worker: then the outage log has it (and sets it aside, with backoff), the
        placements are read again (a shard may have moved), and the other groups go on.
        The failed transaction committed nothing: its jobs are dispatched when the
        worker is back."""
        cause = exc.__cause__ if exc.__cause__ is not None else exc
        if not unreachable_worker(cause):
            return False
        self.lease.outage.failed(cause)
        self.placements.forget()
        return True

    def _dispatch_group(
        self, snap: partition_leases.LeaseSnapshot, partitions: list[int], now: datetime
    ) -> tuple[BatchResult, bool]:
        """The batch of `partitions` (one worker's on Citus): read, plan, commit. Returns
        the batch's result and whether all of it was committed.

        Jobs with a run old enough to lower its tenant's open floor are committed in a
        transaction after the others' (runs/open_floors.py, may_lower). On Citus that
        write reaches every worker's copy of `tenants`: with another worker out of reach
        it fails, and with it only these jobs (a catch-up, a backfilled slot), not every
        job of this worker's batch. They are dispatched once that worker is back, and not
        tried while the outage log sets a worker aside (its backoff holds for this write
        too: against a worker that does not answer, each try would wait for Citus's
        connection timeout)."""
        started = time.monotonic()
        jobs = self._read_due(partitions, now)
        if not jobs:
            return BatchResult(), True
        plans = self._plan_batch(jobs, now)
        fresh: list[Plan] = []
        old: list[Plan] = []
        for plan in plans:
            lowers = any(open_floors.may_lower(run.scheduled_at, now=now) for run in plan.runs)
            (old if lowers else fresh).append(plan)
        result = BatchResult()
        if fresh:
            result = self._commit(snap, fresh, partitions=partitions, now=now, started=started)
        if old:
            # While a worker is set aside (or this write fails on one) the old jobs wait
            # for the next poll, not for their next due time: it has passed, and waiting
            # for it would be a busy loop.
            if self.lease.outage.worker_set_aside():
                return result, False
            try:
                late = self._commit(snap, old, partitions=partitions, now=now, started=started)
                result = _sum(result, late)
            except DatabaseError as exc:
                if not fresh or not self._worker_away(exc):
                    raise
                return result, False
        # A batch cut short by the planning budget has more work waiting too; one that
        # found its partitions gone from the lease (nothing committed) has none here.
        more = len(jobs) >= self.batch_limit or len(plans) < len(jobs)
        return replace(result, full=result.jobs > 0 and more), True

    def _commit(
        self,
        snap: partition_leases.LeaseSnapshot,
        plans: list[Plan],
        *,
        partitions: list[int],
        now: datetime,
        started: float,
    ) -> BatchResult:
        """One transaction: fence the lease, lock the planned jobs unchanged, advance
        them by compare-and-set, insert their runs, misfires and ledger ranges."""
        with transaction.atomic(), connection.wrap_database_errors:
            with connection.cursor() as cursor:
                db_now, held = fencing.fence(
                    cursor, session_pid=snap.session_pid, lease_seconds=self.lease_seconds
                )
            in_lease = [p for p in plans if p.job.partition_id in held]
            if not in_lease:
                # The lease session lost these partitions while we planned (e.g. we
                # were stopped): nothing is dispatched, and no batch is logged
                # under a session that no longer holds them.
                return BatchResult()
            cursor = raw_cursor(connection)
            locked = fencing.lock_unchanged(
                cursor,
                [(p.job.partition_id, p.job.id, p.job.next_run_at, p.job.updated_at) for p in in_lease],
            )
            plans_locked = [p for p in in_lease if p.job.id in locked]
            advanced = fencing.advance_next_run(
                cursor,
                [(p.job.partition_id, p.job.id, p.new_next, p.job.next_run_at) for p in plans_locked],
            )
            plans_ok = [p for p in plans_locked if p.job.id in advanced]
            runs = [run for p in plans_ok for run in p.runs]
            inserted = enqueue_runs(runs)
            rate_limits.defer_excess(plans=plans_ok, inserted=inserted, now=db_now)
            misfires = [p.misfire for p in plans_ok if p.misfire is not None]
            if misfires:
                Misfire.objects.bulk_create(misfires)
            ranges = [r for p in plans_ok for r in p.ranges]
            if ranges:
                SlotRange.objects.bulk_create(ranges)
            if inserted:
                # The oldest slot: a catch-up after an outage queues slots days old.
                notify_executors(oldest=oldest_slot(inserted))
        skipped = sum(1 for r in inserted if r.status == "skipped")
        self.tally.add(counters.DISPATCHED, len(inserted) - skipped, label="queued")
        self.tally.add(counters.DISPATCHED, skipped, label="skipped")
        self.tally.add(counters.MISFIRES, len(misfires))
        self._dispatched_since_summary += len(inserted)
        result = BatchResult(
            jobs=len(plans),
            runs=len(runs),
            inserted=len(inserted),
            skipped=skipped,
            misfires=len(misfires),
            changed=len(in_lease) - len(plans_locked),
            refused=len(plans_locked) - len(plans_ok),
            still_due=any(p.new_next is not None and p.new_next <= now for p in plans_ok),
        )
        if result.refused:
            log.warning(
                "node=%s: %d jobs changed under a locked read (CAS refused)", self.node_id, result.refused
            )
        scheduled = [r.scheduled_at for r in runs]
        # One parseable line per batch; the process tests read these (session_pid
        # and db_now tie every dispatch to the lease session it ran under).
        log.debug(
            "batch node=%s session_pid=%s generation=%d db_now=%s partitions=%d jobs=%d runs=%d inserted=%d "
            "conflicts=%d skipped=%d misfires=%d stale=%d changed=%d min_sched=%s max_sched=%s ms=%.1f",
            self.node_id,
            snap.session_pid,
            snap.generation,
            db_now.isoformat(),
            len(held & set(partitions)),
            result.jobs,
            result.runs,
            result.inserted,
            result.runs - result.inserted,
            skipped,
            result.misfires,
            # stale: CAS refused on a locked, unchanged row; must stay 0 (tests check).
            # changed: plans dropped because the row moved between read and lock (normal
            # when a partition changes hands or a job is edited mid-batch).
            result.refused,
            result.changed,
            min(scheduled).isoformat() if scheduled else "-",
            max(scheduled).isoformat() if scheduled else "-",
            (time.monotonic() - started) * 1000,
        )
        return result

    def _next_due(self, partitions: list[int], now: datetime) -> datetime | None:
        """When the next job of `partitions` falls due (None: none, or not known)."""
        try:
            with connection.wrap_database_errors:
                return fencing.next_due(raw_cursor(connection), owned=partitions, now=now)
        except DatabaseError as exc:
            # Only the idle wait depends on it: fall back to a poll, never fail the batch.
            if not self._an_outage(exc):
                log.warning("node=%s: could not read the next due time (%s); polling", self.node_id, exc)
            return None

    def idle_seconds(self) -> float:
        """Sleep until the next owned job is due, at most a poll interval.

        Polling once a second made the poll the largest part of end-to-end lag (p50
        0.70 s at 200 runs/s; 0.27 s with a 0.2 s poll; docs/decisions/0030-idle-scheduler-sleeps.md). A job
        created or edited meanwhile is found by the next poll at the latest, as before.
        """
        due, self._next_due_mono = self._next_due_mono, None
        if due is None:
            return self.poll_seconds
        # A few milliseconds late rather than early: an early wake finds nothing due.
        return min(self.poll_seconds, max(0.0, due - time.monotonic()) + IDLE_MARGIN_SECONDS)

    def _read_due(self, owned: list[int], now: datetime) -> list[DueJob]:
        """Due jobs of `owned` (fencing.read_due): a plain read, no lock, no transaction."""
        if not owned:
            return []
        with connection.wrap_database_errors:
            return fencing.read_due(
                raw_cursor(connection),
                owned=owned,
                now=now,
                cutoff=now - self.threshold,
                limit=self.batch_limit,
            )

    def _plan_batch(self, jobs: list[DueJob], now: datetime) -> list[Plan]:
        deadline = time.monotonic() + PLAN_BUDGET_SECONDS
        plans = []
        for job in jobs:
            if plans and time.monotonic() > deadline:
                log.info(
                    "node=%s: planning budget spent after %d of %d jobs; the rest go in the next batch",
                    self.node_id,
                    len(plans),
                    len(jobs),
                )
                break
            plans.append(self._plan(job, now))
        return plans

    def _plan(self, job: DueJob, now: datetime) -> Plan:
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
            # wait=False: a node that finds another maintaining skips until next time.
            day_partitions.maintain(retention_days=settings.RUN_RETENTION_DAYS, wait=False)
            # After the maintenance transaction, in batches of their own: no breaker row
            # stays locked while days are created, moved or dropped.
            with connection.cursor() as cursor:
                breakers.prune_idle(cursor)
                counters.fold_retired(cursor)
        except DatabaseError as exc:
            log.warning("partition maintenance failed: %s", exc)
            connection.close()

    def _maybe_sweep_alerts(self) -> None:
        """Overdue and failing jobs (jobs.health); one node at a time, each episode once.
        Sent after the sweep's transaction has committed: no row or lock is held while a
        webhook answers, and the loop does not wait for it."""
        if time.monotonic() < self._next_alert_sweep:
            return
        self._next_alert_sweep = time.monotonic() + ALERT_SWEEP_EVERY_SECONDS
        try:
            due = health.sweep()
        except DatabaseError as exc:
            if not self._an_outage(exc):
                log.warning("alert sweep failed: %s", exc)
            connection.close()
            return
        self._alerts.send(due)

    def _an_outage(self, exc: DatabaseError) -> bool:
        """Whether a failed call of the loop is an outage (the database, or on Citus a
        worker, out of reach): then the process's outage log has it, which says so once
        when it starts and once when it ends instead of a warning per retry. Any other
        error is the caller's to log."""
        cause = exc.__cause__ if exc.__cause__ is not None else exc
        if not is_outage(cause):
            return False
        self.lease.outage.failed(cause)
        return True

    def _maybe_flush_counters(self) -> None:
        """Write what this process counted (runs/counters.py): a statement of its own, after
        the batch's commit; a failure keeps the counts for the next try."""
        if time.monotonic() < self._next_counter_flush:
            return
        self._next_counter_flush = time.monotonic() + counters.FLUSH_EVERY_SECONDS
        try:
            with connection.cursor() as cursor:
                self.tally.flush(cursor)
        except DatabaseError as exc:
            log.warning("counters not written (kept for the next try): %s", exc)
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
