"""The executor's database connections: libpq conninfo of Django's database, and
autocommit async connections tuned for the claim and outcome statements
(runs/execution/claims.py, runs/execution/outcomes.py).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from runs.execution import queries
from scheduler_project.citus import citus_installed_async


def database_conninfo() -> str:
    """libpq conninfo of Django's default database, for connections outside the ORM."""
    from django.conf import settings

    from scheduler_project.db import conninfo

    return conninfo(settings.DATABASES["default"], application_name="cronyard-executor")


def plan_cache_mode(*, citus: bool) -> str:
    """The executor's plan_cache_mode: generic plans on plain PostgreSQL, custom on Citus.

    On plain PostgreSQL a generic plan is made once per statement: job_runs has a
    partition per day, and planning the claim afresh (what plan_cache_mode=auto keeps
    doing, since no custom plan is ever costlier than the generic one) took longer than
    executing it (~4 ms of ~6 ms per statement). On Citus a generic plan of a statement
    on a distributed table cannot be routed to one shard (the shard depends on the
    partition_id parameter) and Citus refuses to build one for the claim; a custom plan
    is what lets it route each statement to its one shard.
    """
    return "force_custom_plan" if citus else "force_generic_plan"


# How long an executor session may sit idle inside a transaction before the server ends
# it (see connect_async). Its transactions' gaps between statements are microseconds.
IDLE_IN_TRANSACTION_SECONDS = 5.0


async def connect_async(conninfo: str | None = None):
    """An autocommit AsyncConnection: each statement commits on its own unless wrapped.

    Statements are prepared on first use; plan_cache_mode is chosen by plan_cache_mode().
    """
    import psycopg

    conn = await psycopg.AsyncConnection.connect(
        conninfo or database_conninfo(), autocommit=True, prepare_threshold=0
    )
    # A generic plan is made once, from the statistics and table sizes of that moment
    # (often an empty queue) and kept until ANALYZE invalidates it: one made on empty
    # partitions bitmap-scanned and sorted the whole queue, 113 ms a claim at 10k
    # queued instead of ~2 ms. Every statement here walks an index or looks up keys,
    # so seq and bitmap scans are ruled out; `replan` lets plans follow table growth.
    # No JIT: these are millisecond statements, and a generic plan's cost estimate
    # easily passes jit_above_cost: compiling ~300 functions took 250 ms per claim.
    # An executor transaction never waits on anything but the database, so one idle for
    # seconds belongs to a stalled process (SIGSTOP, a frozen VM). On Citus a claim holds
    # its claim locks across round trips; the server ends such a session, freeing the
    # tenant's other claimers (the scheduler arms the same for its dispatch transaction).
    mode = plan_cache_mode(citus=await citus_installed_async(conn))
    await conn.execute(queries.SESSION_SETTINGS, [mode, str(int(IDLE_IN_TRANSACTION_SECONDS * 1000))])
    return conn


# Generic plans are kept per connection (see connect_async); re-plan this often so a
# plan made when the queue was small does not outlive the backlog's arrival.
REPLAN_SECONDS = 5.0
# After an empty claim, re-plan this long after the last plan, not at once: executors
# sharing a queue often come back empty, and a plan costs ~8 ms of database CPU.
REPLAN_AFTER_EMPTY_SECONDS = 1.0


@dataclass
class Replanning:
    """When one connection's generic plans are remade: every REPLAN_SECONDS, or
    REPLAN_AFTER_EMPTY_SECONDS after the last time once a statement since came back
    empty (its plan may have been made for an empty queue)."""

    planned_at: float = field(default_factory=time.monotonic)
    empty_since: bool = False

    async def before(self, conn) -> None:
        """Before a statement: drop the connection's plans if they are due."""
        wait = REPLAN_AFTER_EMPTY_SECONDS if self.empty_since else REPLAN_SECONDS
        if time.monotonic() >= self.planned_at + wait:
            await replan(conn)
            self.planned_at, self.empty_since = time.monotonic(), False

    def after(self, *, empty: bool) -> None:
        self.empty_since = self.empty_since or empty


async def replan(conn) -> None:
    """Drop the connection's prepared statements: the next use plans them afresh."""
    await conn.execute(queries.DEALLOCATE_ALL)


async def listen_connection(conninfo: str | None = None):
    """A dedicated autocommit connection LISTENing on the executors' channel."""
    conn = await connect_async(conninfo)
    await conn.execute(queries.LISTEN)
    return conn


RECONNECT_DELAY_SECONDS = 1.0


async def connect_until_up(conninfo: str | None, *, outage, wait_first: bool):
    """connect_async, retried every RECONNECT_DELAY_SECONDS while the database is away
    (first waiting that long if `wait_first`); `outage` (an OutageLog) hears each try."""
    import psycopg

    while True:
        if wait_first:
            await asyncio.sleep(RECONNECT_DELAY_SECONDS)
        wait_first = True
        try:
            conn = await connect_async(conninfo)
        except psycopg.Error as exc:
            outage.failed(exc)
            continue
        outage.ok()
        return conn


async def close_quietly(conn) -> None:
    import psycopg

    try:
        await conn.close()
    except psycopg.Error:
        pass
