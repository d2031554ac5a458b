"""The report's PNG plots (matplotlib, Agg backend: no display needed).

Each function takes the rows the harness already collected and writes one file.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def dispatch_plot(rows: list[dict], path: Path) -> Path:
    """Runs/s against N (log scale), one line per workload, process count and side."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    series: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        label = f"{r['workload']}, {r['processes']} proc"
        series.setdefault(f"Cronyard ({label})", []).append((r["jobs"], r["ours"]))
        if r.get("limit"):
            series.setdefault(f"limit ({label})", []).append((r["jobs"], r["limit"]))
    for label, points in sorted(series.items()):
        points.sort()
        style = "--" if label.startswith("limit") else "-"
        ax.plot([p[0] for p in points], [p[1] for p in points], style, marker="o", label=label)
    ax.set_xscale("log")
    ax.set_xlabel("jobs all due (N)")
    ax.set_ylabel("runs dispatched per second")
    ax.set_title("Dispatch: runs/s vs N")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)


def lag_plot(lags: list[float], path: Path) -> Path:
    """Histogram and CDF of arrival - scheduled_at (seconds) in the steady window."""
    fig, (hist, cdf) = plt.subplots(1, 2, figsize=(10, 4))
    if lags:
        hist.hist(lags, bins=60, color="tab:blue")
        ordered = sorted(lags)
        cdf.plot(ordered, [(i + 1) / len(ordered) for i in range(len(ordered))], color="tab:blue")
        for q, style in ((0.5, ":"), (0.99, "--")):
            value = ordered[min(len(ordered) - 1, int(len(ordered) * q))]
            cdf.axvline(value, linestyle=style, color="gray", label=f"p{round(q * 100)} = {value:.3f} s")
        cdf.legend()
    hist.set_xlabel("arrival - scheduled_at (s)")
    hist.set_ylabel("requests")
    hist.set_title("End-to-end lag")
    cdf.set_xlabel("arrival - scheduled_at (s)")
    cdf.set_ylabel("fraction of requests")
    cdf.set_title("Lag CDF")
    for ax in (hist, cdf):
        ax.grid(True, alpha=0.3)
    return _save(fig, path)


def executor_plot(rows: list[dict], path: Path) -> Path:
    """Runs/s against executor count, Cronyard and the limit, per target kind."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for kind, color in (("task", "tab:green"), ("http", "tab:orange")):
        mine = sorted((r["executors"], r["ours"], r.get("limit")) for r in rows if r["kind"] == kind)
        if not mine:
            continue
        xs = [m[0] for m in mine]
        ax.plot(xs, [m[1] for m in mine], "-", marker="o", color=color, label=f"Cronyard, {kind}")
        if all(m[2] for m in mine):
            ax.plot(xs, [m[2] for m in mine], "--", marker="s", color=color, label=f"limit, {kind}")
    ax.set_xlabel("executor processes (limit: worker processes)")
    ax.set_ylabel("runs per second")
    ax.set_title("Executor scaling")
    ax.set_xticks(sorted({r["executors"] for r in rows}))
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def growth_plot(rows: list[dict], path: Path) -> Path:
    """Dispatch cost per run and each scheduler's peak RSS against N (log x)."""
    fig, (cost, rss) = plt.subplots(1, 2, figsize=(10, 4))
    points = sorted(rows, key=lambda r: r["jobs"])
    xs = [r["jobs"] for r in points]
    cost.plot(xs, [r["us_per_run"] for r in points], "-", marker="o", color="tab:blue")
    cost.set_ylim(bottom=0)
    cost.set_ylabel("µs per run (wall, all schedulers)")
    cost.set_title("Dispatch cost per run vs N")
    rss.plot(xs, [max(r["peak_rss_mb"]) for r in points], "-", marker="o", color="tab:red", label="peak RSS")
    rss.axhline(200, linestyle="--", color="gray", label="target 200 MB")
    rss.set_ylim(bottom=0)
    rss.set_ylabel("MB (largest scheduler)")
    rss.set_title("Scheduler peak RSS vs N")
    rss.legend()
    for ax in (cost, rss):
        ax.set_xscale("log")
        ax.set_xlabel("jobs all due (N)")
        ax.grid(True, alpha=0.3)
    return _save(fig, path)
