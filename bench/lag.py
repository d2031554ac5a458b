"""End-to-end lag: from a run's scheduled_at to the HTTP target receiving the request.

    DATABASE_URL=... .venv/bin/python bench/lag.py [--jobs 60000] [--period 60] [--warmup 30]
        [--window 60] [--burst 100000] [--schedulers 2] [--executors 2] [--json out.json]

Steady part: `jobs` interval jobs of `period` seconds with next_run_at spread evenly
over one period (60,000 jobs of 60 s = a steady 1,000 runs/s), `schedulers` +
`executors` real processes, a recording no-op target (bench/noop_server.py --record:
arrival wall time and the X-Scheduled-At header the executor sends). After `warmup`
seconds, every run scheduled in the next `window` seconds is measured: arrival -
scheduled_at (p50/p99), plus the database's own stamps per stage (scheduled_at →
created_at: the scheduler; created_at → started_at: the executor's claim).

Burst part: `burst` jobs all due at the same top of a minute; drain time = last
request received - that minute.

Both run on a scratch database of the same cluster (like bench/dispatch.py); the
machine's one clock serves the server and PostgreSQL, so the differences are real.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.dispatch import ensure_database, shares  # noqa: E402
from bench.execute import LOGS, http_target, make_jobs, start_executors  # noqa: E402
from bench.noop_server import ARRIVALS_PATH, COUNT_PATH, RESET_PATH, NoopServer  # noqa: E402

LEAD_SECONDS = 3.0  # from the UPDATE that spreads the jobs to the first due one


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p))]


def server_get(server: NoopServer, path: str) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}{path}", timeout=60) as response:
        return response.read()


def server_reset(server: NoopServer) -> None:
    request = urllib.request.Request(f"http://127.0.0.1:{server.port}{RESET_PATH}", method="POST")
    urllib.request.urlopen(request, timeout=10).read()


def arrivals(server: NoopServer) -> list[tuple[float, datetime]]:
    """(arrival wall time, scheduled_at) of every request the server recorded."""
    from runs.keys import parse_utc

    data = json.loads(server_get(server, ARRIVALS_PATH))
    return [(a, parse_utc(s)) for a, s in zip(data["arrivals"], data["scheduled_at"], strict=True) if s]


def reset_jobs(*, n: int, target: dict, interval_seconds: int) -> None:
    """Empty the scratch database's tables and create `n` interval jobs, due tomorrow."""
    from django.db import connection

    from jobs.models import Job, JobTarget, Tenant
    from runs.execution.signing import new_secret

    with connection.cursor() as cursor:
        cursor.execute(
            "TRUNCATE job_runs, run_history, job_misfires, job_slot_ranges, scheduler_nodes, executor_nodes,"
            " jobs"
        )
    tenant, _ = Tenant.objects.get_or_create(
        slug="bench-lag",
        defaults={"name": "bench-lag", "max_concurrency": 1_000_000, "signing_secret": new_secret()},
    )
    later = datetime.now(UTC) + timedelta(days=1)
    jobs = make_jobs(
        tenant=tenant.id, n=n, target=target, interval_seconds=interval_seconds, next_run_at=later
    )
    JobTarget.objects.create_for_new_jobs(jobs, batch_size=5000)
    Job.objects.bulk_create(jobs, batch_size=5000)
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE jobs")


def process_env(args) -> dict:
    """The product's settings (no bench-only poll intervals), unless --scheduler-poll says."""
    env = {**os.environ, "SCHEDULER_ALLOW_PRIVATE_TARGETS": "true", "LOG_LEVEL": "WARNING"}
    if args.scheduler_poll is not None:
        env["SCHEDULER_POLL_SECONDS"] = str(args.scheduler_poll)
    return env


def start_processes(procs, *, schedulers: int, executors: int, concurrency: int) -> list:
    """Schedulers holding a fair share of the partitions each, executors registered."""
    import psycopg
    from django.conf import settings
    from django.db import connection

    children = [procs.start("run_scheduler") for _ in range(schedulers)]
    children += start_executors(procs, executors, concurrency)
    partitions = settings.SCHEDULER_PARTITIONS
    fair = sorted(
        partitions // schedulers + (1 if i < partitions % schedulers else 0) for i in range(schedulers)
    )
    deadline = time.monotonic() + 120
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        while shares(conn) != fair:
            if time.monotonic() > deadline:
                raise RuntimeError(f"scheduler leases never balanced: {shares(conn)}")
            time.sleep(0.2)
    connection.close()  # the scratch database's connection is not needed while they work
    return children


