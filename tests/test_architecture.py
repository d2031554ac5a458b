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
    "scheduler_project.citus",
    "scheduler_project.db",
    "scheduler_project.liveness",
    "scheduler_project.loop",
    "scheduler_project.outage",
    "scheduler_project.serve",
    "scheduler_project.urlpaths",
}
EXECUTOR_SIDE = {
    f"runs.{name}"
    for name in (
        "queue",
        "claims",
        "heartbeats",
        "connections",
        "rows",
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
        "breaker_rules",
        "claim_order",
        "outcomes",
        "per_partition",
        "reaping",
        "table_statistics",
    )
}
# What the operator-facing rest of `runs` (admin, API, selectors, services, metrics) may
# use of `jobs`: the models, the audit log, the one overdue rule, the one way to show an
# instant, and the admin's shared base.
JOBS_SEEN_BY_RUNS = {"jobs.models", "jobs.audit", "jobs.health", "jobs.display", "jobs.admin_base"}
SQL_MODULES = {
    "jobs.leases",
    "jobs.dispatch_sql",
    "jobs.rate_limit_sql",
    "jobs.health",
    "runs.queue",
    "runs.claims",
    "runs.heartbeats",
    "runs.claim_order",
    "runs.outcomes",
    "runs.per_partition",
    "runs.reaping",
    "runs.table_statistics",
    "runs.connections",
    "runs.breakers",
    "runs.nodes",
    "runs.partitions",
    "runs.timeseries",
    "scheduler_project.citus",
    "scheduler_project.db",
}
# Fire-time computation: pure Python, so previews, validation and the scheduler share
# it without a database; inside jobs these modules import only each other.
PURE_SCHEDULE = {"jobs.schedule", "jobs.cron", "jobs.cron_calendar", "jobs.dst"}
MAX_LINES = 400


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


MIGRATIONS = sorted(path for app in ("jobs", "runs") for path in (ROOT / app / "migrations").glob("*.py"))
MIGRATION_PACKAGES = {"jobs.migrations", "runs.migrations"}


def test_migrations_import_no_application_code():
    """A migration is history: what it does must not change when application code does,
    so a fresh install replays what upgraded databases went through. It holds its own
    DDL and steps; one it shares would be a module inside migrations/ that never changes."""
    assert len(MIGRATIONS) > 20
    bad = {}
    for path in MIGRATIONS:
        tree = ast.parse(path.read_text(), filename=str(path))
        names = imported(tree) | {
            node.args[0].value  # importlib.import_module("runs.partitions") counts too
            for node in ast.walk(tree)
            if isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
        }
        outside = sorted(
            m
            for m in names
            if m.split(".")[0] in APPS and ".".join(m.split(".")[:2]) not in MIGRATION_PACKAGES
        )
        if outside:
            bad[str(path.relative_to(ROOT))] = outside
    assert not bad, f"migrations importing application code: {bad}"


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


def test_the_rest_of_runs_sees_only_the_shared_jobs_modules():
    bad = {}
    for name, tree in MODULES.items():
        if name.split(".")[0] != "runs" or name in EXECUTOR_SIDE:
            continue
        used = {m for m in imported(tree) if m.split(".")[0] == "jobs" and m != "jobs"}
        # `from jobs.models import Job` lists both jobs.models and jobs.models.Job.
        outside = sorted(
            m for m in used if not any(m == ok or m.startswith(f"{ok}.") for ok in JOBS_SEEN_BY_RUNS)
        )
        if outside:
            bad[name] = outside
    assert not bad, f"runs modules reaching further into jobs than {sorted(JOBS_SEEN_BY_RUNS)}: {bad}"


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
    long = sorted(f"{name}: {n}" for name, n in sizes.items() if n > MAX_LINES)
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


def _defs(kind: type, name: str | None):
    for module, tree in MODULES.items():
        for node in ast.walk(tree):
            if isinstance(node, kind) and name in (None, node.name):
                yield module, node


def _returns_false(node: ast.FunctionDef) -> bool:
    return (
        len(node.body) == 1
        and isinstance(node.body[0], ast.Return)
        and isinstance(node.body[0].value, ast.Constant)
        and node.body[0].value.value is False
    )


def _calls(node: ast.AST, attr_or_name: str) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            func = sub.func
            if getattr(func, "attr", None) == attr_or_name or getattr(func, "id", None) == attr_or_name:
                return True
    return False


