"""Reads of runs: tenant-scoped querysets for the API, the notes a run's page shows
(a rate-limited start, an attempt number past max_attempts after a replay), and the
operations overview shared by the admin dashboard and /metrics. Secrets are redacted
by runs/target_secrets.py, not here.

The overview reads the jobs, tenants and scheduler_nodes tables too (through
jobs.models, which the operator side of runs may import), and only reads.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import fields as dataclass_fields
from datetime import datetime
from uuid import UUID

from django.contrib.postgres.aggregates import JSONBAgg
from django.db import connection
from django.db.models import Count, Min, Q, QuerySet, Sum, Value
from django.db.models.functions import Greatest

from jobs.models import AuditEntry, Job, JobTarget, SchedulerNode, Tenant
from runs import counters
from runs.attempts import LEASE_EXPIRED, from_stored, history, orm_used, used_up
from runs.keys import format_utc
from runs.models import ExecutorNode, JobRun, RunStatus, TargetHost
from scheduler_project import liveness

# The outcome the executor's reaper records for an attempt whose lease ran out
# (runs/execution/queries.py REAP); the underscore spelling is accepted too.
LEASE_EXPIRED_OUTCOMES = (LEASE_EXPIRED, "lease_expired")


# --- runs -------------------------------------------------------------------------------


def attach_targets(runs: Sequence[JobRun]) -> None:
    """Fill each run's `target` from the version it names (jobs.models.JobTarget), in one
    read: a run written since target versions existed carries no copy. A run that has
    its own copy (written before) keeps it."""
    wanted = [run for run in runs if run.target is None and run.target_version is not None]
    if not wanted:
        return
    keys = Q()
    for run in wanted:
        keys |= Q(partition_id=run.partition_id, job_id=run.job_id, version=run.target_version)
    found = {
        (p, j, v): target
        for p, j, v, target in JobTarget.objects.filter(keys).values_list(
            "partition_id", "job_id", "version", "target"
        )
    }
    for run in wanted:
        run.target = found.get((run.partition_id, run.job_id, run.target_version))


def target_of(run: JobRun) -> dict | None:
    """What the run executes (and executed): its target version's, or its own copy."""
    attach_targets([run])
    return run.target


def of_job(runs: QuerySet[JobRun], *, job_id: UUID) -> QuerySet[JobRun]:
    """`runs` narrowed to the job's, by (partition_id, job_id): the run key's unique index
    serves it, and on Citus it reads the job's one shard. The job's partition_id is read
    from its row first (no index of job_runs is led by job_id alone). Without a job row
    (runs written without one, as tools and tests may) the runs are found by job_id over
    every partition: slower, never wrong."""
    partition_id = Job.objects.filter(id=job_id).values_list("partition_id", flat=True).first()
    if partition_id is None:
        return runs.filter(job_id=job_id)
    return runs.filter(partition_id=partition_id, job_id=job_id)


def runs_for_tenant(
    *,
    tenant_id: int,
    job_id: UUID | None = None,
    status: str | None = None,
    scheduled_after: datetime | None = None,
    scheduled_before: datetime | None = None,
) -> QuerySet[JobRun]:
    """A tenant's runs, newest first. `scheduled_after` is inclusive, `scheduled_before`
    exclusive, so consecutive windows tile without overlap."""
    qs = JobRun.objects.filter(tenant_id=tenant_id)
    if job_id is not None:
        qs = of_job(qs, job_id=job_id)
    if status:
        qs = qs.filter(status=status)
    if scheduled_after is not None:
        qs = qs.filter(scheduled_at__gte=scheduled_after)
    if scheduled_before is not None:
        qs = qs.filter(scheduled_at__lt=scheduled_before)
    return qs.order_by("-scheduled_at", "-id")


def get_run(*, job_id: UUID, scheduled_at: datetime, tenant_id: int | None = None) -> JobRun | None:
    """One run by its key; None when absent or (with tenant_id) another tenant's."""
    qs = of_job(JobRun.objects.filter(scheduled_at=scheduled_at), job_id=job_id)
    if tenant_id is not None:
        qs = qs.filter(tenant_id=tenant_id)
    return qs.first()


# --- attempts beyond max_attempts ----------------------------------------------------


def replayed_after(run: JobRun) -> int | None:
    """How many attempts a replayed run had used when it was last replayed, else None.

    Right after the replay (queued) that is its attempt count; once it ran again, it is
    the attempt that ended it (dead or cancelled) before the replay. Read from the
    attempts history, so no column is needed for it. An entry keeps its attempt number,
    not the attempts used (the history keeps no deferral count); the number stands in
    for them and is never below them, so no expiry that used the attempts up is missed.
    """
    if run.trigger != "replay":
        return None
    if run.status == RunStatus.QUEUED:
        return run.attempt
    final = [
        entry.get("attempt")
        for entry in history(run)
        if isinstance(entry.get("attempt"), int)
        and entry["attempt"] < run.attempt
        and (
            entry.get("outcome") in ("dead", "cancelled")
            or (
                entry.get("outcome") in LEASE_EXPIRED_OUTCOMES
                and used_up(used=entry["attempt"], max_attempts=run.max_attempts)
            )
        )
    ]
    return max(final) if final else max(run.attempt - 1, 0)


