"""Executor throughput: N queued runs, one per job, drained by k `run_executor` processes.

    DATABASE_URL=... .venv/bin/python bench/execute.py [--runs 10000] [--executors 1 2]
        [--kinds task http] [--concurrency 32] [--tenants 1] [--url http://127.0.0.1:PORT/noop]
        [--json out.json]

The top-of-the-hour shape: N jobs, each with one queued run (not N runs of one job),
each job last succeeded an hour ago (make_jobs), so a success leaves its health row
alone, as in production (runs/execution/outcomes.py).
Executors are started first and the clock starts when the runs commit (one INSERT
plus NOTIFY) after every executor has registered, so process start-up is not
measured. `task` runs the builtin `noop` task (database cost only); `http` POSTs to
a no-op aiohttp server in its own process (bench/noop_server.py; --url to share one
with bench/raw_http.py). Runs and jobs go to dedicated tenants, created and emptied
before each scenario and removed after it.

`--tenants N` spreads the same runs round-robin over N bench tenants (weights 1, 2, 3
cycling, caps out of reach): every claim batch then ranks tenants for fair share
(runs/execution/fair_share.py), where one tenant makes the rank trivial. `make bench` compares
1 and 20 to show what fair share costs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "scheduler_project.settings")

# Every bench tenant's slug starts with this ("bench-exec-1".."bench-exec-N"; older
# checkouts made one "bench-execute"), so leftovers of an interrupted run are found too.
SLUG_PREFIX = "bench-exec"
LOGS = ROOT / "var" / "bench" / "logs"
TASK_TARGET = {"type": "task", "name": "noop", "kwargs": {}}


def create_tenants(n: int = 1) -> list[int]:
    """N fresh bench tenants, weights 1..3 cycling, caps out of reach. Leftover bench
    tenants go first: every tenant with a free slot costs the fair-share plan a probe,
    so twenty idle ones left by an earlier run would tax a one-tenant measurement."""
    from jobs.models import Tenant
    from runs.execution.signing import new_secret

    remove_tenants()
    tenants = Tenant.objects.bulk_create(
        Tenant(slug=f"{SLUG_PREFIX}-{i}", name=f"{SLUG_PREFIX}-{i}", weight=(i - 1) % 3 + 1,
               max_concurrency=1_000_000, signing_secret=new_secret())
        for i in range(1, n + 1)
    )  # fmt: skip
    return [t.id for t in tenants]


def remove_tenants() -> None:
    """Every bench tenant, its runs and jobs first (raw DELETEs: no ORM cascade over runs)."""
    from jobs.models import Tenant

    bench = Tenant.objects.filter(slug__startswith=SLUG_PREFIX)
    ids = list(bench.values_list("id", flat=True))
    if ids:
        clear(ids)
        bench.delete()


def clear(tenants: list[int]) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM job_runs WHERE tenant_id = ANY(%s)", [tenants])
        cursor.execute("DELETE FROM run_history WHERE tenant_id = ANY(%s)", [tenants])
        cursor.execute(
            "DELETE FROM job_targets t USING jobs j WHERE j.partition_id = t.partition_id"
            " AND j.id = t.job_id AND j.tenant_id = ANY(%s)",
            [tenants],
        )
        cursor.execute("DELETE FROM jobs WHERE tenant_id = ANY(%s)", [tenants])


def make_jobs(
    *, tenant: int | list[int], n: int, target: dict, interval_seconds: int, next_run_at: datetime
) -> list:
    """N unsaved interval jobs (bulk_create them), each in its own partition slot; several
    tenants take them in turn.

    Each has a history, as recurring jobs at the top of the hour do: its last run
    succeeded an hour ago. (A job's first outcome ever, or one after a failure, also
    writes its health row; a success after a success does not: runs/execution/outcomes.py.)"""
    from jobs.models import Job
    from jobs.services import partition_for

    tenants = tenant if isinstance(tenant, list) else [tenant]
    last_success = datetime.now(UTC) - timedelta(hours=1)
    jobs = []
    for i in range(n):
        job_id = uuid.uuid4()
        jobs.append(
            Job(
                id=job_id,
                tenant_id=tenants[i % len(tenants)],
                name=f"bench-{i}",
                interval_seconds=interval_seconds,
                target=target,
                partition_id=partition_for(job_id),
                next_run_at=next_run_at,
                last_outcome="succeeded",
                last_success_at=last_success,
            )
        )
    return jobs


def enqueue(tenants: list[int], n: int, target: dict) -> datetime:
    """N jobs (never due by themselves), round-robin over the tenants, and one queued run
    each, committed with a NOTIFY. Returns the runs' slot, one for all of them."""
    from django.db import transaction

    from jobs.models import Job, JobTarget
    from runs.enqueue import enqueue_runs, notify_executors
    from runs.rows import NewRun

    scheduled = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=1)
    jobs = make_jobs(
        tenant=tenants, n=n, target=target, interval_seconds=3600, next_run_at=scheduled + timedelta(days=365)
    )
    runs = [
        NewRun(
            job_id=job.id,
            scheduled_at=scheduled,
            tenant_id=job.tenant_id,
            partition_id=job.partition_id,
            target_version=job.target_version,
            job_name=job.name,
            overlap_check=False,
        )
        for job in jobs
    ]
    with transaction.atomic():
        JobTarget.objects.create_for_new_jobs(jobs, batch_size=5000)
        Job.objects.bulk_create(jobs, batch_size=5000)
        enqueue_runs(runs)
        notify_executors()
    return scheduled


