"""Helpers for executor tests: queue runs straight into job_runs, start executors, wait."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from jobs.models import JobTarget
from jobs.services import partition_for
from runs.enqueue import enqueue_runs, notify_executors
from runs.execution.executor import Executor
from runs.models import JobRun, JobRunRow
from runs.rows import NewRun


def queue_runs(
    tenant,
    target: dict,
    *,
    count: int = 1,
    job_id: uuid.UUID | None = None,
    spacing: timedelta = timedelta(seconds=1),
    start: datetime | None = None,
    job_name: str = "test job",
    **fields,
) -> list[tuple[uuid.UUID, datetime]]:
    """Queue `count` runs straight into job_runs (no jobs row: runs carry the policies,
    and their target is a job_targets version written here).

    With job_id given all runs belong to that job, `spacing` apart; otherwise each run
    gets its own job id, so overlap policies do not come into play. Each run is in its
    job's partition, as the scheduler would put it: runs of different jobs are spread
    over partitions, so every claim test also exercises claiming across partitions.
    """
    start = start or datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=5)
    job_ids = [job_id or uuid.uuid4() for _ in range(count)]
    versions = target_versions(set(job_ids), target)
    runs = [
        NewRun(
            job_id=job_ids[i],
            scheduled_at=start + i * spacing,
            tenant_id=tenant.id,
            partition_id=partition_for(job_ids[i]),
            target_version=versions[job_ids[i]],
            job_name=job_name,
            overlap_check=False,
            **fields,
        )
        for i in range(count)
    ]
    inserted = enqueue_runs(runs)
    notify_executors()
    # In scheduled_at order, as queued: RETURNING promises no order (a merge join on
    # job_id in the insert's plan returns the rows shuffled), and tests compare the
    # keys' order with the order runs started in.
    return sorted(((r.job_id, r.scheduled_at) for r in inserted), key=lambda key: key[1])


def target_versions(job_ids: set[uuid.UUID], target: dict) -> dict[uuid.UUID, int]:
    """Each job's version of `target` in job_targets: the one it has, or a new one after
    its newest (a test may queue runs of one job with another target later)."""
    rows = JobTarget.objects.filter(job_id__in=job_ids).values_list("job_id", "version", "target")
    newest: dict[uuid.UUID, int] = {}
    found: dict[uuid.UUID, int] = {}
    for job_id, version, stored in rows:
        newest[job_id] = max(version, newest.get(job_id, 0))
        if stored == target:
            found[job_id] = version
    new = [
        JobTarget(partition_id=partition_for(j), job_id=j, version=newest.get(j, 0) + 1, target=target)
        for j in job_ids
        if j not in found
    ]
    JobTarget.objects.bulk_create(new, batch_size=2000)
    return {**found, **{t.job_id: t.version for t in new}}


def row(key: tuple[uuid.UUID, datetime]) -> JobRun:
    return JobRun.objects.get(job_id=key[0], scheduled_at=key[1])


def wait_for(predicate: Callable[[], object], *, timeout: float = 20, interval: float = 0.05, what: str = ""):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")


def wait_status(key, statuses: str | tuple[str, ...], timeout: float = 20) -> JobRun:
    statuses = (statuses,) if isinstance(statuses, str) else statuses

    def check():
        run = row(key)
        return run if run.status in statuses else None

    return wait_for(check, timeout=timeout, what=f"run {key} to be {statuses}")


def wait_log(processes, proc, text: str, timeout: float = 20) -> str:
    return wait_for(
        lambda: text in processes.log_of(proc) and processes.log_of(proc), timeout=timeout, what=text
    )


def http_spec(url: str, **extra) -> dict:
    return {"type": "http", "url": url, "method": "POST", "timeout_seconds": 30, **extra}


def task_target(name: str, **kwargs) -> dict:
    return {"type": "task", "name": name, "kwargs": kwargs}


def set_running(key, *, attempt: int = 1, lease: timedelta = timedelta(seconds=30), owner: str = "ghost:1"):
    """Make a run look claimed by `owner`; a negative `lease` makes an orphan whose
    owner stopped heartbeating."""
    now = datetime.now(UTC)
    JobRunRow.objects.filter(job_id=key[0], scheduled_at=key[1]).update(
        status="running", attempt=attempt, owner=owner, started_at=now, lease_until=now + lease
    )


def on_executor_connection(work):
    """Run `work(conn)` on an executor-style psycopg AsyncConnection (needs transactional_db:
    it is another session, it sees only committed rows)."""
    from runs.execution import connections

    async def go():
        conn = await connections.connect_async(connections.database_conninfo())
        try:
            return await work(conn)
        finally:
            await conn.close()

    return asyncio.run(go())


def claim_now(*, limit: int = 10, owner: str = "test-claimer"):
    from runs.execution import claims

    return on_executor_connection(lambda conn: claims.claim_runs(conn, owner=owner, limit=limit))


def reap_now():
    from runs.execution import run_leases

    return on_executor_connection(run_leases.reap_expired_leases)


def day_partition_of(key: tuple[uuid.UUID, datetime]) -> str:
    """The job_runs partition that holds the run `key`."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tableoid::regclass::text FROM job_runs WHERE job_id = %s AND scheduled_at = %s", list(key)
        )
        return cursor.fetchone()[0]


class Steps:
    """One Executor, opened on a private event loop that runs only inside run()."""

    def __init__(self, **options) -> None:
        from tests.conftest import database_url

        self.runner = asyncio.Runner()
        self.executor = Executor(conninfo=database_url(), allow_private=True, **options)
        self.run(self.executor.open())

    def run(self, awaitable):
        return self.runner.run(awaitable)

    def calls_done(self, timeout: float = 30) -> None:
        """Wait (in the loop) until every call started so far has returned."""
        calls = [e.task for e in self.executor.in_flight() if e.task is not None]
        self.run(asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), timeout))

    def alerts_done(self, timeout: float = 30) -> None:
        """Run the loop until every alert raised so far is delivered or given up."""
        self.run(self.executor.alert_sender.flush(timeout))

    def close(self) -> None:
        try:
            self.run(self.executor.close())
        finally:
            self.runner.close()


def set_turn(task: str, next_at: str | None) -> None:
    """Set when `task`'s next turn begins (an SQL expression), or remove its row (None):
    upkeep_turns has no model, so the database flush between tests leaves its rows
    (runs/execution/turns.py)."""
    from django.db import connection

    with connection.cursor() as cursor:
        if next_at is None:
            cursor.execute("DELETE FROM upkeep_turns WHERE task = %s", [task])
        else:
            cursor.execute(f"UPDATE upkeep_turns SET next_at = {next_at} WHERE task = %s", [task])
