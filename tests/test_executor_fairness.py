"""Fair share across tenants and priority aging, with real executor processes.

Timestamps come from the run rows (started_at, not_before: both the database clock).
"""

from __future__ import annotations

import statistics
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from jobs.tenant_services import create_tenant
from runs.models import JobRun
from tests.support.executor import queue_runs, row, task_target, wait_for, wait_status

pytestmark = pytest.mark.processes


def _running(tenant) -> int:
    return JobRun.objects.filter(tenant_id=tenant.id, status="running").count()


def test_a_quiet_tenant_starts_on_time_beside_a_noisy_tenants_backlog(processes):
    noisy, _ = create_tenant(slug="noisy", max_concurrency=10_000)
    quiet, _ = create_tenant(slug="quiet", max_concurrency=10_000)
    # The backlog's slots are all older than the quiet tenant's: in plain priority,
    # scheduled_at order every one of them would go first.
    backlog_start = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)
    queue_runs(noisy, task_target("sleep", seconds=0.5), count=2000, start=backlog_start)
    processes.start("run_executor", "--concurrency", "32")
    wait_for(lambda: _running(noisy) >= 32, timeout=30, what="the noisy tenant to fill all 32 slots")

    # With the other tenant idle the noisy one keeps every slot busy: fairness costs it nothing.
    samples = []
    for _ in range(20):
        samples.append(_running(noisy))
        time.sleep(0.1)
    assert statistics.median(samples) >= 30, samples

    # The quiet tenant's 20 runs become due 2 s from now, behind ~30 s of backlog.
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        (db_now,) = cursor.fetchone()
    due = db_now + timedelta(seconds=2)
    keys = queue_runs(quiet, task_target("noop"), count=20, not_before=due, start=due)
    for key in keys:
        wait_status(key, "succeeded", timeout=60)
    delays = sorted((row(k).started_at - row(k).not_before).total_seconds() for k in keys)
    print(f"quiet tenant start delays after their slot (s): {delays}")
    # p99 of 20 is the worst one.
    assert delays[-1] < 2.0, delays
    # ... and the noisy backlog was far from drained meanwhile: without fair share the
    # quiet runs would have waited for it.
    assert JobRun.objects.filter(tenant_id=noisy.id, status__in=["queued", "retrying"]).count() > 500


def test_a_low_priority_run_ages_past_a_sustained_high_priority_flood(processes, tenant):
    (low,) = queue_runs(tenant, task_target("noop"), priority=0)
    queue_runs(tenant, task_target("sleep", seconds=0.05), count=100, priority=9)
    processes.start("run_executor", "--concurrency", "1", env={"EXECUTOR_PRIORITY_AGING_SECONDS": "2"})
    # Keep the flood coming faster than one slot drains it: priority alone would hold
    # the priority-0 run back for as long as the flood lasts.
    deadline = time.monotonic() + 30
    while row(low).status == "queued" and time.monotonic() < deadline:
        queue_runs(tenant, task_target("sleep", seconds=0.05), count=10, priority=9)
        time.sleep(0.5)
    run = wait_status(low, ("running", "succeeded"), timeout=1)
    waited = (run.started_at - run.not_before).total_seconds()
    print(f"priority-0 run started after {waited:.2f}s")
    assert waited < 2 + 10, waited
    # It overtook priority-9 runs that were due before it started.
    overtaken = JobRun.objects.filter(tenant_id=tenant.id, priority=9, not_before__lt=run.started_at).exclude(
        started_at__lt=run.started_at
    )
    assert overtaken.count() > 0


@pytest.mark.django_db(transaction=True)
def test_claims_interleave_tenants_by_weight_and_keep_order_within_each():
    from tests.support.executor import claim_now

    heavy, _ = create_tenant(slug="heavy", max_concurrency=100, weight=2)
    light, _ = create_tenant(slug="light", max_concurrency=100)
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)
    heavy_keys = queue_runs(heavy, task_target("noop"), count=12, start=start)
    light_keys = queue_runs(light, task_target("noop"), count=12, start=start + timedelta(minutes=30))
    claimed = [run for _ in range(6) for run in claim_now(limit=1)]
    claimed += claim_now(limit=12)
    by_tenant = {heavy.id: [], light.id: []}
    for run in claimed:
        by_tenant[run.tenant_id].append((run.job_id, run.scheduled_at))
    # Weight 2 against 1: two of every three slots; oldest first within each tenant.
    assert len(by_tenant[heavy.id]) == 12 and len(by_tenant[light.id]) == 6
    assert by_tenant[heavy.id] == heavy_keys[:12] and by_tenant[light.id] == light_keys[:6]
    first_six = [run.tenant_id for run in claimed[:6]]
    assert first_six.count(heavy.id) == 4 and first_six.count(light.id) == 2