# The reads below name the runs' one slot when they know it (enqueue's): the harness's
# polls compete with the executors for the same cores, and on Citus a read that cannot
# rule out any day partition is planned over every one of them on every shard (300 ms a
# poll with a month's partitions), which charged the harness's cost to the engine.
_IN_SLOT = " AND (%(slot)s::timestamptz IS NULL OR scheduled_at = %(slot)s::timestamptz)"


def finished(tenants: list[int], *, slot: datetime | None = None) -> tuple[int, int]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FILTER (WHERE status IN ('succeeded', 'dead', 'cancelled', 'skipped')),"
            " count(*) FILTER (WHERE status <> 'succeeded' AND status IN ('dead', 'cancelled', 'skipped'))"
            " FROM runs WHERE tenant_id = ANY(%(tenants)s)" + _IN_SLOT,
            {"tenants": tenants, "slot": slot},
        )
        return cursor.fetchone()


def unfinished(tenants: list[int], *, slot: datetime | None = None) -> int:
    """Runs still waiting or running: the progress poll (it filters on the statuses
    still to be left, so it costs less than counting finished rows)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM job_runs"
            " WHERE tenant_id = ANY(%(tenants)s) AND status IN ('queued', 'retrying', 'running')" + _IN_SLOT,
            {"tenants": tenants, "slot": slot},
        )
        return cursor.fetchone()[0]


def last_finished(tenants: list[int], *, slot: datetime | None = None) -> datetime | None:
    """When the last outcome was written (the executors' clock, this machine's)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT max(finished_at) FROM runs WHERE tenant_id = ANY(%(tenants)s)" + _IN_SLOT,
            {"tenants": tenants, "slot": slot},
        )
        return cursor.fetchone()[0]