def dispatch_note(run: JobRun) -> str | None:
    """What dispatch did to the run's start: 'deferred by tenant rate limit to <instant>'."""
    if run.rate_limited_to is None:
        return None
    return f"deferred by tenant rate limit to {format_utc(run.rate_limited_to)}"


def attempt_note(run: JobRun) -> str | None:
    """Why a run's attempt number can pass max_attempts: 'replayed after 5 attempts'."""
    after = replayed_after(run)
    if after is None:
        return None
    return f"replayed after {after} attempt{'s' if after != 1 else ''}"


# --- operations overview (dashboard and /metrics) ---------------------------------------


@dataclass(frozen=True)
class NodeHealth:
    node_id: str
    hostname: str
    pid: int
    started_at: datetime
    heartbeat_age_seconds: float
    partitions: int
    alive: bool
    owned: frozenset[int] = frozenset()


@dataclass(frozen=True)
class TenantLoad:
    tenant_id: int
    slug: str
    running: int
    waiting: int
    max_concurrency: int


def oldest_due(*, now: datetime) -> tuple[float, int]:
    """(seconds the most overdue unpaused job is late, number of jobs due now).

    In a healthy system only a handful of jobs are due at any moment, so this reads
    the partial due index (`WHERE NOT paused`) and a few rows.
    """
    row = Job.objects.filter(paused=False, next_run_at__lte=now).aggregate(
        oldest=Min("next_run_at"), due=Count("id")
    )
    if row["oldest"] is None:
        return 0.0, 0
    return max(0.0, (now - row["oldest"]).total_seconds()), row["due"]


def _active_counts(*fields: str) -> Counter:
    """Active runs grouped by `fields`, as two queries whose filters match the partial
    indexes exactly (claimable: queued/retrying; running), so neither scans the table."""
    counts: Counter = Counter()
    for statuses in ((RunStatus.QUEUED, RunStatus.RETRYING), (RunStatus.RUNNING,)):
        rows = JobRun.objects.filter(status__in=statuses).values(*fields).annotate(n=Count("id")).order_by()
        for row in rows:
            counts[tuple(row[f] for f in fields)] += row["n"]
    return counts


def queue_depth() -> dict[tuple[int, str], int]:
    """Active runs by (priority, status)."""
    return dict(_active_counts("priority", "status"))


def status_counts(*, since: datetime) -> dict[str, int]:
    """Runs scheduled at or after `since`, by status (the window prunes to the recent
    day partitions instead of counting the whole retained table)."""
    rows = JobRun.objects.filter(scheduled_at__gte=since).values("status").annotate(n=Count("id")).order_by()
    return {row["status"]: row["n"] for row in rows}


def dead_count(*, since: datetime) -> int:
    """Dead runs scheduled since `since` (the partial dead index keeps it small)."""
    return JobRun.objects.filter(status=RunStatus.DEAD, scheduled_at__gte=since).count()


def window_totals(*, since: datetime) -> dict[str, int]:
    """Over runs scheduled at or after `since`, in one pass: dispatched (every run row),
    succeeded, retried (attempts used beyond the first), dead, skipped, cancelled, and
    lease_expiries (attempts entries the reaper recorded as expired)."""
    final = (RunStatus.SUCCEEDED, RunStatus.DEAD, RunStatus.SKIPPED, RunStatus.CANCELLED)
    any_expiry = Q()
    for outcome in LEASE_EXPIRED_OUTCOMES:
        # An entry of either stored shape (runs/attempts.py); an array holding the text
        # anywhere is a candidate, and from_stored below reads its outcome.
        any_expiry |= Q(attempts__contains=[{"outcome": outcome}]) | Q(attempts__contains=[[outcome]])
    row = JobRun.objects.filter(scheduled_at__gte=since).aggregate(
        dispatched=Count("id"),
        retried=Sum(Greatest(orm_used() - Value(1), Value(0))),
        # Only the (rare) runs that had an expiry ship their history back to be counted.
        # Stored entries are enough: only a first-attempt success goes unstored
        # (runs/attempts.history), and it holds no expiry.
        expired_histories=JSONBAgg("attempts", filter=any_expiry, default=Value("[]")),
        **{str(status): Count("id", filter=Q(status=status)) for status in final},
    )
    expiries = sum(
        1
        for attempts in row["expired_histories"] or []
        for entry in map(from_stored, attempts or [])
        if entry is not None and entry["outcome"] in LEASE_EXPIRED_OUTCOMES
    )
    return {
        "dispatched": row["dispatched"],
        "succeeded": row[RunStatus.SUCCEEDED],
        "retried": row["retried"] or 0,
        "dead": row[RunStatus.DEAD],
        "skipped": row[RunStatus.SKIPPED],
        "cancelled": row[RunStatus.CANCELLED],
        "lease_expiries": expiries,
    }


