"""What a success keeps in run_history, and how (docs/decisions/0086-lean-history-row.md).

A success is written once into run_history and read through the view `runs` (runs
migration 0024). The row stores a column only where the run differs from what nearly
every run has: NULL stands for that value, and the view gives it back. A NULL costs one
bit of the row's null bitmap, which every row has anyway (the target, the deferral
times and the dropped columns are null). A success has no status column (it is
`succeeded`) and no lease (it has none).

Every writer of run_history builds its INSERT here: the outcome statement's move
(runs/execution/queries.py, COMPLETE), Citus's move after the outcome (MOVE_SUCCEEDED),
the benchmark's own-schema limit and the tests' run maker. The view's COALESCEs are the
other half of the same encoding; migrations are frozen, so 0024 carries its own copy,
and tests/test_run_history.py checks that a run reads the same before and after its
move, column by column.
"""

from __future__ import annotations

# run_history's columns (tests/test_run_history.py checks them against the table, so a
# column the table gains cannot be left out of the move).
COLUMNS: tuple[str, ...] = (
    "id",
    "job_id",
    "scheduled_at",
    "tenant_id",
    "partition_id",
    "trigger",
    "priority",
    "attempt",
    "not_before",
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
)

# A sparse column -> the value its NULL stands for, as SQL over the run's own columns. A
# stored NULL means the value in force when it was written: a value here changes only
# with a migration that writes the old one into the rows (and the view's copy in 0024).
SPARSE: dict[str, str] = {
    "trigger": "'schedule'",
    "priority": "0",
    "attempt": "1",
    "not_before": "created_at",
    "overlap_policy": "'skip'",
    "max_attempts": "5",
    "retry_backoff_seconds": "10",
    "retry_backoff_cap_seconds": "3600",
    "lease_seconds": "30",
    "last_error": "''",
    "attempts": "'[]'::jsonb",
    "deferrals": "0",
}


def insert_sql(source: str, **given: str) -> str:
    """`INSERT INTO run_history ... SELECT ... FROM source`, where `source` has job_runs'
    column names; `given` replaces a column's value with an SQL expression over the
    source (the outcome's finish time, say). Sparse columns are stored as NULL where they
    hold the value NULL stands for."""
    unknown = set(given) - set(COLUMNS)
    if unknown:
        raise ValueError(f"run_history has no column {sorted(unknown)}")

    def value(column: str) -> str:
        expression = given.get(column, f'"{column}"')
        return f"NULLIF({expression}, {SPARSE[column]})" if column in SPARSE else expression

    names = ", ".join(f'"{column}"' for column in COLUMNS)
    values = ", ".join(value(column) for column in COLUMNS)
    return f"INSERT INTO run_history ({names})\nSELECT {values}\nFROM {source}"
