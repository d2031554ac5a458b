"""Claim latency: how long one claim takes while an executor drains a queue.

    DATABASE_URL=... .venv/bin/python bench/claims.py [--runs 5000] [--batch 100] [--json out.json]

One executor in this process (runs/execution/executor.Executor, the product's claim
loop, writer and heartbeats) drains N queued no-op runs of one bench tenant (one run
per job, bench/execute.enqueue); every call of `claims.claim_runs` it makes is timed,
and the calls that returned runs are reported: median and p90 milliseconds per claim,
runs per claim, and the median per claimed run. The runs are queued before the
executor starts, so claims find work; a claim takes up to `--batch` runs (the
executor's concurrency too), as many as its calls have freed. A claim's time is the
executor's: the wait for its statements, and its turns on the event loop that the
calls and the outcome writer share, as in production.

`make bench` runs it on Citus and on plain PostgreSQL, rounds alternated
(bench/citus.py): the ratio of the medians of the rounds is docs/SCALING.md's claim
latency.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "scheduler_project.settings")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def drain(
    n: int, *, batch: int, tenants: list[int], slot, timeout: float = 300
) -> list[tuple[float, int]]:
    """(seconds, runs) of every claim that returned runs, until the N runs finished."""
    from bench.execute import unfinished
    from runs.execution import claims
    from runs.execution.executor import Executor

    timed: list[tuple[float, int]] = []
    claim_runs = claims.claim_runs

    async def timed_claim(*args, **kwargs):
        began = time.perf_counter()
        claimed = await claim_runs(*args, **kwargs)
        if claimed:
            timed.append((time.perf_counter() - began, len(claimed)))
        return claimed

    executor = Executor.from_settings(concurrency=batch, claim_batch=batch, allow_private=True)
    claims.claim_runs = timed_claim
    main = asyncio.create_task(executor.main())
    await asyncio.sleep(0)  # main() makes the events stop() sets
    try:
        deadline = time.monotonic() + timeout
        # Done when the executor has written every outcome (its own counters): a poll of
        # the database (on Citus a count over every shard) would weigh on the claims.
        while executor.counters.succeeded + executor.counters.dead < n:
            if main.done():
                main.result()  # raises what stopped it
                raise RuntimeError("the executor stopped before the runs finished")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the runs did not finish within {timeout:.0f}s")
            await asyncio.sleep(0.05)
    finally:
        claims.claim_runs = claim_runs
        executor.stop()
        await main
    left = await asyncio.to_thread(unfinished, tenants, slot=slot)
    if left:
        raise RuntimeError(f"{left} runs still open after the executor wrote {n} outcomes")
    return timed


def measure(n: int, *, batch: int) -> dict:
    import django

    django.setup()
    from django.db import connection

    from bench.execute import TASK_TARGET, create_tenants, enqueue, remove_tenants
    from bench.workload import retained_partitions
    from scheduler_project.citus import citus_installed

    retained_partitions()
    with connection.cursor() as cursor:
        engine = "citus" if citus_installed(cursor) else "plain"
    tenants = create_tenants(1)
    try:
        slot = enqueue(tenants, n, TASK_TARGET)
        connection.close()  # the drain polls from another thread, with a connection of its own
        timed = asyncio.run(drain(n, batch=batch, tenants=tenants, slot=slot))
    finally:
        remove_tenants()
    ms = [seconds * 1000 for seconds, _ in timed]
    per_run = [seconds * 1000 / runs for seconds, runs in timed]
    return {
        "engine": engine,
        "runs": n,
        "batch": batch,
        "claims": len(timed),
        "median_ms": round(statistics.median(ms), 2),
        "p90_ms": round(percentile(ms, 0.9), 2),
        "runs_per_claim": round(sum(runs for _, runs in timed) / len(timed), 1),
        "median_ms_per_run": round(statistics.median(per_run), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=5_000)
    parser.add_argument("--batch", type=int, default=100, help="runs per claim at most")
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args()
    row = measure(args.runs, batch=args.batch)
    print(
        f"{row['engine']}: {row['claims']} claims of {row['runs_per_claim']} runs:"
        f" median {row['median_ms']} ms (p90 {row['p90_ms']}), {row['median_ms_per_run']} ms per claimed run",
        file=sys.stderr,
    )
    if args.json:
        args.json.write_text(json.dumps(row, indent=2))


if __name__ == "__main__":
    main()
