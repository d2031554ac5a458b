"""On plain PostgreSQL, job_runs keeps one claim index: `job_runs_partition_claim_idx`
is dropped there. On Citus it stays.

Plain PostgreSQL claims a batch in one statement that names no partition and ranks
each tenant's runs across partitions: it walks `job_runs_tenant_claim_idx` (tenant_id,
priority DESC, scheduled_at). Measured with `pg_stat_user_indexes` while an executor
drained 20,000 runs, the per-partition index was scanned (day partitions a generic plan
visits) and never returned a row, while every queued or retrying row version wrote an
entry into it: the largest of the queue's indexes, 19 bytes per finished run in waves
(docs/decisions/0081-one-claim-index.md).

A Citus claim names the partitions of one shard that were granted places
(docs/decisions/0075-citus-claims.md): with a large backlog that is often one
partition, whose runs this index gives in claim order; without it the probe would walk
the tenant's runs of the whole shard and skip the other partitions' rows one heap fetch
at a time.

Dropping a partitioned index is catalog work on every partition under an ACCESS
EXCLUSIVE lock on job_runs; `lock_timeout` keeps it from queueing every reader of runs
behind a long transaction (the migration then fails and can be run again). Backwards
builds the index again as migration 0011 left it, on every day partition under a SHARE
lock: writes of runs wait for it. The DDL is this migration's own.
"""

from django.db import migrations

INDEX = (
    "CREATE INDEX IF NOT EXISTS job_runs_partition_claim_idx"
    " ON job_runs (partition_id, tenant_id, priority DESC, scheduled_at)"
    " WITH (deduplicate_items = off) WHERE status IN ('queued', 'retrying')"
)


def _on_plain_postgresql(statement: str):
    def run(apps, schema_editor) -> None:
        with schema_editor.connection.cursor() as cursor:
            cursor.execute("SELECT 1 FROM pg_extension WHERE extname = 'citus'")
            if cursor.fetchone() is not None:
                return
            cursor.execute("SET LOCAL lock_timeout = '5s'")
            cursor.execute(statement)

    return run


class Migration(migrations.Migration):
    dependencies = [("runs", "0020_upkeep_turns")]

    operations = [
        migrations.RunPython(
            _on_plain_postgresql("DROP INDEX IF EXISTS job_runs_partition_claim_idx"),
            _on_plain_postgresql(INDEX),
            elidable=False,
        )
    ]
