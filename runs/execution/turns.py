"""Turns: periodic work that one executor does for all of them.

Some of an executor's periodic reads cover every partition (on Citus, every shard):
the reaper's look for expired leases, the open floor upkeep, the read of the shards'
planner statistics, the sweep of successes left in job_runs. Run by each executor, their
cost would grow with the number of executors; run once per interval by whichever
executor asks first, it does not. Each task has one row in `upkeep_turns` (on the
coordinator on Citus), holding when its next turn begins: the first caller to ask at or
after that moment takes the turn and sets the next one (TAKE_TURN).

A caller that takes a turn and then fails leaves it taken: the task waits one interval.
Two callers doing the task at once remain safe for every task here (reaping is a
compare-and-set on the attempt, the upkeep's writes are guarded by the floors'
versions, a second ANALYZE is only work wasted, a success moves once whoever moves
it); the turn saves their cost, nothing more.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import psycopg

from runs.execution import queries

# The tasks (upkeep_turns.task).
REAPER = "reaper"  # the executors' read of expired leases (runs/execution/run_leases.py)
OPEN_FLOORS = "open_floors"  # the open floor upkeep (runs/open_floors.py, keep)
STATISTICS = "statistics"  # Citus: the shards' planner statistics (runs/execution/table_statistics.py)
HISTORY_SWEEP = "history_sweep"  # Citus: successes no executor will move (runs/execution/history_moves.py)


async def take(conn: psycopg.AsyncConnection, *, task: str, seconds: float) -> bool:
    """Whether this caller does `task` now: the first to ask once its last turn's
    `seconds` have passed takes the next one. Every caller of one task must pass the same
    `seconds` (a turn set further ahead than two intervals counts as over: the clock went
    back)."""
    cursor = await conn.execute(queries.TAKE_TURN, {"task": task, "seconds": seconds})
    return await cursor.fetchone() is not None


@dataclass
class Asking:
    """One process's asks for a task's turn, at most one per `every` seconds: for a
    task whose turn lasts longer than the process's loop, asking each time round would
    cost a coordinator statement for nothing."""

    task: str
    seconds: float  # the turn's length (`take`)
    every: float  # how often this process asks
    _due: float = 0.0  # monotonic time of the next ask

    async def take(self, conn: psycopg.AsyncConnection) -> bool:
        """Whether this caller does the task now: an ask is due and it took the turn."""
        if time.monotonic() < self._due:
            return False
        self._due = time.monotonic() + self.every
        return await take(conn, task=self.task, seconds=self.seconds)
