"""Runs reference their job's target version instead of carrying a copy of the target.

- `job_runs.target_version`: the jobs.job_targets version the run executes; NULL in
  runs written before this migration, which keep their own copy in `target`.
- `job_runs.target` may be NULL: new runs leave it empty.

Both are catalog changes only (a nullable column without a default, a dropped NOT
NULL): no partition is rewritten or scanned, so runs in flight go on. Old runs are not
rewritten either: the claim and the readers take the version's target when the run has
one, and the run's own copy when not, until retention drops the day partitions that
hold old runs. The DDL is this migration's own.
"""

from django.db import migrations, models

FORWARD = [
    "ALTER TABLE job_runs ADD COLUMN target_version integer",
    "ALTER TABLE job_runs ALTER COLUMN target DROP NOT NULL",
]
BACKWARD = [
    # Only while no run without a copy exists: a run with a version and no copy would
    # lose its target.
    "ALTER TABLE job_runs ALTER COLUMN target SET NOT NULL",
    "ALTER TABLE job_runs DROP COLUMN target_version",
]


class Migration(migrations.Migration):
    dependencies = [("runs", "0017_tenant_holds"), ("jobs", "0018_job_targets")]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL(FORWARD, BACKWARD)],
            state_operations=[
                migrations.AddField(
                    model_name="jobrun",
                    name="target_version",
                    field=models.IntegerField(blank=True, editable=False, null=True),
                ),
                migrations.AlterField(
                    model_name="jobrun",
                    name="target",
                    field=models.JSONField(blank=True, editable=False, null=True),
                ),
            ],
        ),
    ]
