"""The "limit" for executor throughput: a minimal raw-psycopg claim/complete loop.

    DATABASE_URL=... .venv/bin/python bench/raw_limit.py [--runs 10000] [--batch 100]
        [--workers 1 2]

Each worker is one process with one connection doing, until the queue is empty:
claim `batch` runs (`FOR UPDATE SKIP LOCKED` on the claim index, mark them running
with attempt+1 and a lease, one statement, one commit), then move them to run_history
as succeeded, as Cronyard's outcome statement does (fenced on attempt and status, one
statement, one commit). No tenant limits, no
overlap policies, no calls, no history entries: what PostgreSQL alone allows on this
machine, to read next to bench/execute.py's numbers. The runs are the same rows
bench/execute.py makes (same tenant, same INSERT), so table and indexes match.

`--minimal` runs the same loop on the seed's minimal run row instead of Cronyard's:
`(job_id, scheduled_at, status, attempt, lease_until)` keyed by `(job_id, scheduled_at)`,
with one partial index to find queued runs (`bench_minimal_runs`, created for the round
and dropped after it). That is the work the design requires; the gap between the two
limits is what Cronyard's run row itself costs.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "scheduler_project.settings")

from runs import history  # noqa: E402  (after the path: the history row's writer, runs/history.py)

CLAIM_SQL = """
WITH picked AS (
    SELECT partition_id, id, scheduled_at FROM job_runs
    WHERE tenant_id = %(tenant)s AND status IN ('queued', 'retrying') AND not_before <= now()
    ORDER BY priority DESC, scheduled_at
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
)
UPDATE job_runs r SET status = 'running', attempt = r.attempt + 1, owner = %(owner)s,
    started_at = now(), lease_until = now() + r.lease_seconds * interval '1 second'
