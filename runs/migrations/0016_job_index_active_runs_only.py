"""The job index of job_runs keeps active runs only: a finished run leaves it.

`job_runs_job_idx (job_id, scheduled_at)` held an entry for every run ever kept, the
largest index of the table (about 150 bytes per finished run on disk, a third of the
run's index bytes). Its readers were:

- the pages and API reads of one job's runs: they now name the job's partition_id, so
  the run key's unique index (partition_id, job_id, scheduled_at) serves them, and on
  Citus they read one shard instead of all;
- the executor's keyed reads (claim, outcome), which named the partition already and
  take the same unique index;
- the dispatch insert's overlap check (runs/enqueue.py): the job's runs that are
  queued, running or retrying. It names no partition, and without an index led by
  job_id it read the whole retained table per batch. It reads only active runs,
  which is what this partial index holds: a batch of 200 runs read 3,300 buffers
  instead of the 14,600 to 104,000 the full index or a table scan cost (10 days of
  hourly runs of 5,000 jobs).

The new index keeps one entry per row version (`deduplicate_items = off`), like the
other queue indexes (0011): its entries die as runs finish.

It is created before the old one is dropped, so the overlap check never goes without.
CREATE INDEX on the partitioned table builds it on every partition under a SHARE lock
(inserts and updates of runs wait for it: seconds per million runs; stop the
schedulers and executors on a large database). Each statement is sent on its own (an
upgraded Citus cluster refuses several DDL commands in one string), outside a
transaction (Citus would otherwise refuse the CREATE after the parallel DROP), and
with `lock_timeout`: waiting behind a claim for the DROP's ACCESS EXCLUSIVE lock would
queue every read of runs behind it. Every step can be run again (IF [NOT] EXISTS).
"""

from django.db import migrations

ACTIVE_INDEX = (
    "CREATE INDEX IF NOT EXISTS job_runs_job_active_idx ON job_runs (job_id) "
    "WITH (deduplicate_items = off) WHERE status IN ('queued', 'running', 'retrying')"
)
FULL_INDEX = (
    "CREATE INDEX IF NOT EXISTS job_runs_job_idx ON job_runs (job_id, scheduled_at) "
    "WITH (deduplicate_items = off)"
)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("runs", "0015_run_labels")]

    operations = [
        migrations.RunSQL("SET lock_timeout = '5s'", reverse_sql="SET lock_timeout = '5s'"),
        migrations.RunSQL(ACTIVE_INDEX, reverse_sql="DROP INDEX IF EXISTS job_runs_job_active_idx"),
        migrations.RunSQL("DROP INDEX IF EXISTS job_runs_job_idx", reverse_sql=FULL_INDEX),
        migrations.RunSQL("RESET lock_timeout", reverse_sql="RESET lock_timeout"),
    ]
