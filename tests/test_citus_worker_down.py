"""One Citus worker down stops only its own partitions' dispatch
(docs/decisions/0073-one-worker-down.md).

A coordinator + 2 workers of the test's own (the shared cluster of `make test-citus`
must never lose a worker), interval jobs spread over partitions on both workers, and
an in-process scheduler stepping while worker1 is crashed (`pg_ctl stop -m immediate`)
and started again. The jobs on worker2 must keep firing on time meanwhile, the jobs on
worker1 get nothing until it is back and then every slot they missed, no slot twice;
the scheduler logs one "unreachable" and one "reachable again" line for worker1. Jobs
of worker2 two days behind (their runs lower the tenant's open floor, a write every
worker must take) wait for worker1 without holding back worker2's other jobs. Its
lease heartbeat runs in its own thread meanwhile, as in production: the healthy jobs
are dispatched only while it stays fresh, so it must touch no worker either.

Skipped outside `make test-citus` (it starts three PostgreSQL nodes).
"""

from __future__ import annotations

import logging
import os
import time
from datetime import UTC, datetime, timedelta

import pytest

from scheduler_project.outage import AWAY, BACK
from tests.support.exactly_once import RUN_FIELDS, audit
from tests.support.private_pg import PrivateCitus
from tests.support.scheduler import bulk_interval_jobs, expected_interval_slots, wait_until

pytestmark = [
    pytest.mark.processes,
    pytest.mark.skipif(not os.environ.get("CRONYARD_CITUS_WORKERS"), reason="a make test-citus test"),
]

JOBS = 60
INTERVAL = 2  # seconds
BEFORE = 8.0  # seconds of dispatch with both workers up
OUTAGE = 15.0  # seconds worker1 stays down
AFTER = 10.0  # seconds of slots after it is back


@pytest.fixture
def cluster(django_db_blocker):
    """The private cluster, migrated, with Django's connection pointed at it for the test."""
    from django.db import connection

    pg = PrivateCitus()
    try:
        url = pg.start()
        env = {k: v for k, v in os.environ.items() if k not in ("TEST_DB_SUFFIX", "CRONYARD_CITUS_WORKERS")}
        pg.migrate({**env, "DJANGO_SETTINGS_MODULE": "scheduler_project.settings"})
        host, port = url.split("@", 1)[1].split("/", 1)[0].rsplit(":", 1)
        saved = dict(connection.settings_dict)
        with django_db_blocker.unblock():
            connection.close()
            connection.settings_dict.update(
                HOST=host, PORT=int(port), NAME=pg.DB, USER="cronyard", PASSWORD=""
            )
            try:
                yield pg, url
            finally:
                connection.close()
                connection.settings_dict.clear()
                connection.settings_dict.update(saved)
    finally:
        pg.destroy()


