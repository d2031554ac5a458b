"""The planner's statistics of `jobs`, `job_targets` (the claim joins it) and `job_runs`'
day partitions, kept close to the rows they describe.

Why: the executor's hot statements run on generic plans (runs/execution/connections.py), and a
plan made from statistics that call a table empty is not a little slower, it is a
different plan. `ANALYZE` of a table whose rows are (nearly) all dead, after a mass
delete and before `VACUUM` truncates it, records almost no rows in many pages; the
planner scales rows per page by the current pages, so it estimates the table at next
to nothing however full it gets, until the next `ANALYZE`. Autovacuum runs that within
`autovacuum_naptime` (a minute) of enough changes; until then a claim joined its keys to
such a partition by reading all of it once per key (1.15 s for a claim of 100 runs over
20,000), and 20,000 runs drained at 302-449 runs/s instead of ~6,500
(docs/decisions/0047-planner-statistics.md). A partition never
analyzed is estimated from its size: the new day at 00:00 is not in that state, the
day after a delete is.

Two rules, each an `ANALYZE (SKIP_LOCKED)` of the table:
- "called empty" (`understated`): its statistics count fewer rows than pages, and it now
  holds at least a row a page. The executor checks it before the first claim of runs
  announced after an empty claim, reading at most that many rows of the table (the
  claim about to be planned must not see "empty"), and once a second beside the reaper
  from the statistics views.
- "outgrown" (`outgrown`): it holds at least twice the live rows its statistics
  describe, and at least ANALYZE_MIN_ROWS; autovacuum reacts to a tenth of changes but
  looks once a minute. Deletes never trigger it (see `outgrown`), and the steady state
  is left to autovacuum.

`ANALYZE` samples at most 30,000 rows and blocks neither reads nor writes; it updates
`pg_class`, which invalidates the generic plans that read the table, so the executor's
next statement is planned on the new statistics. Left out:
- the default partition, whose `ANALYZE` would hold up the partition maintainer's
  `CREATE TABLE ... PARTITION OF` while it holds the parent's lock (and every claim and
  dispatch behind it); only backfills beyond the created days land there;
- tables this session's role does not own (PostgreSQL would skip them with a warning).
The statistics views trail the inserting sessions by a second or more (PostgreSQL
flushes a busy session's counts every second, an idle one's within ten), which is why
the check before a claim reads the table rather than the views.

Citus: the rows live in shards on the workers, and each worker plans every statement
afresh with its values (custom plans), the claim's and the outcomes' day windows as
constant ranges (runs/per_partition.py). A shard whose statistics describe no row
(never analyzed, or analyzed empty) has no histogram, and a range is estimated at 0.5%
of its rows: a filled shard looks nearly empty, and the claim's keyed update read the
shard's whole day once per key (the measurements: docs/decisions/0047-planner-statistics.md).
The workers' autovacuum fixes it within a minute; the top of a new day is when that
minute costs most. So on Citus a third rule joins the two above, "undescribed"
(`undescribed`). Once a second one executor (turns.STATISTICS) reads every worker's
shard statistics (STATS_SHARDS: one catalog read per worker, none of the shards' rows),
of the days from the lowest open floor to a day ahead, those that can hold open runs
(autovacuum keeps the rest), and analyzes the shards a rule picks on their own workers
(STATS_ON_WORKERS), all workers at once. A worker that refuses the connection is left for a later turn; one
that does not answer holds the turn up for WORKER_TIMEOUT_MS. There is no check before
a claim: it would put a read of every worker on the claim path.
"""

from __future__ import annotations

import json
import logging

import psycopg
from psycopg import sql

from runs.execution import queries, turns
from scheduler_project.citus import citus_installed_async

log = logging.getLogger(__name__)

# Tables with fewer live rows than this are never "outgrown" (autovacuum's job): plans of
# tables this small are cheap whatever their shape.
ANALYZE_MIN_ROWS = 1000

# Citus: one executor's turn to read the shards' statistics comes this often.
SHARDS_EVERY_SECONDS = 1.0
# Citus: how long a worker may take to accept the statistics turn's connection.
WORKER_TIMEOUT_MS = 2000
# Citus: per worker, the error its last failed answer gave (logged once, not every turn).
_FAILED: dict[tuple[str, int], str] = {}


def outgrown(*, rows_when_analyzed: float, rows_now: int, min_rows: int) -> bool:
    """The "outgrown" rule: a table that holds `rows_now` live rows and at least twice
    the `rows_when_analyzed` its statistics describe (-1: never analyzed), and at least
    `min_rows`. Deletes never trigger it: an ANALYZE right after a mass delete is what
    leaves statistics that call a table empty."""
    return rows_now >= max(min_rows, 2 * rows_when_analyzed)


async def _analyze(conn, table: str) -> bool:
    """ANALYZE `table` unless it is locked or gone; whether it ran (SKIP_LOCKED only
    warns when it skips, so the table's last analyze time says)."""
    try:
        before = await (await conn.execute(queries.STATS_ANALYZED_AT, [table])).fetchone()
        await conn.execute(sql.SQL(queries.STATS_ANALYZE).format(sql.Identifier(*table.split("."))))
        after = await (await conn.execute(queries.STATS_ANALYZED_AT, [table])).fetchone()
    except psycopg.errors.UndefinedTable:
        return False  # dropped by retention since the catalog was read
    return after[0] is not None and after[0] != before[0]


def understated(*, rows_when_analyzed: float, pages_when_analyzed: int, rows_now: int) -> bool:
    """The "called empty" rule: statistics that count fewer rows than pages (a table
    analyzed when nearly every row was dead), while it now holds at least a row a page.
    The planner scales the analyzed rows per page by the current pages, so such a table
    is estimated at next to nothing however full it gets."""
    return 0 <= rows_when_analyzed < pages_when_analyzed <= rows_now


