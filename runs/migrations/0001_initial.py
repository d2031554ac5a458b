"""job_runs, declaratively range-partitioned by scheduled_at, and its first day partitions.

Django cannot create a partitioned table: the state is the model, the database side is
the hand-written DDL below. Both the DDL and the partition creation are this
migration's own, as they were when it was written; the live code of runs/day_partitions.py
may change, and history must not change with it (a fresh install replays exactly what
an upgraded database went through). Later migrations change these keys and indexes.
"""

from datetime import UTC, datetime, timedelta

import django.db.models.deletion
from django.db import migrations, models

CREATE_PARENT_SQL = """
CREATE SEQUENCE IF NOT EXISTS job_runs_id_seq;
CREATE TABLE job_runs (
    id bigint NOT NULL DEFAULT nextval('job_runs_id_seq'),
    job_id uuid NOT NULL,
    scheduled_at timestamptz NOT NULL,
    tenant_id bigint NOT NULL,
    partition_id smallint NOT NULL CHECK (partition_id >= 0),
    status varchar(16) NOT NULL DEFAULT 'queued',
    "trigger" varchar(16) NOT NULL DEFAULT 'schedule',
    priority smallint NOT NULL DEFAULT 0 CHECK (priority >= 0),
    attempt integer NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    not_before timestamptz NOT NULL,
    lease_until timestamptz NULL,
    owner varchar(100) NOT NULL DEFAULT '',
    target jsonb NOT NULL,
    job_name varchar(200) NOT NULL DEFAULT '',
    overlap_policy varchar(16) NOT NULL DEFAULT 'skip',
    max_attempts integer NOT NULL DEFAULT 5 CHECK (max_attempts >= 0),
    retry_backoff_seconds integer NOT NULL DEFAULT 10 CHECK (retry_backoff_seconds >= 0),
    retry_backoff_cap_seconds integer NOT NULL DEFAULT 3600 CHECK (retry_backoff_cap_seconds >= 0),
    lease_seconds integer NOT NULL DEFAULT 30 CHECK (lease_seconds >= 0),
    created_at timestamptz NOT NULL DEFAULT now(),
    started_at timestamptz NULL,
    finished_at timestamptz NULL,
    result_code integer NULL,
    last_error text NOT NULL DEFAULT '',
    attempts jsonb NOT NULL DEFAULT '[]'::jsonb,
    CONSTRAINT job_runs_status_valid CHECK (status IN
        ('queued', 'running', 'retrying', 'succeeded', 'dead', 'skipped', 'cancelled')),
    PRIMARY KEY (id, scheduled_at),
    CONSTRAINT job_runs_job_scheduled_uniq UNIQUE (job_id, scheduled_at)
) PARTITION BY RANGE (scheduled_at);
ALTER SEQUENCE job_runs_id_seq OWNED BY job_runs.id;
CREATE TABLE job_runs_default PARTITION OF job_runs DEFAULT;
-- Executors claim from this: runnable runs, best priority first, oldest first.
CREATE INDEX job_runs_claimable_idx ON job_runs (priority DESC, scheduled_at)
    WHERE status IN ('queued', 'retrying');
-- Expired-lease sweeps and per-tenant running counts.
CREATE INDEX job_runs_running_idx ON job_runs (tenant_id, lease_until) WHERE status = 'running';
-- Runs API and dead-letter listing, newest first per tenant.
CREATE INDEX job_runs_tenant_sched_idx ON job_runs (tenant_id, scheduled_at DESC);
CREATE INDEX job_runs_dead_idx ON job_runs (tenant_id, scheduled_at DESC) WHERE status = 'dead';
"""

DROP_PARENT_SQL = "DROP TABLE IF EXISTS job_runs CASCADE; DROP SEQUENCE IF EXISTS job_runs_id_seq;"


def create_day_partitions(apps, schema_editor):
    """The UTC days from today through today + 7, one partition each (`job_runs_pYYYYMMDD`,
    from midnight UTC to the next), as the partition maintainer created them then.

    The maintainer's other work (moving a day's rows out of the default partition, dropping
    days past retention) has nothing to act on in a table created a moment ago, and the
    table is invisible to other sessions until this transaction commits, so neither its
    lock nor those steps are needed here.
    """
    today = datetime.now(UTC).date()
    with schema_editor.connection.cursor() as cursor:
        for offset in range(8):
            day = today + timedelta(days=offset)
            lower = datetime(day.year, day.month, day.day, tzinfo=UTC)
            cursor.execute(
                f"CREATE TABLE job_runs_p{day:%Y%m%d} PARTITION OF job_runs FOR VALUES FROM (%s) TO (%s)",
                [lower, lower + timedelta(days=1)],
            )


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
