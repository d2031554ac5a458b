"""Helpers for the scheduler tests: jobs with a chosen next_run_at, lease inspection,
expected-slot arithmetic and parsing of the scheduler's per-batch log lines."""

from __future__ import annotations

import re
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.db import connection
from django.db.models import Max

from jobs.dispatch.partition_leases import NAMESPACE
from jobs.models import Job, JobTarget, Misfire, SlotRange, Tenant
from jobs.services import partition_for
from runs.models import JobRun

TARGET = {"type": "task", "name": "noop", "kwargs": {}}


def make_job(tenant: Tenant, *, next_run_at: datetime | None, **fields) -> Job:
    """A job whose next_run_at is set directly (what the scheduler would find after downtime)."""
    fields.setdefault("name", "job")
    fields.setdefault("target", TARGET)
    if not fields.get("interval_seconds") and not fields.get("run_at"):
        fields.setdefault("cron_expr", "* * * * *")
    job = Job(tenant=tenant, **fields)
    job.partition_id = partition_for(job.id)
    job.next_run_at = next_run_at
    # The version first: a running scheduler may dispatch the job the moment it is committed.
    JobTarget.current(job).save(force_insert=True)
    job.save(force_insert=True)
    return job


def bulk_interval_jobs(
    tenant: Tenant, *, anchors_and_intervals: Iterable[tuple[datetime, int]], **fields
) -> list[Job]:
    fields.setdefault("target", TARGET)
    jobs = []
    for i, (anchor, interval) in enumerate(anchors_and_intervals):
        job_id = uuid.uuid4()
        jobs.append(
            Job(
                id=job_id,
                tenant=tenant,
                name=f"j{i}",
                interval_seconds=interval,
                partition_id=partition_for(job_id),
                next_run_at=anchor,
                **fields,
            )
        )
    JobTarget.objects.create_for_new_jobs(jobs, batch_size=2000)
    return Job.objects.bulk_create(jobs, batch_size=2000)


def expected_interval_slots(jobs: Iterable[Job], *, cutoff: datetime) -> set[tuple[uuid.UUID, datetime]]:
    """Every (job, slot) with anchor + k*interval <= cutoff, anchors being the initial next_run_at."""
    out = set()
    for job in jobs:
        step = timedelta(seconds=job.interval_seconds)
        t = job.next_run_at
        while t <= cutoff:
            out.add((job.id, t))
            t += step
    return out


def wait_dispatched(jobs: list[Job], *, cutoff: datetime, timeout: float) -> None:
    """Wait until every slot of `jobs` up to `cutoff` has a run.

    Process tests call this before stopping the schedulers, so that a slot dispatched
    late (a loaded machine, a slower engine, a node that just took over a partition)
    is told apart from a slot lost, which never comes: the exactly-once checks after
    the stop then hold whatever the dispatch lag was.
    """
    expected = expected_interval_slots(jobs, cutoff=cutoff)
    ids = [job.id for job in jobs]

    def missing() -> set[tuple[uuid.UUID, datetime]]:
        rows = JobRun.objects.filter(job_id__in=ids, scheduled_at__lte=cutoff).values_list(
            "job_id", "scheduled_at"
        )
        return expected - set(rows)

    try:
        wait_until(
            lambda: not missing(),
            timeout=timeout,
            interval=0.5,
            what=f"every slot up to {cutoff:%H:%M:%S} dispatched",
        )
    except AssertionError as timed_out:
        raise AssertionError(f"{timed_out}\n{undispatched_report(missing())}") from None


def undispatched_report(missing: set[tuple[uuid.UUID, datetime]]) -> str:
    """What a failed wait needs to tell a lost slot from a late or coalesced one: the
    slots, their jobs' partitions, where each job's schedule stands and its misfires."""
    job_ids = {job_id for job_id, _ in missing}
    jobs = {job.id: job for job in Job.objects.filter(id__in=job_ids)}
    newest = dict(
        JobRun.objects.filter(job_id__in=job_ids)
        .values("job_id")
        .annotate(newest=Max("scheduled_at"))
        .values_list("job_id", "newest")
    )
    partitions = Counter(jobs[j].partition_id for j in job_ids if j in jobs)
    misfires = Counter(Misfire.objects.filter(job_id__in=job_ids).values_list("job_id", flat=True))
    # The occurrence ledger's ranges: slots a plan left unfired on purpose, and why.
    unfired = Counter(SlotRange.objects.filter(job_id__in=job_ids).values_list("job_id", "reason"))
    lines = [
        f"{len(missing)} slot(s) of {len(job_ids)} job(s) have no run; now {datetime.now(UTC):%H:%M:%S.%f}",
        f"partitions: {sorted(partitions.items())}",
    ]
    for job_id, slot in sorted(missing, key=lambda item: item[1])[:10]:
        job = jobs.get(job_id)
        lines.append(
            f"  {job_id} slot {slot:%H:%M:%S.%f}: partition {job and job.partition_id}, "
            f"next_run_at {job and job.next_run_at and f'{job.next_run_at:%H:%M:%S.%f}'}, "
            f"newest run {newest.get(job_id) and f'{newest[job_id]:%H:%M:%S.%f}'}, "
            f"misfires {misfires[job_id]}, "
            f"unfired ranges {sorted((r, n) for (j, r), n in unfired.items() if j == job_id)}"
        )
    lines.append(f"partition leases: {lease_holders(set(partitions))}")
    return "\n".join(lines)


