"""job_runs keeps one claim index: `job_runs_partition_claim_idx` is dropped.

Both engines' claims walk `job_runs_tenant_claim_idx` (tenant_id, priority DESC,
scheduled_at): plain PostgreSQL's one statement per batch ranks a tenant's runs across
partitions, and on Citus a claim names every partition of its shard the work map saw
work in (`partition_id = ANY(...)`), which the planner serves from the tenant's index
with a filter rather than sort the per-partition index's runs. Measured with
`pg_stat_user_indexes` while executors drained runs (1 and 20 tenants), the
per-partition index was scanned by no claim on Citus and found no row on plain
PostgreSQL, while every queued or retrying row version still wrote an entry into it: the
largest of the queue's indexes, about 19 bytes per finished run on disk
(docs/decisions/0081-one-claim-index.md).

Dropping a partitioned index drops it on every partition (and on Citus on every shard)
in one transaction under an ACCESS EXCLUSIVE lock on job_runs: catalog work only, no
scan. The DDL is this migration's own; backwards builds the index again as migration
0011 left it.
"""

from django.db import migrations

FORWARD = "DROP INDEX IF EXISTS job_runs_partition_claim_idx;"

BACKWARD = """
CREATE INDEX IF NOT EXISTS job_runs_partition_claim_idx
    ON job_runs (partition_id, tenant_id, priority DESC, scheduled_at)
    WITH (deduplicate_items = off)
    WHERE status IN ('queued', 'retrying');
"""


class Migration(migrations.Migration):
    dependencies = [("runs", "0020_upkeep_turns")]

    operations = [migrations.RunSQL(FORWARD, BACKWARD)]
