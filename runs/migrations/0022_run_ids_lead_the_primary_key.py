"""job_runs' primary key leads with the run id: (id, scheduled_at, partition_id).

The console finds runs by id: its run list is ordered by id, newest first, and a run's
page, its replay and cancel pages and the bulk actions on a page of runs look runs up
by id (runs/admin/, runs/services._lock_by_ids); none of them knows the run's
partition_id. Since the key migration 0008 led the primary key with partition_id, no
index served them: with 1,000,000 runs in a day, the list's first page sorted every run
(21,900 buffers) and a lookup by id read every day partition (2,400 buffers, 93 ms;
a sequential scan, 194 ms, when the planner chose one), both growing with the runs
kept. Led by id, the first page is a merge of each day's newest entries (15 buffers)
and a lookup one probe per day. The hot paths find runs by the run key (partition_id,
job_id, scheduled_at) and never by id, and on Citus a key needs the distribution column
anywhere in it, not first (docs/decisions/0082-run-ids-lead-the-primary-key.md).

The key is larger on disk: 84 against 61 bytes per finished run in waves (new ids all
go to the newest pages, and so do the entries the updates of those runs add).

Dropped and re-added in one transaction, under the ACCESS EXCLUSIVE lock of the ALTER,
taken within 5 s or not at all (run it again): no writer ever sees the table without
it, and every reader and writer of runs waits while the index is built on every day
partition, seconds per million runs kept (hours for billions): stop the schedulers and
executors first on a large database. The DDL is this migration's own.
"""

from django.db import migrations

# One command per statement: Citus forwards a DDL command's text to the workers, and an
# upgraded Citus cluster refuses several commands in one string. The lock timeout: an
# ALTER waiting behind a long transaction on runs would queue every reader behind it.
LOCK_TIMEOUT = "SET LOCAL lock_timeout = '5s'"

FORWARD = [
    LOCK_TIMEOUT,
    "ALTER TABLE job_runs DROP CONSTRAINT job_runs_pkey",
    "ALTER TABLE job_runs ADD CONSTRAINT job_runs_pkey PRIMARY KEY (id, scheduled_at, partition_id)",
]

BACKWARD = [
    LOCK_TIMEOUT,
    "ALTER TABLE job_runs DROP CONSTRAINT job_runs_pkey",
    "ALTER TABLE job_runs ADD CONSTRAINT job_runs_pkey PRIMARY KEY (partition_id, id, scheduled_at)",
]


class Migration(migrations.Migration):
    dependencies = [("runs", "0021_one_claim_index")]

    operations = [migrations.RunSQL(FORWARD, BACKWARD)]
