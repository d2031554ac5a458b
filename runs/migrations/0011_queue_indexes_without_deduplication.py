"""The indexes the executor walks (the claim's probes, the running set, keyed lookups)
keep one entry per row version: `deduplicate_items = off`.

B-tree deduplication folds entries with equal keys into one posting list, and
PostgreSQL can mark a posting list dead only when every row it points to is dead. A
queue's keys repeat by nature: a tenant's runs of one top-of-the-hour share (tenant,
priority, scheduled_at) and not_before; one claim gives all its runs one lease end; the
versions of one run (queued, running, succeeded) share (job_id, scheduled_at). So the
entries of runs already claimed stayed live inside lists that still held a queued run,
and every probe fetched their rows from the heap again, one page per row when tenants'
runs are interleaved: with 20 tenants a claim read 2,300-3,760 buffers where one tenant
needed 1,100 (docs/decisions/0048-queue-indexes-without-deduplication.md). With an entry per
version, a scan marks each dead one as it
passes, and later scans skip it without touching the heap.

The other indexes (the primary key, the run key, listing and dead-letter indexes) keep
deduplication: no hot path walks past their dead versions, and it keeps them small.

Storage parameters cannot be changed on a partitioned index, and new partitions copy
the parent's, so each index is created again with the parameter: this rebuilds them on
every partition in one transaction, holding `DROP INDEX`'s ACCESS EXCLUSIVE lock on
job_runs throughout, so every reader and writer of runs waits for it (seconds per million
runs). Stop the schedulers and executors while it runs on a large database.
"""

from django.db import migrations

QUEUED = "status IN ('queued', 'retrying')"

# name: (columns, predicate)
INDEXES = {
    "job_runs_tenant_claim_idx": ("tenant_id, priority DESC, scheduled_at", QUEUED),
    "job_runs_tenant_waiting_idx": ("tenant_id, not_before", QUEUED),
    "job_runs_partition_claim_idx": ("partition_id, tenant_id, priority DESC, scheduled_at", QUEUED),
    "job_runs_running_idx": ("tenant_id, lease_until", "status = 'running'"),
    "job_runs_job_idx": ("job_id, scheduled_at", None),
}


def _statements(*, deduplicate: bool) -> list[str]:
    """Drop and create each index; backwards (deduplicate) as they were, without options."""
    statements = []
    for name, (columns, predicate) in INDEXES.items():
        create = [f"CREATE INDEX {name} ON job_runs ({columns})"]
        if not deduplicate:
            create.append("WITH (deduplicate_items = off)")
        if predicate:
            create.append(f"WHERE {predicate}")
        statements += [f"DROP INDEX {name}", " ".join(create)]
    return statements


def _recreate(*, deduplicate: bool):
    def run(apps, schema_editor) -> None:
        with schema_editor.connection.cursor() as cursor:
            cursor.execute("SELECT 1 FROM pg_extension WHERE extname = 'citus'")
            if cursor.fetchone() is not None:
                # After a parallel multi-shard command (the DROPs) in a transaction,
                # Citus refuses to create shard indexes with names this long in parallel
                # (it could deadlock); one connection per worker, in sequence, avoids it.
                cursor.execute("SET LOCAL citus.multi_shard_modify_mode TO 'sequential'")
            # One command per execute: Citus forwards a DDL command's text to the workers.
            for statement in _statements(deduplicate=deduplicate):
                cursor.execute(statement)

    return run


class Migration(migrations.Migration):
    dependencies = [("runs", "0010_citus_session_defaults")]

    operations = [
        migrations.RunPython(_recreate(deduplicate=False), _recreate(deduplicate=True), elidable=False)
    ]
