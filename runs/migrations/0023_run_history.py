"""run_history: succeeded runs, written once, and the view `runs` over both tables.

A run's row was written three times in job_runs (insert, claim, outcome), none of the
updates HOT (the queue indexes' predicates name `status`): every finished run left its
dead versions and their index entries behind. From here a success moves the row into
run_history in the outcome's statement (DELETE from job_runs, INSERT here; on plain
PostgreSQL, Citus keeps it in place), where it is
written once and never changed; runs that end otherwise (dead, cancelled, skipped) stay
in job_runs, where the dead-letter queue, replay and cancel find them as before
(docs/decisions/0085-run-history.md).

- `run_history`: job_runs' columns in job_runs' order, partitioned by day like it
  (runs/day_partitions.py keeps both), with its own day partitions for the days
  job_runs has now and a default partition; keyed like job_runs, plus the tenant index
  the run lists read, and none of the queue's indexes. Only successes
  (`CHECK (status = 'succeeded')`). On Citus distributed by partition_id, co-located.
- `runs`: `SELECT * FROM job_runs UNION ALL SELECT * FROM run_history`, what every reader
  reads (runs.models.JobRun).

Nothing moves: the successes already in job_runs stay there until retention drops
their days, and every reader reads both tables. Runs queued, running or retrying when
this runs are in job_runs and move on success like any other. The DDL is this
migration's own; no existing table is rewritten or scanned.
"""

from django.db import migrations, models

# One command per statement: Citus forwards a DDL command's text to the workers.
CREATE = [
    "CREATE TABLE run_history (LIKE job_runs INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"
    " PARTITION BY RANGE (scheduled_at)",
    "ALTER TABLE run_history ADD CONSTRAINT run_history_succeeded CHECK (status = 'succeeded')",
    "ALTER TABLE run_history ADD CONSTRAINT run_history_pkey PRIMARY KEY (id, scheduled_at, partition_id)",
    "ALTER TABLE run_history ADD CONSTRAINT run_history_key UNIQUE (partition_id, job_id, scheduled_at)",
    "CREATE INDEX run_history_tenant_sched_idx ON run_history (tenant_id, scheduled_at DESC)",
    "CREATE TABLE run_history_default PARTITION OF run_history DEFAULT",
]
VIEW = "CREATE VIEW runs AS SELECT * FROM job_runs UNION ALL SELECT * FROM run_history"
DROP = ["DROP VIEW runs", "DROP TABLE run_history"]

DAY_PARTITIONS = r"""
SELECT substring(c.relname FROM '^job_runs_p([0-9]{8})$')
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = 'job_runs'::regclass AND c.relname ~ '^job_runs_p[0-9]{8}$'
ORDER BY 1
"""


def days_and_distribution(apps, schema_editor):
    """A history partition for every day job_runs has; on Citus (detected from
    pg_extension) the table distributed by partition_id, co-located with job_runs."""
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(DAY_PARTITIONS)
        for (day,) in cursor.fetchall():
            cursor.execute(
                f"CREATE TABLE run_history_p{day} PARTITION OF run_history"
                f" FOR VALUES FROM (to_date('{day}', 'YYYYMMDD')::timestamp AT TIME ZONE 'UTC')"
                f" TO ((to_date('{day}', 'YYYYMMDD') + 1)::timestamp AT TIME ZONE 'UTC')"
            )
        cursor.execute("SELECT 1 FROM pg_extension WHERE extname = 'citus'")
        if cursor.fetchone() is not None:
            cursor.execute(
                "SELECT create_distributed_table('run_history', 'partition_id', colocate_with => 'job_runs')"
            )


