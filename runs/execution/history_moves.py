"""Citus: an executor moves the successes it wrote to run_history, in bulk per shard.

On plain PostgreSQL the outcome statement moves a success itself (queries.COMPLETE). On
Citus that statement stays one statement inside its shard only without the move, so it
writes the success in place (`succeeded`, in job_runs) and the executor that wrote it
keeps the run's key here. `Pending.take` hands out the keys due for a move, and `move`
sends them to their shards with queries.MOVE_SUCCEEDED, one statement per shard for
many outcome batches (docs/decisions/0087-citus-history-moves.md).

Between the outcome and the move the success reads the same through the view `runs`, from
job_runs: every reader, and every check for a run key or a newer success, reads both
tables. Keys are kept in memory only: an executor killed before it moved them leaves
those successes in job_runs, read as before, until retention drops their day.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from datetime import datetime
from uuid import UUID

from runs import per_partition
from runs.execution import queries

log = logging.getLogger(__name__)

# A key waits at most this long for its move ...
MOVE_AFTER_SECONDS = 2.0
# ... or until this many are waiting: one statement per shard, as many keys as it names.
MOVE_BATCH = 5000
# Past this many keys waiting (the moves keep failing), the oldest are given up: their
# successes stay in job_runs, where they read the same.
MAX_PENDING = 500_000

MoveKey = tuple[int, UUID, datetime]  # (partition_id, job_id, scheduled_at)


class Pending:
    """The keys of successes this executor wrote in place and has not moved yet."""

    def __init__(self) -> None:
        self._keys: list[MoveKey] = []
        self._since = 0.0  # monotonic time the oldest waiting key was noted

    def __len__(self) -> int:
        return len(self._keys)

    def note(self, keys: Iterable[MoveKey]) -> None:
        if not self._keys:
            self._since = time.monotonic()
        self._keys += keys
        if len(self._keys) > MAX_PENDING:
            dropped = len(self._keys) - MAX_PENDING
            del self._keys[:dropped]
            log.warning("gave up moving %d success(es) to run_history; they stay in job_runs", dropped)

    def due(self, *, now: float | None = None) -> bool:
        """Whether a move is due: keys have waited MOVE_AFTER_SECONDS, or MOVE_BATCH wait."""
        now = time.monotonic() if now is None else now
        return len(self._keys) >= MOVE_BATCH or (bool(self._keys) and now - self._since >= MOVE_AFTER_SECONDS)

    def take(self) -> list[MoveKey]:
        """The oldest MOVE_BATCH keys, no longer pending (`put_back` if their move failed)."""
        taken, self._keys = self._keys[:MOVE_BATCH], self._keys[MOVE_BATCH:]
        self._since = time.monotonic()
        return taken

    def put_back(self, keys: list[MoveKey]) -> None:
        self._keys[:0] = keys


async def move(conn, keys: list[MoveKey]) -> int:
    """Move the successes of `keys` from job_runs to run_history; returns how many rows
    run_history gained. A key whose run is not a success in job_runs (moved already, or
    its job deleted) moves nothing. Raises per_partition.WorkerUnreachable with the keys
    of the workers out of reach (nothing of theirs moved)."""
    rows = await per_partition.run(
        conn,
        queries.MOVE_SUCCEEDED,
        per_partition.group((key[0], key) for key in keys),
        lambda batch: {
            **per_partition.window(*(key[2] for key in batch)),
            "run_partitions": [key[0] for key in batch],
            "job_ids": [key[1] for key in batch],
            "scheduled": [key[2] for key in batch],
        },
    )
    return len(rows)
