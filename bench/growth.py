"""`make bench --full`: the dispatch growth curve, 10k to 1M due jobs
(docs/CONTRACT.md, "Benchmark workload").

Target: 1,000,000 due jobs fully dispatched in < 90 s with 2 schedulers, the cost per
run flat from 10k to 1M, each scheduler's peak RSS < 200 MB at 1M. One
bench/dispatch.py invocation measures every N in a row on the same cluster (realistic
workload, 2 schedulers), so the curve compares rounds minutes apart, not days apart;
the machine is shared, so read "cost vs 100k" (same session) rather than absolute
speed. Each round also carries what PostgreSQL did meanwhile (bench/pgstats.py).
"""

from __future__ import annotations

JOBS = (10_000, 100_000, 300_000, 1_000_000)
SCHEDULERS = 2
TARGET_SECONDS = 90
TARGET_RSS_MB = 200
BASE_JOBS = 100_000  # "cost vs" divides by this round's µs per run


def growth_part(bench, *, db: str, probe, jobs: tuple[int, ...] = JOBS) -> list[dict]:
    """Run the curve (bench.run: progress bar, fails the bench if the script fails)."""
    bench.run(
        "dispatch.py", "--jobs", *(str(n) for n in jobs), "--schedulers", str(SCHEDULERS),
        "--workload", "realistic", "--db", db, "--json", str(bench.data / "growth.json"), probe=probe,
    )  # fmt: skip
    return bench.json("growth.json")


def problems(rows: list[dict]) -> list[str]:
    from bench.dispatch import failed

    return [
        f"growth curve {r['jobs']} jobs: duplicates, missing runs or exit codes" for r in rows if failed(r)
    ]


def _cost_vs_base(rows: list[dict]) -> dict[int, str]:
    base = next((r["us_per_run"] for r in rows if r["jobs"] == BASE_JOBS), None)
    return {r["jobs"]: f"{r['us_per_run'] / base:.2f}" if base else "n/a" for r in rows}


def section(rows: list[dict], *, plot: str) -> str:
    """The report's Markdown for the curve: table, verdicts, heaviest statements at the largest N."""
    if not rows:
        return ""
    cost = _cost_vs_base(rows)
    lines = [
        "| jobs | seconds | runs/s | µs per run | cost vs 100k | peak RSS per scheduler (MB) "
        "| checkpoints | WAL bytes/run | duplicates | missing |",
        "|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        db = r.get("database", {})
        lines.append(
            f"| {r['jobs']} | {r['seconds']} | {r['runs_per_second']} | {r['us_per_run']} "
            f"| {cost[r['jobs']]} | {r['peak_rss_mb']} | {db.get('checkpoints', 'n/a')} "
            f"| {db.get('wal_bytes_per_run', 'n/a')} "
            f"| {r['duplicates']} | {r['missing']} |"
        )
    top = max(rows, key=lambda r: r["jobs"])
    rss = max(top["peak_rss_mb"])
    verdicts = (
        f"At {top['jobs']:,} jobs: {top['seconds']} s (target < {TARGET_SECONDS} s: "
        f"{'met' if top['seconds'] < TARGET_SECONDS else 'not met'}); cost per run {cost[top['jobs']]} times "
        f"the 100k round's (flat = 1.00); peak RSS {rss} MB (target < {TARGET_RSS_MB} MB: "
        f"{'met' if rss < TARGET_RSS_MB else 'not met'})."
    )
    statements = "\n".join(
        f"| {s['query']} | {s['calls']} | {s['us_per_run']} | {s['blocks_per_run']} |"
        for s in top.get("statements", [])
    )
    heaviest = (
        f"\n\nThe heaviest statements of the {top['jobs']:,} round (pg_stat_statements, server time):\n\n"
        "| statement | calls | µs per run | buffers per run |\n|---|---:|---:|---:|\n" + statements
        if statements
        else ""
    )
    return f"""## Dispatch at scale: cost per run from 10k to 1M jobs

`bench/growth.py` (only with `--full`): the realistic workload, {SCHEDULERS} schedulers,
every N in one run of `bench/dispatch.py`. µs per run is wall time over N (both
schedulers together); "cost vs 100k" divides by the 100k round of the same run.
Checkpoints and WAL are counted from the moment the jobs become due until the last run exists.

{chr(10).join(lines)}

{verdicts}{heaviest}

![cost per run and RSS vs N]({plot})
"""