def lease_holders(partitions: set[int]) -> dict[int, str | None]:
    """Which scheduler (its application_name) holds each partition's lease right now."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT l.objid::int, a.application_name FROM pg_locks l
            JOIN pg_stat_activity a ON a.pid = l.pid
            WHERE l.locktype = 'advisory' AND l.classid = %s AND l.objsubid = 2 AND l.granted
              AND l.objid::int = ANY(%s)
            """,
            [NAMESPACE, sorted(partitions)],
        )
        held = dict(cursor.fetchall())
    return {partition: held.get(partition) for partition in sorted(partitions)}


def locks_by_pid(cursor) -> dict[int, set[int]]:
    """Advisory partition locks in the scheduler namespace in this database, per backend pid.

    Partitions are >= 0; the maintenance lock (key -1, held by whichever node runs
    partition maintenance) is not a partition and its holder is not a lease session.
    """
    cursor.execute(
        """
        SELECT pid, objid::int FROM pg_locks
        WHERE locktype = 'advisory' AND classid = %s AND objsubid = 2 AND granted AND objid::int >= 0
          AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
        """,
        [NAMESPACE],
    )
    out: dict[int, set[int]] = {}
    for pid, objid in cursor.fetchall():
        out.setdefault(pid, set()).add(objid)
    return out


def lease_pid_of(cursor, os_pid: int) -> int | None:
    """Backend pid of the lease session of the scheduler process with this OS pid."""
    cursor.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND application_name LIKE %s",
        [f"%:{os_pid}:%"],
    )
    row = cursor.fetchone()
    return row[0] if row else None


def wait_until(
    predicate: Callable[[], object], *, timeout: float, interval: float = 0.2, what: str = ""
) -> object:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(interval)


def wait_drained(count: Callable[[], int], *, stalled_after: float, timeout: float, what: str) -> float:
    """Wait until `count()` is 0 for as long as it keeps falling; seconds it took.

    For a backlog whose size depends on the machine (a chaos test's runs on Citus drain
    at a few dozen a second): a fixed short deadline fails a slow drain, this fails a
    stuck one, a count that has not fallen for `stalled_after` seconds, and one slower
    than `timeout` in all."""
    began = time.monotonic()
    best, best_at = count(), began
    while best:
        time.sleep(0.5)
        now, left = time.monotonic(), count()
        if left < best:
            best, best_at = left, now
        elif now - best_at > stalled_after:
            raise AssertionError(f"{what}: {left} left, none finished in the last {stalled_after:.0f}s")
        if best and now - began > timeout:
            raise AssertionError(f"{what}: {left} left after {timeout:.0f}s")
    return time.monotonic() - began


@dataclass(frozen=True)
class Batch:
    logged_at: datetime
    node: str
    session_pid: int
    generation: int
    db_now: datetime
    inserted: int
    conflicts: int
    stale: int


_BATCH = re.compile(
    r"^(?P<at>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) DEBUG jobs\.dispatch\.scheduler batch node=(?P<node>\S+) "
    r"session_pid=(?P<pid>\d+) generation=(?P<gen>\d+) db_now=(?P<db_now>\S+) .*?"
    r"inserted=(?P<inserted>\d+) conflicts=(?P<conflicts>\d+) .*?stale=(?P<stale>\d+)",
    re.M,
)


def parse_batches(log_text: str) -> list[Batch]:
    out = []
    for m in _BATCH.finditer(log_text):
        out.append(
            Batch(
                logged_at=datetime.strptime(m["at"], "%Y-%m-%d %H:%M:%S,%f"),
                node=m["node"],
                session_pid=int(m["pid"]),
                generation=int(m["gen"]),
                db_now=datetime.fromisoformat(m["db_now"]).astimezone(UTC),
                inserted=int(m["inserted"]),
                conflicts=int(m["conflicts"]),
                stale=int(m["stale"]),
            )
        )
    return out


def duplicates(pairs: Iterable[tuple]) -> list[tuple]:
    return [key for key, n in Counter(pairs).items() if n > 1]


def in_process_schedulers(*, at: datetime):
    """A fixture body: a factory of in-process Schedulers on the test database, their
    clock fixed at `at`, no heartbeat thread or maintenance; all closed afterwards."""
    from jobs.dispatch.scheduler import Scheduler
    from tests.conftest import database_url

    made: list[Scheduler] = []

    def make(**kwargs) -> Scheduler:
        kwargs.setdefault("clock", lambda: at)
        kwargs.setdefault("heartbeat_thread", False)
        kwargs.setdefault("maintain_partitions", False)
        kwargs.setdefault("lease_seconds", 30)
        sched = Scheduler(conninfo=database_url(), **kwargs)
        made.append(sched)
        return sched

    yield make
    for sched in made:
        sched.close()