def _health(cls, node, **derived):
    """A node row (alive annotated) as `cls`: each field read from the row's same-named
    attribute unless `derived` gives it."""
    values = {f.name: getattr(node, f.name) for f in dataclass_fields(cls) if f.name not in derived}
    return cls(**values, **derived)


def scheduler_nodes() -> list[NodeHealth]:
    """Scheduler nodes with their liveness as scheduler_project.liveness decides it."""
    return [
        _health(
            NodeHealth,
            node,
            partitions=len(node.partitions or []),
            owned=frozenset(int(p) for p in node.partitions or []),
        )
        for node in liveness.with_alive(SchedulerNode.objects.order_by("node_id"))
    ]


@dataclass(frozen=True)
class ExecutorHealth:
    node_id: str
    hostname: str
    pid: int
    heartbeat_age_seconds: float
    concurrency: int
    in_flight: int
    last_claim_at: datetime | None
    alive: bool


def executor_nodes() -> list[ExecutorHealth]:
    """Registered executors (runs/execution/nodes.py), alive by the same rule as the schedulers."""
    return [
        _health(ExecutorHealth, node)
        for node in liveness.with_alive(ExecutorNode.objects.order_by("node_id"))
    ]


def unowned_partitions(*, nodes: list[NodeHealth], total: int) -> int:
    """Partitions no live node claims (a node's list is what it last heartbeated)."""
    owned: set[int] = set()
    for node in nodes:
        if node.alive:
            owned |= node.owned
    return max(0, total - len(owned))


def tenant_load(*, limit: int = 100) -> list[TenantLoad]:
    """Tenants with active runs: running vs max_concurrency, and how many wait."""
    by_tenant: Counter = Counter()
    waiting: Counter = Counter()
    for (tenant_id, status), n in _active_counts("tenant_id", "status").items():
        (by_tenant if status == RunStatus.RUNNING else waiting)[tenant_id] += n
    ids = set(by_tenant) | set(waiting)
    tenants = {t.id: t for t in Tenant.objects.filter(id__in=ids)}
    loads = [
        TenantLoad(
            tenant_id=tid,
            slug=tenants[tid].slug if tid in tenants else f"#{tid}",
            running=by_tenant[tid],
            waiting=waiting[tid],
            max_concurrency=tenants[tid].max_concurrency if tid in tenants else 0,
        )
        for tid in ids
    ]
    loads.sort(key=lambda t: (-t.running, -t.waiting, t.slug))
    return loads[:limit]


def recent_changes(*, limit: int = 20) -> QuerySet:
    """The newest audit entries: every change to jobs and runs, from the API, the console
    and the scheduler alike (jobs.audit.record writes them all)."""
    return AuditEntry.objects.select_related("tenant").order_by("-id")[:limit]


def open_circuits(*, limit: int = 100) -> list[TargetHost]:
    """Circuit breakers (one per tenant and target host) that are open or half-open
    (probing), longest open first, each with its tenant's `tenant_slug`."""
    circuits = list(
        TargetHost.objects.exclude(state="closed").order_by("opened_at", "tenant_id", "host")[:limit]
    )
    slugs = dict(Tenant.objects.filter(id__in={c.tenant_id for c in circuits}).values_list("id", "slug"))
    for circuit in circuits:
        circuit.tenant_slug = slugs.get(circuit.tenant_id, f"#{circuit.tenant_id}")
    return circuits


def tenant_slugs(*, limit: int) -> list[str]:
    """The first `limit` tenant slugs, in order: the label values of per-tenant gauges."""
    return [slug for slug, _ in _tenants_shown(limit=limit)]


def _tenants_shown(*, limit: int) -> list[tuple[str, int]]:
    return list(Tenant.objects.order_by("slug").values_list("slug", "id")[:limit])


def tenant_last_success(*, limit: int) -> list[tuple[str, float]]:
    """(slug, Unix seconds of the newest success of its runs) of the tenants tenant_slugs
    names; 0 for a tenant none of whose runs has succeeded since the executors keep it
    (runs/counters.py, `tenant_successes`). Reads the per-process rows, never the runs."""
    with connection.cursor() as cursor:
        newest = counters.last_successes(cursor)
    return [
        (slug, newest[tenant_id].timestamp() if tenant_id in newest else 0.0)
        for slug, tenant_id in _tenants_shown(limit=limit)
    ]


def counter_totals() -> dict[tuple[str, str], int]:
    """Every Prometheus counter's total per label (runs/counters.py)."""
    with connection.cursor() as cursor:
        return counters.totals(cursor)
