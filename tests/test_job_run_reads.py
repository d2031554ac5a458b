"""Every read of one job's runs, on the API and the console, names the job's partition:
the run key's unique index (partition_id, job_id, scheduled_at) serves it, since no
index of job_runs is led by job_id alone any more (runs/migrations/0016: the job index
keeps active runs only). EXPLAIN of each statement, with sequential scans priced out,
must scan job_runs with `partition_id = ...` in its index condition; a read naming only
the job id walks a whole index of every day partition instead."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobs import ledger
from jobs.admin import activity
from jobs.tenant_services import create_tenant
from runs import selectors, services
from scheduler_project.citus import citus_installed
from tests.support.runsapi import make_job, make_run


def job_run_scans(sql: str) -> list[str]:
    """The plan's scans of job_runs and run_history partitions, each with the lines that follow it."""
    with transaction.atomic(), connection.cursor() as cursor:
        if citus_installed(cursor):
            cursor.execute("SET LOCAL citus.propagate_set_commands = 'local'")
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("EXPLAIN " + sql)
        lines = [row[0] for row in cursor.fetchall()]
    return [
        "\n".join(lines[i : i + 3]).strip()
        for i, line in enumerate(lines)
        if (" on job_runs" in line or " on run_history" in line) and "Scan" in line
    ]


@pytest.fixture
def job(transactional_db):
    tenant = create_tenant(slug="acme")[0]
    job = make_job(tenant)
    now = timezone.now().replace(microsecond=0)
    for hours in range(3):
        make_run(job, now - timedelta(hours=hours), status="succeeded", finished_at=now)
    make_run(job, now - timedelta(hours=3), status="dead", finished_at=now)
    return job


def test_reads_of_a_jobs_runs_name_its_partition(job):
    now = timezone.now()
    newest = selectors.runs_for_tenant(tenant_id=job.tenant_id, job_id=job.id).first()
    with CaptureQueriesContext(connection) as captured:
        assert len(list(selectors.runs_for_tenant(tenant_id=job.tenant_id, job_id=job.id))) == 4
        assert selectors.get_run(job_id=job.id, scheduled_at=newest.scheduled_at, tenant_id=job.tenant_id)
        assert len(activity.recent_runs(job=job)) == 4
        assert activity.last_finished(job=job).scheduled_at == newest.scheduled_at
        runs, _ = ledger.occurrences(
            job=job,
            start=now - timedelta(days=1),
            end=now + timedelta(hours=1),
            now=now,
            after=None,
            limit=10,
        )
        assert runs
        dead = newest.scheduled_at - timedelta(hours=3)
        assert services.plan_replay(job_id=job.id, scheduled_at=dead).status == "dead"
    reads = [q["sql"] for q in captured.captured_queries if '"runs"' in q["sql"]]
    assert len(reads) >= 6
    for sql in reads:
        scans = job_run_scans(sql)
        assert scans, sql
        for scan in scans:
            assert "partition_id =" in scan, f"{sql}\n{scan}"
