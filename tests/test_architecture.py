"""The layout rules of docs/ARCHITECTURE.md, checked on the source (no database).

If one of these fails, either the change broke a rule or the rule has to change: then
change docs/ARCHITECTURE.md in the same commit.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
APPS = ("jobs", "runs", "scheduler_project")

INFRASTRUCTURE = {
    "scheduler_project.db",
    "scheduler_project.loop",
    "scheduler_project.outage",
    "scheduler_project.serve",
}
EXECUTOR_SIDE = {
    f"runs.{name}"
    for name in (
        "queue",
        "executor",
        "executor_steps",
        "inflight",
        "attempts",
        "targets",
        "netguard",
        "retry",
        "tasks",
        "task_schema",
        "builtin_tasks",
        "keys",
        "errors",
        "alerts",
        "partitions",
        "nodes",
        "breakers",
    )
}
SQL_MODULES = {
    "jobs.leases",
    "jobs.dispatch_sql",
    "jobs.health",
    "runs.queue",
    "runs.breakers",
    "runs.nodes",
    "runs.partitions",
    "runs.timeseries",
    "scheduler_project.db",
}
# Fire-time computation: pure Python, so previews, validation and the scheduler share
# it without a database; inside jobs these modules import only each other.
PURE_SCHEDULE = {"jobs.schedule", "jobs.cron", "jobs.cron_calendar", "jobs.dst"}
MAX_LINES = 400
# Modules still over MAX_LINES, each waiting for its split (issue 13): this set only shrinks.
TOO_LONG_YET = {"jobs.admin", "jobs.validation", "runs.admin", "runs.queue"}


def sources() -> dict[str, Path]:
    out = {}
    for app in APPS:
        for path in (ROOT / app).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            out[name] = path
    return out


SOURCES = sources()


def modules() -> dict[str, ast.Module]:
    return {name: ast.parse(path.read_text(), filename=str(path)) for name, path in SOURCES.items()}


MODULES = modules()


def imported(tree: ast.Module) -> set[str]:
    """Every module a file imports, at any depth (function-level imports count too)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def test_the_rules_cover_real_modules():
    # A renamed module must not make a rule vacuous.
    assert (INFRASTRUCTURE | EXECUTOR_SIDE | SQL_MODULES | PURE_SCHEDULE) <= set(MODULES)


@pytest.mark.parametrize("name", sorted(INFRASTRUCTURE))
def test_infrastructure_imports_neither_app(name):
    bad = sorted(m for m in imported(MODULES[name]) if m.split(".")[0] in ("jobs", "runs"))
    assert not bad, f"{name} imports {bad}"


@pytest.mark.parametrize("name", sorted(EXECUTOR_SIDE))
def test_the_executor_side_imports_nothing_from_jobs(name):
    bad = sorted(m for m in imported(MODULES[name]) if m.split(".")[0] == "jobs")
    assert not bad, f"{name} imports {bad}: an executor must not load scheduling code"


@pytest.mark.parametrize("name", sorted(PURE_SCHEDULE))
def test_fire_time_modules_are_pure(name):
    def allowed(module: str) -> bool:
        top = module.split(".")[0]
        if top in ("django", "psycopg", "runs", "scheduler_project", "tests"):
            return False
        return (
            top != "jobs"
            or module == "jobs"
            or any(module == pure or module.startswith(f"{pure}.") for pure in PURE_SCHEDULE)
        )

    bad = sorted(m for m in imported(MODULES[name]) if not allowed(m))
    assert not bad, f"{name} imports {bad}: fire-time computation needs no database or app code"


def test_no_module_over_the_line_limit():
    sizes = {name: len(path.read_text().splitlines()) for name, path in SOURCES.items()}
    long = sorted(f"{name}: {n}" for name, n in sizes.items() if n > MAX_LINES and name not in TOO_LONG_YET)
    assert not long, f"split these along their concepts: {long}"


def test_no_application_module_imports_tests():
    bad = {
        name: sorted(m for m in imported(tree) if m.split(".")[0] == "tests")
        for name, tree in MODULES.items()
    }
    assert not {k: v for k, v in bad.items() if v}


def test_hand_written_sql_only_in_the_sql_modules():
    offenders = []
    for name, tree in MODULES.items():
        if name in SQL_MODULES:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                if node.func.attr in ("execute", "executemany", "copy"):
                    offenders.append(f"{name}:{node.lineno}")
    assert not offenders, f"cursor.execute outside {sorted(SQL_MODULES)}: {offenders}"
