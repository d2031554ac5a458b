"""Bytes on disk per finished run, as a user's runs leave them.

    DATABASE_URL=... .venv/bin/python bench/storage.py [--runs 20000] [--retried 5000] [--waves 10]
        [--json out.json]

A scratch database on the same cluster (`cronyard_bench_storage`, dropped and migrated
afresh, so nothing else shares its tables; `--db` names another) holds N jobs with the realistic HTTP target
of docs/CONTRACT.md's benchmark workload: a POST with a JSON body of about 150 bytes and
two headers, `Authorization` marked secret. Every job is due once; one `run_scheduler`
and two `run_executor` processes fire and execute them against the no-op server
(bench/noop_server.py) until every run has succeeded. Then a plain `VACUUM` of the run
partitions, and:

    heap + TOAST   pg_table_size of every partition of job_runs and run_history (with
                   its TOAST, FSM, VM): a success moves its row from the first, where it
                   was queued, claimed and run, to the second, where it stays
    indexes        pg_indexes_size of every partition of both
    row            avg(pg_column_size(run_history.*)): the live tuple alone

each divided by the runs. The same again in `--waves` waves (one_round says why), and both
with a target under `/fail-twice`, which answers 503 twice per run key: runs that needed
three attempts. A run names its job's target version instead of holding the target:
the versions (`job_targets`, one per job and edit, not per run) are printed per job.

The budget is the seed's: about 200 bytes per run (240M runs a day, 30 days kept); the
report prints the seed-scale figures these bytes come to. The scratch database is left
for inspection (`psql .../cronyard_bench_storage`) and dropped by the next run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DATABASE = "cronyard_bench_storage"
RUNS_A_DAY = 240_000_000  # the seed's volume
DAYS_KEPT = 30
BUDGET = {1: 200, 3: 400}  # bytes per finished run, by attempts
BODY = json.dumps(
    {
        "event": "nightly-rollup",
        "account": "acct_4f1c2b9e",
        "window": {"from": "2026-01-01T00:00:00Z", "to": "2026-01-02T00:00:00Z"},
        "options": {"dry_run": False, "notify": ["ops@example.com"]},
    }
)


def target(url: str) -> dict:
    return {
        "type": "http",
        "url": url,
        "method": "POST",
        "headers": {
            "Authorization": "Bearer 7f3c9a1e5b2d4f6a8c0e1b3d5f7a9c2e",
            "Content-Type": "application/json",
        },
        "secret_headers": ["Authorization"],
        "body": BODY,
        "timeout_seconds": 10,
    }


def on_citus(conn: psycopg.Connection) -> bool:
    from scheduler_project.citus import citus_installed

    return citus_installed(conn.cursor())


def fresh_database(base: str, name: str) -> str:
    from bench.dispatch import ensure_database
    from scheduler_project.citus import prepare_database, workers

    with psycopg.connect(base, autocommit=True) as conn:
        citus = on_citus(conn)
        nodes = [f"{host}:{port}" for host, port in workers(conn.cursor())] if citus else []
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if citus:  # a Citus database afresh on every node, the workers' copies dropped too
            conn.execute(f'CREATE DATABASE "{name}"')
    if citus:
        info = psycopg.conninfo.conninfo_to_dict(base)
        coordinator = f"{info.get('host', '127.0.0.1')}:{info.get('port', 5432)}"
        prepare_database(coordinator=coordinator, workers=nodes, db=name, create_on_coordinator=False)
    # Bytes per run over the partitions the runs are in: empty retained ones would add
    # their fixed pages to every run's share.
    return ensure_database(base, name, retained=False)


def seed(*, n: int, url: str) -> None:
    """N jobs of one tenant, each due now and then not for a day: one run each."""
    from bench.execute import make_jobs
    from jobs.models import Job, JobTarget, Tenant
    from runs.execution.signing import new_secret

    tenant, _ = Tenant.objects.get_or_create(
        slug="bench-storage",
        defaults={"name": "bench-storage", "max_concurrency": 1_000_000, "signing_secret": new_secret()},
    )
    jobs = make_jobs(
        tenant=tenant.id, n=n, target=target(url), interval_seconds=86400, next_run_at=datetime.now(UTC)
    )
    for job in jobs:
        job.retry_backoff_seconds, job.retry_backoff_cap_seconds = 1, 2
    JobTarget.objects.create_for_new_jobs(jobs, batch_size=2000)
    Job.objects.bulk_create(jobs, batch_size=2000)


def wait_done(conn: psycopg.Connection, n: int, timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        # In run_history: on Citus a success moves there a few seconds after its outcome
        # (docs/decisions/0087-citus-history-moves.md), and is measured once it has.
        done = conn.execute("SELECT count(*) FROM run_history").fetchone()[0]
        if done >= n:
            return
        time.sleep(1)
    raise RuntimeError(f"only {done} of {n} runs succeeded within {timeout:.0f} s")


def parts(conn: psycopg.Connection) -> dict[tuple[str, str], int]:
    """Bytes per (table, part): each table's heap (with its TOAST and maps) and each of its
    indexes (a day partition's index counts under the table's index it is attached to).
    On Citus the coordinator's tables are empty: the shards' sizes are summed from the
    workers, and a table's indexes together."""
    citus = on_citus(conn)
    table_size, indexes_size = (
        (
            "citus_table_size(i.inhrelid)",
            "citus_total_relation_size(i.inhrelid) - citus_table_size(i.inhrelid)",
        )
        if citus
        else ("pg_table_size(i.inhrelid)", "")
    )
    indexes = (
        f"""SELECT p.relname, 'indexes', {indexes_size}
            FROM pg_inherits i JOIN pg_class p ON p.oid = i.inhparent
            WHERE p.relname IN ('job_runs', 'run_history')"""
        if citus
        else """SELECT p.relname, pi.relname, pg_relation_size(x.indexrelid)
            FROM pg_inherits i JOIN pg_class p ON p.oid = i.inhparent
            JOIN pg_index x ON x.indrelid = i.inhrelid
            JOIN pg_inherits ii ON ii.inhrelid = x.indexrelid JOIN pg_class pi ON pi.oid = ii.inhparent
            WHERE p.relname IN ('job_runs', 'run_history')"""
    )
    rows = conn.execute(
        f"""
        SELECT parent, part, sum(bytes) FROM (
            SELECT p.relname AS parent, 'heap' AS part, {table_size} AS bytes
            FROM pg_inherits i JOIN pg_class p ON p.oid = i.inhparent
            WHERE p.relname IN ('job_runs', 'run_history')
            UNION ALL
            {indexes}
        ) AS parts GROUP BY 1, 2 ORDER BY 1 DESC, 3 DESC
        """
    ).fetchall()
    return {(parent, part): int(size) for parent, part, size in rows}