def _fields(*, related_name: str) -> list:
    return [
        ("id", models.BigAutoField(primary_key=True, serialize=False)),
        ("scheduled_at", models.DateTimeField()),
        ("partition_id", models.PositiveSmallIntegerField()),
        (
            "status",
            models.CharField(
                choices=[
                    ("queued", "Queued"),
                    ("running", "Running"),
                    ("retrying", "Retrying"),
                    ("succeeded", "Succeeded"),
                    ("dead", "Dead"),
                    ("skipped", "Skipped"),
                    ("cancelled", "Cancelled"),
                ],
                default="queued",
                max_length=16,
            ),
        ),
        (
            "trigger",
            models.CharField(
                choices=[
                    ("schedule", "Schedule"),
                    ("manual", "Manual"),
                    ("backfill", "Backfill"),
                    ("replay", "Replay"),
                    ("catch_up", "Catch-up"),
                ],
                default="schedule",
                max_length=16,
            ),
        ),
        ("priority", models.PositiveSmallIntegerField(default=0)),
        ("attempt", models.PositiveIntegerField(default=0)),
        ("not_before", models.DateTimeField()),
        ("lease_until", models.DateTimeField(blank=True, null=True)),
        ("owner", models.CharField(blank=True, default="", max_length=100)),
        ("target", models.JSONField(blank=True, editable=False, null=True)),
        ("target_version", models.IntegerField(blank=True, editable=False, null=True)),
        ("job_name", models.CharField(blank=True, default="", max_length=200)),
        ("overlap_policy", models.CharField(default="skip", max_length=16)),
        ("max_attempts", models.PositiveIntegerField(default=5)),
        ("retry_backoff_seconds", models.PositiveIntegerField(default=10)),
        ("retry_backoff_cap_seconds", models.PositiveIntegerField(default=3600)),
        ("lease_seconds", models.PositiveIntegerField(default=30)),
        ("created_at", models.DateTimeField(auto_now_add=True)),
        ("started_at", models.DateTimeField(blank=True, null=True)),
        ("finished_at", models.DateTimeField(blank=True, null=True)),
        ("result_code", models.IntegerField(blank=True, null=True)),
        ("last_error", models.TextField(blank=True, default="")),
        ("attempts", models.JSONField(blank=True, default=list)),
        ("deferrals", models.PositiveIntegerField(db_default=0, editable=False)),
        ("deferred_since", models.DateTimeField(blank=True, editable=False, null=True)),
        ("rate_limited_to", models.DateTimeField(blank=True, editable=False, null=True)),
        (
            "job",
            models.ForeignKey(
                db_constraint=False, on_delete=models.DO_NOTHING, related_name=related_name, to="jobs.job"
            ),
        ),
        (
            "tenant",
            models.ForeignKey(
                db_constraint=False, on_delete=models.DO_NOTHING, related_name=related_name, to="jobs.tenant"
            ),
        ),
    ]


class Migration(migrations.Migration):
    dependencies = [("runs", "0022_run_ids_lead_the_primary_key"), ("jobs", "0018_job_targets")]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(CREATE, DROP[1:]),
                migrations.RunPython(days_and_distribution, migrations.RunPython.noop, elidable=False),
                migrations.RunSQL(VIEW, DROP[:1]),
            ],
            state_operations=[
                migrations.RemoveConstraint(model_name="jobrun", name="job_runs_job_scheduled_uniq"),
                migrations.AlterModelTable(name="jobrun", table="runs"),
                migrations.AlterModelOptions(
                    name="jobrun",
                    options={
                        "managed": False,
                        "ordering": ["-scheduled_at"],
                        "verbose_name": "run",
                        "verbose_name_plural": "runs",
                    },
                ),
                migrations.CreateModel(
                    name="RunHistoryRow",
                    fields=_fields(related_name="+"),
                    options={"db_table": "run_history"},
                ),
                migrations.CreateModel(
                    name="JobRunRow",
                    fields=_fields(related_name="+"),
                    options={
                        "db_table": "job_runs",
                        "constraints": [
                            models.UniqueConstraint(
                                fields=("partition_id", "job", "scheduled_at"),
                                name="job_runs_job_scheduled_uniq",
                            )
                        ],
                    },
                ),
            ],
        ),
    ]
