"""Tenant dispatch rate limit (max_runs_per_minute): the allocation, Scheduler.step() in-process
on the real database, and what the ledger and run detail say about a deferred run."""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from jobs import tenant_services
from jobs.dispatch.rate_limits import Wanted, allocate, window_of
from jobs.dispatch.scheduler import Scheduler
from jobs.models import Job, Tenant, TenantDispatchWindow
from runs.keys import format_utc
from runs.models import JobRun
from scheduler_project import db
from tests.support.runsapi import make_run
from tests.support.scheduler import bulk_interval_jobs, in_process_schedulers

T = datetime(2026, 5, 4, 10, 0, 5, tzinfo=UTC)
DUE = T - timedelta(seconds=5)
MINUTE = timedelta(minutes=1)


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def make_scheduler():
    yield from in_process_schedulers(at=T)


def herd(tenant: Tenant, n: int, *, due: datetime = DUE, **fields) -> list[Job]:
    """n hourly jobs all due at `due`: one tenant's `0 * * * *` herd."""
    return bulk_interval_jobs(tenant, anchors_and_intervals=[(due, 3600)] * n, **fields)


def drain(sched: Scheduler) -> None:
    for _ in range(100):
        if not sched.step():
            return
    raise AssertionError("the scheduler still had work after 100 steps")


def runs_of(tenant: Tenant) -> list[JobRun]:
    return list(JobRun.objects.filter(tenant=tenant))


def per_minute(runs: list[JobRun]) -> dict[datetime, int]:
    return dict(sorted(Counter(window_of(r.not_before) for r in runs).items()))


# --- the allocation itself (pure) ---------------------------------------------------------


def wanted(n: int, start: datetime, priority: int = 0) -> list[Wanted]:
    return [Wanted(uuid.uuid4(), start, 0, priority, start) for _ in range(n)]


def test_allocate_fills_each_minute_to_the_limit_and_defers_to_minute_starts():
    at = datetime(2026, 12, 3, 9, 0, 20, tzinfo=UTC)
    w0 = window_of(at)
    added, deferred = allocate(wanted(25, at), used={w0: 3, w0 + 2 * MINUTE: 10}, limit=10)
    # 7 fit in the current minute, the next is free, the one after is full, then the rest.
    assert added == {w0: 7, w0 + MINUTE: 10, w0 + 3 * MINUTE: 8}
    assert sorted(Counter(to for _, to in deferred).items()) == [(w0 + MINUTE, 10), (w0 + 3 * MINUTE, 8)]


def test_allocate_gives_the_earlier_minutes_to_higher_priority():
    at = datetime(2026, 12, 3, 9, 0, 0, tzinfo=UTC)
    low, high = wanted(5, at, priority=0), wanted(5, at, priority=9)
    _, deferred = allocate(low + high, used={}, limit=5)
    assert {w.job_id for w, _ in deferred} == {w.job_id for w in low}


# --- Scheduler.step on the real database ----------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_herd_is_spread_over_minutes_and_nothing_is_lost(tenant, make_scheduler):
    tenant_services.set_rate_limit(tenant=tenant, max_runs_per_minute=100)
    jobs = herd(tenant, 450)
    drain(make_scheduler(node_id="n1", batch_size=200))  # three batches share the budget
    runs = runs_of(tenant)
    # Exactly one run per job (nothing dropped, nothing doubled), all queued.
    assert sorted(r.job_id for r in runs) == sorted(j.id for j in jobs)
    assert {r.status for r in runs} == {"queued"}
    base = window_of(min(r.created_at for r in runs))
    assert per_minute(runs) == {base + k * MINUTE: n for k, n in enumerate([100, 100, 100, 100, 50])}
    deferred = [r for r in runs if r.rate_limited_to is not None]
    assert len(deferred) == 350
    assert all(r.rate_limited_to == r.not_before == window_of(r.not_before) for r in deferred)
    # The shared counters say the same as the run rows.
    counted = {
        w.window_start: w.runs
        for w in TenantDispatchWindow.objects.filter(tenant_id=tenant.id, window_start__gte=base)
    }
    assert counted == per_minute(runs)


@pytest.mark.django_db(transaction=True)
def test_another_tenant_in_the_same_batches_is_untouched(tenant, make_scheduler):
    tenant_services.set_rate_limit(tenant=tenant, max_runs_per_minute=10)
    other, _ = tenant_services.create_tenant(slug="other")
    herd(tenant, 60)
    herd(other, 60)
    drain(make_scheduler(node_id="n1"))
    limited, free = runs_of(tenant), runs_of(other)
    assert len(limited) == 60 and len(free) == 60
    assert max(per_minute(limited).values()) == 10
    assert all(r.rate_limited_to is None and r.not_before == r.created_at for r in free)


