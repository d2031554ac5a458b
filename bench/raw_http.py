"""The limit for HTTP targets: a raw aiohttp-on-uvloop client loop, no database.

    .venv/bin/python bench/raw_http.py --url http://127.0.0.1:PORT/noop [--requests 10000]
        [--workers 1 2 4] [--concurrency 32] [--json out.json]

Each worker is one process with one uvloop event loop and one aiohttp session whose
pool holds `concurrency` connections, like one `run_executor --concurrency N`; it
POSTs with the headers Cronyard sends (an idempotency key, the attempt, the job,
the scheduled time, a traceparent) and reads each answer. `requests` are split
evenly over the workers. No claims, no outcome writes: what the HTTP client and the
server alone allow on this machine, read beside bench/execute.py's `http` rows
against the same server (without --url a server of bench/noop_server.py is started).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


async def _drive(url: str, n: int, concurrency: int) -> int:
    import asyncio

    import aiohttp

    job = str(uuid.uuid4())
    connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=0)
    done = 0
    async with aiohttp.ClientSession(connector=connector, trust_env=False) as session:
        queue = iter(range(n))

        async def one_lane() -> None:
            nonlocal done
            for i in queue:
                headers = {
                    "Idempotency-Key": f"{job}/{i}",
                    "X-Run-Attempt": "1",
                    "X-Job-Id": job,
                    "X-Scheduled-At": "2026-01-01T00:00:00Z",
                    "traceparent": f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01",
                }
                async with session.post(url, headers=headers, allow_redirects=False) as response:
                    await response.content.read(2000)
                    if response.status == 200:
                        done += 1

        await asyncio.gather(*(one_lane() for _ in range(concurrency)))
    return done


def worker(url: str, n: int, concurrency: int, start, results) -> None:
    import asyncio

    import uvloop

    start.wait()
    began, cpu = time.monotonic(), time.process_time()
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        done = runner.run(_drive(url, n, concurrency))
    results.put((done, time.monotonic() - began, time.process_time() - cpu))


def measure(*, url: str, requests: int, workers: int, concurrency: int) -> dict:
    """Send `requests` POSTs from `workers` processes; the clock starts once all are up."""
    ctx = multiprocessing.get_context("spawn")
    start, results = ctx.Event(), ctx.Queue()
    shares = [requests // workers + (1 if i < requests % workers else 0) for i in range(workers)]
    procs = [ctx.Process(target=worker, args=(url, share, concurrency, start, results)) for share in shares]
    for p in procs:
        p.start()
    time.sleep(1.0)  # interpreters up: the clock measures requests, not imports
    began = time.monotonic()
    start.set()
    answers = [results.get(timeout=600) for _ in procs]
    elapsed = time.monotonic() - began
    done = sum(a[0] for a in answers)
    for p in procs:
        p.join()
    if done != requests:
        raise RuntimeError(f"raw HTTP loop: {done} of {requests} requests answered 200")
    return {
        "kind": "http",
        "workers": workers,
        "runs": requests,
        "concurrency": concurrency,
        "seconds": round(elapsed, 2),
        "runs_per_s": round(requests / elapsed),
        "client_cpu_ms_per_request": round(sum(a[2] for a in answers) * 1000 / requests, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", help="a running no-op server (default: start bench/noop_server.py)")
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()

    from bench.noop_server import NoopServer

    server = None if args.url else NoopServer().__enter__()
    try:
        url = args.url or server.url
        results = [
            measure(url=url, requests=args.requests, workers=w, concurrency=args.concurrency)
            for w in args.workers
        ]
    finally:
        if server is not None:
            server.__exit__(None, None, None)
    print(
        "| raw aiohttp-on-uvloop loop | processes | concurrency | requests | runs/s | seconds "
        "| client CPU ms/req |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(
            f"| no database | {r['workers']} | {r['concurrency']} | {r['runs']} "
            f"| {r['runs_per_s']} | {r['seconds']} | {r['client_cpu_ms_per_request']} |"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
