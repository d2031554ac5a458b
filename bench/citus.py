"""`make bench`'s Citus rows (docs/CONTRACT.md, "Beyond one server"): dispatch and execution on a local Citus
coordinator + 2 workers (scripts/citus_cluster.py, under var/citus/), each round right
beside the same round on the plain PostgreSQL of the rest of the run.

Modest sizes (CITUS_JOBS realistic jobs; CITUS_RUNS runs, no-op task and HTTP, with 1
and 2 executors): three PostgreSQL nodes share the machine with the benchmark, so the
rows measure Citus's overhead per run, not scale-out. Without Citus installed the report says so in one line.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = [sys.executable, str(ROOT / "scripts" / "citus_cluster.py")]
CITUS_JOBS = 20_000
CITUS_RUNS = 5_000
# bench/claims.py's rounds per engine, and its claims' size (the same on both engines).
CLAIM_ROUNDS = 3
CLAIM_BATCH = 100
NOT_INSTALLED = "Citus rows skipped: citus.so not installed"


def available() -> bool:
    """citus_cluster.py's own check (citus.so beside the server's libraries)."""
    return subprocess.run([*CLUSTER, "available"], capture_output=True).returncode == 0


@contextmanager
def cluster(*, db: str, scratch: str) -> Iterator[dict[str, str]]:
    """Start the cluster with `db` migrated and `scratch` created on every node (a
    Citus database for bench/dispatch.py to migrate); yield the environment that points
    at it; stop it, whatever happens."""
    started = subprocess.run([*CLUSTER, "start", "--db", db], stdout=subprocess.PIPE, text=True, check=True)
    try:
        env = dict(os.environ, **dict(line.split("=", 1) for line in started.stdout.split()))
        manage = [sys.executable, str(ROOT / "manage.py"), "migrate", "--noinput", "-v0"]
        subprocess.run(manage, cwd=ROOT, env=env, check=True)
        subprocess.run([*CLUSTER, "createdb", scratch], check=True, stdout=subprocess.DEVNULL)
        yield env
    finally:
        subprocess.run([*CLUSTER, "stop"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def citus_part(bench, *, jobs: int, runs: int, db: str) -> list[dict]:
    """Dispatch (with the raw loop on Citus, interleaved by bench/dispatch.py
    --with-limit), then plain PostgreSQL; execution on Citus, then plain PostgreSQL.
    `bench` is bench.__main__.Bench; `db` names the dispatch scratch database on both."""
    dispatch = ["--jobs", str(jobs), "--schedulers", "1", "--workload", "realistic", "--db", db]
    execute = ["--kinds", "task", "http", "--executors", "1", "2", "--runs", str(runs)]
    with cluster(db="cronyard_bench_citus", scratch=db) as citus_env:
        out = bench.data / "citus_dispatch.json"
        bench.run("dispatch.py", *dispatch, "--with-limit", "--json", str(out), env=citus_env)
        on_citus = bench.json(out.name)[0]
        bench.run("dispatch.py", *dispatch, "--json", str(out))
        on_plain = bench.json(out.name)[0]
        rows = [
            {
                "what": f"dispatch, {jobs:,} realistic jobs all due, 1 scheduler",
                "citus": on_citus["runs_per_second"],
                "plain": on_plain["runs_per_second"],
                "citus_limit": on_citus["limit_runs_per_second"],
                "checks": {
                    side: (r["duplicates"], r["missing"])
                    for side, r in (("citus", on_citus), ("plain", on_plain))
                },
            }
        ]
        out = bench.data / "citus_execute.json"
        bench.run("execute.py", *execute, "--json", str(out), env=citus_env)
        on_citus = bench.json(out.name)
        bench.run("execute.py", *execute, "--json", str(out))
        on_plain = {(r["kind"], r["executors"]): r for r in bench.json(out.name)}
        what = {"task": "no-op task runs", "http": "HTTP runs (a no-op server on 127.0.0.1)"}
        for r in on_citus:
            executors = f"{r['executors']} executor" + ("s" if r["executors"] > 1 else "")
            plain = on_plain[(r["kind"], r["executors"])]
            rows.append(
                {
                    "what": f"execution, {runs:,} {what[r['kind']]}, {executors}",
                    "citus": r["runs_per_s"],
                    "plain": plain["runs_per_s"],
                    "citus_limit": None,
                    "cpu": {
                        "executor": r["executor_cpu_ms_per_run"],
                        "coordinator": r["postgres_cpu_ms_per_run"],
                        "workers": r["worker_cpu_ms_per_run"],
                        "plain_executor": plain["executor_cpu_ms_per_run"],
                        "plain_postgres": plain["postgres_cpu_ms_per_run"],
                    },
                }
            )
        # Claim latency: the rounds alternate between the engines, as the machine's
        # load drifts over minutes.
        latency: dict[str, list[dict]] = {"citus": [], "plain": []}
        out = bench.data / "citus_claims.json"
        for _ in range(CLAIM_ROUNDS):
            for side, env in (("citus", citus_env), ("plain", None)):
                bench.run(
                    "claims.py", "--runs", str(runs), "--batch", str(CLAIM_BATCH), "--json", str(out), env=env
                )
                latency[side].append(bench.json(out.name))
        rows.append(
            {"what": f"claims of {CLAIM_BATCH} runs, draining {runs:,} no-op runs", "latency": latency}
        )
    return rows


def verify(rows: list[dict] | None) -> list[str]:
    """Dispatch on either side: no duplicate, no missing run."""
    problems = []
    for row in rows or []:
        for side, (duplicates, missing) in row.get("checks", {}).items():
            if duplicates or missing:
                problems.append(f"{row['what']} on {side}: {duplicates} duplicates, {missing} missing")
    return problems


def section(rows: list[dict] | None, *, skipped: str = NOT_INSTALLED) -> str:
    """The report's Citus paragraph: the table, or the one line saying why not."""
    if rows is None:
        return skipped
    lines = [
        "| what | Cronyard on Citus runs/s | Cronyard on plain PostgreSQL runs/s | Citus / plain "
        "| raw limit on Citus runs/s | Cronyard / limit on Citus |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if "latency" in r:
            continue
        limit = r["citus_limit"]
        cells = [
            r["what"],
            r["citus"],
            r["plain"],
            f"{r['citus'] / r['plain']:.2f}" if r["plain"] else "n/a",
            limit or "n/a",
            f"{r['citus'] / limit:.2f}" if limit else "n/a",
        ]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines + cpu_section(rows) + latency_section(rows))


