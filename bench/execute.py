"""Executor throughput: N queued runs drained by 1..k `run_executor` processes.

    DATABASE_URL=... .venv/bin/python bench/execute.py [--runs 10000] [--executors 1 2]
        [--kinds task http] [--concurrency 32]

Executors are started first and the clock starts when the runs commit (one INSERT
plus NOTIFY), so process start-up is not measured. `task` runs the builtin `noop`
task (database cost only); `http` POSTs to a local aiohttp no-op server running in
its own process. Runs go to a dedicated tenant that is emptied before and after.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import socket
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "scheduler_project.settings")

SLUG = "bench-execute"


def serve_noop(port: int) -> None:
    from aiohttp import web

    async def ok(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", ok)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("no-op HTTP server did not start")


def tenant_id() -> int:
    from jobs.models import Tenant

    tenant, _ = Tenant.objects.get_or_create(slug=SLUG, defaults={"name": SLUG, "max_concurrency": 1_000_000})
    return tenant.id


def clear(tenant: int) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM job_runs WHERE tenant_id = %s", [tenant])


def enqueue(tenant: int, n: int, target: dict, *, spread: bool) -> None:
    from django.db import transaction

    from jobs.services import partition_for
    from runs.queue import enqueue_runs, notify_executors
    from runs.rows import NewRun

    base = datetime.now(UTC) - timedelta(minutes=1)
    job_ids = [uuid.uuid4() for _ in range(n)]
    runs = [
        NewRun(
            job_id=job_ids[i],
            scheduled_at=base + timedelta(microseconds=i),
            tenant_id=tenant,
            # As the scheduler writes them (each run in its job's partition), or all in one.
            partition_id=partition_for(job_ids[i]) if spread else 0,
            target=target,
            job_name="bench",
            overlap_check=False,
        )
        for i in range(n)
    ]
    with transaction.atomic():
        enqueue_runs(runs)
        notify_executors()


def finished(tenant: int) -> tuple[int, int]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FILTER (WHERE status IN ('succeeded', 'dead', 'cancelled', 'skipped')),"
            " count(*) FILTER (WHERE status <> 'succeeded' AND status IN ('dead', 'cancelled', 'skipped'))"
            " FROM job_runs WHERE tenant_id = %s",
            [tenant],
        )
        return cursor.fetchone()


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def scenario(
    kind: str, executors: int, n: int, concurrency: int, target: dict, tenant: int, *, spread: bool = True
) -> dict:
    clear(tenant)
    env = {
        **os.environ,
        "SCHEDULER_ALLOW_PRIVATE_TARGETS": "true",
        "EXECUTOR_POLL_SECONDS": "0.5",
        "LOG_LEVEL": "WARNING",
    }
    procs = [
        subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "run_executor", "--concurrency", str(concurrency)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
        )
        for _ in range(executors)
    ]
    try:
        time.sleep(2.5)  # Django start-up
        enqueue(tenant, n, target, spread=spread)
        # Executors cannot see the runs before the commit, which enqueue() has just
        # done: the clock measures draining, not inserting.
        started = time.monotonic()
        peak_rss = 0.0
        while True:
            done, failed = finished(tenant)
            peak_rss = max(peak_rss, *(rss_mb(p.pid) for p in procs))
            if done >= n:
                break
            if time.monotonic() - started > 600:
                raise RuntimeError(f"{kind}: only {done}/{n} finished in 10 minutes")
            time.sleep(0.05)
        elapsed = time.monotonic() - started
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)
    clear(tenant)
    return {
        "kind": kind,
        "executors": executors,
        "runs": n,
        "concurrency": concurrency,
        "seconds": round(elapsed, 2),
        "runs_per_s": round(n / elapsed),
        "failed": failed,
        "peak_rss_mb": round(peak_rss, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--executors", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--kinds", nargs="+", choices=["task", "http"], default=["task", "http"])
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument(
        "--partitions",
        choices=["spread", "one"],
        default="spread",
        help="runs in their jobs' partitions (as scheduled; default) or all in partition 0",
    )
    args = parser.parse_args()

    import django

    django.setup()
    tenant = tenant_id()
    server = None
    results = []
    try:
        for kind in args.kinds:
            if kind == "http":
                port = free_port()
                server = multiprocessing.Process(target=serve_noop, args=(port,), daemon=True)
                server.start()
                wait_port(port)
                target = {
                    "type": "http",
                    "url": f"http://127.0.0.1:{port}/noop",
                    "method": "POST",
                    "timeout_seconds": 10,
                }
            else:
                target = {"type": "task", "name": "noop", "kwargs": {}}
            for executors in args.executors:
                spread = args.partitions == "spread"
                result = scenario(kind, executors, args.runs, args.concurrency, target, tenant, spread=spread)
                results.append(result)
                print(
                    f"{kind:5} executors={executors} runs={result['runs']} concurrency={args.concurrency}: "
                    f"{result['seconds']}s = {result['runs_per_s']} runs/s "
                    f"(failed {result['failed']}, peak RSS {result['peak_rss_mb']} MB/executor)",
                    flush=True,
                )
            if server is not None:
                server.terminate()
                server.join()
                server = None
    finally:
        if server is not None:
            server.terminate()
    print("| target | executors | runs | runs/s | seconds | peak RSS/executor |")
    print("|---|---|---|---|---|---|")
    for r in results:
        cells = [
            r["kind"],
            r["executors"],
            r["runs"],
            r["runs_per_s"],
            r["seconds"],
            f"{r['peak_rss_mb']} MB",
        ]
        print("| " + " | ".join(str(c) for c in cells) + " |")


if __name__ == "__main__":
    main()
