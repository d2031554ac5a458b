"""The dispatch limit: the same database work as a scheduler batch, in a minimal
raw-psycopg loop (lock due jobs SKIP LOCKED, insert their runs ON CONFLICT DO
NOTHING, advance next_run_at, commit), with none of Cronyard's Python around it:
no leases, no schedule math beyond `+ interval`, no misfire or overlap policy.

    DATABASE_URL=... .venv/bin/python bench/raw_dispatch.py --jobs 100000 --workers 1 2

Uses the scratch database of bench/dispatch.py, so both measure the same rows.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.dispatch import ensure_database, reset_and_create_jobs  # noqa: E402

BATCH = 500

CLAIM = """
SELECT id, next_run_at, interval_seconds, tenant_id, partition_id, target::text
FROM jobs
WHERE partition_id = ANY(%s) AND NOT paused AND next_run_at <= now()
ORDER BY next_run_at
LIMIT %s
FOR UPDATE SKIP LOCKED
"""
INSERT = """
INSERT INTO job_runs (job_id, scheduled_at, tenant_id, partition_id, not_before, target)
SELECT j, s, t, p, now(), g::jsonb
FROM unnest(%s::uuid[], %s::timestamptz[], %s::bigint[], %s::smallint[], %s::text[]) AS u(j, s, t, p, g)
ON CONFLICT DO NOTHING
"""
ADVANCE = """
UPDATE jobs SET next_run_at = next_run_at + interval_seconds * interval '1 second'
WHERE id = ANY(%s)
"""


def worker(url: str, partitions: list[int], go, done) -> None:
    with psycopg.connect(url) as conn:
        conn.prepare_threshold = 0
        go.wait()
        while not done.is_set():
            with conn.transaction():
                rows = conn.execute(CLAIM, [partitions, BATCH]).fetchall()
                if rows:
                    ids = [r[0] for r in rows]
                    conn.execute(
                        INSERT,
                        [
                            ids,
                            [r[1] for r in rows],
                            [r[3] for r in rows],
                            [r[4] for r in rows],
                            [r[5] for r in rows],
                        ],
                    )
                    conn.execute(ADVANCE, [ids])
            if len(rows) < BATCH:
                time.sleep(0.05)


def one_round(url: str, n: int, k: int, partitions: int) -> dict:
    reset_and_create_jobs(url, n)
    ctx = multiprocessing.get_context("fork")
    go, done = ctx.Event(), ctx.Event()
    procs = [
        ctx.Process(target=worker, args=(url, [p for p in range(partitions) if p % k == i], go, done))
        for i in range(k)
    ]
    for proc in procs:
        proc.start()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE jobs SET next_run_at = now() - interval '1 second'")
        started = time.monotonic()
        go.set()
        count = 0
        while count < n:
            time.sleep(0.1)
            count = conn.execute("SELECT count(*) FROM job_runs").fetchone()[0]
        elapsed = time.monotonic() - started
    done.set()
    for proc in procs:
        proc.join(timeout=30)
    return {"jobs": n, "workers": k, "seconds": round(elapsed, 2), "runs_per_second": round(n / elapsed)}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, nargs="+", default=[100_000])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--db", default="cronyard_bench_dispatch")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    url = ensure_database(os.environ["DATABASE_URL"], args.db)
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "scheduler_project.settings")
    import django

    django.setup()
    from django.conf import settings

    results = [one_round(url, n, k, settings.SCHEDULER_PARTITIONS) for n in args.jobs for k in args.workers]
    print("| jobs | raw workers | seconds | runs/s |")
    print("|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['jobs']} | {r['workers']} | {r['seconds']} | {r['runs_per_second']} |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
