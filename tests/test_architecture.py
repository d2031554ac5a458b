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
    "jobs.health",
    "runs.queue",
    "runs.breakers",
    "runs.nodes",
    "runs.partitions",
    "runs.timeseries",
    "scheduler_project.db",
}


def modules() -> dict[str, ast.Module]:
    out = {}
    for app in APPS:
        for path in (ROOT / app).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            out[name] = ast.parse(path.read_text(), filename=str(path))
    return out


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
    assert (INFRASTRUCTURE | EXECUTOR_SIDE | SQL_MODULES) <= set(MODULES)


@pytest.mark.parametrize("name", sorted(INFRASTRUCTURE))
def test_infrastructure_imports_neither_app(name):
    bad = sorted(m for m in imported(MODULES[name]) if m.split(".")[0] in ("jobs", "runs"))
    assert not bad, f"{name} imports {bad}"


@pytest.mark.parametrize("name", sorted(EXECUTOR_SIDE))
def test_the_executor_side_imports_nothing_from_jobs(name):
    bad = sorted(m for m in imported(MODULES[name]) if m.split(".")[0] == "jobs")
    assert not bad, f"{name} imports {bad}: an executor must not load scheduling code"


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
