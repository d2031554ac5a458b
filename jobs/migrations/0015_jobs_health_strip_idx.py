"""Index the console's status strip: jobs failing and jobs paused, per tenant.

The admin home and the dashboard count, on every page view, the jobs failing (their
streak of failed attempts reached `alert_after_failures`, jobs.health.FAILING) and the
jobs paused, for everyone or for one tenant. Neither predicate matched an index: each
count was a sequential scan of jobs. Two partial indexes on tenant_id hold only the
matching jobs, so a count is an index-only scan of those few entries, and one tenant's
count reads only its own (docs/decisions/0070-status-strip-and-job-health.md). The other
two counts already have theirs: overdue jobs jobs_due_order_idx (0002), dead runs
job_runs_dead_idx (runs 0001).

What writers pay: the executors' outcome update already changes indexed columns when
consecutive_failures changes (jobs_failing_idx, 0012), so HOT eligibility is unchanged;
only a streak reaching or leaving the threshold adds or drops an entry, and only a pause
or resume touches the paused index. RunSQL (model state untouched), CONCURRENTLY so a
live jobs table keeps its writes.
"""

from django.db import migrations


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("jobs", "0014_tenant_signing_secret")]

    operations = [
        migrations.RunSQL(
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_failing_streak_idx ON jobs (tenant_id) "
            "WHERE consecutive_failures >= alert_after_failures",
            reverse_sql="DROP INDEX CONCURRENTLY IF EXISTS jobs_failing_streak_idx",
        ),
        migrations.RunSQL(
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_paused_idx ON jobs (tenant_id) WHERE paused",
            reverse_sql="DROP INDEX CONCURRENTLY IF EXISTS jobs_paused_idx",
        ),
    ]
