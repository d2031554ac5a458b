"""Citus: an executor moves the successes it wrote to run_history, in bulk per shard.

On plain PostgreSQL the outcome statement moves a success itself (queries.COMPLETE). On
Citus that statement stays one statement inside its shard only without the move, so it
writes the success in place (`succeeded`, in job_runs) and the executor that wrote it
keeps the run's key here. `Pending` says when a move is due and hands out the oldest
keys; `move` sends them to their shards with queries.MOVE_SUCCEEDED, one statement per
shard for many outcome batches (docs/decisions/0087-citus-history-moves.md).

Between the outcome and the move the success reads the same through the view `runs`, from
job_runs: every reader, and every check for a run key or a newer success, reads both
tables. Keys are kept in memory only: an executor killed before it moved them, or one
that gave them up, leaves those successes in job_runs, where they read the same until
`sweep` moves them. Once a minute across all executors (turns.HISTORY_SWEEP), one reads
the keys of successes of the last SWEEP_DAYS' slots that finished over
SWEEP_AFTER_SECONDS ago (within the last day) and moves them as its own. It may meet a
live executor's move of the same run: the later DELETE finds the row gone and moves
nothing.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from uuid import UUID

import psycopg
from django.conf import settings

from runs import per_partition
from runs.execution import queries

log = logging.getLogger(__name__)

# A key waits at most this long for its move ...
MOVE_AFTER_SECONDS = 2.0
# ... or until this many wait. One move names at most this many keys, with one statement
# per shard for its share: a few hundred to a few thousand rows each on 32 shards.
MOVE_BATCH = 20_000
# After a move that failed (a worker out of reach, an outage), the next waits this long.
RETRY_SECONDS = 10.0
# Past this many keys waiting (the moves keep failing), the oldest are given up, a move's
# worth at a time: their successes stay in job_runs, where they read the same, for the
# sweep.
MAX_PENDING = 500_000

# The sweep: how often one executor looks for successes left in job_runs; how long after
# its outcome a success counts as left (its executor moves it within seconds, or within
# RETRY_SECONDS of a worker's return); for how long after that the sweep moves it; and
# the days it reads, of runs scheduled at most SWEEP_DAYS before (older days' partitions
# are not read). Successes written before the executors moved them (an upgrade) stay,
# save those of its last day: moving a month of them would write each again only for
# retention to drop it.
SWEEP_EVERY_SECONDS = 60.0
SWEEP_AFTER_SECONDS = 300.0
SWEEP_WITHIN_SECONDS = 86_400.0
SWEEP_DAYS = 2

MoveKey = tuple[int, UUID, datetime]  # (partition_id, job_id, scheduled_at)


class Pending:
    """The keys of successes this executor wrote in place and has not moved yet, oldest
    first."""

    def __init__(self) -> None:
        self._keys: list[MoveKey] = []
        self._since = 0.0  # monotonic time the oldest waiting key was noted
        self._retry_at = 0.0  # no move before this (monotonic), after a failed one

    def __len__(self) -> int:
        return len(self._keys)

    def note(self, keys: Iterable[MoveKey]) -> None:
        if not self._keys:
            self._since = time.monotonic()
        self._keys += keys
        if len(self._keys) > MAX_PENDING:
            dropped = len(self._keys) - (MAX_PENDING - MOVE_BATCH)
            del self._keys[:dropped]
            log.warning("gave up moving %d success(es) to run_history; the sweep moves them", dropped)

    def due(self, *, now: float | None = None) -> bool:
        """Whether a move is due: MOVE_BATCH keys wait, or the oldest has waited
        MOVE_AFTER_SECONDS; never within RETRY_SECONDS of a failed move."""
        now = time.monotonic() if now is None else now
        if not self._keys or now < self._retry_at:
            return False
        return len(self._keys) >= MOVE_BATCH or now - self._since >= MOVE_AFTER_SECONDS

    def take(self) -> list[MoveKey]:
        """The oldest MOVE_BATCH keys, no longer pending (`put_back` if their move failed).
        The keys left have waited as long: they stay due."""
        taken, self._keys = self._keys[:MOVE_BATCH], self._keys[MOVE_BATCH:]
        return taken

    def put_back(self, keys: list[MoveKey], *, now: float | None = None) -> None:
        """Keys whose move failed: pending again, behind the others (a worker out of reach
        must not hold up the keys of the rest), and no move for RETRY_SECONDS."""
        if not keys:
            return
        now = time.monotonic() if now is None else now
        if not self._keys:
            self._since = now
        self._keys += keys
        self._retry_at = now + RETRY_SECONDS


async def move(conn, keys: list[MoveKey]) -> int:
    """Move the successes of `keys` from job_runs to run_history; returns how many rows
    run_history gained. A key whose run is not a success in job_runs (moved already, or
    its job deleted) moves nothing. Raises per_partition.WorkerUnreachable with the keys
    of the workers out of reach (nothing of theirs moved)."""
    # Sorted: where the plan locks rows in key order, a sweep and an executor moving the
    # same rows lock them in one order and do not deadlock.
    rows = await per_partition.run(
        conn,
        queries.MOVE_SUCCEEDED,
        per_partition.group((key[0], key) for key in sorted(keys)),
        lambda batch: {
            **per_partition.window(*(key[2] for key in batch)),
            "run_partitions": [key[0] for key in batch],
            "job_ids": [key[1] for key in batch],
            "scheduled": [key[2] for key in batch],
        },
    )
    return len(rows)


@dataclass(frozen=True)
class Swept:
    moved: int
    unreachable: psycopg.Error | None = None  # a worker out of reach: its shards wait


async def sweep(conn) -> Swept:
    """Move the successes `left_behind` finds. A worker out of reach keeps its successes
    for a later sweep; the others' move."""
    keys, unreachable = await left_behind(conn)
    if not keys:
        return Swept(0, unreachable)
    try:
        moved = await move(conn, keys)
    except per_partition.WorkerUnreachable as exc:
        moved, unreachable = len(exc.rows), exc.cause
    log.info("swept %d success(es) left in job_runs to run_history", moved)
    return Swept(moved, unreachable)


async def left_behind(conn) -> tuple[list[MoveKey], psycopg.Error | None]:
    """The keys of up to MOVE_BATCH successes still in job_runs, of runs of the last
    SWEEP_DAYS, that finished between SWEEP_WITHIN_SECONDS and SWEEP_AFTER_SECONDS ago;
    and the error of a worker out of reach (one statement per shard: the others
    answer). Each shard reads at most its partitions' share of MOVE_BATCH."""
    partitions = settings.SCHEDULER_PARTITIONS
    since = datetime.now(UTC) - timedelta(days=SWEEP_DAYS)
    unreachable = None
    try:
        rows = await per_partition.run(
            conn,
            queries.UNMOVED_SUCCEEDED,
            {partition: [partition] for partition in range(partitions)},
            lambda batch: {
                "since": since,
                "after": SWEEP_AFTER_SECONDS,
                "within": SWEEP_WITHIN_SECONDS,
                "limit": math.ceil(MOVE_BATCH * len(batch) / partitions),
            },
        )
    except per_partition.WorkerUnreachable as exc:
        rows, unreachable = exc.rows, exc.cause
    return [(row[0], row[1], row[2]) for row in rows][:MOVE_BATCH], unreachable
