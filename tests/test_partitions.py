"""job_runs and run_history day partitions: created ahead, rows rescued from the default partition,
old days dropped for retention."""

import re
import time
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from django.db import connection

from jobs.dispatch.planning import run_for
from jobs.services import create_job
from runs.day_partitions import HISTORY, MAINTAINER_LOCK, maintain, partition_name
from runs.enqueue import enqueue_runs
from runs.models import JobRun, JobRunRow
from scheduler_project import db
from scheduler_project.citus import citus_installed
from tests.support.runsapi import make_run

pytestmark = pytest.mark.django_db


def partition_of(job_id, scheduled_at, *, table: str = "job_runs") -> str:
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT tableoid::regclass::text FROM {table} WHERE job_id = %s AND scheduled_at = %s",
            [job_id, scheduled_at],
        )
        # On Citus the row's table is a shard of the partition: "<partition>_<shard id>".
        return re.sub(r"_\d+$", "", cursor.fetchone()[0])


def make_job(tenant):
    return create_job(
        tenant=tenant, fields=dict(name="p", interval_seconds=60, target={"type": "task", "name": "noop"})
    )


def test_migration_created_today_and_a_week_ahead():
    # The day the migration ran: the test database is made before the tests, so on a run
    # across midnight UTC that was yesterday, and today's week ahead has one day more.
    today = datetime.now(UTC).date()
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass(%s)", [partition_name(today + timedelta(days=7))])
        migrated = today if cursor.fetchone()[0] else today - timedelta(days=1)
    report = maintain(days_ahead=7, retention_days=30, today=migrated)
    assert report.created == []  # the migration already made them
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT to_regclass(%s), to_regclass(%s)",
            [partition_name(migrated), partition_name(migrated + timedelta(days=7))],
        )
        assert all(cursor.fetchone())


def test_rows_in_default_move_into_the_new_day(tenant):
    job = make_job(tenant)
    far = datetime.now(UTC).replace(microsecond=0) + timedelta(days=12)
    enqueue_runs([run_for(job, scheduled_at=far, trigger="backfill", overlap_check=False)])
    assert partition_of(job.id, far) == "job_runs_default"

    report = maintain(days_ahead=12, retention_days=30)

    assert partition_name(far.date()) in report.created
    assert report.moved_rows == 1
    assert partition_of(job.id, far) == partition_name(far.date())
    # The unique key still holds across the moved row: a second insert is a no-op.
    assert enqueue_runs([run_for(job, scheduled_at=far, trigger="backfill", overlap_check=False)]) == []


def test_successes_in_the_history_default_move_into_the_new_day(tenant):
    """run_history's default partition keeps the columns runs 0024 dropped from its parent;
    its rows move into a new day all the same, and read as before."""
    job = make_job(tenant)
    far = datetime.now(UTC).replace(microsecond=0) + timedelta(days=12)
    make_run(job, far, status="succeeded", trigger="manual", attempt=1)
    assert partition_of(job.id, far, table="run_history") == "run_history_default"

    report = maintain(days_ahead=12, retention_days=30)

    assert partition_name(far.date(), HISTORY) in report.created
    assert partition_of(job.id, far, table="run_history") == partition_name(far.date(), HISTORY)
    run = JobRun.objects.get(job_id=job.id, scheduled_at=far)
    assert (run.status, run.trigger, run.attempt) == ("succeeded", "manual", 1)


def deduplicating(table: str) -> list[tuple[str, bool]]:
    """(index columns and predicate, whether B-tree deduplication is on) per index of a table."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT regexp_replace(pg_get_indexdef(i.indexrelid), '^.* USING btree ', ''),
                   coalesce(c.reloptions, '{}')
            FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
            WHERE i.indrelid = %s::regclass
            """,
            [table],
        )
        return [
            (re.sub(r" WITH \([^)]*\)", "", d), "deduplicate_items=off" not in o)
            for d, o in cursor.fetchall()
        ]


