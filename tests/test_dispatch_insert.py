"""The dispatch insert's overlap read (runs/enqueue.py) on plain PostgreSQL plans and reads
the day partitions from the lowest open floor of the batch's tenants on
(runs/open_floors.py), not every day of the retention; it still sees an old open run,
whose insert lowered the floor, also when that insert commits between the floor's read
and the dispatch insert."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, transaction

from jobs.dispatch.planning import run_for
from jobs.tenant_services import create_tenant
from runs import enqueue, open_floors
from runs.day_partitions import maintain, partition_name
from scheduler_project.citus import citus_installed
from scheduler_project.db import raw_cursor
from tests.support.plans import job_runs_reads
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


def _job_runs_in(node: dict, *, scanned: bool) -> set[str]:
    """The job_runs partitions in the plan (those not pruned while planning), or only those
    it read (not pruned when it ran either)."""
    return {
        read["Relation Name"]
        for read in job_runs_reads(node)
        if not scanned or read.get("Actual Loops", 0) > 0
    }


def _overlap_read(runs) -> tuple[set[str], set[str]]:
    """The job_runs partitions the insert planned, and those it read, as enqueue_runs runs it."""
    with transaction.atomic(), connection.wrap_database_errors, raw_cursor(connection) as cursor:
        # As in a database whose day partitions hold runs: no sequential scan of them.
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute(open_floors.BATCH_FLOOR, [enqueue._tenants(runs)])
        (floor,) = cursor.fetchone()
        cursor.execute(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + enqueue._INSERT[False],
            enqueue._parameters(runs, citus=False, floor=floor),
        )
        plan = cursor.fetchone()[0][0]["Plan"]
        transaction.set_rollback(True)
    return _job_runs_in(plan, scanned=False), _job_runs_in(plan, scanned=True)


def test_the_overlap_read_starts_at_the_tenants_open_floor(past_days):
    tenant = create_tenant(slug="acme")[0]
    jobs = [make_job(tenant, name=f"j{i}", overlap_policy="skip") for i in range(20)]
    slot = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    runs = [run_for(job, scheduled_at=slot, trigger="schedule") for job in jobs]

    # A new tenant's floor is a day before its creation: no day before yesterday is
    # planned, so none is read.
    planned, scanned = _overlap_read(runs)
    assert scanned and not planned & set(past_days), planned

    # An old run opened (a backfill four days back) lowers the floor: its day is read,
    # and the job's next slot is skipped behind it.
    old = slot.replace(hour=0) - timedelta(days=4)
    enqueue.enqueue_runs([run_for(jobs[0], scheduled_at=old, trigger="backfill", overlap_check=False)])
    planned, scanned = _overlap_read(runs)
    assert partition_name(old.date()) in scanned
    assert not planned & set(past_days[: PAST_DAYS - 4])
    with transaction.atomic():
        inserted = {run.job_id: run.status for run in enqueue.enqueue_runs(runs)}
    assert inserted[jobs[0].id] == "skipped"
    assert set(inserted.values()) == {"skipped", "queued"} and len(inserted) == len(jobs)


def _backfill_elsewhere(job, slot) -> None:
    """A backfill of `slot` committed by another session: Django gives the thread its own
    connection, and enqueue_runs lowers the tenant's floor in the run's transaction."""

    def backfill() -> None:
        try:
            with transaction.atomic():
                enqueue.enqueue_runs(
                    [run_for(job, scheduled_at=slot, trigger="backfill", overlap_check=False)]
                )
        finally:
            connection.close()

    thread = threading.Thread(target=backfill)
    thread.start()
    thread.join()


class _OldRunOpenedAfterTheFloorsRead:
    """A cursor that, right after the batch's floor is read, lets another session open an
    old run of `job` and commit."""

    def __init__(self, cursor, job, slot):
        self.cursor, self.job, self.slot = cursor, job, slot

    def execute(self, sql, params=None, **kwargs):
        result = self.cursor.execute(sql, params, **kwargs)
        if sql == open_floors.BATCH_FLOOR:
            _backfill_elsewhere(self.job, self.slot)
        return result

    def __getattr__(self, name):
        return getattr(self.cursor, name)


def test_an_old_run_opened_after_the_floor_was_read_is_still_counted(past_days):
    tenant = create_tenant(slug="late-old-run")[0]
    jobs = [make_job(tenant, name=f"j{i}", overlap_policy="skip") for i in range(3)]
    slot = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    runs = [run_for(job, scheduled_at=slot, trigger="schedule") for job in jobs]
    old = slot.replace(hour=0) - timedelta(days=4)

    # The floor read first is the tenant's recent one; the old run is below it. An insert
    # that trusted it would not see that run, and would queue the job's next slot.
    with transaction.atomic(), connection.wrap_database_errors, raw_cursor(connection) as cursor:
        inserted = enqueue._insert(_OldRunOpenedAfterTheFloorsRead(cursor, jobs[0], old), runs, citus=False)
    statuses = {job_id: status for _, job_id, _, status in inserted}
    assert statuses == {jobs[0].id: "skipped", jobs[1].id: "queued", jobs[2].id: "queued"}
