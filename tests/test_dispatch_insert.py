"""The dispatch insert's overlap read (runs/enqueue.py) on plain PostgreSQL reads the
day partitions from the lowest open floor of the batch's tenants on (runs/open_floors.py),
not every day of the retention; and it still sees an old open run, whose insert lowered
the floor."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, transaction

from jobs.dispatch.planning import run_for
from jobs.tenant_services import create_tenant
from runs import enqueue
from runs.day_partitions import maintain, partition_name
from scheduler_project.citus import citus_installed
from scheduler_project.db import raw_cursor
from tests.support.runsapi import make_job

pytestmark = pytest.mark.django_db(transaction=True)

PAST_DAYS = 6


@pytest.fixture
def past_days():
    """Day partitions for the PAST_DAYS days before yesterday, as a database in use has
    them (a fresh one starts at today); dropped again at the end."""
    with connection.cursor() as cursor:
        if citus_installed(cursor):
            pytest.skip("Citus keeps the join with the batch's partitions (runs/enqueue.py says why)")
    today = datetime.now(UTC).date()
    first = today - timedelta(days=PAST_DAYS + 1)
    created = maintain(days_ahead=PAST_DAYS - 1, retention_days=3650, today=first).created
    yield [partition_name(first + timedelta(days=i)) for i in range(PAST_DAYS)]
    with connection.cursor() as cursor:
        for name in created:
            cursor.execute(f'DROP TABLE IF EXISTS "{name}"')


def _scanned(node: dict) -> set[str]:
    """The job_runs partitions the plan read (not the ones pruned when it ran)."""
    found = set()
    if node["Node Type"] != "ModifyTable" and node.get("Relation Name", "").startswith("job_runs"):
        if node.get("Actual Loops", 0) > 0:
            found.add(node["Relation Name"])
    for child in node.get("Plans", []):
        found |= _scanned(child)
    return found


def _overlap_read(runs) -> set[str]:
    with transaction.atomic(), connection.wrap_database_errors, raw_cursor(connection) as cursor:
        # As in a database whose day partitions hold runs: no sequential scan of them.
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + enqueue._INSERT[False], enqueue._parameters(runs, citus=False)
        )
        plan = cursor.fetchone()[0][0]["Plan"]
        transaction.set_rollback(True)
    return _scanned(plan)


def test_the_overlap_read_starts_at_the_tenants_open_floor(past_days):
    tenant = create_tenant(slug="acme")[0]
    jobs = [make_job(tenant, name=f"j{i}", overlap_policy="skip") for i in range(20)]
    slot = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    runs = [run_for(job, scheduled_at=slot, trigger="schedule") for job in jobs]

    # A new tenant's floor is a day before its creation: no day before yesterday is read.
    scanned = _overlap_read(runs)
    assert scanned and not scanned & set(past_days), scanned

    # An old run opened (a backfill four days back) lowers the floor: its day is read,
    # and the job's next slot is skipped behind it.
    old = slot.replace(hour=0) - timedelta(days=4)
    enqueue.enqueue_runs([run_for(jobs[0], scheduled_at=old, trigger="backfill", overlap_check=False)])
    scanned = _overlap_read(runs)
    assert partition_name(old.date()) in scanned
    assert not scanned & set(past_days[: PAST_DAYS - 4])
    with transaction.atomic():
        inserted = {run.job_id: run.status for run in enqueue.enqueue_runs(runs)}
    assert inserted[jobs[0].id] == "skipped"
    assert set(inserted.values()) == {"skipped", "queued"} and len(inserted) == len(jobs)