def measure(conn: psycopg.Connection, *, empty: dict[tuple[str, str], int]) -> dict:
    """Bytes per run; `empty` is parts() of the database before its first run. On Citus
    it is subtracted: every shard of every day partition starts with pages of its own
    (its indexes' first pages, its heap's free space and visibility maps), 32 shards
    times the days, which at these sizes would outweigh the runs. On plain PostgreSQL
    it is a few pages per day partition and stays in."""
    conn.execute("VACUUM job_runs, run_history")
    runs, row = conn.execute("SELECT count(*), avg(pg_column_size(r.*)) FROM run_history AS r").fetchone()
    # The view gives back the attempt a history row leaves out (runs/history.py).
    (attempts,) = conn.execute("SELECT avg(attempt) FROM runs WHERE status = 'succeeded'").fetchone()
    citus = on_citus(conn)
    sizes = parts(conn)
    if citus:
        sizes = {key: size - empty.get(key, 0) for key, size in sizes.items()}
    heap = sum(size for (_, part), size in sizes.items() if part == "heap")
    indexes = sum(size for (_, part), size in sizes.items() if part != "heap")
    (index_count,) = conn.execute(
        "SELECT count(*) FROM pg_indexes WHERE tablename IN ('job_runs', 'run_history')"
    ).fetchone()
    total = (heap + indexes) / runs
    where = [(parent, part, size) for (parent, part), size in sizes.items()]
    size = "citus_total_relation_size" if citus else "pg_total_relation_size"
    versions, version_bytes = conn.execute(
        f"SELECT count(*), {size}('job_targets') FROM job_targets"
    ).fetchone()
    return {
        "target_version_bytes_per_job": round(version_bytes / max(versions, 1)),
        "runs": runs,
        "attempts": round(float(attempts), 2),
        "heap_bytes_per_run": round(heap / runs),
        "index_bytes_per_run": round(indexes / runs),
        "indexes": index_count,
        "total_bytes_per_run": round(total),
        "row_bytes": round(float(row)),
        "gb_a_day_at_seed_scale": round(total * RUNS_A_DAY / 1e9, 1),
        "tb_for_30_days": round(total * RUNS_A_DAY * DAYS_KEPT / 1e12, 2),
        "where": [[parent, part, round(size / runs)] for parent, part, size in where],
    }


