"""run_history keeps a column only where a success differs from nearly every run.

A success's row in run_history held every column of job_runs: its status (always
`succeeded`), its lease (always none), and a dozen columns that hold the same value in
nearly every run (the trigger `schedule`, priority 0, the first attempt, the policies'
defaults, no error, no attempts history, no deferral, a start at the time the run was
created). From here those columns are NULL in such a row, which costs one bit of the
null bitmap every row has anyway, and the view `runs` gives the value back
(docs/decisions/0086-lean-history-row.md; the writers build their INSERT in
runs/history.py).

- run_history loses `status` (its CHECK goes with it) and `lease_until`; the sparse
  columns lose NOT NULL and their defaults.
- run_history's primary key `(id, scheduled_at, partition_id)` gives way to the run key
  `(partition_id, job_id, scheduled_at)`, which was its unique constraint, and an index
  on `id`; ids come from job_runs' sequence.
- `runs` reads run_history through COALESCE with the value each NULL stands for, and
  `succeeded` and a null lease for the dropped columns.

The rows written before stay as they are: their sparse columns hold the value itself,
which the COALESCE returns unchanged. Dropping a column and a NOT NULL changes the
catalog only; the two indexes are built over the successes run_history holds (those
since 0023), under an ACCESS EXCLUSIVE lock that every read of the view waits for, and
no row is rewritten. Stop the executors of the release before first: their move writes
run_history's old columns. There is no way back: the old
move inserts by column position, and the dropped columns cannot come back in their place.
"""

from django.db import migrations

# Column -> the value its NULL stands for: runs/history.py SPARSE at the time, frozen here.
SPARSE = {
    "trigger": "'schedule'::varchar(16)",
    "priority": "0::smallint",
    "attempt": "1",
    "not_before": "h.created_at",
    "overlap_policy": "'skip'::varchar(16)",
    "max_attempts": "5",
    "retry_backoff_seconds": "10",
    "retry_backoff_cap_seconds": "3600",
    "lease_seconds": "30",
    "last_error": "''",
    "attempts": "'[]'::jsonb",
    "deferrals": "0",
}
# The view's columns: job_runs' columns in job_runs' order, as run_history gives them.
VIEW_COLUMNS = [
    "id",
    "job_id",
    "scheduled_at",
    "tenant_id",
    "partition_id",
    "status",
    "trigger",
    "priority",
    "attempt",
    "not_before",
    "lease_until",
    "owner",
    "target",
    "job_name",
    "overlap_policy",
    "max_attempts",
    "retry_backoff_seconds",
    "retry_backoff_cap_seconds",
    "lease_seconds",
    "created_at",
    "started_at",
    "finished_at",
    "result_code",
    "last_error",
    "attempts",
    "deferrals",
    "deferred_since",
    "rate_limited_to",
    "target_version",
]
DROPPED = {"status": "'succeeded'::varchar(16)", "lease_until": "NULL::timestamptz"}


def _history_value(column: str) -> str:
    if column in DROPPED:
        return f'{DROPPED[column]} AS "{column}"'
    if column in SPARSE:
        return f'COALESCE(h."{column}", {SPARSE[column]}) AS "{column}"'
    return f'h."{column}"'


# One command per statement: Citus forwards a DDL command's text to the workers. The
# lock timeout: an ALTER waiting behind a long transaction on run_history would queue
# every reader of the view behind it. The view goes first (it depends on the columns
# dropped), which also puts the transaction in Citus's sequential mode, so the last
# CREATE VIEW runs after the DDL on the shards.
FORWARD = [
    "SET LOCAL lock_timeout = '5s'",
    "DROP VIEW runs",
    "ALTER TABLE run_history DROP COLUMN status",
    "ALTER TABLE run_history DROP COLUMN lease_until",
    *(f'ALTER TABLE run_history ALTER COLUMN "{column}" DROP NOT NULL' for column in SPARSE),
    *(f'ALTER TABLE run_history ALTER COLUMN "{column}" DROP DEFAULT' for column in SPARSE),
    # The run key becomes the primary key, the table's replica identity (a Citus shard
    # move replicates deletes by it), and (id, scheduled_at, partition_id) gives way to an
    # index on id: the console finds a run, and lists runs newest first, by id alone.
    "ALTER TABLE run_history DROP CONSTRAINT run_history_pkey",
    "ALTER TABLE run_history DROP CONSTRAINT run_history_key",
    "ALTER TABLE run_history ADD CONSTRAINT run_history_pkey PRIMARY KEY (partition_id, job_id, scheduled_at)",
    "CREATE INDEX run_history_id_idx ON run_history (id)",
    "CREATE VIEW runs AS SELECT * FROM job_runs UNION ALL SELECT "
    + ", ".join(_history_value(column) for column in VIEW_COLUMNS)
    + " FROM run_history h",
]

# RunHistoryRow only counts and deletes (readers read the view): its state keeps these
# fields, and the others go.
KEPT = {"id", "job_id", "scheduled_at", "tenant_id", "partition_id"}
REMOVED = [column for column in VIEW_COLUMNS if column not in KEPT]


class Migration(migrations.Migration):
    dependencies = [("runs", "0023_run_history")]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL(FORWARD)],
            state_operations=[migrations.RemoveField(model_name="runhistoryrow", name=name) for name in REMOVED],
        ),
    ]