@contextmanager
def running(server: NoopServer, args, *, jobs: int, interval_seconds: int) -> Iterator[None]:
    """`jobs` fresh jobs (not yet due), the processes up and ready, the recordings empty."""
    from tests.support.processes import Processes

    reset_jobs(n=jobs, target=http_target(server.url), interval_seconds=interval_seconds)
    procs = Processes(process_env(args), LOGS)
    try:
        start_processes(
            procs, schedulers=args.schedulers, executors=args.executors, concurrency=args.concurrency
        )
        server_reset(server)
        yield
    finally:
        procs.stop_all()


def stage_percentiles(*, since: datetime, until: datetime) -> dict:
    """Where the time goes, from the database's own stamps of the measured runs (seconds)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP
                       (ORDER BY extract(epoch FROM created_at - scheduled_at)),
                   percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP
                       (ORDER BY extract(epoch FROM started_at - created_at))
            FROM runs WHERE scheduled_at >= %s AND scheduled_at < %s AND started_at IS NOT NULL
            """,
            [since, until],
        )
        dispatch, claim = cursor.fetchone()
        # Slots more than SCHEDULER_MISFIRE_THRESHOLD_SECONDS late are misfires, not runs:
        # a machine too loaded to keep up shows here, not as a long lag.
        cursor.execute("SELECT coalesce(sum(missed_count), 0) FROM job_misfires")
        misfires = cursor.fetchone()[0]
    rounded = [[round(float(v), 3) for v in pair] if pair else [None, None] for pair in (dispatch, claim)]
    return {"dispatch_p50_p99_s": rounded[0], "claim_p50_p99_s": rounded[1], "misfired_slots": misfires}


def steady(server: NoopServer, args, progress) -> dict:
    from django.conf import settings
    from django.db import connection

    from scheduler_project import db

    with running(server, args, jobs=args.jobs, interval_seconds=args.period):
        t0 = db.now() + timedelta(seconds=LEAD_SECONDS)
        with connection.cursor() as cursor:
            # Evenly spread over one period, in id order (random, so partitions mix).
            cursor.execute(
                """
                UPDATE jobs j SET next_run_at = s.at FROM (
                    SELECT id, %s::timestamptz + (row_number() OVER (ORDER BY id) - 1)
                                                 * (%s::float8 / %s) * interval '1 second' AS at
                    FROM jobs) s
                WHERE j.id = s.id
                """,
                [t0, args.period, args.jobs],
            )
        since = t0 + timedelta(seconds=args.warmup)
        until = since + timedelta(seconds=args.window)
        expected = round(args.jobs * args.window / args.period)
        # Wait until the window is over, then for its last runs (a minute at most).
        end = until.timestamp()
        with progress(total=round(end - time.time()), desc="lag: steady", unit="s") as bar:
            while time.time() < end:
                time.sleep(0.5)
                bar.update(min(bar.total, round(bar.total - (end - time.time()))) - bar.n)
        deadline = time.monotonic() + 60
        while True:
            window = [(a, s) for a, s in arrivals(server) if since <= s < until]
            if len(window) >= expected or time.monotonic() > deadline:
                break
            time.sleep(1)
    lags = [a - s.timestamp() for a, s in window]
    result = {
        "jobs": args.jobs,
        "period_s": args.period,
        "rate_per_s": round(args.jobs / args.period),
        "schedulers": args.schedulers,
        "executors": args.executors,
        "warmup_s": args.warmup,
        "window_s": args.window,
        "expected": expected,
        "scheduler_poll_s": args.scheduler_poll or settings.SCHEDULER_POLL_SECONDS,
        "received": len(window),
        "p50_s": round(percentile(lags, 0.5), 3) if lags else None,
        "p99_s": round(percentile(lags, 0.99), 3) if lags else None,
        "max_s": round(max(lags), 3) if lags else None,
        "mean_s": round(statistics.fmean(lags), 3) if lags else None,
        **stage_percentiles(since=since, until=until),
    }
    return {"summary": result, "lags": [round(v, 4) for v in lags]}


