"""Job health: the "overdue" and "failing" rules, the time of the last success, a job's
health figures (the API's `health` object and the job page's panel), and the alert sweep.

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

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Aggregate, Count, F, FloatField, Func, OuterRef, Q, Subquery
from django.db.models.functions import Greatest

from jobs.dispatch.partition_leases import NAMESPACE
from jobs.dispatch.planning import starting_deadline
from jobs.models import Job
from runs.alerts import Alert
from runs.models import JobRun, RunStatus, RunTrigger

SWEEP_LOCK_KEY = -2  # with jobs.dispatch.partition_leases.NAMESPACE; partitions are >= 0, maintenance is -1
SWEEP_LIMIT = 1000  # alerts per sweep; the rest wait for the next one


def overdue_seconds(job: Job, *, now: datetime) -> float | None:
    """How late the job's next slot is, when later than SCHEDULER_OVERDUE_ALERT_SECONDS."""
    if job.paused or job.next_run_at is None:
        return None
    late = (now - job.next_run_at).total_seconds()
    return round(late, 3) if late > settings.SCHEDULER_OVERDUE_ALERT_SECONDS else None


def overdue(*, now: datetime, late_seconds: float | None = None) -> Q:
    """The rule of overdue_seconds as a filter of jobs: unpaused, next slot late by more than
    `late_seconds` (default SCHEDULER_OVERDUE_ALERT_SECONDS). jobs_due_order_idx
    (next_run_at WHERE NOT paused, jobs/migrations/0002) holds exactly the candidates."""
    if late_seconds is None:
        late_seconds = settings.SCHEDULER_OVERDUE_ALERT_SECONDS
    return Q(paused=False, next_run_at__lt=now - timedelta(seconds=late_seconds))


# A job is failing while its streak of failed attempts has reached the count it alerts at:
# the `job.failing` alert's rule (the sweep's SQL below says it once more, with its mark).
# jobs_failing_streak_idx (jobs/migrations/0015) holds exactly these jobs.
FAILING = Q(consecutive_failures__gte=F("alert_after_failures"))


def is_failing(job: Job) -> bool:
    """FAILING, of one job row in hand."""
    return job.consecutive_failures >= job.alert_after_failures


def overdue_by_tenant(*, now: datetime, late_seconds: float) -> dict[str, int]:
    """Unpaused jobs per tenant slug whose next slot is late by more than `late_seconds`
    (the rule of overdue_seconds, counted in the database: /metrics, the dashboard)."""
    rows = Job.objects.filter(overdue(now=now, late_seconds=late_seconds)).values_list("tenant__slug")
    return dict(rows.annotate(n=Count("id")))


def failing_by_tenant() -> dict[str, int]:
    """Failing jobs (FAILING) per tenant slug: an index-only walk of jobs_failing_streak_idx."""
    rows = Job.objects.filter(FAILING).values_list("tenant__slug")
    return dict(rows.annotate(n=Count("id")))


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


def misfire_count(job: Job) -> int:
    """The job's recorded misfires: the views' annotation when present (jobs/api/views.py
    `_misfire_count`, one subquery per listed job), else one count."""
    count = getattr(job, "misfire_count", None)
    return job.misfires.count() if count is None else count


# --- a job's health figures: the API's `health` object and the job page's panel --------

# Runs that stand for a slot of the schedule. A manual trigger's or a backfill's slot is
# when it was asked for, and a replay re-runs a slot long past: none says whether the
# schedule's slots start on time.
SLOT_TRIGGERS = (RunTrigger.SCHEDULE, RunTrigger.CATCH_UP)
HEALTH_WINDOWS = (("last_24h", timedelta(hours=24)), ("last_7d", timedelta(days=7)))


class _Percentile(Aggregate):
    """percentile_cont (linear interpolation between the closest ranks), FILTER-able."""

    function = "percentile_cont"
    template = "%(function)s(%(fraction)s) WITHIN GROUP (ORDER BY %(expressions)s)"
    output_field = FloatField()

    def __init__(self, expression, *, fraction: float, **extra):
        super().__init__(expression, fraction=float(fraction), **extra)


def _seconds(expression) -> Func:
    return Func(expression, template="EXTRACT(EPOCH FROM %(expressions)s)", output_field=FloatField())


