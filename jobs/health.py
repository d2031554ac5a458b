"""Job health: the "overdue" rule, the time of the last success, and the alert sweep.

Health counters (last outcome, last failure, consecutive failures) are written by the
executors' outcome statement (runs/execution/outcomes.py) when they change; this module reads
them. A success of a healthy job changes nothing but the time of its last success, so
that time is read from the job's runs (`last_success_at()`). Alerts:

* overdue: a job whose next slot is late by more than SCHEDULER_OVERDUE_ALERT_SECONDS
  (the scheduler is behind or down) is alerted once per late slot;
* failing: a job whose consecutive failed attempts reach its `alert_after_failures` is
  alerted once per failure streak (a success ends the streak).

A scheduler runs `sweep()` every few seconds; a transaction-scoped advisory lock makes
one node do it at a time, and the marks written in the same transaction make each
episode alert once across nodes. The scheduler sends them after the commit through the
one alert sender (runs/alerts.py, which also gives every alert its payload). When no
scheduler is alive nobody can send the webhook: /metrics still shows
`cronyard_jobs_overdue` and the schedulers' heartbeat age, which is what an external
alert rule watches (README).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, F, OuterRef, Subquery
from django.db.models.functions import Greatest

from jobs.dispatch.partition_leases import NAMESPACE
from jobs.models import Job
from runs.alerts import Alert
from runs.models import JobRun

SWEEP_LOCK_KEY = -2  # with jobs.dispatch.partition_leases.NAMESPACE; partitions are >= 0, maintenance is -1
SWEEP_LIMIT = 1000  # alerts per sweep; the rest wait for the next one


def overdue_seconds(job: Job, *, now: datetime) -> float | None:
    """How late the job's next slot is, when later than SCHEDULER_OVERDUE_ALERT_SECONDS."""
    if job.paused or job.next_run_at is None:
        return None
    late = (now - job.next_run_at).total_seconds()
    return round(late, 3) if late > settings.SCHEDULER_OVERDUE_ALERT_SECONDS else None


def overdue_by_tenant(*, now: datetime, late_seconds: float) -> dict[str, int]:
    """Unpaused jobs per tenant slug whose next slot is late by more than `late_seconds`
    (the rule of overdue_seconds, counted in the database: /metrics, the dashboard)."""
    rows = (
        Job.objects.filter(paused=False, next_run_at__lt=now - timedelta(seconds=late_seconds))
        .values_list("tenant__slug")
        .annotate(n=Count("id"))
    )
    return dict(rows)


_OVERDUE_SQL = """
UPDATE jobs j SET overdue_alerted_for = j.next_run_at
FROM tenants t
WHERE j.id IN (
    SELECT id FROM jobs
    WHERE NOT paused AND next_run_at < %(now)s - make_interval(secs => %(late)s)
      AND overdue_alerted_for IS DISTINCT FROM next_run_at
    ORDER BY next_run_at LIMIT %(limit)s
) AND t.id = j.tenant_id
RETURNING j.id, j.name, t.id, t.slug, j.next_run_at
"""

# ORDER BY id walks jobs_failing_idx (jobs/migrations/0012), which holds only the jobs
# this predicate matches. Without it the planner guessed (no statistics on a comparison
# of two columns) that most jobs match, so `LIMIT` would stop a sequential scan early,
# and scanned all of jobs every 5 s instead: ~0.5-1.4 s of a core at 1M jobs. The ids
# come as an array (an InitPlan), so the update probes them by id whatever the planner
# expects; as `IN (subquery)` it hash-joined a sequential scan of jobs when it expected
# 1000 ids from a table of a few thousand.
_FAILING_SQL = """
UPDATE jobs j SET failure_alerted = true
FROM tenants t
WHERE j.id = ANY(ARRAY(
    SELECT id FROM jobs
    WHERE NOT failure_alerted AND consecutive_failures >= alert_after_failures
    ORDER BY id LIMIT %(limit)s
)) AND t.id = j.tenant_id
RETURNING j.id, j.name, t.id, t.slug, j.consecutive_failures, j.last_failure_at
"""


def sweep() -> list[Alert]:
    """Mark and return the alerts due now (one transaction); [] if another node sweeps.

    The caller sends them after this returns, when the marks are committed and no row
    is locked (jobs/dispatch/scheduler.py): a webhook that stays down loses these
    alerts, it never repeats them or holds a lock."""
    with transaction.atomic(), connection.cursor() as cursor:
        # The database's clock, read once: Citus refuses now() in an UPDATE's RETURNING.
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s, %s), now()", [NAMESPACE, SWEEP_LOCK_KEY])
        locked, now = cursor.fetchone()
        if not locked:
            return []
        cursor.execute(
            _OVERDUE_SQL, {"now": now, "late": settings.SCHEDULER_OVERDUE_ALERT_SECONDS, "limit": SWEEP_LIMIT}
        )
        alerts = [
            Alert.job_overdue(
                at=now, tenant_id=tenant_id, tenant_slug=slug, job_id=job_id, job_name=name, slot=slot
            )
            for job_id, name, tenant_id, slug, slot in cursor.fetchall()
        ]
        cursor.execute(_FAILING_SQL, {"limit": SWEEP_LIMIT})
        alerts += [
            Alert.job_failing(
                at=now,
                tenant_id=tenant_id,
                tenant_slug=slug,
                job_id=job_id,
                job_name=name,
                consecutive_failures=failures,
                last_failure_at=last,
            )
            for job_id, name, tenant_id, slug, failures, last in cursor.fetchall()
        ]
    return alerts


def last_success_at() -> Greatest:
    """An annotation: when a job last succeeded. The finish of its newest succeeded run
    (its index on (partition_id, job_id, scheduled_at), read backwards: a probe per job),
    or what the job row kept, whichever is later. The row keeps the time of every success
    this read would miss (runs/execution/outcomes.py): one that changed the job's health (its first,
    the end of a failure streak) and one of an older slot than a success already recorded
    (a replay, a backfill, a late retry). A success refreshes it at most once a day, so
    once retention has dropped a job's runs the answer is at most a day early. For a job
    in a failure streak the probe walks back over the streak's runs. (PostgreSQL's
    GREATEST skips NULLs.) The partition_id
    equality keeps the probe in the job's shard on Citus."""
    mine = JobRun.objects.filter(partition_id=OuterRef("partition_id"), job_id=OuterRef("pk"))
    newest = mine.filter(status="succeeded").order_by("-scheduled_at").values("finished_at")[:1]
    return Greatest(F("last_success_at"), Subquery(newest))
