"""One schema for plain PostgreSQL and Citus: every key of jobs and of the
tables hanging off a job holds partition_id (and starts with it, but for job_runs'
primary key, led by the run id the console looks runs up by), the run key still forbids
a second run of a slot, and Django's save() never rewrites partition_id. On a database
with the citus extension (make test-citus) the tables are also distributed and
co-located."""

import inspect
import re
from datetime import UTC, datetime, timedelta

import pytest
from django.db import IntegrityError, connection, models, transaction
from django.test.utils import CaptureQueriesContext

from jobs.dispatch.planning import run_for
from jobs.models import Job
from jobs.services import create_job, pause_job
from runs.enqueue import enqueue_runs
from runs.models import JobRun, JobRunRow
from scheduler_project.citus import citus_installed
from scheduler_project.sharding import PartitionKeyed

pytestmark = pytest.mark.django_db

JOB_TABLES = ("jobs", "job_runs", "job_misfires", "job_slot_ranges")


def keys_of(table: str, *, referencing: tuple[str, ...] = JOB_TABLES) -> dict[str, tuple[str, list[str]]]:
    """name -> (contype, columns) of the table's primary and unique keys and its foreign
    keys to `referencing` (a key to the reference table tenants needs no partition_id)."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT c.conname, c.contype, array_agg(a.attname::text ORDER BY k.ord)
            FROM pg_constraint c
            CROSS JOIN LATERAL unnest(c.conkey) WITH ORDINALITY AS k(attnum, ord)
            JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.attnum
            WHERE c.conrelid = %s::regclass
              AND (c.contype IN ('p', 'u') OR (c.contype = 'f' AND c.confrelid::regclass::text = ANY(%s)))
            GROUP BY c.conname, c.contype
            """,
            [table, list(referencing)],
        )
        return {name: (kind, list(cols)) for name, kind, cols in cursor.fetchall()}


def make_job(tenant, **fields) -> Job:
    return create_job(
        tenant=tenant,
        fields=dict(name="k", interval_seconds=60, target={"type": "task", "name": "noop"}, **fields),
    )


def test_the_keys_of_jobs_and_runs_are_the_citus_ones():
    assert keys_of("jobs")["jobs_pkey"] == ("p", ["partition_id", "id"])
    runs = keys_of("job_runs")
    assert runs["job_runs_pkey"] == ("p", ["id", "scheduled_at", "partition_id"])
    assert runs["job_runs_job_scheduled_uniq"] == ("u", ["partition_id", "job_id", "scheduled_at"])
    # A success's row is keyed by its run key alone, which is also its replica identity (a
    # Citus shard move replicates deletes by it); the console reads it by an index on id.
    assert keys_of("run_history") == {"run_history_pkey": ("p", ["partition_id", "job_id", "scheduled_at"])}


@pytest.mark.parametrize("table", ["job_misfires", "job_slot_ranges"])
def test_a_jobs_satellites_are_keyed_and_referenced_by_partition(table):
    keys = keys_of(table)
    assert keys[f"{table}_pkey"] == ("p", ["partition_id", "id"])
    assert keys[f"{table}_job_fk"] == ("f", ["partition_id", "job_id"])


@pytest.mark.parametrize("table", JOB_TABLES)
def test_no_key_of_a_job_table_lacks_partition_id(table):
    # Citus refuses such a key on a distributed table; the schema must not grow one. It
    # leads every key but job_runs' primary key, which the console's lookups by id need
    # led by the id (Citus takes the column anywhere in a key).
    keys = keys_of(table)
    assert all("partition_id" in cols for _, cols in keys.values()), keys
    led = [cols[0] for name, (_, cols) in keys.items() if name != "job_runs_pkey"]
    assert set(led) == {"partition_id"}, keys


