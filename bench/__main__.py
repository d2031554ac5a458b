"""`make bench`: every benchmark in one run, each beside its limit, into docs/BENCHMARKS.md.

    make bench                      # 10k, 100k jobs; 10k runs; lag at 1k runs/s; forecast 100k, 1M (~18 min)
    make bench BENCH_ARGS=--full    # adds the growth curve 10k..1M jobs (bench/growth.py; ~5 min more)
    python -m bench --smoke --report /tmp/b.md --plots /tmp/plots   # seconds: make test's form

Each part is its own script under bench/ and can be run alone; this runs them in an
order that puts Cronyard and its limit side by side (dispatch N then the raw loop at
the same N; k executors then k raw workers), because the machine is shared and
noisy: a ratio of two numbers taken minutes apart would measure the neighbours.
It checks each dispatch round's duplicates and missing runs, computes the ratios,
draws the plots (bench/plots.py) and writes the report.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


class Bench:
    """Runs the part scripts with a progress line each and keeps their outputs."""

    def __init__(self, *, data: Path, steps: int) -> None:
        from tqdm import tqdm

        self.data = data
        self.data.mkdir(parents=True, exist_ok=True)
        self.overall = tqdm(total=steps, desc="make bench", unit="step", file=sys.stderr, position=0)

    def run(self, script: str, *args: str, probe=None, env: dict | None = None) -> str:
        """Run bench/<script> (with `env`, default ours); the bar's postfix shows the
        elapsed time and what `probe` says."""
        self.overall.set_description(f"bench: {script} {' '.join(args)}"[:100])
        self.overall.set_postfix_str("")
        stop = threading.Event()
        started = time.monotonic()

        def tick() -> None:
            while not stop.wait(1.0):
                said = probe()
                extra = f", {said}" if said else ""
                self.overall.set_postfix_str(f"{time.monotonic() - started:.0f}s{extra}")

        # Only with a probe: scripts that draw their own bars would fight this one's redraws.
        ticker = threading.Thread(target=tick, daemon=True)
        if probe:
            ticker.start()
        try:
            result = subprocess.run(
                [sys.executable, str(ROOT / "bench" / script), *args],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                text=True,
            )
        finally:
            stop.set()
            if probe:
                ticker.join()
        self.overall.update(1)
        self.overall.write(f"bench: {script} {' '.join(args)} took {time.monotonic() - started:.0f}s")
        if result.returncode != 0:
            sys.exit(f"bench: {script} failed with exit code {result.returncode}:\n{result.stdout}")
        return result.stdout.strip()

    def json(self, name: str):
        return json.loads((self.data / name).read_text())


def tables(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if line.startswith("|"))


def parse_table(text: str) -> list[dict[str, str]]:
    """The first Markdown table in `text`, one dict per row keyed by the header cells."""
    lines = [line for line in text.splitlines() if line.startswith("|")]
    if len(lines) < 2:
        return []
    cells = [[c.strip() for c in line.strip().strip("|").split("|")] for line in lines]
    header = cells[0]
    return [dict(zip(header, row, strict=False)) for row in cells[2:]]


def ratio(ours: float | None, limit: float | None) -> str:
    return f"{ours / limit:.2f}" if ours and limit else "n/a"


def job_runs_probe(database: str):
    """How many run rows the scratch database holds now (dispatch progress), or None."""
    import psycopg

    from bench.dispatch import scratch_url

    url = scratch_url(os.environ["DATABASE_URL"], database)

    def probe() -> str | None:
        try:
            with psycopg.connect(url, autocommit=True, connect_timeout=2) as conn:
                return f"{conn.execute('SELECT count(*) FROM job_runs').fetchone()[0]} run rows"
        except psycopg.Error:
            return None

    return probe


# --- the parts ------------------------------------------------------------------------


def dispatch_workloads() -> list[str]:
    """bench/dispatch.py grows a --workload flag (realistic cron mix, interval): both when there."""
    help_text = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "dispatch.py"), "--help"], capture_output=True, text=True
    ).stdout
    return ["realistic", "interval"] if "--workload" in help_text else ["interval"]


def dispatch_part(
    bench: Bench, *, workloads: list[str], jobs: list[int], processes: list[int], db: str
) -> list[dict]:
    """Per workload and N: Cronyard, then the raw loop on the same rows; every round verified."""
    rows = []
    for workload in workloads:
        flag = ["--workload", workload] if len(workloads) > 1 else []
        for n in jobs:
            counts = [str(k) for k in processes]
            for script, processes_flag, out, extra in (
                ("dispatch.py", "--schedulers", "dispatch.json", []),
                ("raw_dispatch.py", "--workers", "raw_dispatch.json", []),
                ("raw_dispatch.py", "--workers", "minimal_dispatch.json", ["--minimal"]),
            ):
                bench.run(
                    script, "--jobs", str(n), processes_flag, *counts, "--db", db, *flag, *extra,
                    "--json", str(bench.data / out), probe=job_runs_probe(db),
                )  # fmt: skip
            limits = {r["workers"]: r["runs_per_second"] for r in bench.json("raw_dispatch.json")}
            minimal = {r["workers"]: r["runs_per_second"] for r in bench.json("minimal_dispatch.json")}
            problems = [r for r in bench.json("minimal_dispatch.json") if r["duplicates"] or r["missing"]]
            if problems:
                sys.exit(f"bench: the minimal dispatch loop lost or doubled runs: {problems}")
            for r in bench.json("dispatch.json"):
                rows.append(
                    {
                        "workload": workload,
                        "jobs": r["jobs"],
                        "processes": r["schedulers"],
                        "ours": r["runs_per_second"],
                        "limit": limits.get(r["schedulers"]),
                        "minimal": minimal.get(r["schedulers"]),
                        "seconds": r["seconds"],
                        "peak_rss_mb": r.get("peak_rss_mb"),
                        "duplicates": r.get("duplicates"),
                        "missing": r.get("missing"),
                        "exit_codes": r.get("exit_codes", []),
                    }
                )
    return rows


def verify_dispatch(rows: list[dict]) -> list[str]:
    """Every round: no duplicate run, no missing run, every scheduler exited cleanly."""
    problems = []
    for r in rows:
        where = f"dispatch {r['workload']} {r['jobs']} jobs x{r['processes']}"
        if r["duplicates"]:
            problems.append(f"{where}: {r['duplicates']} duplicate runs")
        if r["missing"]:
            problems.append(f"{where}: {r['missing']} missing runs")
        if any(r["exit_codes"]):
            problems.append(f"{where}: scheduler exit codes {r['exit_codes']}")
    return problems


def execute_part(
    bench: Bench, *, runs: int, task_executors: list[int], http_executors: list[int]
) -> list[dict]:
    """k executors, then the limit with k workers, per k: task targets, then HTTP targets."""
    from bench.noop_server import NoopServer

    rows = []
    for k in task_executors:
        bench.run(
            "execute.py",
            "--kinds",
            "task",
            "--executors",
            str(k),
            "--runs",
            str(runs),
            "--json",
            str(bench.data / "execute.json"),
        )
        ours = bench.json("execute.json")[0]
        limit = parse_table(bench.run("raw_limit.py", "--workers", str(k), "--runs", str(runs)))
        minimal = parse_table(
            bench.run("raw_limit.py", "--workers", str(k), "--runs", str(runs), "--minimal")
        )
        rows.append(
            {
                "kind": "task",
                **ours,
                "ours": ours["runs_per_s"],
                "limit": int(limit[0]["runs/s"]),
                "minimal": int(minimal[0]["runs/s"]),
                "limit_cpu_ms_per_run": float(limit[0]["client CPU ms/run"]),
                "limit_postgres_cpu_ms_per_run": float(limit[0]["PostgreSQL CPU ms/run"]),
            }
        )
    # One server for both sides, in its own process: the same target for Cronyard and the loop.
    with NoopServer() as server:
        for k in http_executors:
            server_cpu = server.cpu_seconds()
            bench.run(
                "execute.py",
                "--kinds",
                "http",
                "--executors",
                str(k),
                "--runs",
                str(runs),
                "--url",
                server.url,
                "--json",
                str(bench.data / "execute.json"),
            )
            ours = bench.json("execute.json")[0]
            after = server.cpu_seconds()
            ours_server_cpu, server_cpu = after - server_cpu, after
            bench.run(
                "raw_http.py",
                "--workers",
                str(k),
                "--requests",
                str(runs),
                "--url",
                server.url,
                "--concurrency",
                str(ours["concurrency"]),
                "--json",
                str(bench.data / "raw_http.json"),
            )
            limit = bench.json("raw_http.json")[0]
            rows.append(
                {
                    "kind": "http",
                    **ours,
                    "ours": ours["runs_per_s"],
                    "limit": limit["runs_per_s"],
                    "limit_cpu_ms_per_run": limit["client_cpu_ms_per_request"],
                    # Per request, both sides: the server's work is the same, its share of
                    # the cores is not (cpu_budget_table).
                    "server_cpu_ms_per_run": round(ours_server_cpu * 1000 / ours["runs"], 3),
                    "limit_server_cpu_ms_per_run": round(
                        (server.cpu_seconds() - server_cpu) * 1000 / limit["runs"], 3
                    ),
                }
            )
    return rows


# Fair share's cost: one tenant (a trivial rank) against this many (every batch ranks them).
FAIR_SHARE_TENANTS = 20


def fair_share_part(bench: Bench, *, runs: int, pairs: int) -> dict:
    """The task bench with 1 executor, 1 tenant then FAIR_SHARE_TENANTS tenants, `pairs`
    times: interleaved, so the machine's noise lands on both sides alike."""
    rounds: dict[int, list[dict]] = {1: [], FAIR_SHARE_TENANTS: []}
    for _ in range(pairs):
        for tenants in rounds:
            bench.run(
                "execute.py", "--kinds", "task", "--executors", "1", "--runs", str(runs),
                "--tenants", str(tenants), "--json", str(bench.data / "execute_fair_share.json"),
            )  # fmt: skip
            rounds[tenants].append(bench.json("execute_fair_share.json")[0])
    (bench.data / "fair_share.json").write_text(json.dumps({str(t): r for t, r in rounds.items()}, indent=2))
    return {"runs": runs, "rounds": rounds}


