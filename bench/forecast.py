"""Load forecast: the next 24 h by minute of N jobs of the realistic mix.

    DATABASE_URL=... .venv/bin/python bench/forecast.py [--jobs 100000 1000000] [--repeat 3]

The jobs are the dispatch benchmark's (bench/workload.py: the same COPY, the same
mix of expressions, zones and intervals, one tenant), each waiting for its real next
slot as after a dispatch: cron jobs at their next fire time, interval jobs at a random
phase of their period. Each round times `jobs.forecast.compute`, the function
`GET /api/v1/forecast` calls, on the default window (the next 24 h by minute) for
the tenant, and prints a Markdown table. Runs on a scratch database of the same
cluster; not a timed test. Target: under 2 s at 100k jobs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dispatch import ROOT, ensure_database

TARGET_SECONDS = 2.0
TARGET_JOBS = 100_000


def settle(url: str) -> None:
    """Every job waits for its real next slot, as the scheduler leaves it."""
    from jobs import schedule
    from scheduler_project import db

    now = db.now()
    with psycopg.connect(url, autocommit=True) as conn:
        # Interval jobs: a random phase of the period (jobs are created at any second).
        conn.execute(
            "UPDATE jobs SET next_run_at = date_trunc('second', %s::timestamptz)"
            " + (1 + floor(random() * interval_seconds)) * interval '1 second'"
            " WHERE interval_seconds IS NOT NULL",
            [now],
        )
        groups: dict[tuple[str, str], list] = defaultdict(list)
        for job_id, cron, zone in conn.execute(
            "SELECT id, cron_expr, time_zone FROM jobs WHERE cron_expr <> ''"
        ):
            seed = job_id if "H" in cron.upper() else None
            groups[(schedule.expand_cron(cron, seed), zone)].append(job_id)
        for (expanded, zone), ids in groups.items():
            moment = schedule.next_fire_time(
                cron=expanded, timezone=zone, interval_seconds=None, run_at=None, anchor=None, after=now
            )
            conn.execute("UPDATE jobs SET next_run_at = %s WHERE id = ANY(%s)", [moment, ids])
        conn.execute("VACUUM ANALYZE jobs")


def one_round(url: str, *, n: int, repeat: int) -> dict:
    from bench import workload
    from jobs import forecast
    from jobs.models import Tenant
    from scheduler_project import db

    started = time.monotonic()
    workload.create_jobs(url, n=n, workload="realistic", later=workload.later_than_now())
    settle(url)
    setup = time.monotonic() - started
    tenant = Tenant.objects.get(slug="bench")
    seconds, result = [], None
    for _ in range(repeat):
        win = forecast.window(start=None, end=None, step_seconds=None, now=db.now())
        t = time.perf_counter()
        result = forecast.compute(window=win, tenant_id=tenant.id)
        seconds.append(time.perf_counter() - t)
    assert result is not None
    peak = result.spikes[0] if result.spikes else None
    return {
        "jobs": n,
        "seconds": [round(s, 3) for s in seconds],
        "median_seconds": round(statistics.median(seconds), 3),
        "due_runs": result.total,
        "steps": result.window.steps,
        "peak_count": peak.count if peak else 0,
        "peak_at": peak.at.isoformat() if peak else None,
        "setup_seconds": round(setup, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--db", default="cronyard_bench_forecast")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    url = ensure_database(os.environ["DATABASE_URL"], args.db)
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "scheduler_project.settings")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    rows = []
    for n in args.jobs:
        row = one_round(url, n=n, repeat=args.repeat)
        print(json.dumps(row), file=sys.stderr, flush=True)
        rows.append(row)
    print("| jobs | seconds (each round) | median s | due runs in 24 h | peak minute | setup s |")
    print("|---:|---|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['jobs']} | {', '.join(str(s) for s in r['seconds'])} | {r['median_seconds']} "
            f"| {r['due_runs']} | {r['peak_count']} | {r['setup_seconds']} |"
        )
    base = next((r for r in rows if r["jobs"] == TARGET_JOBS), None)
    if base:
        met = "met" if base["median_seconds"] < TARGET_SECONDS else "not met"
        print(
            f"\nAt {TARGET_JOBS:,} jobs: {base['median_seconds']} s (target < {TARGET_SECONDS:.0f} s: {met})."
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    with psycopg.connect(url, autocommit=True) as conn:
        # A million rows left behind would have autovacuum compete with the rounds after.
        conn.execute("TRUNCATE job_runs, run_history, job_misfires, job_slot_ranges, jobs")


if __name__ == "__main__":
    main()
