import django.db.models.deletion
from django.db import migrations, models

from runs.partitions import CREATE_PARENT_SQL, DROP_PARENT_SQL


def create_day_partitions(apps, schema_editor):
    from django.conf import settings

    from runs.partitions import maintain

    maintain(days_ahead=7, retention_days=settings.RUN_RETENTION_DAYS)


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("jobs", "0001_initial"),
    ]

    operations = [
        # job_runs is a declarative range-partitioned table, which Django cannot
        # create; the state is the model, the database side is hand-written DDL.
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL(CREATE_PARENT_SQL, DROP_PARENT_SQL)],
            state_operations=[
                migrations.CreateModel(
                    name="JobRun",
                    fields=[
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
                                    ("catch_up", "Catch Up"),
                                ],
                                default="schedule",
                                max_length=16,
                            ),
                        ),
                        ("priority", models.PositiveSmallIntegerField(default=0)),
                        ("attempt", models.PositiveIntegerField(default=0)),
                        ("not_before", models.DateTimeField()),
                        ("lease_until", models.DateTimeField(blank=True, null=True)),
                        (
                            "owner",
                            models.CharField(blank=True, default="", max_length=100),
                        ),
                        ("target", models.JSONField()),
                        (
                            "job_name",
                            models.CharField(blank=True, default="", max_length=200),
                        ),
                        (
                            "overlap_policy",
                            models.CharField(default="skip", max_length=16),
                        ),
                        ("max_attempts", models.PositiveIntegerField(default=5)),
                        (
                            "retry_backoff_seconds",
                            models.PositiveIntegerField(default=10),
                        ),
                        (
                            "retry_backoff_cap_seconds",
                            models.PositiveIntegerField(default=3600),
                        ),
                        ("lease_seconds", models.PositiveIntegerField(default=30)),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                        ("started_at", models.DateTimeField(blank=True, null=True)),
                        ("finished_at", models.DateTimeField(blank=True, null=True)),
                        ("result_code", models.IntegerField(blank=True, null=True)),
                        ("last_error", models.TextField(blank=True, default="")),
                        ("attempts", models.JSONField(blank=True, default=list)),
                        (
                            "job",
                            models.ForeignKey(
                                db_constraint=False,
                                on_delete=django.db.models.deletion.DO_NOTHING,
                                related_name="runs",
                                to="jobs.job",
                            ),
                        ),
                        (
                            "tenant",
                            models.ForeignKey(
                                db_constraint=False,
                                on_delete=django.db.models.deletion.DO_NOTHING,
                                related_name="runs",
                                to="jobs.tenant",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "job_runs",
                        "ordering": ["-scheduled_at"],
                        "constraints": [
                            models.UniqueConstraint(
                                fields=("job", "scheduled_at"),
                                name="job_runs_job_scheduled_uniq",
                            )
                        ],
                    },
                )
            ],
        ),
        migrations.RunPython(create_day_partitions, migrations.RunPython.noop),
    ]