def test_new_day_partitions_keep_one_index_entry_per_run_version(tenant):
    """The indexes the executor walks do not deduplicate (runs migration 0011), in a day
    the maintainer creates afresh and in one it attaches after moving rows in; the others
    do. A partition created without the parent's storage parameters would bring back the
    posting lists that kept claimed runs in every probe's way."""
    job = make_job(tenant)
    far = datetime.now(UTC).replace(microsecond=0) + timedelta(days=12)
    enqueue_runs([run_for(job, scheduled_at=far, trigger="backfill", overlap_check=False)])
    report = maintain(days_ahead=13, retention_days=30)
    attached, fresh = partition_name(far.date()), partition_name(far.date() + timedelta(days=1))
    assert report.moved_rows == 1 and {attached, fresh} <= set(report.created)

    executor_walks = {
        "(tenant_id, priority DESC, scheduled_at) WHERE ((status)::text = ANY",
        "(tenant_id, not_before) WHERE ((status)::text = ANY",
        "(tenant_id, lease_until) WHERE ((status)::text = 'running'::text)",
        "(job_id) WHERE ((status)::text = ANY",
    }
    with connection.cursor() as cursor:
        citus = citus_installed(cursor)
    if citus:  # the per-partition claim index (runs migration 0021)
        executor_walks.add(
            "(partition_id, tenant_id, priority DESC, scheduled_at) WHERE ((status)::text = ANY"
        )
    for table in ("job_runs", attached, fresh):
        indexes = deduplicating(table)
        for prefix in executor_walks:
            matching = [on for d, on in indexes if d.startswith(prefix)]
            assert matching == [False], (table, prefix, indexes)
        others = [on for d, on in indexes if not any(d.startswith(p) for p in executor_walks)]
        assert others and all(others), (table, indexes)
    if citus:
        with connection.cursor() as cursor:
            # On Citus the probes run in the shards. This test's own days are not committed,
            # so the workers' sessions cannot see them: today's shards (committed by the
            # migrations) carry the parameter, as the migration made them.
            count_off = (
                "SELECT count(*) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
                " WHERE i.indrelid = '%s'::regclass AND 'deduplicate_items=off' = ANY(c.reloptions)"
            )
            today = partition_name(datetime.now(UTC).date())
            cursor.execute("SELECT success, result FROM run_command_on_shards(%s, %s)", (today, count_off))
            shards = cursor.fetchall()
            assert shards and all(shard == (True, str(len(executor_walks))) for shard in shards), shards


def test_retention_drops_old_days_and_old_default_rows(tenant):
    job = make_job(tenant)
    today = datetime.now(UTC).date()
    old = datetime(today.year, today.month, today.day, tzinfo=UTC) - timedelta(days=45)
    enqueue_runs([run_for(job, scheduled_at=old, trigger="backfill", overlap_check=False)])
    assert partition_of(job.id, old) == "job_runs_default"
    JobRunRow.objects.filter(job_id=job.id).update(status="succeeded")  # final: retention may drop it

    later = today + timedelta(days=31)
    report = maintain(days_ahead=0, retention_days=30, today=later)

    assert partition_name(today) in report.dropped
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM job_runs WHERE job_id = %s", [job.id])
        assert cursor.fetchone()[0] == 0


def test_retention_applies_to_the_ledger_ranges(tenant):
    from jobs.dispatch.planning import skipped_range
    from jobs.models import SlotRange, SlotReason

    job = make_job(tenant)
    today = datetime.now(UTC).date()
    midnight = datetime(today.year, today.month, today.day, tzinfo=UTC)
    old = skipped_range(
        job, first=midnight - timedelta(days=50), last=midnight - timedelta(days=40), reason=SlotReason.PAUSED
    )
    recent = skipped_range(
        job, first=midnight - timedelta(days=40), last=midnight - timedelta(days=20), reason=SlotReason.PAUSED
    )
    SlotRange.objects.bulk_create([old, recent])
    maintain(days_ahead=0, retention_days=30)
    assert list(SlotRange.objects.filter(job=job).values_list("last_at", flat=True)) == [recent.last_at]


def test_a_maintainer_that_finds_another_at_work_skips_instead_of_queueing():
    """The scheduler asks for maintenance every hour on every node: with `wait=False` a
    node that finds another maintainer at work skips at once (nodes that start together
    do not queue behind each other), and the next call, once the lock is free, runs."""
    other = psycopg.connect(db.conninfo(connection.settings_dict), autocommit=True)
    try:
        other.execute("BEGIN")
        other.execute(f"SELECT pg_advisory_xact_lock(hashtext('{MAINTAINER_LOCK}'))")
        started = time.monotonic()
        report = maintain(days_ahead=9, retention_days=30, wait=False)
        assert report.skipped and report.created == []
        assert time.monotonic() - started < 30, "a skipping maintainer must not wait for the lock"
        other.execute("COMMIT")
    finally:
        other.close()
    report = maintain(days_ahead=9, retention_days=30, wait=False)
    assert not report.skipped
    assert partition_name(datetime.now(UTC).date() + timedelta(days=9)) in report.created
