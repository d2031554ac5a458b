"""The executor's writes that name their runs by key find each run by its key, whatever
the statistics say (runs/execution/queries.py, `held`). No result shows it: a plan that
walks every running run once per outcome writes the same rows as one that looks each
run up, only its cost grows with the runs in flight."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from psycopg import sql

from runs import rows
from runs.attempts import AttemptRecord
from runs.execution import outcomes, queries
from tests.support.executor import day_partition_of, on_executor_connection, queue_runs, task_target
from tests.support.plans import job_runs_reads

pytestmark = pytest.mark.django_db(transaction=True)

IN_FLIGHT = 400
BATCH = 20


class Explaining:
    """An executor connection that runs `statement` as EXPLAIN ANALYZE of its generic
    plan (the plan an executor connection keeps: force_generic_plan) and keeps that
    plan; every other statement passes through."""

    def __init__(self, conn, statement: str) -> None:
        self.conn, self.statement, self.plans = conn, statement, []

    def __getattr__(self, name: str):
        return getattr(self.conn, name)

    async def execute(self, query, params=None):
        if query != self.statement:
            return await self.conn.execute(query, params)
        names: list[str] = []

        def number(match: re.Match) -> str:
            if match.group(1) not in names:
                names.append(match.group(1))
            return f"${names.index(match.group(1)) + 1}"

        numbered = re.sub(r"%\((\w+)\)s", number, query)
        types = ", ".join(_TYPES[type(params[name])] for name in names)
        await self.conn.execute(f"PREPARE keyed({types}) AS {numbered}")
        values = ", ".join(sql.Literal(params[name]).as_string(self.conn) for name in names)
        cursor = await self.conn.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE keyed({values})")
        self.plans.append((await cursor.fetchone())[0][0]["Plan"])
        await self.conn.execute("DEALLOCATE keyed")
        return _NoRows()


# The parameters' types for PREPARE (the statement's casts take the text to jsonb).
_TYPES = {datetime: "timestamptz", str: "text", list: "uuid[]"}


class _NoRows:
    async def fetchall(self) -> list:
        return []


def repeated_walks(plan: dict) -> list[tuple[str, float]]:
    """The scans of job_runs the plan repeats (once per row of the batch) that read more
    than one run each time: (index, runs read per loop). A lookup by key reads one."""
    # EXPLAIN gives both counts per loop.
    return [
        (read.get("Index Name", read["Node Type"]), per_loop)
        for read in job_runs_reads(plan)
        if read.get("Actual Loops", 0) > 1
        and (per_loop := read.get("Actual Rows", 0) + read.get("Rows Removed by Filter", 0)) > 1
    ]


def test_outcomes_look_each_run_up_by_its_key_however_many_runs_are_in_flight(tenant):
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=5)
    keys = queue_runs(tenant, task_target("noop"), count=IN_FLIGHT, start=start, spacing=timedelta(0))
    with connection.cursor() as cursor:
        # Statistics taken while every run was queued, as the executor's table statistics
        # and autovacuum take them at the start of a burst: they count no running run.
        cursor.execute(f"ANALYZE {day_partition_of(keys[0])}")
        cursor.execute(
            "UPDATE job_runs SET status = 'running', attempt = 1, lease_until = now() + interval '1 hour'"
            " WHERE tenant_id = %s RETURNING partition_id, job_id, scheduled_at",
            [tenant.id],
        )
        claimed = cursor.fetchall()
    now = datetime.now(UTC)
    # Successes (moved to run_history) and failures (updated in place): each half of the
    # statement finds its runs.
    outcomes_of = [("succeeded", 200, ""), ("retrying", 503, "busy"), ("dead", 500, "broken")]
    done = []
    for i, (partition_id, job_id, scheduled_at) in enumerate(claimed[:BATCH]):
        status, code, error = outcomes_of[i % 3]
        done.append(
            rows.Completion(
                job_id=job_id,
                scheduled_at=scheduled_at,
                partition_id=partition_id,
                attempt=1,
                status=status,
                retry_in_s=30.0 if status == "retrying" else None,
                result_code=code,
                error=error,
                entry=AttemptRecord(1, "x:1", now, now, None, status, code, error, None),
            )
        )

    async def explain(conn) -> list[dict]:
        explaining = Explaining(conn, queries.COMPLETE.many)
        await outcomes.complete_runs(explaining, done, now=now)
        return explaining.plans

    (plan,) = on_executor_connection(explain)
    with connection.cursor() as cursor:
        # The statement ran and wrote every outcome.
        cursor.execute("SELECT count(*) FROM run_history WHERE tenant_id = %s", [tenant.id])
        assert cursor.fetchone()[0] == len([c for c in done if c.status == "succeeded"])
        cursor.execute(
            "SELECT count(*) FROM job_runs WHERE tenant_id = %s AND status IN ('retrying', 'dead')",
            [tenant.id],
        )
        assert cursor.fetchone()[0] == len([c for c in done if c.status != "succeeded"])
    # A lookup per outcome. Through the running index, the plan read every run in flight
    # (400) again for each outcome. (A single pass over a small partition, hashed against
    # the batch, is the planner's choice by the table's size, and costed as such.)
    assert repeated_walks(plan) == []