@dataclass(frozen=True)
class SlotWindow:
    """A job's slots scheduled in the last `seconds` (up to now), from its runs."""

    seconds: int
    slots: int  # slots decided: their run started, or the threshold passed without a start
    on_time: int  # of those, runs that started within the threshold of their slot
    on_time_rate: float | None  # on_time / slots; None without a decided slot
    lateness_p50_seconds: float | None  # started_at - scheduled_at over the started runs
    lateness_p99_seconds: float | None


@dataclass(frozen=True)
class JobHealth:
    consecutive_failures: int
    alert_after_failures: int
    failing: bool
    last_success_at: datetime | None
    last_failure_at: datetime | None
    overdue_seconds: float | None
    misfire_count: int
    on_time_threshold_seconds: int
    last_24h: SlotWindow
    last_7d: SlotWindow


def job_health(job: Job, *, now: datetime) -> JobHealth:
    """The job's health figures at `now`: its row's counters, the API's last success and
    overdue rule, its misfires, and per window the on-time rate and the start lateness.

    A slot is on time when its run started within the job's starting deadline of it
    (jobs.dispatch.planning.starting_deadline: its starting_deadline_seconds, else
    SCHEDULER_MISFIRE_THRESHOLD_SECONDS; a later start is what a scheduler would call a
    misfire). A slot counts once its
    run started or the threshold passed without a start; skipped runs (the overlap
    policy) and runs cancelled before they started are not counted. started_at is the
    latest attempt's start (as on the dashboard's lateness chart): a retried run's
    lateness includes its retries. One aggregate over the job's runs of the last 7 days,
    on the (partition_id, job_id, scheduled_at) unique index of the day partitions the
    window reaches (in the job's shard on Citus)."""
    threshold = int(starting_deadline(job).total_seconds())
    widest = max(span for _, span in HEALTH_WINDOWS)
    runs = JobRun.objects.filter(
        partition_id=job.partition_id,
        job_id=job.pk,
        scheduled_at__gt=now - widest,
        scheduled_at__lte=now,
        trigger__in=SLOT_TRIGGERS,
    ).exclude(status=RunStatus.SKIPPED)
    started = Q(started_at__isnull=False)
    decided = started | (
        Q(scheduled_at__lt=now - timedelta(seconds=threshold)) & ~Q(status=RunStatus.CANCELLED)
    )
    on_time = started & Q(started_at__lte=F("scheduled_at") + timedelta(seconds=threshold))
    lateness = _seconds(F("started_at") - F("scheduled_at"))
    aggregates = {}
    for name, span in HEALTH_WINDOWS:
        inside = Q(scheduled_at__gt=now - span)
        aggregates |= {
            f"{name}_slots": Count("id", filter=inside & decided),
            f"{name}_on_time": Count("id", filter=inside & on_time),
            f"{name}_p50": _Percentile(lateness, fraction=0.5, filter=inside & started),
            f"{name}_p99": _Percentile(lateness, fraction=0.99, filter=inside & started),
        }
    row = runs.aggregate(**aggregates)
    windows = {
        name: SlotWindow(
            seconds=int(span.total_seconds()),
            slots=row[f"{name}_slots"],
            on_time=row[f"{name}_on_time"],
            on_time_rate=round(row[f"{name}_on_time"] / row[f"{name}_slots"], 4)
            if row[f"{name}_slots"]
            else None,
            lateness_p50_seconds=_rounded(row[f"{name}_p50"]),
            lateness_p99_seconds=_rounded(row[f"{name}_p99"]),
        )
        for name, span in HEALTH_WINDOWS
    }
    return JobHealth(
        consecutive_failures=job.consecutive_failures,
        alert_after_failures=job.alert_after_failures,
        failing=is_failing(job),
        last_success_at=_last_success(job),
        last_failure_at=job.last_failure_at,
        overdue_seconds=overdue_seconds(job, now=now),
        misfire_count=misfire_count(job),
        on_time_threshold_seconds=threshold,
        **windows,
    )


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 3)


def _last_success(job: Job) -> datetime | None:
    """last_success_at() as the API reads it: the views' annotation, or one probe."""
    if hasattr(job, "last_success"):
        return job.last_success
    read = Job.objects.filter(partition_id=job.partition_id, pk=job.pk).annotate(at=last_success_at())
    return read.values_list("at", flat=True).first()