def burst(server: NoopServer, args, progress) -> dict:
    from django.db import connection

    from scheduler_project import db

    with running(server, args, jobs=args.burst, interval_seconds=3600):
        now = db.now() + timedelta(seconds=LEAD_SECONDS)
        # The next top of a minute at least LEAD_SECONDS away (the processes idle until
        # then); `soon` (make test's smoke) does not wait for the minute.
        due = (
            now
            if args.burst_due == "soon"
            else (now + timedelta(seconds=60)).replace(second=0, microsecond=0)
        )
        with connection.cursor() as cursor:
            cursor.execute("UPDATE jobs SET next_run_at = %s", [due])
        deadline = due.timestamp() + args.burst_timeout
        with progress(total=args.burst, desc=f"lag: burst due {due:%H:%M}", unit="run") as bar:
            while True:
                count = int(server_get(server, COUNT_PATH))
                bar.update(count - bar.n)
                if count >= args.burst or time.time() > deadline:
                    break
                time.sleep(0.5)
        got = arrivals(server)
    times = [a for a, s in got if s == due]
    return {
        "jobs": args.burst,
        "schedulers": args.schedulers,
        "executors": args.executors,
        "received": len(times),
        "first_s": round(min(times) - due.timestamp(), 2) if times else None,
        "drain_s": round(max(times) - due.timestamp(), 2) if times else None,
        "runs_per_s": round(len(times) / (max(times) - due.timestamp())) if times else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=60_000)
    parser.add_argument("--period", type=int, default=60, help="interval of every job (s)")
    parser.add_argument("--warmup", type=float, default=30)
    parser.add_argument("--window", type=float, default=60)
    parser.add_argument("--burst", type=int, default=100_000, help="0: no burst part")
    parser.add_argument("--burst-due", choices=["minute", "soon"], default="minute")
    parser.add_argument("--burst-timeout", type=float, default=600)
    parser.add_argument("--schedulers", type=int, default=2)
    parser.add_argument("--executors", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument(
        "--scheduler-poll",
        type=float,
        help="SCHEDULER_POLL_SECONDS for the schedulers (default: the setting's)",
    )
    parser.add_argument("--db", default="cronyard_bench_lag", help="scratch database name")
    parser.add_argument("--json", type=Path, help="also write the results (and every lag) here")
    args = parser.parse_args()

    url = ensure_database(os.environ["DATABASE_URL"], args.db)
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "scheduler_project.settings")
    import django

    django.setup()
    from functools import partial

    from tqdm import tqdm

    progress = partial(tqdm, file=sys.stderr, leave=False)
    with NoopServer(record=True) as server:
        steady_result = steady(server, args, progress)
        burst_result = burst(server, args, progress) if args.burst else None
    s = steady_result["summary"]
    print("| steady rate | schedulers | executors | window | received/expected | p50 s | p99 s | max s |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    print(
        f"| {s['rate_per_s']}/s ({s['jobs']} jobs every {s['period_s']} s) | {s['schedulers']} | "
        f"{s['executors']} | {s['window_s']:g} s after {s['warmup_s']:g} s | "
        f"{s['received']}/{s['expected']} | "
        f"{s['p50_s']} | {s['p99_s']} | {s['max_s']} |"
    )
    print()
    print(
        f"Stages (database stamps, p50/p99 s): scheduled_at → run row created {s['dispatch_p50_p99_s']}, "
        f"created → claimed {s['claim_p50_p99_s']}; SCHEDULER_POLL_SECONDS = {s['scheduler_poll_s']:g}."
    )
    if s["received"] < s["expected"] or s["misfired_slots"]:
        print()
        print(
            f"**Fell behind:** {s['expected'] - s['received']} runs of the window never reached the target "
            f"within a minute of its end; {s['misfired_slots']} slots were misfires (more than "
            "SCHEDULER_MISFIRE_THRESHOLD_SECONDS late)."
        )
    if burst_result:
        b = burst_result
        print()
        print(
            "| burst | schedulers | executors | received | first request s | last request (drain) s "
            "| runs/s |"
        )
        print("|---:|---:|---:|---:|---:|---:|---:|")
        print(
            f"| {b['jobs']} due at once | {b['schedulers']} | {b['executors']} | {b['received']} | "
            f"{b['first_s']} | {b['drain_s']} | {b['runs_per_s']} |"
        )
    if args.json:
        args.json.write_text(json.dumps({"steady": steady_result, "burst": burst_result}))
    # Falling behind is a result to report (above), not a failure of the benchmark.


if __name__ == "__main__":
    main()