def test_the_consoles_run_list_reads_the_newest_runs_from_the_primary_key(tenant):
    # The console lists runs newest id first (runs/admin/): with partition_id first in
    # the key no index gave that order, and the list's first page sorted every run kept
    # (docs/decisions/0082-run-ids-lead-the-primary-key.md). Lookups by id alone need
    # the key led by id too, which test_the_keys_of_jobs_and_runs_are_the_citus_ones pins.
    from django.contrib import admin
    from django.test import RequestFactory

    with connection.cursor() as cursor:
        if citus_installed(cursor):
            pytest.skip("on Citus the coordinator merges each shard's own top rows")
    enqueue_runs([run_for(make_job(tenant), scheduled_at=datetime.now(UTC), trigger="manual")])
    console, request = admin.site._registry[JobRun], RequestFactory().get("/")
    page = console.get_queryset(request).order_by(*console.get_ordering(request))[:50]
    with transaction.atomic(), connection.cursor() as cursor:
        # Whatever a tiny table's statistics suggest: a sort costs as if disabled, so a
        # plan without one is an order an index gives.
        cursor.execute("SET LOCAL enable_sort = off")
        listed = page.explain()
    runs_part = listed.split("SubPlan")[0]  # the subplans read each listed run's job
    assert not re.search(r"(^|->)\s*Sort\s+\(", runs_part, re.M), listed  # a merge of indexes, no sort
    assert "Index Scan Backward using job_runs_" in listed, listed
    assert "Index Scan Backward using run_history_" in listed, listed  # the id index (runs 0024)


def test_the_run_key_still_refuses_a_second_run_of_a_slot(tenant):
    job = make_job(tenant)
    slot = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=1)
    assert len(enqueue_runs([run_for(job, scheduled_at=slot, trigger="manual", overlap_check=False)])) == 1
    assert enqueue_runs([run_for(job, scheduled_at=slot, trigger="manual", overlap_check=False)]) == []
    first = JobRun.objects.get(job=job, scheduled_at=slot)
    with pytest.raises(IntegrityError), transaction.atomic():
        JobRunRow.objects.create(
            job=job,
            tenant=tenant,
            partition_id=job.partition_id,
            scheduled_at=slot,
            not_before=slot,
            target=first.target,
        )
    assert JobRun.objects.filter(job=job, scheduled_at=slot).count() == 1


def test_a_misfire_and_a_ledger_range_carry_their_jobs_partition(tenant):
    past = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=10)
    job = make_job(tenant)
    Job.objects.filter(pk=job.pk).update(next_run_at=past)
    job.refresh_from_db()
    pause_job(job=job)
    assert {m.partition_id for m in job.misfires.all()} == {job.partition_id}
    assert {r.partition_id for r in job.slot_ranges.all()} == {job.partition_id}


def test_saving_a_job_neither_rewrites_nor_ignores_its_partition(tenant):
    job = make_job(tenant)
    job.name = "renamed"
    with CaptureQueriesContext(connection) as queries:
        job.save()
    (update,) = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("UPDATE")]
    set_list, where = update.split(" WHERE ")
    # Citus refuses an UPDATE that sets the distribution column and fans one without it
    # in its WHERE out to every shard.
    assert '"partition_id"' not in set_list
    assert '"partition_id"' in where
    assert Job.objects.get(pk=job.pk).name == "renamed"


# What PartitionKeyed._do_update receives from Model._save_table and passes on to
# Django's own, in this order.
DO_UPDATE_PARAMETERS = ("self", "base_qs", "using", "pk_val", "values", "update_fields", "forced_update")


def test_the_private_save_hook_is_the_one_django_has():
    """PartitionKeyed overrides Django's private Model._do_update: Django has no public way
    to put a condition into the UPDATE of save() (docs/decisions/0001-run-identity.md). A
    Django whose _do_update takes other parameters fails here, in `make test`, rather
    than have the override drop or misplace one and send UPDATEs Citus cannot route."""
    django_hook = inspect.signature(models.Model._do_update)
    assert tuple(django_hook.parameters) == DO_UPDATE_PARAMETERS
    assert inspect.signature(PartitionKeyed._do_update) == django_hook


# Co-located by partition_id: a job, its runs, misfires and ledger ranges share a shard.
DISTRIBUTED = ("jobs", "job_runs", "job_misfires", "job_slot_ranges")


def test_the_distribution_migration_matches_the_database():
    with connection.cursor() as cursor:
        if not citus_installed(cursor):
            # Plain PostgreSQL: the migration did nothing (no Citus catalog at all).
            cursor.execute("SELECT to_regclass('pg_dist_partition')")
            assert cursor.fetchone() == (None,)
            return
        cursor.execute(
            "SELECT logicalrelid::text, partmethod, colocationid FROM pg_dist_partition"
            " WHERE logicalrelid::text = ANY(%s)",
            [[*DISTRIBUTED, "tenants"]],
        )
        rows = {name: (method, colocation) for name, method, colocation in cursor.fetchall()}
    assert rows["tenants"][0] == "n"  # a reference table
    assert {rows[t][0] for t in DISTRIBUTED} == {"h"}  # hash-distributed by partition_id
    assert len({rows[t][1] for t in DISTRIBUTED}) == 1  # one co-location group
