"""job_targets: immutable versions of each job's target, which runs reference instead
of carrying a copy (runs migration 0018 gives runs the reference).

- `job_targets (partition_id, job_id, version, target, created_at)`, keyed by all three;
  on Citus distributed by partition_id and co-located with jobs, so the claim's join of
  a run to its target stays inside one shard.
- `jobs.target_version`: the version of the job's current target, 1 for every existing
  job (a column with a constant default: no table rewrite, no scan).
- Every existing job's target becomes its version 1.

The DDL is this migration's own.
"""

from django.db import migrations, models

CREATE = """
CREATE TABLE job_targets (
    partition_id smallint NOT NULL CHECK (partition_id >= 0),
    job_id uuid NOT NULL,
    version integer NOT NULL CHECK (version >= 0),
    target jsonb NOT NULL,
    created_at timestamptz NOT NULL,
    PRIMARY KEY (partition_id, job_id, version)
)
"""
ADD_VERSION = "ALTER TABLE jobs ADD COLUMN target_version integer NOT NULL DEFAULT 1"
COPY = """
INSERT INTO job_targets (partition_id, job_id, version, target, created_at)
SELECT partition_id, id, target_version, target, now() FROM jobs
"""


def distribute(apps, schema_editor):
    """On Citus only (detected from pg_extension), co-located with jobs."""
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_extension WHERE extname = 'citus'")
        if cursor.fetchone() is None:
            return
        cursor.execute(
            "SELECT create_distributed_table('job_targets', 'partition_id', colocate_with => 'jobs')"
        )


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0017_tenant_credentials_audited"),
        # Citus's distribution of jobs (runs 0009) comes first: job_targets is co-located with it.
        ("runs", "0017_tenant_holds"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(CREATE, "DROP TABLE job_targets"),
                migrations.RunSQL(ADD_VERSION, "ALTER TABLE jobs DROP COLUMN target_version"),
                migrations.RunPython(distribute, migrations.RunPython.noop, elidable=False),
                migrations.RunSQL(COPY, migrations.RunSQL.noop),
            ],
            state_operations=[
                migrations.CreateModel(
                    name="JobTarget",
                    fields=[
                        (
                            "pk",
                            models.CompositePrimaryKey(
                                "partition_id", "job_id", "version", blank=True, editable=False,
                                primary_key=True, serialize=False,
                            ),
                        ),
                        ("partition_id", models.PositiveSmallIntegerField()),
                        ("job_id", models.UUIDField()),
                        ("version", models.PositiveIntegerField()),
                        ("target", models.JSONField()),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                    ],
                    options={"db_table": "job_targets"},
                ),
                migrations.AddField(
                    model_name="job",
                    name="target_version",
                    field=models.IntegerField(default=1, editable=False),
                ),
            ],
        ),
    ]
