"""Two real `run_scheduler` processes dispatch one tenant's herd at the same moment:
the tenant's max_runs_per_minute is one budget for both, and every job still fires once."""

from __future__ import annotations

import os
import signal
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from jobs import tenant_services
from jobs.dispatch.rate_limits import window_of
from jobs.models import TenantDispatchWindow
from runs.models import JobRun
from tests.support.scheduler import bulk_interval_jobs, locks_by_pid, parse_batches, wait_until

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

LEASE = 3
SCHED_ENV = {"SCHEDULER_LEASE_SECONDS": str(LEASE), "LOG_LEVEL": "DEBUG", "SCHEDULER_BATCH_SIZE": "50"}
LIMIT = 40
N_JOBS = 300


def test_two_schedulers_share_one_tenant_budget(tenant, processes):
    tenant_services.set_rate_limit(tenant=tenant, max_runs_per_minute=LIMIT)
    other, _ = tenant_services.create_tenant(slug="other")
    procs = [processes.start("run_scheduler", env=SCHED_ENV) for _ in range(2)]
    with connection.cursor() as cursor:
        wait_until(
            lambda: sorted(len(v) > 100 for v in locks_by_pid(cursor).values()) == [True, True],
            timeout=10 * LEASE,
            what="both schedulers hold a share of the partitions",
        )
    # Both nodes find their half of the herd due at the same instant.
    due = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=2)
    jobs = bulk_interval_jobs(tenant, anchors_and_intervals=[(due, 3600)] * N_JOBS)
    bystanders = bulk_interval_jobs(other, anchors_and_intervals=[(due, 3600)] * 50)
    wait_until(
        lambda: JobRun.objects.count() == N_JOBS + 50, timeout=60, interval=0.5, what="every job dispatched"
    )
    for proc in procs:
        os.kill(proc.pid, signal.SIGTERM)
    for proc in procs:
        assert proc.wait(timeout=20) == 0, processes.log_of(proc)[-2000:]

    runs = list(JobRun.objects.filter(tenant=tenant))
    # Exactly once: one run per job, none lost.
    assert sorted(r.job_id for r in runs) == sorted(j.id for j in jobs)
    minutes = Counter(window_of(r.not_before) for r in runs)
    print(f"runs per minute: {sorted((format(m, '%H:%M'), n) for m, n in minutes.items())}")
    assert max(minutes.values()) <= LIMIT
    # Spread without holes: the herd takes ceil(N / LIMIT) minutes, or one more if its
    # dispatch straddled a minute boundary.
    assert len(minutes) in (-(-N_JOBS // LIMIT), -(-N_JOBS // LIMIT) + 1)
    first = min(minutes)
    assert all(first + k * timedelta(minutes=1) in minutes for k in range(len(minutes)))
    counted = {
        w.window_start: w.runs
        for w in TenantDispatchWindow.objects.filter(tenant_id=tenant.id, window_start__gte=first)
    }
    assert counted == dict(minutes)
    # Both schedulers dispatched (so both spent the one budget); the other tenant was not held back.
    batches = [b for proc in procs for b in parse_batches(processes.log_of(proc)) if b.inserted]
    assert len({b.node for b in batches}) == 2
    free = JobRun.objects.filter(tenant=other)
    assert free.count() == len(bystanders)
    assert all(r.rate_limited_to is None and r.not_before == r.created_at for r in free)
