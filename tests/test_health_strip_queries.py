"""The status strip's counts and a job's health figures are index reads: EXPLAIN of each
statement they run, with sequential scans priced out (`enable_seqscan = off` leaves a
sequential scan only where no index can answer), reads no table of jobs or runs
sequentially. Tiny tables get sequential scans by choice; this asks whether an index
exists for each predicate (jobs/migrations/0015 and the older ones its docstring names)."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib import admin
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.test import RequestFactory
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobs import health, services
from jobs.models import Job
from jobs.tenant_services import create_tenant
from runs.admin.health_strip import strip
from scheduler_project.citus import citus_installed
from tests.support import job_health

HOOK = {"type": "http", "url": "https://example.com/hook"}


def plans(queries: list[dict]) -> list[str]:
    found = []
    with transaction.atomic(), connection.cursor() as cursor:
        if citus_installed(cursor):
            # The shards' plans are the workers': the setting must reach them too.
            cursor.execute("SET LOCAL citus.propagate_set_commands = 'local'")
        cursor.execute("SET LOCAL enable_seqscan = off")
        for query in queries:
            if not query["sql"].lstrip().upper().startswith("SELECT"):
                continue
            cursor.execute("EXPLAIN " + query["sql"])
            found.append("\n".join(row[0] for row in cursor.fetchall()))
    return found


def sequential(plan: str) -> list[str]:
    return [line.strip() for line in plan.splitlines() if "Seq Scan on job" in line]


@pytest.fixture
def acme(transactional_db):
    # Committed rows: on Citus, a test-wide transaction that writes the tenants
    # reference table and then the distributed jobs cannot check its foreign keys.
    return create_tenant(slug="acme")[0]


@pytest.fixture
def request_of_staff(transactional_db):
    user = User.objects.create_superuser("boss", password="x")
    request = RequestFactory().get("/admin/", {"tenant": "acme"})
    request.user = user
    return request


@pytest.mark.parametrize("narrowed", [False, True])
def test_strip_counts_read_indexes_only(acme, request_of_staff, narrowed):
    job = services.create_job(tenant=acme, fields=dict(name="j", interval_seconds=60, target=HOOK))
    job_health.seed(job)
    request = request_of_staff
    if not narrowed:
        request.GET = request.GET.copy()
        request.GET.pop("tenant")
    with CaptureQueriesContext(connection) as captured:
        shown = strip(request, admin_site=admin.site, now=timezone.now())
    assert [c.key for c in shown.counts] == ["failing", "dead", "overdue", "paused"]
    counts = [q for q in captured.captured_queries if "COUNT(" in q["sql"].upper()]
    assert len(counts) == 4
    for plan in plans(counts):
        assert sequential(plan) == [], plan


def test_job_health_reads_the_jobs_runs_by_index(acme):
    job = services.create_job(tenant=acme, fields=dict(name="j", interval_seconds=60, target=HOOK))
    job_health.seed(job)
    job = Job.objects.get(pk=job.pk)
    with CaptureQueriesContext(connection) as captured:
        figures = health.job_health(job, now=timezone.now())
    assert figures.last_7d.slots > 0
    found = plans(captured.captured_queries)
    assert found
    for plan in found:
        assert sequential(plan) == [], plan
    # The runs' aggregate reaches only the day partitions of the last week (and the default).
    aggregate = next(p for p in found if "percentile_cont" in p or "Aggregate" in p)
    week = {(timezone.now() - timedelta(days=d)).strftime("%Y%m%d") for d in range(9)}
    # Day partitions are job_runs_pYYYYMMDD (a shard's name adds _<shard id> on Citus).
    scanned = set(re.findall(r" on job_runs_(default|p\d{8})", aggregate))
    assert scanned and all(name == "default" or name[1:] in week for name in scanned), scanned


def test_an_unknown_tenant_is_said_not_silently_widened(admin_client, acme):
    page = admin_client.get("/admin/", {"tenant": "nope"}).content.decode()
    assert "No tenant is named “nope”: the counts are for all tenants." in page
    assert 'data-strip-tenant="' not in page
    known = admin_client.get("/admin/", {"tenant": "acme"}).content.decode()
    assert 'data-strip-tenant="acme"' in known and "No tenant is named" not in known


def test_the_tenant_menu_becomes_a_text_box_past_its_cap(admin_client, acme, monkeypatch):
    from runs.admin import health_strip

    page = admin_client.get("/admin/").content.decode()
    assert '<option value="acme"' in page
    create_tenant(slug="zeta")
    monkeypatch.setattr(health_strip, "TENANT_MENU_CAP", 1)
    page = admin_client.get("/admin/").content.decode()
    assert '<option value="acme"' not in page
    assert 'type="text" name="tenant" id="strip-tenant"' in page