def test_small_helpers_have_one_home():
    """Repeated blocks a newcomer tripped on (issue 13, item 5) stay folded."""
    homes = {
        # the read-only admin page
        "read-only admin": {
            m
            for m, cls in _defs(ast.ClassDef, None)
            if {f.name for f in cls.body if isinstance(f, ast.FunctionDef) and _returns_false(f)}
            >= {"has_add_permission", "has_change_permission", "has_delete_permission"}
        },
        # the admin's audit actor
        "admin actor": {m for m, f in _defs(ast.FunctionDef, "actor_of") if _calls(f, "admin_actor")},
        # "unknown body field" refusal of both APIs
        "unknown fields": {
            m for m, f in _defs(ast.FunctionDef, "to_internal_value") if "Unknown field." in ast.unparse(f)
        },
        # RFC 3339 parsing
        "rfc3339": {m for m, tree in MODULES.items() if _calls(tree, "fromisoformat")},
        # a node's id
        "node id": {m for m, _ in _defs(ast.FunctionDef, "make_node_id")},
        # the admin form's field groups (the fieldsets reuse them)
        "policy fields": {
            m
            for m, tree in MODULES.items()
            for node in ast.walk(tree)
            if isinstance(node, ast.Tuple)
            and {"max_catch_up", "lease_seconds"} <= {getattr(e, "value", None) for e in node.elts}
        },
        # node rows read into the dashboard's health records
        "node health": {
            m
            for m, tree in MODULES.items()
            for node in ast.walk(tree)
            if isinstance(node, ast.Call)
            and getattr(node.func, "id", "").endswith("Health")
            and any(k.arg == "heartbeat_age_seconds" for k in node.keywords)
        },
        # URLconfs spelling a route twice by hand (the root URLconf only includes)
        "both spellings": {m for m, tree in MODULES.items() if "url" in m and _calls(tree, "path")},
        # the validator of a schedule preview (API and admin)
        "preview check": {m for m, tree in MODULES.items() if _calls(tree, "check_interval")}
        - {"jobs.validation"},
    }
    assert homes == {
        "read-only admin": {"jobs.admin_base"},
        "admin actor": {"jobs.admin_base"},
        "unknown fields": {"runs.api.fields"},
        "rfc3339": {"runs.keys"},
        "node id": {"scheduler_project.liveness"},
        "policy fields": {"jobs.forms"},
        "node health": set(),
        "both spellings": {"scheduler_project.urls", "scheduler_project.urlpaths"},
        "preview check": {"jobs.describe"},
    }


def test_next_fire_time_and_fire_times_share_one_path():
    """One path from a trigger to its fire times (issue 13, item 5): `next_fire_time`
    (the scheduler's next slot) and `fire_times` (previews, the ledger, backfill) both
    take them from `_fire_instants`; neither walks a trigger kind on its own."""
    defs = {name: list(_defs(ast.FunctionDef, name)) for name in ("next_fire_time", "fire_times")}
    walkers = ("next_cron_time", "next_interval_time", "next_cron", "_check_interval")
    for name, found in defs.items():
        ((module, node),) = found
        assert module == "jobs.schedule"
        assert _calls(node, "_fire_instants"), f"{name} does not go through _fire_instants"
        assert not any(_calls(node, walker) for walker in walkers), f"{name} walks a trigger itself"


def test_a_class_name_names_one_thing():
    """Two classes of one name (the dead-letter proxy model and the alert about a dead
    run were both `DeadRun`) send a newcomer to the wrong one. Django's management
    commands must all be called `Command`."""
    homes: dict[str, list[str]] = {}
    for module, tree in MODULES.items():
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and ".management.commands." not in module:
                homes.setdefault(node.name, []).append(module)
    assert not {name: where for name, where in homes.items() if len(where) > 1}


def _actor_services() -> set[str]:
    """The service functions that record who acted (they take an `actor` keyword)."""
    out = set()
    for name in ("jobs.services", "runs.services"):
        for node in MODULES[name].body:
            if isinstance(node, ast.FunctionDef) and any(a.arg == "actor" for a in node.args.kwonlyargs):
                out.add(node.name)
    return out


def test_every_service_call_names_its_actor():
    """The audit log names who acted; a call that leaves `actor` to its default records
    `system` for an operator's click (the job page's buttons once did)."""
    services = _actor_services()
    assert {"pause_job", "resume_job", "trigger_job", "create_job", "update_job"} <= services
    missing = []
    for name, tree in MODULES.items():
        if name in ("jobs.services", "runs.services"):
            continue
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "services"
                and node.func.attr in services
                and not any(k.arg == "actor" for k in node.keywords)
            ):
                missing.append(f"{name}:{node.lineno} services.{node.func.attr}")
    assert missing == [], missing
