"""job_runs' keys start with partition_id, like every key of jobs (jobs migration 0010).

The run key (the exactly-once guarantee) becomes UNIQUE (partition_id, job_id,
scheduled_at): a job's runs all carry the job's partition_id (set from the job row
when the run is planned), so it forbids exactly what (job_id, scheduled_at) forbade,
and on Citus it is a key the shard holding the job can enforce alone. Dropped and
re-added in one transaction, under the ACCESS EXCLUSIVE lock of the ALTER: no writer
ever sees the table without it.

The old unique index also served every lookup by job_id alone (the ledger, a job's
runs, the insert's overlap check): a plain index on (job_id, scheduled_at) keeps those
plans as they were on plain PostgreSQL (on Citus such a lookup visits every shard
unless it names partition_id too).
"""

from django.db import migrations, models

FORWARD = """
ALTER TABLE job_runs DROP CONSTRAINT job_runs_pkey;
ALTER TABLE job_runs ADD CONSTRAINT job_runs_pkey PRIMARY KEY (partition_id, id, scheduled_at);
ALTER TABLE job_runs DROP CONSTRAINT job_runs_job_scheduled_uniq;
ALTER TABLE job_runs ADD CONSTRAINT job_runs_job_scheduled_uniq UNIQUE (partition_id, job_id, scheduled_at);
CREATE INDEX job_runs_job_idx ON job_runs (job_id, scheduled_at);
"""

BACKWARD = """
DROP INDEX job_runs_job_idx;
ALTER TABLE job_runs DROP CONSTRAINT job_runs_job_scheduled_uniq;
ALTER TABLE job_runs ADD CONSTRAINT job_runs_job_scheduled_uniq UNIQUE (job_id, scheduled_at);
ALTER TABLE job_runs DROP CONSTRAINT job_runs_pkey;
ALTER TABLE job_runs ADD CONSTRAINT job_runs_pkey PRIMARY KEY (id, scheduled_at);
"""


class Migration(migrations.Migration):
    dependencies = [("runs", "0007_partition_claim_index"), ("jobs", "0011_partition_keys")]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL(FORWARD, BACKWARD)],
            state_operations=[
                migrations.RemoveConstraint(model_name="jobrun", name="job_runs_job_scheduled_uniq"),
                migrations.AddConstraint(
                    model_name="jobrun",
                    constraint=models.UniqueConstraint(
                        fields=("partition_id", "job", "scheduled_at"), name="job_runs_job_scheduled_uniq"
                    ),
                ),
            ],
        ),
    ]
