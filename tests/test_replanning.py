"""When an executor connection's generic plans are remade (runs/execution/connections.Replanning)."""

from __future__ import annotations

import asyncio
import time

from runs.execution import connections


class Recorder:
    """Stands in for a connection: records the statements sent to it."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    async def execute(self, sql: str) -> None:
        self.sent.append(sql)


def deallocations(replanning: connections.Replanning, conn: Recorder) -> int:
    asyncio.run(replanning.before(conn))
    return conn.sent.count("DEALLOCATE ALL")


def test_plans_are_kept_until_replan_seconds_have_passed():
    conn = Recorder()
    replanning = connections.Replanning(planned_at=time.monotonic() + 60)  # planned "just now"
    assert deallocations(replanning, conn) == 0
    replanning.planned_at = time.monotonic() - connections.REPLAN_SECONDS
    assert deallocations(replanning, conn) == 1
    assert deallocations(replanning, conn) == 1  # planned just now


def test_after_an_empty_statement_plans_are_remade_sooner_but_not_at_once():
    conn = Recorder()
    replanning = connections.Replanning(planned_at=time.monotonic() + 60)
    replanning.after(empty=True)
    replanning.after(empty=False)  # a later full one does not undo it
    assert deallocations(replanning, conn) == 0
    replanning.planned_at = time.monotonic() - connections.REPLAN_AFTER_EMPTY_SECONDS
    assert deallocations(replanning, conn) == 1
    # Re-planned: until the next empty statement, REPLAN_SECONDS again.
    replanning.after(empty=False)
    replanning.planned_at = time.monotonic() - connections.REPLAN_AFTER_EMPTY_SECONDS
    assert deallocations(replanning, conn) == 1