def commits() -> int:
    """Transactions committed in this database so far: per run, the batching at work."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")
        return cursor.fetchone()[0]


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def wait_registered(count: int, *, since: datetime, timeout: float = 120) -> None:
    """Until `count` executors started after `since` have their executor_nodes row:
    each registers just before its first claim (runs/execution/executor.Executor.open)."""
    from django.db import connection

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM executor_nodes WHERE started_at >= %s", [since])
            if cursor.fetchone()[0] >= count:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{count} executor(s) did not register within {timeout:.0f}s")


def executor_env() -> dict:
    return {
        **os.environ,
        "SCHEDULER_ALLOW_PRIVATE_TARGETS": "true",
        "EXECUTOR_POLL_SECONDS": "0.5",
        "LOG_LEVEL": "WARNING",
    }


def start_executors(procs, count: int, concurrency: int) -> list:
    """`count` run_executor processes, started and registered (the clock starts after)."""
    from scheduler_project import db

    since = db.now()
    started = [procs.start("run_executor", "--concurrency", str(concurrency)) for _ in range(count)]
    wait_registered(count, since=since)
    return started


def cpu_since(before: dict[int, float], read: Callable[[], dict[int, float]]) -> float:
    """CPU seconds the processes `read()` lists used since it gave `before`; a backend
    started since counts from zero. Read it while the clients are still connected: a
    backend that exited took its CPU with it."""
    return sum(after - before.get(pid, 0.0) for pid, after in read().items())


def cpu_of(cursor) -> dict[int, float]:
    """CPU seconds of every process of the server `cursor` is connected to."""
    from bench import cpu

    return {pid: cpu.cpu_seconds(pid) for pid in cpu.postgres_pids(cursor)}


def worker_cpu() -> dict[int, float]:
    """Citus: CPU seconds of the processes of every worker on this machine ({} on plain
    PostgreSQL); `postgres_cpu` is the coordinator's. Together: where a run's database
    work goes, and which part more workers would share."""
    import psycopg
    from django.db import connection
    from psycopg.conninfo import make_conninfo

    from runs.execution.connections import database_conninfo
    from scheduler_project.citus import citus_installed, workers

    with connection.cursor() as cursor:
        if not citus_installed(cursor):
            return {}
        nodes = workers(cursor)
    out: dict[int, float] = {}
    for host, port in nodes:
        with psycopg.connect(make_conninfo(database_conninfo(), host=host, port=port)) as conn:
            out.update(cpu_of(conn.cursor()))
    return out


def postgres_cpu() -> dict[int, float]:
    """CPU seconds of the processes of the database server (the coordinator on Citus)."""
    from django.db import connection

    with connection.cursor() as cursor:
        return cpu_of(cursor)


def scenario(kind: str, executors: int, n: int, concurrency: int, target: dict, tenant_count: int) -> dict:
    from tqdm import tqdm

    from bench import cpu
    from tests.support.processes import Processes

    # Before the executors start: they would otherwise see the tenants come and go.
    tenants = create_tenants(tenant_count)
    LOGS.mkdir(parents=True, exist_ok=True)
    procs = Processes(executor_env(), LOGS)
    try:
        children = start_executors(procs, executors, concurrency)
        xacts = commits()
        slot = enqueue(tenants, n, target)
        # Executors cannot see the runs before the commit, which enqueue() has just
        # done: the clock measures draining, not inserting.
        started, began = time.monotonic(), datetime.now(UTC)
        executor_cpu = cpu.total([p.pid for p in children])
        pg_before = postgres_cpu()
        workers_before = worker_cpu()
        peak_rss = 0.0
        desc = f"{kind} x{executors}" + (f", {tenant_count} tenants" if tenant_count > 1 else "")
        with tqdm(total=n, desc=desc, unit="run", file=sys.stderr, leave=False) as bar:
            while True:
                done = n - unfinished(tenants, slot=slot)
                bar.update(done - bar.n)
                peak_rss = max(peak_rss, *(rss_mb(p.pid) for p in children))
                if done >= n:
                    break
                if time.monotonic() - started > 600:
                    raise RuntimeError(f"{kind}: only {done}/{n} finished in 10 minutes")
                # The poll competes with the drain for the same cores, and its cost grows
                # with the tenants (with 20, 18 ms a poll against 9 for one: it visits
                # the heap rows of every claimed run not yet vacuumed), which a 0.25 s
                # poll added to the fair-share comparison. Once a second is enough for
                # the clock, which stops at the last outcome's finished_at; near the end
                # it polls faster, so the CPU readings after it stop close to the drain.
                time.sleep(1.0 if n - done > n // 10 else 0.1)
        last = last_finished(tenants, slot=slot)
        elapsed = (last - began).total_seconds() if last else time.monotonic() - started
        executor_cpu = cpu.total([p.pid for p in children]) - executor_cpu
        # (PostgreSQL's figure includes this loop's polling.)
        pg_cpu = cpu_since(pg_before, postgres_cpu)
        workers_cpu = cpu_since(workers_before, worker_cpu)
        time.sleep(1.0)  # backends report their commit counts within a second of going idle
        xacts = commits() - xacts
        _, failed = finished(tenants, slot=slot)
    finally:
        procs.stop_all()
        remove_tenants()
    return {
        "kind": kind,
        "executors": executors,
        "tenants": tenant_count,
        "runs": n,
        "concurrency": concurrency,
        "seconds": round(elapsed, 2),
        "runs_per_s": round(n / elapsed),
        "failed": failed,
        "peak_rss_mb": round(peak_rss, 1),
        "executor_cpu_ms_per_run": round(executor_cpu * 1000 / n, 3),
        "postgres_cpu_ms_per_run": round(pg_cpu * 1000 / n, 3),
        # Citus: the workers' processes (postgres_cpu_ms_per_run is then the coordinator's).
        "worker_cpu_ms_per_run": round(workers_cpu * 1000 / n, 3),
        "cpu_busy": round((executor_cpu + pg_cpu + workers_cpu) / elapsed, 2),
        "commits_per_run": round(xacts / n, 3),
    }


def http_target(url: str) -> dict:
    return {"type": "http", "url": url, "method": "POST", "timeout_seconds": 10}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--executors", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--kinds", nargs="+", choices=["task", "http"], default=["task", "http"])
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument(
        "--tenants", type=int, default=1, help="spread the runs round-robin over this many tenants"
    )
    parser.add_argument("--url", help="a running no-op server (default: start bench/noop_server.py)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()

    import django

    django.setup()
    from bench.noop_server import NoopServer
    from bench.workload import retained_partitions

    retained_partitions()

    if args.tenants < 1:
        parser.error("--tenants: at least 1")
    results = []
    server = NoopServer() if "http" in args.kinds and not args.url else None
    if server is not None:
        server.__enter__()
    try:
        for kind in args.kinds:
            target = TASK_TARGET if kind == "task" else http_target(args.url or server.url)
            for executors in args.executors:
                result = scenario(kind, executors, args.runs, args.concurrency, target, args.tenants)
                results.append(result)
                print(
                    f"{kind:5} executors={executors} tenants={args.tenants} runs={result['runs']} "
                    f"concurrency={args.concurrency}: "
                    f"{result['seconds']}s = {result['runs_per_s']} runs/s "
                    f"(failed {result['failed']}, peak RSS {result['peak_rss_mb']} MB/executor, CPU ms/run: "
                    f"executors {result['executor_cpu_ms_per_run']}, "
                    f"PostgreSQL {result['postgres_cpu_ms_per_run']}"
                    + (f" (Citus workers {w})" if (w := result["worker_cpu_ms_per_run"]) else "")
                    + "; "
                    f"commits/run {result['commits_per_run']})",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        if server is not None:
            server.__exit__(None, None, None)
    print(
        "| target | executors | tenants | runs | runs/s | seconds | failed | peak RSS/executor "
        "| executor CPU ms/run | PostgreSQL CPU ms/run | commits/run |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        cells = [r["kind"], r["executors"], r["tenants"], r["runs"], r["runs_per_s"], r["seconds"]]
        cells.append(r["failed"])
        cells += [f"{r['peak_rss_mb']} MB", r["executor_cpu_ms_per_run"], r["postgres_cpu_ms_per_run"]]
        cells.append(r["commits_per_run"])
        print("| " + " | ".join(str(c) for c in cells) + " |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    if any(r["failed"] for r in results):
        sys.exit("some runs did not succeed")


if __name__ == "__main__":
    main()
