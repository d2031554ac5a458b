"""Every key of jobs and of the tables hanging off a job starts with partition_id.

Citus (docs/CONTRACT.md, "Beyond one server") distributes these tables by partition_id and requires every
primary key, unique key and foreign key between them to contain it; plain PostgreSQL
gets the same keys, so there is one schema. The Django models keep their single-field
`id` key (the admin refuses CompositePrimaryKey): only the database side changes here,
and the foreign keys to jobs become composite ones Django does not know about
(state: db_constraint=False). See docs/decisions/0001-run-identity.md.

jobs.id stays unique in practice: partition_id is a function of the id
(jobs.services.partition_for), so (partition_id, id) is unique exactly when id is.
A plain index on jobs(id) keeps lookups by id alone (URLs, the admin) an index scan.
"""

from django.db import migrations, models

CHILDREN = ("job_misfires", "job_slot_ranges")

FORWARD = """
DO $$
DECLARE r record;
BEGIN
    -- Django's foreign keys to jobs(id), whatever their generated names.
    FOR r IN SELECT conrelid::regclass AS tbl, conname FROM pg_constraint
             WHERE contype = 'f' AND confrelid = 'jobs'::regclass LOOP
        EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', r.tbl, r.conname);
    END LOOP;
END $$;
ALTER TABLE jobs DROP CONSTRAINT jobs_pkey;
ALTER TABLE jobs ADD CONSTRAINT jobs_pkey PRIMARY KEY (partition_id, id);
CREATE INDEX jobs_id_idx ON jobs (id);
""" + "".join(
    f"""
ALTER TABLE {t} ADD COLUMN partition_id smallint CHECK (partition_id >= 0);
UPDATE {t} c SET partition_id = j.partition_id FROM jobs j WHERE j.id = c.job_id;
ALTER TABLE {t} ALTER COLUMN partition_id SET NOT NULL;
ALTER TABLE {t} DROP CONSTRAINT {t}_pkey;
ALTER TABLE {t} ADD CONSTRAINT {t}_pkey PRIMARY KEY (partition_id, id);
ALTER TABLE {t} ADD CONSTRAINT {t}_job_fk FOREIGN KEY (partition_id, job_id)
    REFERENCES jobs (partition_id, id) ON DELETE CASCADE DEFERRABLE INITIALLY DEFERRED;
"""
    for t in CHILDREN
)

BACKWARD = (
    "".join(
        f"""
ALTER TABLE {t} DROP CONSTRAINT {t}_job_fk;
ALTER TABLE {t} DROP CONSTRAINT {t}_pkey;
ALTER TABLE {t} ADD CONSTRAINT {t}_pkey PRIMARY KEY (id);
ALTER TABLE {t} DROP COLUMN partition_id;
"""
        for t in CHILDREN
    )
    + """
DROP INDEX jobs_id_idx;
ALTER TABLE jobs DROP CONSTRAINT jobs_pkey;
ALTER TABLE jobs ADD CONSTRAINT jobs_pkey PRIMARY KEY (id);
"""
    + "".join(
        f"ALTER TABLE {t} ADD CONSTRAINT {t}_job_id_fk FOREIGN KEY (job_id) REFERENCES jobs (id) "
        "DEFERRABLE INITIALLY DEFERRED;\n"
        for t in CHILDREN
    )
)


def _job_fk(related_name: str) -> models.ForeignKey:
    return models.ForeignKey(
        on_delete=models.deletion.CASCADE, db_constraint=False, related_name=related_name, to="jobs.job"
    )


class Migration(migrations.Migration):
    dependencies = [("jobs", "0010_tenant_rate_limit")]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL(FORWARD, BACKWARD)],
            state_operations=[
                migrations.AddField(
                    model_name="misfire",
                    name="partition_id",
                    field=models.PositiveSmallIntegerField(editable=False, help_text="The job's."),
                    preserve_default=False,
                ),
                migrations.AddField(
                    model_name="slotrange",
                    name="partition_id",
                    field=models.PositiveSmallIntegerField(editable=False, help_text="The job's."),
                    preserve_default=False,
                ),
                migrations.AlterField(model_name="misfire", name="job", field=_job_fk("misfires")),
                migrations.AlterField(model_name="slotrange", name="job", field=_job_fk("slot_ranges")),
                migrations.AlterModelOptions(name="slotrange", options={"ordering": ["job_id", "first_at"]}),
            ],
        ),
    ]
