"""The dispatch limit: the same database work as a scheduler batch, in a minimal
raw-psycopg loop, with none of Cronyard's Python around it: no leases, no fence, no
misfire or overlap policy, no plan-then-lock.

Per batch, one partition at a time (as a Citus shard would be addressed): lock up
to 500 due jobs of the partition `FOR UPDATE SKIP LOCKED` in index order, compute
each job's next time the way the product does (cron: cronsim in the job's zone, `H`
expanded by the job id; interval: `+ interval`), insert their runs with every
snapshot column the executor reads (`unnest`, `ON CONFLICT DO NOTHING`), advance
`next_run_at` to the computed values, commit. Arrays are bound in binary and the
statements prepared, as the scheduler's are.

    DATABASE_URL=... .venv/bin/python bench/raw_dispatch.py --jobs 100000 --workers 1 2 \
        [--workload realistic|interval]

`--minimal` writes the seed's minimal run row instead of Cronyard's: `minimal_runs
(job_id, scheduled_at, status, attempt, lease_until)` keyed by `(job_id, scheduled_at)`,
with one partial index for the queue, and reads only the columns that compute the next
time. That is the work the design requires; the gap between the two limits is what
Cronyard's run row itself costs.

Uses the scratch database and the jobs of bench/dispatch.py (bench/workload.py), so
both measure the same rows; bench/dispatch.py --with-limit runs `one_round` right
after each Cronyard round.
"""

from __future__ import annotations

import argparse
import functools
import json
import multiprocessing
import os
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.dispatch import ensure_database, wait_for_runs  # noqa: E402

BATCH = 500

CLAIM = """
SELECT id, next_run_at, cron_expr, time_zone, interval_seconds, tenant_id, target::text, name,
       overlap_policy, max_attempts, retry_backoff_seconds, retry_backoff_cap_seconds, lease_seconds, priority
FROM jobs
WHERE partition_id = %s AND NOT paused AND next_run_at <= now()
ORDER BY next_run_at
LIMIT %s
FOR UPDATE SKIP LOCKED
"""
INSERT = """
INSERT INTO job_runs (
    job_id, scheduled_at, tenant_id, partition_id, status, "trigger", priority, not_before, target,
    job_name, overlap_policy, max_attempts, retry_backoff_seconds, retry_backoff_cap_seconds, lease_seconds)
SELECT j, s, t, %b, 'queued', 'schedule', pr, now(), g::jsonb, nm, op, ma, rb, rc, ls
FROM unnest(%b::uuid[], %b::timestamptz[], %b::bigint[], %b::text[], %b::text[], %b::text[], %b::int[],
            %b::int[], %b::int[], %b::int[], %b::smallint[])
     AS u(j, s, t, g, nm, op, ma, rb, rc, ls, pr)
ON CONFLICT DO NOTHING
"""
ADVANCE = """
UPDATE jobs AS j SET next_run_at = v.new
FROM unnest(%b::uuid[], %b::timestamptz[]) AS v(id, new)
WHERE j.partition_id = %b AND j.id = v.id
"""

# The seed's minimal run row (see the module docstring); made afresh in the scratch database.
MINIMAL_TABLE = "minimal_runs"


def minimal_ddl(table: str) -> str:
    """The seed's minimal run row as `table`, dropped and made afresh: its key and the one
    partial index that finds queued runs (status 0 queued, 1 running, 2 succeeded). The
    minimal limits of dispatch and of execution (bench/raw_limit.py) both use it."""
    return f"""
DROP TABLE IF EXISTS {table};
CREATE TABLE {table} (
    job_id uuid NOT NULL,
    scheduled_at timestamptz NOT NULL,
    status smallint NOT NULL DEFAULT 0,
    attempt smallint NOT NULL DEFAULT 0,
    lease_until timestamptz,
    PRIMARY KEY (job_id, scheduled_at)
);
CREATE INDEX {table}_queue_idx ON {table} (scheduled_at) WHERE status = 0;
"""


MINIMAL_CLAIM = """
SELECT id, next_run_at, cron_expr, time_zone, interval_seconds
FROM jobs
WHERE partition_id = %s AND NOT paused AND next_run_at <= now()
ORDER BY next_run_at
LIMIT %s
FOR UPDATE SKIP LOCKED
"""
MINIMAL_INSERT = f"""
INSERT INTO {MINIMAL_TABLE} (job_id, scheduled_at)
SELECT * FROM unnest(%b::uuid[], %b::timestamptz[])
ON CONFLICT DO NOTHING
"""


