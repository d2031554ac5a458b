"""On a database with the citus extension, distribute jobs and its satellites by
partition_id (co-located) and make tenants a reference table; on plain PostgreSQL,
nothing. Detected from pg_extension, so there is no setting to forget.

Must come after every migration that changed their keys (jobs 0011, runs 0008): Citus
refuses to distribute a table whose unique keys lack the distribution column. Later
migrations may ALTER these tables as usual: Citus propagates DDL to the shards.

The layout and the steps are this migration's own, as they were when it was written:
a later change of layout is a new migration, never an edit of this one.
"""

from django.db import migrations

# Distributed by partition_id and co-located with jobs, so a job, its runs, misfires and
# ledger ranges share a shard and every hot statement (one partition_id) is a
# single-shard statement.
DISTRIBUTED = ("jobs", "job_runs", "job_misfires", "job_slot_ranges")
# Replicated to every node: the executors' claim joins tenants to job_runs inside the shard.
REFERENCE = ("tenants",)
# Everything else stays an ordinary table on the coordinator: api_tokens, audit_entries,
# scheduler_nodes, executor_nodes, target_hosts and Django's own tables.


def distribute(apps, schema_editor):
    """Idempotent: a table already in pg_dist_partition is left alone."""
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_extension WHERE extname = 'citus'")
        if cursor.fetchone() is None:
            return
        cursor.execute("SELECT logicalrelid::text FROM pg_dist_partition")
        done = {name for (name,) in cursor.fetchall()}
        # Without this, making tenants a reference table would first turn every local table
        # that references it, jobs included, into a "Citus local table", which can then no
        # longer be distributed. api_tokens and audit_entries keep ordinary foreign keys to it.
        cursor.execute("SET LOCAL citus.enable_local_reference_table_foreign_keys = off")
        for table in REFERENCE:
            if table not in done:
                cursor.execute("SELECT create_reference_table(%s)", [table])
        for table in DISTRIBUTED:
            if table not in done:
                colocate = "none" if table == DISTRIBUTED[0] else DISTRIBUTED[0]
                cursor.execute(
                    "SELECT create_distributed_table(%s, 'partition_id', colocate_with => %s)",
                    [table, colocate],
                )


class Migration(migrations.Migration):
    dependencies = [("runs", "0008_partition_keys"), ("jobs", "0011_partition_keys")]

    operations = [migrations.RunPython(distribute, migrations.RunPython.noop, elidable=False)]
