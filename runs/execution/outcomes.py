"""The write that ends attempts: outcomes, fenced by attempt, with each job's health in
the same statement (only where it changes). One statement for the batch, or one per
partition on Citus (runs/per_partition.py): a job's runs and its jobs row share the partition, so each
job's health is judged from all its outcomes of the batch at once. Times are computed
here and passed in (runs/execution/queries.py says why). The statement is
queries.COMPLETE.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from runs import per_partition
from runs.execution import queries
from runs.rows import Completion, RunKey

# How stale a healthy job's stored last_success_at may grow before a success rewrites
# it (readers prefer its newest succeeded run; the copy serves once retention dropped it).
LAST_SUCCESS_REFRESH = timedelta(days=1)


async def complete_runs(
    conn, completions: Sequence[Completion], *, now: datetime | None = None
) -> set[RunKey]:
    """Write the outcomes of attempts, each only if that attempt still holds its run.

    Returns the keys written; the others were fenced off and wrote nothing. One
    statement, or one per partition on Citus (a job's runs and its jobs row share it, so each job's
    health is judged from all its outcomes of the batch at once). `now` (default: the
    clock) is the finished_at the ended runs get.
    """
    now = now or datetime.now(UTC)
    try:
        written = await per_partition.run(
            conn,
            queries.COMPLETE,
            per_partition.group((c.partition_id, c) for c in completions),
            lambda batch: {
                # The batch's slots and the newer successes the health check looks for.
                **per_partition.window(now, *(c.scheduled_at for c in batch)),
                "now": now,
                "stale_before": now - LAST_SUCCESS_REFRESH,
                "rows": _encode_completions(batch, now=now),
                "job_ids": sorted({c.job_id for c in batch}),
            },
        )
    except per_partition.WorkerUnreachable as exc:
        raise PartlyWritten(exc, written={(row[0], row[1], row[2]) for row in exc.rows}) from exc
    return {(row[0], row[1], row[2]) for row in written}


class PartlyWritten(per_partition.WorkerUnreachable):
    """Some outcomes were written (`written`, as complete_runs returns them; the others of
    those workers were fenced), and those of `items` (Completions) were not: their worker
    is out of reach. Write them again later."""

    def __init__(self, exc: per_partition.WorkerUnreachable, *, written: set[RunKey]) -> None:
        super().__init__(exc.cause, rows=exc.rows, items=exc.items)
        self.written = written


def _encode_completions(completions: Sequence[Completion], *, now: datetime) -> str:
    return json.dumps(
        [
            {
                "partition_id": c.partition_id,
                "job_id": str(c.job_id),
                "scheduled_at": c.scheduled_at.isoformat(),
                "attempt": c.attempt,
                "status": c.status,
                # The retry time is computed here, not in SQL (see the module docstring).
                "not_before": (now + timedelta(seconds=c.retry_in_s or 0)).isoformat(),
                "result_code": c.result_code,
                "error": c.error,
                "entry": [c.entry.to_stored()],
            }
            for c in completions
        ]
    )