FROM picked p WHERE r.partition_id = p.partition_id AND r.id = p.id AND r.scheduled_at = p.scheduled_at
RETURNING r.partition_id, r.id, r.scheduled_at, r.attempt
"""

DONE_SQL = f"""
WITH done AS (
    DELETE FROM job_runs r
    USING unnest(%s::smallint[], %s::bigint[], %s::timestamptz[], %s::integer[])
        AS d(partition_id, id, scheduled_at, attempt)
    WHERE r.partition_id = d.partition_id AND r.id = d.id AND r.scheduled_at = d.scheduled_at
      AND r.attempt = d.attempt AND r.status = 'running'
    RETURNING r.*
)
{history.insert_sql("done", finished_at="now()", result_code="200")}
"""


# The minimal row (bench/raw_dispatch.minimal_ddl), in the DATABASE_URL database for the round.
MINIMAL_TABLE = "bench_minimal_runs"
MINIMAL_CLAIM_SQL = f"""
WITH picked AS (
    SELECT job_id, scheduled_at FROM {MINIMAL_TABLE}
    WHERE status = 0 ORDER BY scheduled_at LIMIT %(batch)s FOR UPDATE SKIP LOCKED
)
UPDATE {MINIMAL_TABLE} r SET status = 1, attempt = r.attempt + 1, lease_until = now() + interval '30 seconds'
FROM picked p WHERE r.job_id = p.job_id AND r.scheduled_at = p.scheduled_at
RETURNING r.job_id, r.scheduled_at, r.attempt
"""
MINIMAL_DONE_SQL = f"""
UPDATE {MINIMAL_TABLE} r SET status = 2, lease_until = NULL
FROM unnest(%s::uuid[], %s::timestamptz[], %s::smallint[]) AS d(job_id, scheduled_at, attempt)
WHERE r.job_id = d.job_id AND r.scheduled_at = d.scheduled_at AND r.attempt = d.attempt AND r.status = 1
"""


def worker(conninfo: str, tenant: int, batch: int, start, done, finish, minimal: bool = False) -> None:
    import psycopg

    with psycopg.connect(conninfo, autocommit=True, prepare_threshold=0) as conn:
        start.wait()
        began = os.times()
        claimed = 0
        params = {"tenant": tenant, "batch": batch, "owner": f"raw:{os.getpid()}"}
        claim, complete = (MINIMAL_CLAIM_SQL, MINIMAL_DONE_SQL) if minimal else (CLAIM_SQL, DONE_SQL)
        while True:
            rows = conn.execute(claim, params).fetchall()
            if not rows:
                break
            claimed += len(rows)
            conn.execute(complete, [[r[i] for r in rows] for i in range(len(rows[0]))])
        ended = os.times()
        done.put((claimed, ended.user + ended.system - began.user - began.system))
        # Connected until the parent has read the server's CPU: a closed connection's
        # backend exits, and its CPU with it.
        finish.wait()


def enqueue_minimal(conninfo: str, runs: int) -> None:
    """`runs` queued minimal rows, one per job, all of one slot (the top-of-the-hour shape)."""
    import uuid

    import psycopg

    from bench.raw_dispatch import minimal_ddl

    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(minimal_ddl(MINIMAL_TABLE))
        with conn.cursor().copy(f"COPY {MINIMAL_TABLE} (job_id, scheduled_at) FROM STDIN") as copy:
            for _ in range(runs):
                copy.write_row((uuid.uuid4(), "2026-01-01T00:00:00Z"))
        conn.execute(f"VACUUM ANALYZE {MINIMAL_TABLE}")


def finished_minimal(conninfo: str) -> int:
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as conn:
        done = conn.execute(f"SELECT count(*) FROM {MINIMAL_TABLE} WHERE status = 2").fetchone()[0]
        conn.execute(f"DROP TABLE {MINIMAL_TABLE}")
    return done


def measure(tenant: int, runs: int, batch: int, workers: int, *, minimal: bool = False) -> dict:
    from bench.execute import clear, cpu_since, enqueue, finished, postgres_cpu
    from runs.execution.connections import database_conninfo

    if minimal:
        enqueue_minimal(database_conninfo(), runs)
    else:
        clear([tenant])
        enqueue([tenant], runs, {"type": "task", "name": "noop", "kwargs": {}})
    ctx = multiprocessing.get_context("spawn")
    start, done, finish = ctx.Event(), ctx.Queue(), ctx.Event()
    procs = [
        ctx.Process(target=worker, args=(database_conninfo(), tenant, batch, start, done, finish, minimal))
        for _ in range(workers)
    ]
    for p in procs:
        p.start()
    time.sleep(1.0)  # connections up; the clock measures the drain only
    pg_before = postgres_cpu()
    began = time.monotonic()
    start.set()
    reports = [done.get(timeout=600) for _ in procs]
    elapsed = time.monotonic() - began
    pg_cpu = cpu_since(pg_before, postgres_cpu)
    finish.set()
    total = sum(claimed for claimed, _ in reports)
    client_cpu = sum(cpu for _, cpu in reports)
    for p in procs:
        p.join()
    if minimal:
        ok = finished_minimal(database_conninfo())
    else:
        ok, _ = finished([tenant])
        clear([tenant])
    if total != runs or ok != runs:
        raise RuntimeError(f"claimed {total}, finished {ok}, expected {runs}")
    return {
        "workers": workers,
        "batch": batch,
        "runs": runs,
        "seconds": round(elapsed, 2),
        "runs_per_s": round(runs / elapsed),
        "client_cpu_ms_per_run": round(client_cpu * 1000 / runs, 3),
        "postgres_cpu_ms_per_run": round(pg_cpu * 1000 / runs, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--minimal", action="store_true", help="the seed's minimal run row, not Cronyard's")
    args = parser.parse_args()

    import django

    django.setup()
    from bench.execute import create_tenants, remove_tenants
    from bench.workload import retained_partitions

    retained_partitions()

    (tenant,) = create_tenants(1)
    try:
        results = [measure(tenant, args.runs, args.batch, w, minimal=args.minimal) for w in args.workers]
    finally:
        remove_tenants()
    print(
        "| raw limit (claim+complete, no calls) | workers | batch | runs | runs/s | seconds"
        " | client CPU ms/run | PostgreSQL CPU ms/run |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        cells = [
            "raw psycopg loop" + (", minimal row" if args.minimal else ""),
            r["workers"],
            r["batch"],
            r["runs"],
            r["runs_per_s"],
            r["seconds"],
        ]
        cells += [r["client_cpu_ms_per_run"], r["postgres_cpu_ms_per_run"]]
        print("| " + " | ".join(str(c) for c in cells) + " |")


if __name__ == "__main__":
    main()
