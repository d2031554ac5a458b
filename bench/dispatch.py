"""Dispatch throughput: N interval jobs all due at once, time until every run row exists.

    DATABASE_URL=... .venv/bin/python bench/dispatch.py --jobs 100000 --schedulers 1 2

Uses a scratch database on the same cluster (created and migrated if missing,
its tables truncated between rounds); never touches the DATABASE_URL database's
data. For each scheduler count: insert N jobs with next_run_at tomorrow, start the
`run_scheduler` processes and wait until their leases cover all partitions, then
make every job due in one UPDATE and time from its commit until N runs exist.
Prints a Markdown table (and --json writes the numbers) for docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg

ROOT = Path(__file__).resolve().parent.parent
NAMESPACE = 0x43524F4E  # jobs.leases.NAMESPACE (not imported: Django is set up later)


def scratch_url(base: str, name: str) -> str:
    """The same server as the DATABASE_URL, another database (a URL: django-environ reads it)."""
    parts = urlsplit(base)
    return urlunsplit(parts._replace(path=f"/{name}"))


def ensure_database(base: str, name: str) -> str:
    with psycopg.connect(base, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')
    url = scratch_url(base, name)
    env = {**os.environ, "DATABASE_URL": url}
    subprocess.run([sys.executable, str(ROOT / "manage.py"), "migrate", "-v0"], cwd=ROOT, env=env, check=True)
    return url


def reset_and_create_jobs(url: str, n: int) -> None:
    from jobs.models import Job, Tenant
    from jobs.services import partition_for

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE job_runs, job_misfires, job_slot_ranges, scheduler_nodes, jobs")
    tenant, _ = Tenant.objects.get_or_create(
        slug="bench", defaults={"name": "bench", "max_concurrency": 1000}
    )
    later = datetime.now(UTC) + timedelta(days=1)
    target = {"type": "http", "url": "http://127.0.0.1:9/noop", "method": "POST", "headers": {}, "body": ""}
    chunk = []
    for i in range(n):
        job_id = uuid.uuid4()
        chunk.append(
            Job(
                id=job_id,
                tenant=tenant,
                name=f"bench-{i}",
                interval_seconds=3600,
                target=target,
                partition_id=partition_for(job_id),
                next_run_at=later,
            )
        )
        if len(chunk) == 5000:
            Job.objects.bulk_create(chunk)
            chunk = []
    if chunk:
        Job.objects.bulk_create(chunk)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE jobs")


def shares(conn) -> list[int]:
    rows = conn.execute(
        """
        SELECT count(*) FROM pg_locks
        WHERE locktype = 'advisory' AND classid = %s AND objsubid = 2 AND granted
          AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
        GROUP BY pid
        """,
        [NAMESPACE],
    ).fetchall()
    return sorted(r[0] for r in rows)


def peak_rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def one_round(url: str, n: int, k: int, partitions: int, timeout: float) -> dict:
    reset_and_create_jobs(url, n)
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "SCHEDULER_POLL_SECONDS": "0.1",
        "SCHEDULER_LEASE_SECONDS": "10",
        "CONN_MAX_AGE": "600",
    }
    logs = [open(f"/tmp/bench-dispatch-{k}-{i}.log", "wb") for i in range(k)]
    procs = [
        subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "run_scheduler"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        for log in logs
    ]
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            fair = sorted(partitions // k + (1 if i < partitions % k else 0) for i in range(k))
            deadline = time.monotonic() + 60
            while shares(conn) != fair:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"leases never balanced: {shares(conn)}")
                time.sleep(0.2)
            conn.execute("UPDATE jobs SET next_run_at = now() - interval '1 second'")
            started = time.monotonic()
            count = 0
            while count < n:
                if time.monotonic() - started > timeout:
                    raise RuntimeError(f"only {count}/{n} runs after {timeout}s")
                time.sleep(0.25)
                count = conn.execute("SELECT count(*) FROM job_runs").fetchone()[0]
            elapsed = time.monotonic() - started
            dupes = conn.execute(
                "SELECT count(*) FROM (SELECT 1 FROM job_runs GROUP BY job_id, scheduled_at"
                " HAVING count(*) > 1) d"
            ).fetchone()[0]
        rss = [peak_rss_mb(p.pid) for p in procs]
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(timeout=30)
        for log in logs:
            log.close()
    return {
        "jobs": n,
        "schedulers": k,
        "seconds": round(elapsed, 2),
        "runs_per_second": round(n / elapsed),
        "peak_rss_mb": [round(r, 1) for r in rss],
        "duplicates": dupes,
        "exit_codes": [p.returncode for p in procs],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, nargs="+", default=[100_000])
    parser.add_argument("--schedulers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--db", default="cronyard_bench_dispatch", help="scratch database name")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()

    base = os.environ.get("DATABASE_URL")
    if not base:
        base = subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "embedded_pg.py"), "start"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    url = ensure_database(base, args.db)
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "scheduler_project.settings")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.conf import settings

    results = []
    for n in args.jobs:
        for k in args.schedulers:
            result = one_round(url, n, k, settings.SCHEDULER_PARTITIONS, args.timeout)
            print(json.dumps(result), file=sys.stderr, flush=True)
            results.append(result)
    print(f"batch size {settings.SCHEDULER_BATCH_SIZE}, {settings.SCHEDULER_PARTITIONS} partitions")
    print("| jobs | schedulers | seconds | runs/s | peak RSS per scheduler (MB) |")
    print("|---:|---:|---:|---:|---|")
    for r in results:
        cells = [r["jobs"], r["schedulers"], r["seconds"], r["runs_per_second"], r["peak_rss_mb"]]
        print("| " + " | ".join(str(c) for c in cells) + " |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    if any(r["duplicates"] or any(r["exit_codes"]) for r in results):
        sys.exit("duplicates or a scheduler exited non-zero")


if __name__ == "__main__":
    main()