def latency_section(rows: list[dict]) -> list[str]:
    """Claim latency (bench/claims.py): per round, the median and p90 milliseconds of the
    claims that returned runs, on each engine; the ratio of the medians of the rounds."""
    lines = []
    for r in rows:
        if "latency" not in r:
            continue
        citus, plain = r["latency"]["citus"], r["latency"]["plain"]

        def rounds(side: list[dict]) -> str:
            return ", ".join(f"{x['median_ms']} ({x['p90_ms']})" for x in side)

        def median(side: list[dict]) -> float:
            return statistics.median(x["median_ms"] for x in side)

        lines += [
            "",
            "Claim latency (`bench/claims.py`): one executor in the benchmark's process drains the"
            " runs, every claim timed; median (p90) ms of the claims that returned runs, per round,"
            " the rounds alternated between the engines:",
            "",
            "| what | Citus: median (p90) ms per round | plain PostgreSQL "
            "| Citus / plain, median of the rounds |",
            "|---|---|---|---:|",
            f"| {r['what']} | {rounds(citus)} | {rounds(plain)} | {median(citus) / median(plain):.2f} |",
        ]
    return lines


def cpu_section(rows: list[dict]) -> list[str]:
    """Where an execution round's CPU went, per run: on Citus the executor, the coordinator
    and the workers together; on plain PostgreSQL the executor and the server. The
    workers' part is what more workers (on machines of their own) would share; the
    coordinator's is not: one coordinator core allows 1,000 / its milliseconds runs/s."""
    rounds = [r for r in rows if r.get("cpu")]
    if not rounds:
        return []
    lines = [
        "",
        "Where an execution round's CPU went, ms per run (from /proc: every process of each"
        " node, and the executors). The workers' part is what more workers, on machines of"
        " their own, would share; the coordinator's is not, and bounds one coordinator core"
        " at 1,000 / its ms runs/s:",
        "",
        "| what | Citus: executor | coordinator | workers | coordinator core's bound runs/s "
        "| plain: executor | PostgreSQL |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rounds:
        c = r["cpu"]
        bound = f"{1000 / c['coordinator']:,.0f}" if c["coordinator"] else "n/a"
        cells = [r["what"], c["executor"], c["coordinator"], c["workers"], bound]
        cells += [c["plain_executor"], c["plain_postgres"]]
        lines.append("| " + " | ".join(str(x) for x in cells) + " |")
    return lines