def fair_share_section(fair: dict) -> str:
    """One sentence on what is measured, then the median runs/s and CPU per run of each
    side and their ratio to one tenant."""
    many = FAIR_SHARE_TENANTS
    return (
        f"The cost of fair share: the task target, 1 executor, {fair['runs']} runs all in one tenant\n"
        f"(the fair-share rank is trivial) or round-robin over {many} tenants of weights 1 to 3 (every\n"
        f"claim batch ranks them), {len(fair['rounds'][1])} rounds of each interleaved (1, {many}, 1, "
        f"{many}, ...);\nmedians, and the {many}-tenant figure over the 1-tenant one:\n\n"
        + fair_share_table(fair)
    )


def fair_share_table(fair: dict) -> str:
    medians = {
        tenants: {key: statistics.median(r[key] for r in rows) for key in
                  ("runs_per_s", "executor_cpu_ms_per_run", "postgres_cpu_ms_per_run")}
        for tenants, rows in fair["rounds"].items()
    }  # fmt: skip
    one = medians[1]
    lines = [
        "| tenants | runs/s per round | median runs/s | vs 1 tenant "
        "| median executor CPU ms/run | vs 1 tenant | median PostgreSQL CPU ms/run | vs 1 tenant |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for tenants, m in medians.items():
        per_round = ", ".join(str(r["runs_per_s"]) for r in fair["rounds"][tenants])
        cells = [tenants, per_round, round(m["runs_per_s"]), ratio(m["runs_per_s"], one["runs_per_s"])]
        for key in ("executor_cpu_ms_per_run", "postgres_cpu_ms_per_run"):
            cells += [round(m[key], 3), ratio(m[key], one[key])]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


# --- the report ----------------------------------------------------------------------


def machine() -> dict:
    def first(path: str, key: str) -> str:
        try:
            for line in Path(path).read_text().splitlines():
                if line.startswith(key):
                    return line.split(":", 1)[1].strip()
        except OSError:
            pass
        return "unknown"

    import psycopg

    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        server = conn.execute("SHOW server_version").fetchone()[0]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True
    )
    mem_kb = first("/proc/meminfo", "MemTotal").split()[0]
    return {
        "cpu": first("/proc/cpuinfo", "model name"),
        # The cores this process may use (a container's or taskset's share), not the host's.
        "cores": len(os.sched_getaffinity(0)),
        "ram_gb": f"{int(mem_kb) / 1024 / 1024:.1f}" if mem_kb.isdigit() else "unknown",
        "arch": platform.machine(),
        "python": platform.python_version(),
        "postgres": server,
        "commit": commit.stdout.strip() + (" (with uncommitted changes)" if dirty.stdout.strip() else ""),
    }