def undescribed(
    *, rows_when_analyzed: float, pages_when_analyzed: int, rows_now: int, pages_now: int
) -> bool:
    """The "undescribed" rule (Citus shards): statistics that describe no row (never
    analyzed: -1, or analyzed empty: 0) of a table that holds rows now, by the statistics
    views (`rows_now`) or because it has more pages than when analyzed (`pages_now`, the
    file's size, which does not trail the inserts as the views do). Such statistics have
    no histogram, and a constant range is estimated at 0.5% of the rows. (A shard filled
    by one long transaction grows while ANALYZE counts none of its rows: it is analyzed
    again each turn until that transaction commits.)"""
    return rows_when_analyzed <= 0 and (rows_now > 0 or pages_now > max(pages_when_analyzed, 0))


async def analyze_if_called_empty(conn) -> tuple[str, ...]:
    """Before a claim: ANALYZE the day partitions and job_targets whose statistics call
    them (nearly) empty while they hold a row a page. One catalog read when there is none."""
    if await citus_installed_async(conn):
        return ()
    cursor = await conn.execute(queries.STATS_UNDERSTATED)
    analyzed = []
    for table, pages in await cursor.fetchall():
        # Counts at most `pages` rows: enough to tell, without reading a full table whole.
        query = sql.SQL(queries.STATS_ROWS_UP_TO).format(sql.Identifier(*table.split(".")))
        try:
            (rows,) = await (await conn.execute(query, [pages])).fetchone()
        except psycopg.errors.UndefinedTable:
            continue
        if rows >= pages and await _analyze(conn, table):
            analyzed.append(table)
    return tuple(analyzed)


async def keep_statistics(conn, *, min_rows: int = ANALYZE_MIN_ROWS) -> tuple[str, ...]:
    """Once a second (autocommit `conn`): ANALYZE the watched tables that are "called
    empty" by their statistics or outgrew them, by the statistics views' live row counts.
    Returns the tables analyzed. On Citus, the shards (`_keep_shard_statistics`)."""
    if await citus_installed_async(conn):
        return await _keep_shard_statistics(conn, min_rows=min_rows)
    cursor = await conn.execute(queries.STATS_WATCHED)
    analyzed = []
    for table, rows_then, pages_then, rows_now in await cursor.fetchall():
        stale = understated(rows_when_analyzed=rows_then, pages_when_analyzed=pages_then, rows_now=rows_now)
        if (stale or outgrown(rows_when_analyzed=rows_then, rows_now=rows_now, min_rows=min_rows)) and (
            await _analyze(conn, table)
        ):
            analyzed.append(table)
    return tuple(analyzed)


async def _keep_shard_statistics(conn, *, min_rows: int) -> tuple[str, ...]:
    """Citus, in this executor's turn: ANALYZE the shards of the watched tables that a
    rule picks (undescribed, called empty, outgrown), each on its worker. Returns the
    tables whose shards were sent an ANALYZE; a shard another session holds a lock on
    (autovacuum) is skipped by its worker and looked at again in a later turn, as are
    the shards of a worker that did not answer, or whose list named a shard moved or
    dropped since the read (the whole list fails)."""
    if not await turns.take(conn, task=turns.STATISTICS, seconds=SHARDS_EVERY_SECONDS):
        return ()
    # A worker that does not answer would hold up the others, and this executor's reaper,
    # for Citus's default of 30 s. A session setting, not a transaction's: no transaction
    # stays open while the workers analyze.
    await conn.execute(queries.STATS_WORKERS_TIMEOUT, [str(WORKER_TIMEOUT_MS)])
    try:
        cursor = await conn.execute(queries.STATS_SHARDS, [queries.STATS_SHARDS_ON_WORKER])
        stale: dict[tuple[str, int], list[tuple[str, str]]] = {}
        for node, port, reached, result in await cursor.fetchall():
            if not _answered((node, port), reached, result):
                continue
            for schema, shard, rows_then, pages_then, rows_now, pages_now in json.loads(result):
                then = {"rows_when_analyzed": rows_then, "rows_now": rows_now}
                if (
                    undescribed(**then, pages_when_analyzed=pages_then, pages_now=pages_now or 0)
                    or understated(**then, pages_when_analyzed=pages_then)
                    or outgrown(**then, min_rows=min_rows)
                ):
                    stale.setdefault((node, port), []).append((schema, shard))
        if not stale:
            return ()
        workers = sorted(stale)
        commands = [
            sql.SQL(queries.STATS_ANALYZE)
            .format(sql.SQL(", ").join(sql.Identifier(*name) for name in sorted(stale[w])))
            .as_string(conn)
            for w in workers
        ]
        cursor = await conn.execute(
            queries.STATS_ON_WORKERS,
            {"nodes": [n for n, _ in workers], "ports": [p for _, p in workers], "commands": commands},
        )
        analyzed = set()
        for node, port, done, result in await cursor.fetchall():
            if _answered((node, port), done, result):
                analyzed.update(shard.rsplit("_", 1)[0] for _, shard in stale[(node, port)])
    finally:
        await conn.execute(queries.STATS_WORKERS_TIMEOUT_RESET)
    return tuple(sorted(analyzed))


def _answered(worker: tuple[str, int], ok: bool, result: str) -> bool:
    """Whether `worker` answered the statistics turn; a failure is logged when it first
    shows or changes, and its shards wait for a later turn."""
    if ok:
        _FAILED.pop(worker, None)
        return True
    if _FAILED.get(worker) != result:
        _FAILED[worker] = result
        log.warning("planner statistics of the shards on %s:%s not kept this turn: %s", *worker, result)
    return False
