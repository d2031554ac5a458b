"""The planner's statistics of `jobs` and `job_runs`' day partitions, kept close to the
rows they describe.

Why: the executor's hot statements are prepared and run on generic plans
(runs/connections.py), and a plan made from statistics of an empty table is not just
a little slower. A day partition first fills when its day starts (00:00 UTC, the top
of an hour for every hourly job) and until autovacuum analyzes it, up to a minute
later (`autovacuum_naptime`), its planner picture is "never analyzed" or "empty". The
fair-share probes then read a tenant's whole day to sort it instead of walking an
index to the first rows: a claim cost 2.7 ms of database time per run instead of
0.04, and 20,000 runs drained at 302 runs/s instead of 6,000 (docs/DECISIONS.md,
"Statistics of a table that filled since its last ANALYZE (stop 22)"). The same
follows a bulk import of jobs.

`TableStatistics.step` runs beside the reaper (once a second per executor): a table
that changed by at least as many rows as it had when last analyzed (and by at least
`min_changes`) is analyzed at once. Autovacuum's rule is a tenth of the table, but it
looks only once a minute; this one reacts within a second to the case that hurts (a
table that grew from nothing) and leaves the steady state to autovacuum. `ANALYZE`
takes a lock that does not block reads or writes of the rows, samples at most 30,000
of them, and `SKIP_LOCKED` passes over a table another session (autovacuum, another
executor, a partition change) is working on.

The step also says when any watched table was analyzed since its previous look (by it,
another executor or autovacuum): the executor then plans its statements afresh
instead of waiting for `REPLAN_SECONDS`.

On Citus the rows live in shards on the workers, whose own autovacuum keeps them; the
coordinator's tables show no changes, so the step finds nothing to do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from psycopg import sql

# Fewer changed rows than this never trigger an ANALYZE here (autovacuum's job): plans
# of tables this small are cheap whatever their shape.
ANALYZE_MIN_CHANGES = 1000

_WATCHED = r"(c.relname = 'jobs' OR c.relname LIKE 'job\_runs\_%')"

# The watched tables of this database's schema: jobs and every partition of job_runs.
_WATCHED_SQL = f"""
SELECT c.relname, s.n_mod_since_analyze, c.reltuples,
       greatest(s.last_analyze, s.last_autoanalyze) AS analyzed_at
FROM pg_stat_user_tables s
JOIN pg_class c ON c.oid = s.relid
WHERE s.schemaname = current_schema() AND {_WATCHED}
"""

# Watched tables whose statistics say "no rows in these pages": ANALYZE ran when every
# row was dead (after a mass delete, before VACUUM truncated the table). The planner
# then estimates the table at zero rows however large it grows, until the next ANALYZE,
# whereas a table never analyzed or analyzed empty and truncated is estimated from its
# current size. pg_class is current at once; the change counts above reach the
# statistics views up to a second after the inserting transaction.
_EMPTY_IN_STATISTICS_SQL = f"""
SELECT c.relname
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = current_schema() AND c.relkind = 'r' AND c.reltuples = 0 AND c.relpages > 0
  AND {_WATCHED}
"""


@dataclass(frozen=True)
class Look:
    """What one step did: the tables it analyzed, and whether any watched table was
    analyzed since the previous step (here or elsewhere), which makes plans stale."""

    analyzed: tuple[str, ...] = ()
    statistics_changed: bool = False


def needs_analyze(*, changes: int, rows_when_analyzed: float, min_changes: int) -> bool:
    """Whether a table that changed `changes` rows since its last ANALYZE, when it had
    `rows_when_analyzed` rows (-1: never analyzed), should be analyzed now."""
    return changes >= max(min_changes, rows_when_analyzed)


async def _analyze(conn, table: str) -> None:
    await conn.execute(sql.SQL("ANALYZE (SKIP_LOCKED) {}").format(sql.Identifier(table)))


async def analyze_if_called_empty(conn) -> tuple[str, ...]:
    """ANALYZE the watched tables whose statistics say they hold no rows while they do
    (see _EMPTY_IN_STATISTICS_SQL). Cheap when there are none: one catalog read."""
    cursor = await conn.execute(_EMPTY_IN_STATISTICS_SQL)
    analyzed = []
    for (table,) in await cursor.fetchall():
        query = sql.SQL("SELECT EXISTS (SELECT FROM {})").format(sql.Identifier(table))
        if (await (await conn.execute(query)).fetchone())[0]:
            await _analyze(conn, table)
            analyzed.append(table)
    return tuple(analyzed)


@dataclass
class TableStatistics:
    min_changes: int = ANALYZE_MIN_CHANGES
    # The newest analyze time seen among the watched tables (None before the first look).
    _newest: datetime | None = field(default=None, init=False)
    _looked: bool = field(default=False, init=False)

    async def step(self, conn) -> Look:
        """One look (autocommit `conn`): analyze the tables that outgrew their
        statistics, and report whether plans made before are stale."""
        analyzed = list(await analyze_if_called_empty(conn))
        cursor = await conn.execute(_WATCHED_SQL)
        watched = await cursor.fetchall()
        for name, changes, rows_then, _ in watched:
            if name not in analyzed and needs_analyze(
                changes=changes, rows_when_analyzed=rows_then, min_changes=self.min_changes
            ):
                await _analyze(conn, name)
                analyzed.append(name)
        if analyzed:
            cursor = await conn.execute(_WATCHED_SQL)
            watched = await cursor.fetchall()
        newest = max((row[3] for row in watched if row[3] is not None), default=None)
        moved = self._looked and newest is not None and (self._newest is None or newest > self._newest)
        self._newest, self._looked = newest, True
        return Look(analyzed=tuple(analyzed), statistics_changed=bool(analyzed) or moved)