def run_for(sched, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not sched.step():
            time.sleep(min(sched.idle_seconds(), max(0.0, deadline - time.monotonic())))


def test_the_healthy_workers_jobs_keep_firing_while_one_worker_is_down(cluster, caplog):
    from django.db import connection

    from jobs.dispatch.scheduler import Scheduler
    from jobs.models import Job
    from jobs.tenant_services import create_tenant
    from runs.models import JobRun
    from scheduler_project.citus import Placements

    pg, url = cluster
    caplog.set_level(logging.INFO, logger="scheduler_project.outage")
    down_worker = pg.workers[0]

    # A rate limit below the jobs' 1,800 runs a minute: the dispatch transaction then also
    # counts the tenant's minutes and defers its excess runs (jobs/dispatch/rate_limits.py),
    # statements that must not reach the down worker either.
    tenant, _ = create_tenant(slug="worker-down", max_concurrency=100_000, max_runs_per_minute=600)
    start = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=3)
    end = start + timedelta(seconds=BEFORE + OUTAGE + AFTER)
    jobs = bulk_interval_jobs(
        tenant,
        anchors_and_intervals=[
            (start + timedelta(milliseconds=i * 2000 // JOBS), INTERVAL) for i in range(JOBS)
        ],
        end_at=end,
        overlap_policy="allow",
        misfire_policy="catch_up",
        max_catch_up=10_000,
    )
    # Jobs two days behind, paused until worker1 is down: their first runs lower the
    # tenant's open floor, a write of the reference table tenants that needs every worker
    # (runs/open_floors.py). Those on the healthy worker must wait for worker1 without
    # holding back the rest of their worker's batch.
    behind = bulk_interval_jobs(
        tenant,
        anchors_and_intervals=[(start - timedelta(days=2), 86_400)] * 12,
        end_at=end,
        paused=True,
        overlap_policy="allow",
        misfire_policy="catch_up",
        max_catch_up=10,
    )
    with connection.cursor() as cursor:
        nodes = Placements().read(cursor, sorted({j.partition_id for j in jobs + behind}))
    on_down = [j for j in jobs if nodes[j.partition_id] == down_worker]
    healthy = [j for j in jobs if nodes[j.partition_id] != down_worker]
    behind = [j for j in behind if nodes[j.partition_id] != down_worker]
    assert on_down and healthy and behind, nodes

    # Far above the outage: a late slot fires late, it is no misfire.
    sched = Scheduler(
        conninfo=url,
        lease_seconds=5,
        poll_seconds=0.2,
        misfire_threshold_seconds=3600,
        maintain_partitions=False,
    )
    try:
        wait_until(lambda: datetime.now(UTC) >= start, timeout=10)
        run_for(sched, BEFORE)
        pg.stop_node("worker1", immediate=True)
        down_from = datetime.now(UTC)
        # Naming the partitions keeps the update on the healthy worker's shards.
        Job.objects.filter(
            partition_id__in={j.partition_id for j in behind}, id__in=[j.id for j in behind]
        ).update(paused=False)
        run_for(sched, OUTAGE)
        down_until = datetime.now(UTC)
        pg.start_node("worker1")
        run_for(sched, (end - datetime.now(UTC)).total_seconds() + 1)
        expected = expected_interval_slots(jobs + behind, cutoff=end)

        def all_dispatched() -> bool:
            run_for(sched, 1)
            return JobRun.objects.filter(job_id__in=[j.id for j in jobs + behind]).count() >= len(expected)

        wait_until(
            all_dispatched, timeout=30, interval=0, what="every slot dispatched after the worker is back"
        )
    finally:
        sched.close()

    runs = list(
        JobRun.objects.filter(job_id__in=[j.id for j in jobs + behind]).values_list(*RUN_FIELDS, "created_at")
    )
    result = audit([r[:-1] for r in runs], expected=expected, seen=set())
    # No executor runs here: only the dispatch checks of the audit apply.
    assert (result.duplicates, result.missing, result.extra) == ([], [], []), result.counts()

    created = {(r[0], r[1]): r[-1] for r in runs}
    # The slots of the healthy worker's jobs due while worker1 was down (with a second of
    # margin at each end) were dispatched on time, as before the outage.
    window = (down_from + timedelta(seconds=1), down_until - timedelta(seconds=1))
    during = expected_interval_slots(healthy, cutoff=window[1])
    during = {(job, at) for job, at in during if at >= window[0]}
    on_time = {s for s in during if s in created and created[s] - s[1] < timedelta(seconds=2)}
    print(f"healthy worker's slots due during the outage: {len(on_time)} of {len(during)} on time")
    assert len(during) > len(healthy) and len(on_time) / len(during) >= 0.9, (len(on_time), len(during))
    # The down worker's jobs got none meanwhile, and all of theirs after (the audit above).
    down_ids = {j.id for j in on_down}
    meanwhile = [s for s, at in created.items() if s[0] in down_ids and down_from < at < down_until]
    assert meanwhile == []
    # The jobs two days behind, on the healthy worker, got theirs once worker1 was back.
    behind_ids = {j.id for j in behind}
    assert not [s for s, at in created.items() if s[0] in behind_ids and at < down_until]

    messages = [r.getMessage() for r in caplog.records]
    assert len([m for m in messages if AWAY in m and down_worker in m]) == 1, messages
    assert len([m for m in messages if BACK in m and down_worker in m]) == 1, messages
    assert not [m for m in messages if (AWAY in m or BACK in m) and down_worker not in m], messages
