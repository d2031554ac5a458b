"""What PostgreSQL did during a timed window: counter deltas from `pg_stat_*`.

The dispatch benchmark (bench/dispatch.py) takes a snapshot right before it makes
the jobs due and one when the last run exists, and reports the difference per round,
so the growth curve from 10k to 1M jobs says where the cost went:
checkpoints forced by WAL volume, WAL bytes per run, HOT updates of `jobs`,
buffers read from disk, and the heaviest statements when pg_stat_statements is loaded.
"""

from __future__ import annotations

import psycopg

_COUNTERS_SQL = """
SELECT
  (SELECT checkpoints_timed FROM pg_stat_bgwriter),
  (SELECT checkpoints_req FROM pg_stat_bgwriter),
  (SELECT buffers_backend FROM pg_stat_bgwriter),
  pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint,
  (SELECT blks_read FROM pg_stat_database WHERE datname = current_database()),
  (SELECT blks_hit FROM pg_stat_database WHERE datname = current_database()),
  coalesce((SELECT n_tup_upd FROM pg_stat_user_tables WHERE relname = 'jobs'), 0),
  coalesce((SELECT n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'jobs'), 0),
  coalesce((SELECT autovacuum_count + autoanalyze_count FROM pg_stat_user_tables WHERE relname = 'jobs'), 0)
"""
_NAMES = (
    "checkpoints_timed",
    "checkpoints_req",
    "buffers_backend",
    "wal_bytes",
    "blks_read",
    "blks_hit",
    "jobs_tup_upd",
    "jobs_tup_hot_upd",
    "jobs_autovacuum_analyze",
)
TOP_STATEMENTS = 5


def counters(conn: psycopg.Connection) -> dict[str, int]:
    """The cumulative counters now. Statistics are flushed by backends about once a
    second, so a window shorter than that undercounts (the 10k round, not the 1M one)."""
    conn.execute("SELECT pg_stat_clear_snapshot()")
    return dict(zip(_NAMES, conn.execute(_COUNTERS_SQL).fetchone(), strict=True))


def delta(before: dict[str, int], after: dict[str, int], *, runs: int) -> dict:
    """after - before, plus the per-run figures the growth curve compares."""
    out: dict = {name: after[name] - before[name] for name in _NAMES}
    out["wal_bytes_per_run"] = round(out["wal_bytes"] / runs) if runs else None
    out["checkpoints"] = out["checkpoints_timed"] + out["checkpoints_req"]
    return out


def has_statements(conn: psycopg.Connection) -> bool:
    """pg_stat_statements usable in this database (preloaded and the extension created)."""
    loaded = conn.execute(
        "SELECT 'pg_stat_statements' = ANY(string_to_array(current_setting('shared_preload_libraries'), ','))"
    ).fetchone()[0]
    if not loaded:
        return False
    conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    return True


def reset_statements(conn: psycopg.Connection) -> None:
    if has_statements(conn):
        conn.execute("SELECT pg_stat_statements_reset()")


def top_statements(conn: psycopg.Connection, *, runs: int) -> list[dict]:
    """The statements of this database that took the most execution time since the reset,
    in µs per dispatched run (so rounds of different N compare directly)."""
    if not has_statements(conn) or not runs:
        return []
    rows = conn.execute(
        """
        SELECT regexp_replace(left(query, 90), '\\s+', ' ', 'g'), calls, total_exec_time,
               shared_blks_hit + shared_blks_read
        FROM pg_stat_statements
        WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
        ORDER BY total_exec_time DESC LIMIT %s
        """,
        [TOP_STATEMENTS],
    ).fetchall()
    return [
        {
            "query": query,
            "calls": calls,
            "us_per_run": round(ms * 1000 / runs, 1),
            "blocks_per_run": round(blocks / runs, 1),
        }
        for query, calls, ms, blocks in rows
    ]