@functools.lru_cache(maxsize=8192)
def _cron_after(expanded: str, zone: str, due: datetime) -> datetime:
    from cronsim import CronSim

    from jobs.schedule.dst import load_zone

    return next(CronSim(expanded, due.astimezone(load_zone(zone)))).astimezone(UTC)


def next_time(cron: str, zone: str, interval: int | None, job_id, due: datetime) -> datetime:
    """The job's first slot after `due`: cronsim in its zone, or `+ interval`.

    As cheap as an expert's loop would make it, so the limit stays a limit: the job id
    seeds only `H`, and jobs that share an expanded expression, a zone and a due time
    share one cronsim search (what jobs.dispatch.planning does too).
    """
    from jobs.schedule.cron import expand_cron

    if interval:
        return due + timedelta(seconds=interval)
    return _cron_after(expand_cron(cron, job_id if "H" in cron.upper() else None), zone, due)


def dispatch_partition(conn: psycopg.Connection, partition: int, minimal: bool = False) -> int:
    """One batch of one partition, one transaction: the jobs dispatched."""
    with conn.transaction():
        rows = conn.execute(MINIMAL_CLAIM if minimal else CLAIM, [partition, BATCH]).fetchall()
        if not rows:
            return 0
        ids = [r[0] for r in rows]
        due = [r[1] for r in rows]
        if minimal:
            conn.execute(MINIMAL_INSERT, [ids, due])
        else:
            conn.execute(INSERT, [partition, ids, due, *([r[i] for r in rows] for i in range(5, 14))])
        conn.execute(ADVANCE, [ids, [next_time(r[2], r[3], r[4], r[0], r[1]) for r in rows], partition])
    return len(rows)


def worker(url: str, partitions: list[int], go, done, minimal: bool = False) -> None:
    with psycopg.connect(url) as conn:
        conn.prepare_threshold = 0
        go.wait()
        while not done.is_set():
            if not sum(dispatch_partition(conn, p, minimal) for p in partitions):
                time.sleep(0.05)


def one_round(
    url: str, *, n: int, k: int, partitions: int, workload: str, timeout: float = 900, minimal: bool = False
) -> dict:
    from bench import workload as wl

    wl.create_jobs(url, n=n, workload=workload, later=wl.later_than_now())
    runs_table = MINIMAL_TABLE if minimal else "job_runs"
    if minimal:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(minimal_ddl(MINIMAL_TABLE))
    ctx = multiprocessing.get_context("fork")
    go, done = ctx.Event(), ctx.Event()
    procs = [
        ctx.Process(
            target=worker, args=(url, [p for p in range(partitions) if p % k == i], go, done, minimal)
        )
        for i in range(k)
    ]
    for proc in procs:
        proc.start()
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            moment = wl.make_due(conn)
            started = time.monotonic()
            go.set()
            elapsed = wait_for_runs(
                conn, n=n, moment=moment, started=started, timeout=timeout, runs_table=runs_table
            )
    finally:
        done.set()
        for proc in procs:
            proc.join(timeout=30)
    with psycopg.connect(url, autocommit=True) as conn:
        checks = wl.verify(conn, n=n, moment=moment, runs_table=runs_table)
    return {
        "workload": workload,
        "jobs": n,
        "workers": k,
        "schedulers": k,
        "seconds": round(elapsed, 2),
        "runs_per_second": round(n / elapsed),
        **checks,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, nargs="+", default=[100_000])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--workload", choices=("realistic", "interval"), default="realistic")
    parser.add_argument("--db", default="cronyard_bench_dispatch")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--minimal", action="store_true", help="the seed's minimal run row, not Cronyard's")
    args = parser.parse_args()
    url = ensure_database(os.environ["DATABASE_URL"], args.db)
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "scheduler_project.settings")
    import django

    django.setup()
    from django.conf import settings

    results = [
        one_round(
            url,
            n=n,
            k=k,
            partitions=settings.SCHEDULER_PARTITIONS,
            workload=args.workload,
            minimal=args.minimal,
        )
        for n in args.jobs
        for k in args.workers
    ]
    for r in results:
        print(json.dumps(r), file=sys.stderr, flush=True)
    print("| jobs | raw workers | seconds | runs/s |")
    print("|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['jobs']} | {r['workers']} | {r['seconds']} | {r['runs_per_second']} |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
