"""Index the failing-streak alert sweep, so it stops reading the whole jobs table.

jobs.health.sweep runs every ALERT_SWEEP_EVERY_SECONDS (5 s) on one scheduler, and its
`NOT failure_alerted AND consecutive_failures >= alert_after_failures` matched no
index: a sequential scan of jobs each time. At 1M jobs that was 0.7-1.4 s of a core
per sweep, read through the disk cache (the table outgrows shared_buffers), during a
1M-job burst (docs/decisions/0027-job-health-and-alerts.md).

A partial index with exactly the sweep's predicate holds only the jobs waiting for a
failing alert (usually none), so the sweep is a probe of an empty index. The sweep
orders by id so the planner takes it (jobs/health.py says why). It costs the
writers little: dispatch's next_run_at update evaluates the predicate and inserts
nothing; the executors' outcome update stays HOT-eligible when consecutive_failures
and failure_alerted keep their values (a success after a success), and only a
failure or the first success after one (which change them) updates index entries.
RunSQL (model state untouched), CONCURRENTLY so a live jobs table keeps its writes.
"""

from django.db import migrations


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("jobs", "0011_partition_keys")]

    operations = [
        migrations.RunSQL(
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_failing_idx ON jobs (id) "
            "WHERE NOT failure_alerted AND consecutive_failures >= alert_after_failures",
            reverse_sql="DROP INDEX CONCURRENTLY IF EXISTS jobs_failing_idx",
        ),
    ]
