"""`make bench`'s Citus rows (docs/CONTRACT.md, "Beyond one server"): dispatch and execution on a local Citus
coordinator + 2 workers (scripts/citus_cluster.py, under var/citus/), each round right
beside the same round on the plain PostgreSQL of the rest of the run.

Modest sizes (CITUS_JOBS realistic jobs; EXECUTE_RUNS runs, no-op task and HTTP, with 1
and 2 executors, EXECUTE_ROUNDS rounds alternated between the engines): three PostgreSQL
nodes share the machine with the benchmark, so the rows measure Citus's overhead per run,
not scale-out. Without Citus installed the report says so in one line.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = [sys.executable, str(ROOT / "scripts" / "citus_cluster.py")]
CITUS_JOBS = 20_000
CITUS_RUNS = 5_000
# Execution: rounds per engine, alternated, and their size. One round of 5,000 runs drained
# in well under a second on plain PostgreSQL, and a single round's ratio moved by a fifth
# between runs of the same code.
EXECUTE_ROUNDS = 3
EXECUTE_RUNS = 10_000
# bench/claims.py's rounds per engine, and its claims' size (the same on both engines).
CLAIM_ROUNDS = 3
CLAIM_BATCH = 100
# bench/storage.py on Citus: first-attempt successes in ten waves. Every shard of every day
# partition starts with pages of its own, which bench/storage.py subtracts there; runs
# enough that each of the 32 shards holds a few thousand.
STORAGE_RUNS = 100_000
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
    --with-limit), then plain PostgreSQL; execution and claims in rounds alternated
    between Citus and plain PostgreSQL (`runs` is the claims' drain).
    `bench` is bench.__main__.Bench; `db` names the dispatch scratch database on both."""
    dispatch = ["--jobs", str(jobs), "--schedulers", "1", "--workload", "realistic", "--db", db]
    execute = ["--kinds", "task", "http", "--executors", "1", "2", "--runs", str(EXECUTE_RUNS)]
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
        # Execution: each row gives every round and the median.
        rounds: dict[tuple[str, int], dict[str, list[dict]]] = {}
        outputs = _alternate(
            bench,
            "execute.py",
            *execute,
            out=bench.data / "citus_execute.json",
            env=citus_env,
            rounds=EXECUTE_ROUNDS,
        )
        for side, results in outputs.items():
            for r in (r for result in results for r in result):
                rounds.setdefault((r["kind"], r["executors"]), {"citus": [], "plain": []})[side].append(r)
        what = {"task": "no-op task runs", "http": "HTTP runs (a no-op server on 127.0.0.1)"}
        for (kind, executors), sides in rounds.items():
            citus, plain = sides["citus"], sides["plain"]
            rows.append(
                {
                    "what": f"execution, {EXECUTE_RUNS:,} {what[kind]}, {executors} executor"
                    + ("s" if executors > 1 else ""),
                    "citus": statistics.median(r["runs_per_s"] for r in citus),
                    "plain": statistics.median(r["runs_per_s"] for r in plain),
                    "rounds": {
                        "citus": [r["runs_per_s"] for r in citus],
                        "plain": [r["runs_per_s"] for r in plain],
                    },
                    "citus_limit": None,
                    "cpu": {
                        "executor": _mean(r["executor_cpu_ms_per_run"] for r in citus),
                        "coordinator": _mean(r["postgres_cpu_ms_per_run"] for r in citus),
                        "workers": _mean(r["worker_cpu_ms_per_run"] for r in citus),
                        "plain_executor": _mean(r["executor_cpu_ms_per_run"] for r in plain),
                        "plain_postgres": _mean(r["postgres_cpu_ms_per_run"] for r in plain),
                    },
                }
            )
        latency = _alternate(
            bench,
            "claims.py",
            *("--runs", str(runs), "--batch", str(CLAIM_BATCH)),
            out=bench.data / "citus_claims.json",
            env=citus_env,
            rounds=CLAIM_ROUNDS,
        )
        rows.append(
            {"what": f"claims of {CLAIM_BATCH} runs, draining {runs:,} no-op runs", "latency": latency}
        )
        storage = bench.run(
            "storage.py", "--runs", str(STORAGE_RUNS), "--retried", "0", "--waves", "10",
            "--db", "cronyard_bench_citus_storage", "--json", str(bench.data / "citus_storage.json"),
            env=citus_env,
        )  # fmt: skip
        rows.append({"what": "storage", "storage": storage})
    return rows


def _alternate(
    bench, script: str, *args: str, out: Path, env: dict[str, str], rounds: int
) -> dict[str, list]:
    """`script` run `rounds` times on each engine, Citus (`env`) then plain PostgreSQL, the
    rounds alternated as the machine's load drifts over minutes: each side's JSON outputs."""
    outputs: dict[str, list] = {"citus": [], "plain": []}
    for _ in range(rounds):
        for side, side_env in (("citus", env), ("plain", None)):
            bench.run(script, *args, "--json", str(out), env=side_env)
            outputs[side].append(bench.json(out.name))
    return outputs


def _mean(values: Iterable[float]) -> float:
    return round(statistics.fmean(values), 3)


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
    lines = []
    several = max((len(r["rounds"]["citus"]) for r in rows if "rounds" in r), default=1)
    if several > 1:
        lines += [
            f"Execution ran {several} rounds on each engine, alternated: a cell gives the median"
            " runs/s, then each round's; the ratio is of the medians.",
            "",
        ]
    lines += [
        "| what | Cronyard on Citus runs/s | Cronyard on plain PostgreSQL runs/s | Citus / plain "
        "| raw limit on Citus runs/s | Cronyard / limit on Citus |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if "latency" in r or "storage" in r:
            continue
        limit = r["citus_limit"]
        cells = [
            r["what"],
            _with_rounds(r, "citus"),
            _with_rounds(r, "plain"),
            f"{r['citus'] / r['plain']:.2f}" if r["plain"] else "n/a",
            limit or "n/a",
            f"{r['citus'] / limit:.2f}" if limit else "n/a",
        ]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines + cpu_section(rows) + latency_section(rows) + storage_section(rows))


def storage_section(rows: list[dict]) -> list[str]:
    """Bytes per finished run on Citus (bench/storage.py's table, its runs on the shards)."""
    return [
        line
        for r in rows
        if "storage" in r
        for line in (
            "",
            f"Bytes on disk per first-attempt success on Citus (`bench/storage.py --runs {STORAGE_RUNS}"
            " --waves 10` on the cluster: the shards' sizes, less those of the empty database;"
            " a success moves to `run_history` a few seconds after its outcome,"
            " docs/decisions/0087-citus-history-moves.md):",
            "",
            r["storage"].strip(),
        )
    ]


def _with_rounds(row: dict, side: str) -> str:
    """A side's runs/s: the median, and every round after it where there were several."""
    value = str(round(row[side]))
    if "rounds" not in row:
        return value
    return f"{value} ({', '.join(str(round(x)) for x in row['rounds'][side])})"


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
    """Where an execution's CPU went, per run, the mean of its rounds: on Citus the executor, the coordinator
    and the workers together; on plain PostgreSQL the executor and the server. The
    workers' part is what more workers (on machines of their own) would share; the
    coordinator's is not: one coordinator core allows 1,000 / its milliseconds runs/s."""
    rounds = [r for r in rows if r.get("cpu")]
    if not rounds:
        return []
    lines = [
        "",
        "Where an execution's CPU went, ms per run, the mean of its rounds (from /proc: every process of each"
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