@pytest.mark.django_db(transaction=True)
def test_a_later_batch_continues_after_the_minutes_already_given(tenant, make_scheduler):
    tenant_services.set_rate_limit(tenant=tenant, max_runs_per_minute=10)
    herd(tenant, 25)
    sched = make_scheduler(node_id="n1")
    drain(sched)
    # More jobs become due later; a second node (its own lease session) dispatches them.
    sched.close()
    herd(tenant, 12, due=T)
    drain(make_scheduler(node_id="n2", clock=lambda: T + timedelta(seconds=1)))
    runs = runs_of(tenant)
    assert len(runs) == 37
    assert max(per_minute(runs).values()) == 10
    base = window_of(min(r.created_at for r in runs))
    assert per_minute(runs) == {base + k * MINUTE: n for k, n in enumerate([10, 10, 10, 7])}


@pytest.mark.django_db(transaction=True)
def test_off_by_default_and_no_statement_for_unlimited_tenants(tenant, make_scheduler):
    assert Tenant.objects.get(pk=tenant.pk).max_runs_per_minute is None
    herd(tenant, 300)
    sched = make_scheduler(node_id="n1")
    with CaptureQueriesContext(connection) as queries:
        drain(sched)
    runs = runs_of(tenant)
    assert len(runs) == 300 and all(r.rate_limited_to is None for r in runs)
    assert all(r.not_before == r.created_at for r in runs)
    assert not [q for q in queries.captured_queries if "tenant_dispatch_windows" in q["sql"]]
    assert not TenantDispatchWindow.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_skipped_runs_take_no_share_of_the_budget(tenant, make_scheduler):
    tenant_services.set_rate_limit(tenant=tenant, max_runs_per_minute=5)
    jobs = herd(tenant, 10, overlap_policy="skip")
    # Half the herd still has a run waiting: their new runs are skipped by the overlap policy.
    for job in jobs[:5]:
        make_run(job, DUE - timedelta(hours=1), not_before=DUE)
    drain(make_scheduler(node_id="n1"))
    new = [r for r in runs_of(tenant) if r.scheduled_at == DUE]
    assert Counter(r.status for r in new) == {"queued": 5, "skipped": 5}
    # The five queued ones fit this minute: a skipped run starts nothing, so takes nothing.
    assert all(r.rate_limited_to is None for r in new)


@pytest.mark.django_db(transaction=True)
def test_the_ledger_and_run_detail_say_the_run_was_deferred(tenant, api, make_scheduler, admin_client):
    tenant_services.set_rate_limit(tenant=tenant, max_runs_per_minute=1)
    # On the database's clock: the ledger speaks for slots inside a job's life only.
    due = db.now().replace(microsecond=0) - timedelta(seconds=5)
    jobs = herd(tenant, 2, due=due)
    Job.objects.filter(id__in=[j.id for j in jobs]).update(created_at=due - MINUTE)
    drain(make_scheduler(node_id="n1", clock=None))
    run = JobRun.objects.filter(tenant=tenant, rate_limited_to__isnull=False).get()
    on_time = JobRun.objects.filter(tenant=tenant, rate_limited_to__isnull=True).get()
    note = f"deferred by tenant rate limit to {format_utc(run.rate_limited_to)}"

    detail = api.get(f"/api/v1/runs/{run.job_id}/{format_utc(run.scheduled_at)}/").json()
    assert detail["dispatch_note"] == note and detail["rate_limited_to"] == format_utc(run.rate_limited_to)
    assert detail["not_before"] == format_utc(run.rate_limited_to)

    def occurrence(job_id) -> dict:
        query = {"from": format_utc(due), "to": format_utc(due + timedelta(seconds=1))}
        return api.get(f"/api/v1/jobs/{job_id}/occurrences", query).json()["results"][0]

    deferred_slot = occurrence(run.job_id)
    assert deferred_slot["outcome"] == "fired" and deferred_slot["reason"] == "rate_limited"
    assert deferred_slot["run"]["dispatch_note"] == note
    plain = occurrence(on_time.job_id)
    assert plain["reason"] is None and plain["run"]["dispatch_note"] is None

    page = admin_client.get(f"/admin/runs/jobrun/{run.pk}/change/").content.decode()
    assert note in page
    job_page = admin_client.get(f"/admin/jobs/job/{run.job_id}/change/").content.decode()
    assert note in job_page


@pytest.mark.django_db(transaction=True)
def test_limits_ride_on_the_due_jobs_read(settings):
    from jobs.dispatch import fencing
    from scheduler_project.db import raw_cursor

    limited, _ = tenant_services.create_tenant(slug="ride", max_runs_per_minute=7)
    free, _ = tenant_services.create_tenant(slug="free")
    herd(limited, 2)
    herd(free, 2)
    with connection.wrap_database_errors:
        rows = fencing.read_due(
            raw_cursor(connection),
            owned=list(range(settings.SCHEDULER_PARTITIONS)),
            now=T,
            cutoff=T - timedelta(hours=1),
            limit=100,
        )
    assert {(r.tenant_id, r.tenant_max_runs_per_minute) for r in rows} == {(limited.id, 7), (free.id, None)}
    assert len(rows) == 4
