"""Index the dispatch query can walk in next_run_at order.

The scheduler's batch is `partition_id IN (owned) AND next_run_at <= now ... ORDER BY
next_run_at LIMIT batch FOR UPDATE SKIP LOCKED`. With only jobs_due_idx
(partition_id, next_run_at) PostgreSQL must fetch and sort EVERY due row of the
owned partitions before locking the first 500 (~250 ms per batch at a 100k
backlog, so draining it is quadratic). Walking this index in order stops after the
batch is locked. Created with RunSQL so the model state (and makemigrations) is
unaffected; CONCURRENTLY so adding it to a live jobs table does not block writes.
"""

from django.db import migrations


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("jobs", "0001_initial")]

    operations = [
        migrations.RunSQL(
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_due_order_idx ON jobs (next_run_at) WHERE NOT paused",
            reverse_sql="DROP INDEX CONCURRENTLY IF EXISTS jobs_due_order_idx",
        ),
    ]
