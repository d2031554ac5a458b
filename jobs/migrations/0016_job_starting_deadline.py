"""Per-job starting deadline: a slot found later than this is a misfire (NULL: the global
SCHEDULER_MISFIRE_THRESHOLD_SECONDS; docs/decisions/0022-late-slots.md).

The jobs table is large (millions of rows) and the scheduler locks its rows every batch,
so nothing here may scan it under ACCESS EXCLUSIVE: a nullable column without a default
is a catalog change only, but a column added with a CHECK is verified by a full scan
under that lock (2M rows: 0.4 s of blocked dispatch; 0.6 ms without). The check is
therefore added NOT VALID (instant) and validated in a statement of its own, which scans
under SHARE UPDATE EXCLUSIVE and lets reads and writes go on. The model state is the
plain PositiveIntegerField; the DDL is written out here so that it never changes.

Each ALTER still needs a moment of ACCESS EXCLUSIVE, and waiting for it behind a
dispatch batch would queue every read of jobs behind the ALTER: `lock_timeout` makes it
give up after 5 s instead (run the migration again). Every step can be run again after
a failure part way (IF NOT EXISTS, the constraint dropped before it is added).
"""

from django.core.validators import MinValueValidator
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("jobs", "0015_jobs_health_strip_idx")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddField(
                    model_name="job",
                    name="starting_deadline_seconds",
                    field=models.PositiveIntegerField(
                        blank=True, null=True, validators=[MinValueValidator(1)]
                    ),
                ),
            ],
            database_operations=[
                migrations.RunSQL("SET lock_timeout = '5s'", reverse_sql="SET lock_timeout = '5s'"),
                migrations.RunSQL(
                    "ALTER TABLE jobs ADD COLUMN IF NOT EXISTS starting_deadline_seconds integer NULL",
                    reverse_sql="ALTER TABLE jobs DROP COLUMN IF EXISTS starting_deadline_seconds",
                ),
                # Two statements, sent one by one: a connection with server-side binding
                # (the scheduler's, the benchmarks') refuses several in one.
                migrations.RunSQL(
                    [
                        "ALTER TABLE jobs DROP CONSTRAINT IF EXISTS jobs_starting_deadline_seconds_check",
                        "ALTER TABLE jobs ADD CONSTRAINT jobs_starting_deadline_seconds_check "
                        "CHECK (starting_deadline_seconds >= 1) NOT VALID",
                    ],
                    reverse_sql="ALTER TABLE jobs DROP CONSTRAINT IF EXISTS jobs_starting_deadline_seconds_check",
                ),
                migrations.RunSQL(
                    "ALTER TABLE jobs VALIDATE CONSTRAINT jobs_starting_deadline_seconds_check",
                    reverse_sql=migrations.RunSQL.noop,
                ),
                migrations.RunSQL("RESET lock_timeout", reverse_sql="RESET lock_timeout"),
            ],
        ),
    ]