def dispatch_table(rows: list[dict]) -> str:
    lines = [
        "| workload | jobs | schedulers | Cronyard runs/s | minimal limit runs/s | ratio to minimal "
        "| own-schema limit runs/s | ratio | seconds | peak RSS per scheduler (MB) | duplicates | missing |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for r in rows:
        missing = "n/a" if r["missing"] is None else r["missing"]
        lines.append(
            f"| {r['workload']} | {r['jobs']} | {r['processes']} | {r['ours']} | {r.get('minimal') or 'n/a'} "
            f"| **{ratio(r['ours'], r.get('minimal'))}** | {r['limit'] or 'n/a'} "
            f"| {ratio(r['ours'], r['limit'])} | {r['seconds']} | {r['peak_rss_mb']} "
            f"| {r['duplicates']} | {missing} |"
        )
    return "\n".join(lines)


def execute_table(rows: list[dict], kind: str, limit_name: str) -> str:
    mine = [r for r in rows if r["kind"] == kind]
    one = next((r["ours"] for r in mine if r["executors"] == 1), None)
    # Task rounds also have the minimal row's limit (bench/raw_limit.py --minimal): the ratio to read.
    minimal = any("minimal" in r for r in mine)
    lines = [
        "| executors | runs | Cronyard runs/s | "
        + ("minimal limit runs/s | ratio to minimal | " if minimal else "")
        + f"{limit_name} runs/s | ratio | vs 1 executor "
        "| peak RSS/executor (MB) | executor CPU ms/run | PostgreSQL CPU ms/run | commits/run |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if minimal else ""),
    ]
    for r in mine:
        first = f"{r.get('minimal')} | **{ratio(r['ours'], r.get('minimal'))}** | " if minimal else ""
        lines.append(
            f"| {r['executors']} | {r['runs']} | {r['ours']} | {first}{r['limit']} "
            f"| {ratio(r['ours'], r['limit'])} "
            f"| {ratio(r['ours'], one)} | {r['peak_rss_mb']} | {r.get('executor_cpu_ms_per_run')} "
            f"| {r.get('postgres_cpu_ms_per_run')} | {r.get('commits_per_run')} |"
        )
    return "\n".join(lines)


# Where one run's CPU goes, per target kind: (column, row key), Cronyard's side then the limit's.
_CPU_PARTS = {
    "task": (
        [("executor", "executor_cpu_ms_per_run"), ("PostgreSQL", "postgres_cpu_ms_per_run")],
        [("raw client", "limit_cpu_ms_per_run"), ("raw PostgreSQL", "limit_postgres_cpu_ms_per_run")],
    ),
    "http": (
        [
            ("executor", "executor_cpu_ms_per_run"),
            ("PostgreSQL", "postgres_cpu_ms_per_run"),
            ("server", "server_cpu_ms_per_run"),
        ],
        [("raw client", "limit_cpu_ms_per_run"), ("raw server", "limit_server_cpu_ms_per_run")],
    ),
}


def cpu_budget_table(rows: list[dict], kind: str, cores: int) -> str:
    """What the ratio could be if the measured CPU per run were all there is.

    Cronyard's k executors can do at most k cores' worth of their own work, and with
    PostgreSQL (and the server) at most `cores` of everything: the lower of the two
    bounds is its ceiling on this machine, read against the limit's measured rate."""
    ours, raw = _CPU_PARTS[kind]
    lines = [
        "| executors | "
        + " | ".join(name for name, _ in ours)
        + " | Cronyard total | "
        + " | ".join(name for name, _ in raw)
        + f" | raw total | Cronyard's ceiling on {cores} cores, runs/s | ceiling / raw | measured ratio |",
        "|---:" * (len(ours) + len(raw) + 6) + "|",
    ]
    for r in rows:
        if r["kind"] != kind or any(key not in r for _, key in ours + raw):
            continue
        own = r["executor_cpu_ms_per_run"]
        total = sum(r[key] for _, key in ours)
        raw_total = sum(r[key] for _, key in raw)
        ceiling = min(r["executors"] * 1000 / own, cores * 1000 / total) if own and total else None
        cells = [r["executors"], *(r[key] for _, key in ours), f"{total:.3f}"]
        cells += [*(r[key] for _, key in raw), f"{raw_total:.3f}"]
        cells += [round(ceiling) if ceiling else "n/a", ratio(ceiling, r["limit"]) if ceiling else "n/a"]
        cells += [ratio(r["ours"], r["limit"])]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def relative(path: Path, report: Path) -> str:
    return os.path.relpath(path, report.parent)


def write_report(
    *,
    report: Path,
    plots: dict[str, Path],
    info: dict,
    dispatch: list[dict],
    execute: list[dict],
    fair_share: dict,
    citus_text: str,
    lag_text: str,
    ledger_text: str | None,
    forecast_text: str,
    storage_text: str,
    growth_text: str,
    args: argparse.Namespace,
    minutes: float,
) -> str:
    ledger = (
        "525,600 slots, mostly paused (12 ranged rows), 4,800 runs; each page through\n"
        "`jobs.ledger.occurrences`, the function `GET /jobs/{id}/occurrences` calls (`bench/ledger.py`):\n\n"
        + tables(ledger_text)
        if ledger_text
        else "Not run (--smoke)."
    )
    text = f"""# Benchmarks

Written by `make bench` ({" ".join(sys.argv[1:]) or "default"}) on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC
in {minutes:.1f} minutes, commit {info["commit"]}.

Machine: {info["cpu"]}, {info["cores"]} cores, {info["ram_gb"]} GB RAM, {info["arch"]}; Python
{info["python"]}; PostgreSQL {info["postgres"]} (the embedded cluster, default settings).
The machine may be shared with other builds and tests: absolute numbers are noisy.
Each Cronyard figure was taken right beside its limit (interleaved), so read the ratios.
Every round but storage runs on a database with the day partitions of
`RUN_RETENTION_DAYS` of use (`bench/workload.retained_partitions`), as a month-old
installation has them; the minimal limits' table is not partitioned.

## Storage: bytes on disk per finished run

`bench/storage.py`: jobs with the realistic HTTP target (a POST with a JSON body of about
150 bytes and two headers, `Authorization` secret), each fired once by `run_scheduler` and
executed by two `run_executor` processes against the no-op server until it succeeded; then
a plain `VACUUM` and the sizes of every partition of `job_runs` and `run_history` (heap
with its TOAST, and all indexes) over the runs: a success moves its row from the first to
the second (docs/decisions/0085-run-history.md), where it keeps only what sets it apart
(0086-lean-history-row.md). `waves` 1: every run due at once, the
worst case (the queue's indexes and the row versions claims and outcomes leave grow to
every run); more waves: the same runs due in that many waves with a plain `VACUUM` after
each (what autovacuum does between the hours of a day), where later waves reuse the space
earlier ones freed, as a day whose busiest second holds a share of its runs does. The rows
with 3 attempts have a target that answers 503 twice per run key (breakers and retry
budgets lifted for that round). The seed's budget is about 200 bytes per run (400 for a
retried one); the GB and TB columns are what these bytes come to at its volume (240M runs
a day, 30 days kept). A run names its job's target version instead of holding the target:
the last column is a version's bytes, one per job and target edit, not per run. The
second table says where a run's bytes are: what `job_runs` keeps after its runs left is
index pages its busiest wave filled, which later waves reuse.

{storage_text}

## Dispatch: N jobs all due, time until every run row exists

Cronyard: `run_scheduler` processes (`bench/dispatch.py`). Two limits, each a raw-psycopg
loop with one worker per scheduler on the same jobs right after (`bench/raw_dispatch.py`):
lock due jobs `SKIP LOCKED` per partition, insert runs `ON CONFLICT DO NOTHING`, advance
`next_run_at` with the same next times, commit; 500 per batch. The **minimal limit**
writes the seed's minimal run row `(job_id, scheduled_at, status, attempt, lease_until)`
with its key and one queue index: the work the design requires, so its ratio includes
what Cronyard's run row costs. The own-schema limit writes Cronyard's own row and indexes:
its ratio is the Python around the statements. Every round is checked: duplicates must
be 0 and missing must be 0 (`make bench` fails otherwise).

{dispatch_table(dispatch)}

![runs/s vs N]({relative(plots["dispatch"], report)})

{growth_text}
## Execution: no-op runs, one per job (the top-of-the-hour shape)

N jobs each with one queued run, drained by `run_executor --concurrency
{execute[0]["concurrency"] if execute else 32}` processes (`bench/execute.py`).

Task target (builtin `noop`: the database cost only). Two limits, each a raw-psycopg
batched claim + complete loop with one worker per executor (`bench/raw_limit.py`): the
**minimal limit** on the seed's minimal run row (`--minimal`), and the same loop on
Cronyard's own rows and indexes:

{execute_table(execute, "task", "raw claim+complete")}

Where the CPU of one run goes (ms per run, from /proc), and the ratio the machine
would allow with these costs if every core were busy:

{cpu_budget_table(execute, "task", info["cores"])}

{fair_share_section(fair_share)}

HTTP target: one no-op aiohttp server in its own process (`bench/noop_server.py`). The
limit: a raw aiohttp-on-uvloop client loop, no database, the same concurrency per
process and one process per executor, against the same server (`bench/raw_http.py`):

{execute_table(execute, "http", "raw aiohttp")}

The raw loop's client CPU per request: {
        ", ".join(
            f"{r['limit_cpu_ms_per_run']} ms ({r['executors']} proc)" for r in execute if r["kind"] == "http"
        )
    } (compare with the executor CPU per run above; the difference is Cronyard's own work per call).

Where the CPU of one run goes (ms per run, from /proc), and the ratio the machine
would allow with these costs if every core were busy:

{cpu_budget_table(execute, "http", info["cores"])}

![executor scaling]({relative(plots["executor"], report)})

## Citus: the same rounds on a local coordinator + 2 workers

`bench/citus.py`: a Citus coordinator and two workers on this same machine
(`scripts/citus_cluster.py`, 32 shards), each round right beside the same round on
the plain PostgreSQL above; modest sizes. Three PostgreSQL nodes share the cores with
the benchmark: this is Citus's overhead per run, not scale-out (docs/SCALING.md). The
raw dispatch loop runs on Citus as it is (one partition per statement); the raw
claim+complete loop (`bench/raw_limit.py`) locks runs of many partitions in one
statement, which Citus refuses, so execution has no limit there. Last, the storage
round on the cluster.

{citus_text}

## End-to-end lag: scheduled_at → the target receives the request

`bench/lag.py`: interval jobs spread evenly over their period (a steady rate), the
schedulers and executors of the table with the product's default settings, an HTTP target that
records each arrival and the `X-Scheduled-At` header; every run scheduled in the
measured window, after the warm-up. Targets: p50 < 0.5 s, p99 < 2 s.

{lag_text}

![lag distribution]({relative(plots["lag"], report)})

How these numbers are measured, and why that way: `docs/decisions/0065-benchmark-harness.md`.

## Occurrence ledger: a year of a minutely job, page by page

{ledger}

## Load forecast: the next 24 h by minute

`bench/forecast.py`: the realistic mix of the dispatch rounds (bench/workload.py), each
job waiting for its real next slot, one tenant; each round times `jobs.forecast.compute`,
the function `GET /api/v1/forecast` calls, on its default window. Target: under 2 s at
100,000 jobs.

{forecast_text}
"""
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text(text)
    return text


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--full", action="store_true", help="also the dispatch growth curve up to 1M jobs")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, one process each (make test)")
    parser.add_argument("--runs", type=int, default=10_000, help="runs per execution scenario")
    parser.add_argument("--report", type=Path, default=ROOT / "docs" / "BENCHMARKS.md")
    parser.add_argument("--plots", type=Path, default=ROOT / "docs" / "bench", help="PNG directory")
    parser.add_argument("--data", type=Path, default=ROOT / "var" / "bench", help="raw JSON directory")
    parser.add_argument(
        "--no-citus", action="store_true", help="skip the Citus rows even if Citus is installed"
    )
    args = parser.parse_args()
    if not os.environ.get("DATABASE_URL"):
        sys.exit("bench: DATABASE_URL is not set (make bench starts the embedded cluster)")
    started = time.monotonic()
    from bench import growth

    if args.smoke:
        jobs, processes, runs = [200], [1], 200
        task_executors, http_executors = [1], [1]
        fair_runs, fair_pairs = 200, 1
        lag = [
            "--jobs",
            "100",
            "--period",
            "5",
            "--warmup",
            "1",
            "--window",
            "5",
            "--burst",
            "100",
            "--burst-due",
            "soon",
            "--schedulers",
            "1",
            "--executors",
            "1",
        ]
        prefix = "cronyard_bench_smoke_"
    else:
        # --full adds the 1M round as its own curve (bench/growth.py: realistic, 2
        # schedulers), not to this matrix: 1M x 2 workloads x 1 and 2 schedulers x the
        # limit loop would add ~40 minutes.
        jobs = [10_000, 100_000]
        processes, runs = [1, 2], args.runs
        task_executors, http_executors = [1, 2], [1, 2, 4]
        # Three pairs add about two minutes. Rounds of 5,000 runs took under a second and
        # scattered by +-20% (20 tenants over 1 came out 0.68 in one make bench and 0.70-0.89
        # in three runs of the same pairs by hand): too short to show a cost of a
        # few percent.
        fair_runs, fair_pairs = 20_000, 3
        lag = []
        prefix = "cronyard_bench_"
    # Read before the run: the report and plots it writes would mark the tree as changed.
    info = machine()
    workloads = dispatch_workloads()
    from bench import citus

    # make test's smoke form stays on plain PostgreSQL: a Citus cluster is make test-citus's.
    skip_citus = "--smoke" if args.smoke else "--no-citus" if args.no_citus else None
    if skip_citus is None and not citus.available():
        skip_citus = "not installed"
    steps = (
        3 * len(jobs) * len(workloads)
        + 3 * len(task_executors)
        + 2 * fair_pairs
        + 2 * len(http_executors)
        + 3
        + (0 if args.smoke else 1)
        + (1 if args.full else 0)
        + (0 if skip_citus else 2 + 2 * citus.EXECUTE_ROUNDS + 2 * citus.CLAIM_ROUNDS)
    )
    bench = Bench(data=args.data, steps=steps)
    dispatch = dispatch_part(
        bench, workloads=workloads, jobs=jobs, processes=processes, db=prefix + "dispatch"
    )
    problems = verify_dispatch(dispatch)
    execute = execute_part(bench, runs=runs, task_executors=task_executors, http_executors=http_executors)
    fair_share = fair_share_part(bench, runs=fair_runs, pairs=fair_pairs)
    citus_rows = (
        None
        if skip_citus
        else citus.citus_part(bench, jobs=citus.CITUS_JOBS, runs=citus.CITUS_RUNS, db=prefix + "dispatch")
    )
    problems += citus.verify(citus_rows)
    lag_text = bench.run("lag.py", *lag, "--db", prefix + "lag", "--json", str(bench.data / "lag.json"))
    ledger_text = None if args.smoke else bench.run("ledger.py", "--db", prefix + "ledger")
    forecast_sizes = ["200"] if args.smoke else ["100000", "1000000"]
    forecast_text = bench.run(
        "forecast.py", "--jobs", *forecast_sizes, "--repeat", "1" if args.smoke else "3",
        "--db", prefix + "forecast", "--json", str(bench.data / "forecast.json"),
    )  # fmt: skip
    storage_sizes = (
        ("200", "50") if args.smoke else ("1000000", "50000") if args.full else ("100000", "10000")
    )
    storage_text = bench.run(
        "storage.py", "--runs", storage_sizes[0], "--retried", storage_sizes[1],
        "--waves", "2" if args.smoke else "10",
        "--db", prefix + "storage", "--json", str(bench.data / "storage.json"),
    )  # fmt: skip
    # The 1M round goes last: the autovacuum of its millions of rows, a minute after it,
    # took the CPU from the executor rounds that followed it (the 4-executor HTTP round and
    # the fair-share rounds ran at a quarter of their speed, with 6-10x the PostgreSQL CPU
    # per run, when they came after it; neither reproduced alone).
    growth_rows = (
        growth.growth_part(
            bench,
            db=prefix + "dispatch",
            probe=job_runs_probe(prefix + "dispatch"),
            jobs=(100, 200) if args.smoke else growth.JOBS,  # --smoke --full: the wiring only
        )
        if args.full
        else []
    )
    problems += growth.problems(growth_rows)
    bench.overall.close()

    from bench import plots

    lags = bench.json("lag.json")["steady"]["lags"]
    drawn = {
        "dispatch": plots.dispatch_plot(dispatch, args.plots / "dispatch.png"),
        "executor": plots.executor_plot(execute, args.plots / "executors.png"),
        "lag": plots.lag_plot(lags, args.plots / "lag.png"),
    }
    if growth_rows:
        drawn["growth"] = plots.growth_plot(growth_rows, args.plots / "growth.png")
    text = write_report(
        report=args.report,
        plots=drawn,
        info=info,
        dispatch=dispatch,
        execute=execute,
        fair_share=fair_share,
        citus_text=citus.section(
            citus_rows,
            skipped=citus.NOT_INSTALLED
            if skip_citus == "not installed"
            else f"Citus rows skipped: {skip_citus}",
        ),
        lag_text=lag_text,
        ledger_text=ledger_text,
        forecast_text=forecast_text,
        storage_text=storage_text,
        growth_text=growth.section(growth_rows, plot=relative(drawn["growth"], args.report))
        if growth_rows
        else "",
        args=args,
        minutes=(time.monotonic() - started) / 60,
    )
    print(text)
    if problems:
        sys.exit("bench: " + "; ".join(problems))


if __name__ == "__main__":
    main()
