"""Dispatch throughput: N jobs all due at once, time until every run row exists.

    DATABASE_URL=... .venv/bin/python bench/dispatch.py --jobs 100000 --schedulers 1 2 \
        [--workload realistic interval] [--with-limit] [--json out.json]

Uses a scratch database on the same cluster (created and migrated if missing,
its tables truncated between rounds); never touches the DATABASE_URL database's
data. For each workload (bench/workload.py), job count and scheduler count: COPY N
jobs with next_run_at tomorrow, start the `run_scheduler` processes and wait until
their leases cover all partitions, then make every job due at one moment in one
UPDATE and time from its commit until N runs exist; then verify (0 duplicates, 0
missing, next times as the product computes them). With --with-limit the same
jobs are dispatched right after by bench/raw_dispatch.py's loop with as many
workers, so each row carries the limit and the ratio measured in the same run.

Prints one JSON row per round on stderr, a Markdown table on stdout, and --json
writes the rows: workload, jobs, schedulers, seconds, runs_per_second, us_per_run,
duplicates, missing, wrong_next, peak_rss_mb (one per scheduler process), database
(pg_stat_* deltas over the timed window: checkpoints, WAL bytes per run, HOT updates
of jobs, blocks read; bench/pgstats.py), statements (the heaviest statements in µs per
run, when pg_stat_statements is loaded), and with --with-limit limit_runs_per_second
and ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg

ROOT = Path(__file__).resolve().parent.parent
NAMESPACE = 0x43524F4E  # jobs.dispatch.partition_leases.NAMESPACE (not imported: Django is set up later)


def scratch_url(base: str, name: str) -> str:
    """The same server as the DATABASE_URL, another database (a URL: django-environ reads it)."""
    parts = urlsplit(base)
    return urlunsplit(parts._replace(path=f"/{name}"))


def ensure_database(base: str, name: str, *, retained: bool = True) -> str:
    """The scratch database `name`, migrated; with `retained`, with the day partitions of a
    database in use for RUN_RETENTION_DAYS (bench/workload.retained_partitions)."""
    with psycopg.connect(base, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')
    url = scratch_url(base, name)
    env = {**os.environ, "DATABASE_URL": url}
    subprocess.run([sys.executable, str(ROOT / "manage.py"), "migrate", "-v0"], cwd=ROOT, env=env, check=True)
    if retained:
        subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), "shell", "-v", "0", "-c",
             "from bench.workload import retained_partitions; retained_partitions()"],
            cwd=ROOT, env=env, check=True,
        )  # fmt: skip
    return url


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


def wait_for_runs(
    conn, *, n: int, moment, started: float, timeout: float, runs_table: str = "job_runs"
) -> float:
    """Seconds from `started` until the `n` runs of `moment` exist (within 1 %).

    The poll asks whether any job is still due at `moment`: an index probe of
    jobs_due_order_idx, because a job's next_run_at moves past the moment in the very
    transaction that inserts its run. It used to count the runs every 0.1 s: at 1M
    jobs that count took ~160 ms with two parallel workers, most of a core of this
    2-core machine spent by the benchmark itself (docs/decisions/0065-benchmark-harness.md).
    The runs are counted once at the end (and again until they are all there: a job
    whose schedule cannot be computed stops without a run, and then the round times out).
    """
    while True:
        waited = time.monotonic() - started
        if waited > timeout:
            raise RuntimeError(f"runs of {moment} still missing after {timeout}s")
        # 1 % of the time so far (at least 0.1 s): the probe walks the index entries the
        # schedulers left dead since the last one, 15 ms a probe at 1M jobs.
        time.sleep(max(0.1, waited / 100))
        due = conn.execute(
            "SELECT EXISTS (SELECT 1 FROM jobs WHERE NOT paused AND next_run_at <= %s)", [moment]
        ).fetchone()[0]
        if due:
            continue
        elapsed = time.monotonic() - started
        count = conn.execute(
            f"SELECT count(*) FROM {runs_table} WHERE scheduled_at = %s", [moment]
        ).fetchone()[0]
        if count >= n:
            return elapsed


def checkpoint(conn) -> None:
    """Write out what creating the jobs dirtied (COPY, VACUUM), so that a checkpoint it
    would trigger does not land in the timed window. Needs superuser or pg_checkpoint;
    without them the round runs as before."""
    try:
        conn.execute("CHECKPOINT")
    except psycopg.errors.InsufficientPrivilege:
        pass


def one_round(url: str, *, n: int, k: int, partitions: int, workload: str, timeout: float) -> dict:
    """Cronyard: `k` run_scheduler processes dispatch `n` due jobs of `workload`."""
    from bench import pgstats
    from bench import workload as wl

    wl.create_jobs(url, n=n, workload=workload, later=wl.later_than_now())
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "SCHEDULER_POLL_SECONDS": "0.1",
        "SCHEDULER_LEASE_SECONDS": "10",
        "CONN_MAX_AGE": "600",
        # A burst is on time however long it takes to drain: at 1M jobs on a loaded
        # machine the tail would pass the 60 s threshold and become misfires, which
        # is another code path (and the limit loop has none).
        "SCHEDULER_MISFIRE_THRESHOLD_SECONDS": "900",
    }
    logs = [open(f"/tmp/bench-dispatch-{os.getpid()}-{k}-{i}.log", "wb") for i in range(k)]
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
            checkpoint(conn)
            before = pgstats.counters(conn)
            moment = wl.make_due(conn)
            # After the UPDATE: the schedulers' reads during it (walking its uncommitted
            # index entries) are setup, not dispatch.
            pgstats.reset_statements(conn)
            elapsed = wait_for_runs(conn, n=n, moment=moment, started=time.monotonic(), timeout=timeout)
            rss = [peak_rss_mb(p.pid) for p in procs]
            database = pgstats.delta(before, pgstats.counters(conn), runs=n)
            statements = pgstats.top_statements(conn, runs=n)
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(timeout=30)
        with psycopg.connect(url, autocommit=True) as conn:
            checks = wl.verify(conn, n=n, moment=moment)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for log in logs:
            log.close()
    return {
        "workload": workload,
        "jobs": n,
        "schedulers": k,
        "seconds": round(elapsed, 2),
        "runs_per_second": round(n / elapsed),
        "us_per_run": round(elapsed * 1e6 / n, 1),
        "peak_rss_mb": [round(r, 1) for r in rss],
        **checks,
        "database": database,
        "statements": statements,
        "exit_codes": [p.returncode for p in procs],
    }


def failed(row: dict) -> bool:
    return bool(row["duplicates"] or row["missing"] or row["wrong_next"] or any(row.get("exit_codes", ())))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, nargs="+", default=[100_000])
    parser.add_argument("--schedulers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--workload", nargs="+", choices=("realistic", "interval"), default=["realistic"])
    parser.add_argument("--with-limit", action="store_true", help="also the raw loop, interleaved")
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

    from bench import raw_dispatch

    results = []
    for workload in args.workload:
        for n in args.jobs:
            for k in args.schedulers:
                same = {
                    "n": n,
                    "k": k,
                    "partitions": settings.SCHEDULER_PARTITIONS,
                    "workload": workload,
                    "timeout": args.timeout,
                }
                row = one_round(url, **same)
                if args.with_limit:
                    raw = raw_dispatch.one_round(url, **same)
                    row["limit_runs_per_second"] = raw["runs_per_second"]
                    row["ratio"] = round(row["runs_per_second"] / raw["runs_per_second"], 2)
                    row["limit_checks"] = {key: raw[key] for key in ("duplicates", "missing", "wrong_next")}
                print(json.dumps(row), file=sys.stderr, flush=True)
                results.append(row)
    batch = settings.SCHEDULER_BATCH_SIZE or "the engine's default (500; 2000 on Citus)"
    print(f"batch size {batch}, {settings.SCHEDULER_PARTITIONS} partitions")
    print("| workload | jobs | schedulers | seconds | runs/s | limit runs/s | ratio | dup/missing | RSS MB |")
    print("|---|---:|---:|---:|---:|---:|---:|---|---|")
    for r in results:
        cells = [
            r["workload"],
            r["jobs"],
            r["schedulers"],
            r["seconds"],
            r["runs_per_second"],
            r.get("limit_runs_per_second", "-"),
            r.get("ratio", "-"),
            f"{r['duplicates']}/{r['missing']}",
            r["peak_rss_mb"],
        ]
        print("| " + " | ".join(str(c) for c in cells) + " |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    if any(failed(r) or failed({**r.get("limit_checks", r), "exit_codes": ()}) for r in results):
        sys.exit("duplicates, missing runs, wrong next times or a scheduler exited non-zero")


if __name__ == "__main__":
    main()
