"""`make bench`: every benchmark in one run, next to the raw-SQL limit, into docs/BENCHMARKS.md.

    make bench                      # 10k and 100k jobs; 10k runs
    make bench BENCH_ARGS=--full    # adds 1M jobs (several minutes more)

Each part is its own script under bench/ and can be run alone; this only runs them
in order, collects their Markdown tables and computes the ratios to the limit.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "var" / "bench"


def run(script: str, *args: str) -> str:
    print(f"bench: {script} {' '.join(args)}", file=sys.stderr, flush=True)
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *args], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    print(f"bench: {script} took {time.monotonic() - started:.0f}s", file=sys.stderr, flush=True)
    if result.returncode != 0:
        sys.exit(f"bench: {script} failed with exit code {result.returncode}")
    return result.stdout.strip()


def tables(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if line.startswith("|"))


def dispatch_ratios(ours: list[dict], limit: list[dict]) -> str:
    best = {(r["jobs"], r["workers"]): r["runs_per_second"] for r in limit}
    lines = [
        "| jobs | processes | Cronyard runs/s | raw limit runs/s | ratio |",
        "|---:|---:|---:|---:|---:|",
    ]
    for r in ours:
        raw = best.get((r["jobs"], r["schedulers"]))
        ratio = f"{r['runs_per_second'] / raw:.2f}" if raw else "n/a"
        lines.append(
            f"| {r['jobs']} | {r['schedulers']} | {r['runs_per_second']} | {raw or 'n/a'} | {ratio} |"
        )
    return "\n".join(lines)


def server_version() -> str:
    try:
        out = subprocess.run(["psql", "--version"], capture_output=True, text=True).stdout.strip()
    except OSError:
        out = "unknown"
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--full", action="store_true", help="also 1M jobs")
    parser.add_argument("--runs", type=int, default=10_000, help="runs per execution scenario")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    jobs = ["10000", "100000"] + (["1000000"] if args.full else [])

    dispatch = run(
        "dispatch.py", "--jobs", *jobs, "--schedulers", "1", "2", "--json", str(OUT / "dispatch.json")
    )
    raw_dispatch = run(
        "raw_dispatch.py", "--jobs", *jobs, "--workers", "1", "2", "--json", str(OUT / "raw_dispatch.json")
    )
    execute = run("execute.py", "--runs", str(args.runs), "--executors", "1", "2", "4")
    raw_execute = run("raw_limit.py")
    ledger = run("ledger.py")
    ratios = dispatch_ratios(
        json.loads((OUT / "dispatch.json").read_text()), json.loads((OUT / "raw_dispatch.json").read_text())
    )

    report = f"""# Benchmarks

Written by `make bench` on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC: {platform.machine()},
{subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()} cores, Python
{platform.python_version()}, {server_version()} (the embedded cluster, default settings).
Numbers from one run on a shared 2-core machine: compare ratios, not absolutes.

## Dispatch: N jobs all due, time until every run row exists

{tables(dispatch)}

The limit: the same statements (lock due jobs `SKIP LOCKED`, insert runs `ON CONFLICT
DO NOTHING`, advance `next_run_at`, commit; 500 per batch) in a minimal raw-psycopg
loop without leases, schedule math or policies (`bench/raw_dispatch.py`):

{tables(raw_dispatch)}

{ratios}

## Execution: queued runs drained by executors

{tables(execute)}

The limit (`bench/raw_limit.py`):

{raw_execute}

## Occurrence ledger: a year of a minutely job, page by page

525,600 slots, mostly paused (12 ranged rows), 4,800 runs; each page through
`jobs.ledger.occurrences`, the function `GET /jobs/{{id}}/occurrences` calls
(`bench/ledger.py`):

{tables(ledger)}

## Not measured yet

End-to-end lag p50/p99 from `scheduled_at` to start, and plots (DESIGN section 9).
"""
    (ROOT / "docs" / "BENCHMARKS.md").write_text(report)
    print(report)


if __name__ == "__main__":
    main()
