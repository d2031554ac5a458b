"""`make bench`'s harness in its smoke form: tiny sizes, one process each, real processes
on the test cluster. Checks the report and plots are written, never the numbers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import citus
from bench.__main__ import parse_table
from jobs.models import Tenant
from tests.conftest import database_url

ROOT = Path(__file__).resolve().parent.parent

HEADINGS = [
    "# Benchmarks",
    "## Dispatch: N jobs all due, time until every run row exists",
    "## Execution: no-op runs, one per job (the top-of-the-hour shape)",
    "## Citus: the same rounds on a local coordinator + 2 workers",
    "## End-to-end lag: scheduled_at → the target receives the request",
    "## Occurrence ledger: a year of a minutely job, page by page",
    "## Load forecast: the next 24 h by minute",
    "## Storage: bytes on disk per finished run",
]
TABLE_HEADERS = [
    "| workload | jobs | schedulers | Cronyard runs/s | minimal limit runs/s | ratio to minimal "
    "| own-schema limit runs/s | ratio |",
    "| executors | runs | Cronyard runs/s | minimal limit runs/s | ratio to minimal "
    "| raw claim+complete runs/s | ratio |",
    "| runs | waves | attempts | heap + TOAST B/run | indexes B/run (count) | total B/run | budget |",
    "| tenants | runs/s per round | median runs/s | vs 1 tenant |",
    "| executors | runs | Cronyard runs/s | raw aiohttp runs/s | ratio |",
    "| steady rate | schedulers | executors | window | received/expected | p50 s | p99 s |",
    "| burst | schedulers | executors | received | first request s | last request (drain) s |",
    "| jobs | seconds (each round) | median s | due runs in 24 h | peak minute | setup s |",
]
PLOTS = ["dispatch.png", "executors.png", "lag.png"]
# (execution table header, CPU budget table header, Cronyard's parts, the limit's parts)
CPU_BUDGETS = [
    (
        "| executors | runs | Cronyard runs/s | minimal limit runs/s |",
        "| executors | executor | PostgreSQL | Cronyard total | raw client | raw PostgreSQL |",
        ["executor", "PostgreSQL"],
        ["raw client", "raw PostgreSQL"],
    ),
    (
        "| executors | runs | Cronyard runs/s | raw aiohttp runs/s |",
        "| executors | executor | PostgreSQL | server | Cronyard total |",
        ["executor", "PostgreSQL", "server"],
        ["raw client", "raw server"],
    ),
]


def table_at(text: str, header: str) -> list[dict[str, str]]:
    return parse_table(text[text.index(header) :].split("\n\n")[0])


def check_cpu_budget(text: str, *, execution: str, budget: str, ours: list[str], raw: list[str]) -> None:
    (run,) = table_at(text, execution)
    (row,) = table_at(text, budget)
    assert row["executors"] == run["executors"] == "1"
    assert (row["executor"], row["PostgreSQL"]) == (run["executor CPU ms/run"], run["PostgreSQL CPU ms/run"])
    assert row["measured ratio"] == run["ratio"]
    assert float(row["Cronyard total"]) == pytest.approx(sum(float(row[c]) for c in ours), abs=0.0015)
    assert float(row["raw total"]) == pytest.approx(sum(float(row[c]) for c in raw), abs=0.0015)
    assert float(row["ceiling / raw"]) > 0  # n/a unless the executor's and the total CPU were measured


def test_smoke_run_writes_the_report_with_every_table_and_plot(transactional_db, tmp_path):
    report, plots = tmp_path / "BENCHMARKS.md", tmp_path / "plots"
    env = {**os.environ, "DATABASE_URL": database_url(), "PYTHONUNBUFFERED": "1"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "--smoke",
            "--report",
            str(report),
            "--plots",
            str(plots),
            "--data",
            str(tmp_path / "data"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-3000:]
    text = report.read_text()
    for heading in HEADINGS:
        assert f"\n{heading}\n" in f"\n{text}", heading
    for header in TABLE_HEADERS:
        assert header in text, header
    # Machine, commit and server version are part of every report.
    assert "cores" in text and "GB RAM" in text and "commit " in text and "PostgreSQL 1" in text
    # Fair share's cost: the same bench with 1 tenant and with 20, each round's row
    # saying which, and no bench tenant left behind to tax the next plan read.
    rounds = json.loads((tmp_path / "data" / "fair_share.json").read_text())
    assert {t: [r["tenants"] for r in rows] for t, rows in rounds.items()} == {"1": [1], "20": [20]}
    fair_table = parse_table(text[text.index("| tenants | runs/s per round") :].split("\n\n")[0])
    assert [row["tenants"] for row in fair_table] == ["1", "20"]
    assert not Tenant.objects.filter(slug__startswith="bench-exec").exists()
    # The CPU budgets: built from the same rounds as the execution tables, and each side's
    # total is the sum of its parts (the server's share in Cronyard's total for HTTP).
    # A few hundred requests may use less than /proc's 10 ms tick of the server's CPU, so
    # no part's size is asserted, only that it was measured and counted.
    for execution, budget, ours, raw in CPU_BUDGETS:
        check_cpu_budget(text, execution=execution, budget=budget, ours=ours, raw=raw)
    # Storage: first-attempt successes and runs that took three, all due at once and in two
    # waves, each measured from its own scratch database's partitions.
    storage = table_at(text, "| runs | waves | attempts |")
    assert [(row["runs"], row["waves"], row["attempts"], row["budget"]) for row in storage] == [
        ("200", "1", "1.0", "200"),
        ("200", "2", "1.0", "200"),
        ("50", "1", "3.0", "400"),
        ("50", "2", "3.0", "400"),
    ]
    assert all(int(row["total B/run"].strip("*")) > int(row["live row B"]) > 0 for row in storage)
    assert all(int(row["target version B/job"]) > 0 for row in storage)
    # The smoke form stays on plain PostgreSQL and says so where the Citus rows would be.
    assert "\nCitus rows skipped: --smoke\n" in text
    for name in PLOTS:
        data = (plots / name).read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n"), name
        assert f"](plots/{name})" in text


def test_the_citus_rows_give_both_sides_and_their_ratios_or_say_why_not():
    assert citus.section(None) == "Citus rows skipped: citus.so not installed"
    rows = [
        {"what": "dispatch", "citus": 500, "plain": 2000, "citus_limit": 800, "checks": {"citus": (0, 0)}},
        {"what": "execution", "citus": 150, "plain": 3000, "citus_limit": None},
    ]
    table = parse_table(citus.section(rows))
    assert [(r["Citus / plain"], r["Cronyard / limit on Citus"]) for r in table] == [
        ("0.25", "0.62"),
        ("0.05", "n/a"),
    ]
    assert citus.verify(rows) == []
    # Claim latency: its own table, the ratio of the rounds' medians (not of their means).
    side = [{"median_ms": ms, "p90_ms": 2 * ms} for ms in (10.0, 30.0, 12.0)]
    rows.append(
        {"what": "claims", "latency": {"citus": side, "plain": [{"median_ms": 4.0, "p90_ms": 5.0}] * 3}}
    )
    text = citus.section(rows)
    assert [r["what"] for r in parse_table(text.split("\n\n")[0])] == ["dispatch", "execution"]
    latency = parse_table(text[text.index("| what | Citus: median (p90)") :])
    assert latency == [
        {
            "what": "claims",
            "Citus: median (p90) ms per round": "10.0 (20.0), 30.0 (60.0), 12.0 (24.0)",
            "plain PostgreSQL": "4.0 (5.0), 4.0 (5.0), 4.0 (5.0)",
            "Citus / plain, median of the rounds": "3.00",
        }
    ]
    rows[0]["checks"]["plain"] = (1, 2)
    assert citus.verify(rows) == ["dispatch on plain: 1 duplicates, 2 missing"]


def test_citus_execution_rounds_give_the_median_then_each_round_and_the_ratio_of_the_medians():
    rows = [
        {
            "what": "execution",
            "citus": 2000,
            "plain": 5000,
            "rounds": {"citus": [1000, 2000, 2500], "plain": [5000, 9000, 4000]},
            "citus_limit": None,
        }
    ]
    text = citus.section(rows)
    assert text.startswith("Execution ran 3 rounds on each engine, alternated")
    (row,) = parse_table(text.split("\n\n", 1)[1])
    assert row["Cronyard on Citus runs/s"] == "2000 (1000, 2000, 2500)"
    assert row["Cronyard on plain PostgreSQL runs/s"] == "5000 (5000, 9000, 4000)"
    assert row["Citus / plain"] == "0.40"