def one_round(base: str, *, db: str, n: int, path: str, expect_attempts: int, waves: int = 1) -> dict:
    """N runs fired and finished in `waves` waves of n/waves runs each, with a plain VACUUM
    after each wave (what autovacuum does between the hours of a real day): one wave is
    every run due at once, the worst case, where the queue's indexes and the row versions
    that claims and outcomes leave reach the size of every run; more waves is a day whose
    busiest moment holds a share of its runs (the seed's: 3M due at once of 240M a day),
    where later waves reuse the space the earlier ones freed."""
    from django.db import connections

    connections.close_all()  # the previous round's, to the database about to be dropped
    url = fresh_database(base, db)
    os.environ["DATABASE_URL"] = url
    from bench.execute import executor_env
    from bench.noop_server import NoopServer
    from tests.support.processes import Processes

    logs = ROOT / "var" / "bench" / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    with NoopServer() as server, psycopg.connect(url, autocommit=True) as conn:
        empty = parts(conn)
        # Every run of the retried round fails twice against one host: that would open the
        # host's breaker and spend its retry budget, and the round would measure deferrals.
        # Both are lifted for it (the storage of a retried run is what is measured here).
        lifted = {
            "EXECUTOR_CIRCUIT_FAILURES": "100000000",
            "EXECUTOR_RETRY_BUDGET_RATIO": "100",
            "EXECUTOR_RETRY_BUDGET_FLOOR": "100000000",
        }
        procs = Processes({**executor_env(), **lifted, "DATABASE_URL": url}, logs)
        try:
            procs.start("run_scheduler")
            for _ in range(2):
                procs.start("run_executor", "--concurrency", "64")
            for wave in range(1, waves + 1):
                seed(n=n // waves, url=server.url.replace("/noop", path))
                wait_done(conn, wave * (n // waves))
                conn.execute("VACUUM job_runs, run_history")
        finally:
            procs.stop_all()
        row = measure(conn, empty=empty)
    row["case"] = f"{expect_attempts} attempt" + ("s" if expect_attempts > 1 else "")
    row["waves"] = waves
    row["budget"] = BUDGET[expect_attempts]
    return row


def table(rows: list[dict]) -> str:
    lines = [
        "| runs | waves | attempts | heap + TOAST B/run | indexes B/run (count) | total B/run | budget"
        " | live row B | GB a day at 240M runs | TB for 30 days | target version B/job |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['runs']} | {r['waves']} | {r['attempts']} | {r['heap_bytes_per_run']}"
            f" | {r['index_bytes_per_run']} ({r['indexes']}) | **{r['total_bytes_per_run']}** | {r['budget']}"
            f" | {r['row_bytes']} | {r['gb_a_day_at_seed_scale']} | {r['tb_for_30_days']}"
            f" | {r['target_version_bytes_per_job']} |"
        )
    lines += ["", "Where a run's bytes are (B/run: each table's heap, then its indexes):", ""]
    lines += ["| runs | waves | attempts | run_history | job_runs |", "|---|---:|---:|---|---|"]
    for r in rows:
        parts = {table: [f"{part} {size}" for t, part, size in r["where"] if t == table and size]
                 for table in ("run_history", "job_runs")}  # fmt: skip
        lines.append(
            f"| {r['runs']} | {r['waves']} | {r['attempts']}"
            f" | {', '.join(parts['run_history'])} | {', '.join(parts['job_runs']) or 'nothing'} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=20_000, help="runs that succeed on their first attempt")
    parser.add_argument("--retried", type=int, default=5_000, help="runs that need three attempts (0: skip)")
    parser.add_argument(
        "--waves", type=int, default=10, help="the first-attempt runs again in this many waves (1: skip)"
    )
    parser.add_argument("--db", default=DATABASE, help="scratch database name (dropped and made afresh)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "scheduler_project.settings")
    base = os.environ["DATABASE_URL"]
    import django

    # Settings read DATABASE_URL once: point them at the scratch database before setup.
    os.environ["DATABASE_URL"] = f"{base.rsplit('/', 1)[0]}/{args.db}"
    django.setup()
    rows = [one_round(base, db=args.db, n=args.runs, path="/ok", expect_attempts=1)]
    if args.waves > 1:
        rows.append(one_round(base, db=args.db, n=args.runs, path="/ok", expect_attempts=1, waves=args.waves))
    if args.retried:
        rows.append(one_round(base, db=args.db, n=args.retried, path="/fail-twice", expect_attempts=3))
        if args.waves > 1:
            rows.append(
                one_round(
                    base, db=args.db, n=args.retried, path="/fail-twice", expect_attempts=3, waves=args.waves
                )
            )
    for r in rows:
        print(json.dumps(r), file=sys.stderr)
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
