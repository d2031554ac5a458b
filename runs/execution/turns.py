"""Turns: periodic work that one executor does for all of them.

Some of an executor's periodic reads cover every partition (on Citus, every shard):
the reaper's look for expired leases, the open floor upkeep. Run by each executor, their
cost would grow with the number of executors; run once per interval by whichever
executor asks first, it does not. Each task has one row in `upkeep_turns` (on the
coordinator on Citus), holding when its next turn begins: the first caller to ask at or
after that moment takes the turn and sets the next one (TAKE_TURN).

A caller that takes a turn and then fails leaves it taken: the task waits one interval.
Two callers doing the task at once remain safe for every task here (each is a
compare-and-set or only raises what it may); the turn saves their cost, nothing more.
"""

from __future__ import annotations

from runs.execution import queries


async def take(conn, *, task: str, seconds: float) -> bool:
    """Whether this caller does `task` now: the first to ask once its last turn's
    `seconds` have passed takes the next one. Every caller of one task must pass the same
    `seconds` (a turn set further ahead than two intervals counts as over: the clock went
    back)."""
    cursor = await conn.execute(queries.TAKE_TURN, {"task": task, "seconds": seconds})
    return await cursor.fetchone() is not None
