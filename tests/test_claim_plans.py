"""The fair-share probes' bounds on `scheduled_at` as the planner reads them
(runs/execution/queries.py). No result shows it: a probe that reads a tenant's whole day and
sorts it returns the same runs as one that walks its ordered index to the first few."""

from __future__ import annotations

import re
from datetime import UTC, datetime, time, timedelta

import pytest
from django.db import connection

from runs.execution import queries
from tests.support.executor import day_partition_of, on_executor_connection, queue_runs, task_target

pytestmark = pytest.mark.django_db(transaction=True)


def estimated_rows(table: str, where: str) -> int:
    """The generic plan's row estimate (an executor connection: force_generic_plan) of
    the runs of `table` (a day partition) matching `where`, with OPEN_FROM's parameter at
    the start of today. A day partition, not job_runs: a generic plan prunes no partition
    here, and the estimates of the others (never analyzed: ten pages' worth of rows each,
    as many as other tests created) would add to the figure."""
    numbered = where.replace("%(open_from)s", "$1")

    async def explain(conn) -> int:
        await conn.execute(f"PREPARE bounds(timestamptz) AS SELECT 1 FROM {table} r WHERE {numbered}")
        cursor = await conn.execute("EXPLAIN EXECUTE bounds(date_trunc('day', now()))")
        first = (await cursor.fetchone())[0]
        return int(re.search(r"rows=(\d+)", first).group(1))

    return on_executor_connection(explain)


def test_the_day_bounds_are_not_read_as_a_range_of_half_a_percent(tenant):
    # PostgreSQL reads `x >= <parameter> AND x < <expression>` as a range and, with a
    # parameter at one end (always, in a generic plan), estimates it at 0.5% of the rows.
    # The tenant's (tenant_id, scheduled_at) index then looked cheaper than the aged-run
    # probe's ordered (tenant_id, not_before) index, and the probe read and sorted the
    # tenant's whole day (docs/decisions/0035-claim-day-bounds.md). NOT_AHEAD's always-false OR arm
    # keeps the two bounds apart; if a PostgreSQL release folds it away, this fails.
    start = datetime.combine(datetime.now(UTC).date(), time(6), tzinfo=UTC)
    keys = queue_runs(tenant, task_target("noop"), count=2000, start=start, spacing=timedelta(0))
    day = day_partition_of(keys[0])
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {day}")
    as_a_range = estimated_rows(day, f"{queries.OPEN_FROM} AND r.scheduled_at < now() + interval '1 day'")
    as_written = estimated_rows(day, f"{queries.OPEN_FROM} AND {queries.NOT_AHEAD}")
    assert as_a_range <= 2000 * 0.01  # the trap this guards against is still there
    assert as_written >= 2000 * 0.2  # each bound estimated on its own (1/3 for the parameter)
