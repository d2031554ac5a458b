"""The layout rules of docs/ARCHITECTURE.md, checked on the source (no database).

Where a rule can be derived from the code it is: what the executor process loads is the
import closure of its command, not a list kept by hand. If one of these fails, either
the change broke a rule or the rule has to change: then change docs/ARCHITECTURE.md in
the same commit.
"""

from __future__ import annotations

import ast
import copy
import re
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
APPS = ("jobs", "runs", "scheduler_project")

# What wires the apps together: settings, URLconfs, the WSGI entry. The rest of
# scheduler_project is infrastructure that knows neither app.
WIRING = {
    "scheduler_project",
    "scheduler_project.settings",
    "scheduler_project.urls",
    "scheduler_project.views",
    "scheduler_project.wsgi",
}
EXECUTOR_COMMAND = "runs.management.commands.run_executor"
SCHEDULER_COMMAND = "jobs.management.commands.run_scheduler"
# What the operator-facing rest of `runs` (admin, API, selectors, services, metrics) may
# use of `jobs`: the models, the audit log, the one overdue rule, the one load forecast
# (the dashboard's chart), the one way to show an instant, and the admin's shared base.
JOBS_SEEN_BY_RUNS = {
    "jobs.models",
    "jobs.audit",
    "jobs.health",
    "jobs.forecast",
    "jobs.admin.display",
    "jobs.admin.base",
}
# The fire-time package's public doors: the package itself and its jitter module.
SCHEDULE_DOORS = {"jobs.schedule", "jobs.schedule.jitter"}
SQL_MODULES = {
    "jobs.dispatch.fencing",
    "jobs.dispatch.partition_leases",
    "jobs.dispatch.rate_limits",
    "jobs.health",
    "runs.enqueue",
    "runs.open_floors",
    "runs.alerts",
    "runs.counters",
    "runs.execution.claims",
    "runs.execution.run_leases",
    "runs.execution.turns",
    "runs.execution.fair_share",
    "runs.execution.outcomes",
    "runs.execution.history_moves",
    "runs.per_partition",
    "runs.execution.table_statistics",
    "runs.execution.connections",
    "runs.execution.breakers",
    "runs.execution.nodes",
    "runs.day_partitions",
    "runs.admin.timeseries",
    "scheduler_project.citus",
    "scheduler_project.db",
    "scheduler_project.liveness",
}
# Each process's statements, every one named, in one module of its package; the package's
# other modules run them. The statements of the shared modules a process also runs (the run
# insert and open floors, counters, alerts, day partitions, the alert sweep) stay with
# those modules.
EXECUTOR_PACKAGE = "runs.execution"
EXECUTOR_QUERIES = "runs.execution.queries"
SCHEDULER_PACKAGE = "jobs.dispatch"
SCHEDULER_QUERIES = "jobs.dispatch.queries"
# A module that holds one concept may be long; past this it is worth a look.
WARN_LINES = 600
MAX_LINES = 1000
# Modules whose one concept is a list: each process's SQL statements, one module per
# process (the style's rule), grow with the statements the process runs.
STATEMENT_MODULES = {EXECUTOR_QUERIES, SCHEDULER_QUERIES}
MAX_STATEMENT_LINES = 1300


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


def closure(start: str) -> set[str]:
    """The application modules a process loads from its command: its imports, theirs,
    and every package a module lives in (importing a.b runs a/__init__.py)."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        name = todo.pop()
        if name in seen or name not in MODULES:
            continue
        seen.add(name)
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]
        todo += [m for m in imported(MODULES[name]) if m in MODULES]
    return seen


EXECUTOR_SIDE = closure(EXECUTOR_COMMAND)
SCHEDULER_SIDE = closure(SCHEDULER_COMMAND)
INFRASTRUCTURE = {m for m in MODULES if m.split(".")[0] == "scheduler_project" and m not in WIRING}
PURE_SCHEDULE = {m for m in MODULES if m == "jobs.schedule" or m.startswith("jobs.schedule.")}


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
            node.args[0].value  # importlib.import_module("runs.day_partitions") counts too
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
    assert {EXECUTOR_COMMAND, SCHEDULER_COMMAND} <= set(MODULES)
    assert SQL_MODULES | JOBS_SEEN_BY_RUNS | SCHEDULE_DOORS | {EXECUTOR_QUERIES, SCHEDULER_QUERIES} <= set(
        MODULES
    )
    assert len(EXECUTOR_SIDE) > 20 and len(SCHEDULER_SIDE) > 15 and len(PURE_SCHEDULE) >= 4


@pytest.mark.parametrize("name", sorted(INFRASTRUCTURE))
def test_infrastructure_imports_neither_app(name):
    bad = sorted(m for m in imported(MODULES[name]) if m.split(".")[0] in ("jobs", "runs"))
    assert not bad, f"{name} imports {bad}"


def test_the_executor_loads_no_scheduling_code():
    """An executor process loads nothing of `jobs`: derived from what run_executor imports."""
    bad = sorted(m for m in EXECUTOR_SIDE if m.split(".")[0] == "jobs")
    assert not bad, f"run_executor loads {bad}"


def test_each_process_package_holds_what_its_process_loads():
    """A newcomer finds the executor in runs/execution and the scheduler in jobs/dispatch:
    everything in those packages is loaded by that process's command."""
    for package, side in (("runs.execution", EXECUTOR_SIDE), ("jobs.dispatch", SCHEDULER_SIDE)):
        held = {m for m in MODULES if m == package or m.startswith(f"{package}.")}
        assert held - side == set(), (
            f"{sorted(held - side)} are in {package} but its process never loads them"
        )


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
        if module in PURE_SCHEDULE or module.rsplit(".", 1)[0] in PURE_SCHEDULE or module == "jobs":
            return True
        if module == "runs.keys" or module.startswith("runs.keys."):
            return True  # the run key's text form, which jitter hashes: stdlib only
        return module.split(".")[0] not in ("django", "psycopg", "jobs", "runs", "scheduler_project", "tests")

    bad = sorted(m for m in imported(MODULES[name]) if not allowed(m))
    assert not bad, f"{name} imports {bad}: fire-time computation needs no database or app code"


def test_fire_times_are_reached_through_the_schedule_door():
    """Dispatch, previews, validation and the ledger ask jobs.schedule (whose cache is
    inside it), never its cron, calendar or DST internals: one path to a fire time."""
    bad = {}
    for name, tree in MODULES.items():
        if name in PURE_SCHEDULE:
            continue
        inner = sorted(m for m in imported(tree) if m in PURE_SCHEDULE - SCHEDULE_DOORS)
        if inner:
            bad[name] = inner
    assert not bad, f"reaching past the jobs.schedule door: {bad}"


def test_module_sizes():
    """No line-count rule splits a concept: a long module only warns; a very long one fails."""
    sizes = {name: len(path.read_text().splitlines()) for name, path in SOURCES.items()}
    for name, n in sorted(sizes.items()):
        if n > WARN_LINES:
            warnings.warn(f"{name} has {n} lines: does it still hold one concept?", stacklevel=1)
    too_long = sorted(
        f"{name}: {n}"
        for name, n in sizes.items()
        if n > (MAX_STATEMENT_LINES if name in STATEMENT_MODULES else MAX_LINES)
    )
    assert not too_long, f"split these along their concepts: {too_long}"


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
                # `copy.copy(x)` is the stdlib's shallow copy, not a cursor's COPY.
                stdlib_copy = isinstance(node.func.value, ast.Name) and node.func.value.id == "copy"
                if node.func.attr in ("execute", "executemany", "copy", "raw", "extra") and not stdlib_copy:
                    offenders.append(f"{name}:{node.lineno}")
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", getattr(node.func, "attr", None)) == "RawSQL"
            ):
                offenders.append(f"{name}:{node.lineno} RawSQL")
    assert not offenders, f"cursor.execute outside {sorted(SQL_MODULES)}: {offenders}"


# What a statement looks like: it starts with a statement's keyword, or holds one of the
# pairs that only a statement has. Keywords in capitals, as every statement here is written.
# Transaction control (BEGIN, COMMIT, ROLLBACK) is not a statement of its own: it stays
# where the transaction is.
_STATEMENT = re.compile(
    r"^\s*\(?\s*(SELECT|WITH|INSERT|UPDATE|DELETE|ANALYZE|LISTEN|DEALLOCATE|SET)\b"
    r"|\bSELECT\b[\s\S]*\bFROM\b|\bUPDATE\s+\w+[\s\S]*\bSET\b|\bINSERT\s+INTO\b"
    r"|\bDELETE\s+FROM\b|\bWITH\s+\w+\s+AS\s+(MATERIALIZED\s+)?\("
)


def _string_parts(tree: ast.Module) -> list[tuple[int, str]]:
    """The string literals a module's code holds (f-strings by their literal parts), without
    docstrings: prose about a statement is not one."""
    stripped = ast.parse(_code(tree))
    return [
        (node.lineno, node.value)
        for node in ast.walk(stripped)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]


def _statements_outside(package: str, queries_module: str) -> list[str]:
    """The SQL-looking strings of `package`'s modules other than its queries module."""
    offenders = []
    for name, tree in MODULES.items():
        if not name.startswith(f"{package}.") or name == queries_module:
            continue
        found = [text for _, text in _string_parts(tree) if _STATEMENT.search(text)]
        offenders += [f"{name}: {text.strip()[:50]!r}" for text in found]
    return offenders


def _statements_in(queries_module: str) -> int:
    return sum(bool(_STATEMENT.search(text)) for _, text in _string_parts(MODULES[queries_module]))


def test_the_executors_statements_live_in_its_queries_module():
    """Every SQL statement of the executor is a named constant of runs/execution/queries.py;
    the other runs/execution modules run them and hold no SQL text of their own."""
    offenders = _statements_outside(EXECUTOR_PACKAGE, EXECUTOR_QUERIES)
    assert not offenders, f"SQL outside {EXECUTOR_QUERIES}: {offenders}"
    # The pattern finds statements: the queries module's own text is full of them.
    assert _statements_in(EXECUTOR_QUERIES) >= 25


def test_the_schedulers_statements_live_in_its_queries_module():
    """Every SQL statement of the scheduler's package is a named constant of
    jobs/dispatch/queries.py; the other jobs/dispatch modules run them."""
    offenders = _statements_outside(SCHEDULER_PACKAGE, SCHEDULER_QUERIES)
    assert not offenders, f"SQL outside {SCHEDULER_QUERIES}: {offenders}"
    assert _statements_in(SCHEDULER_QUERIES) >= 15


# Outgoing HTTP clients. Only two modules call out: the targets' calls and the alert sender.
HTTP_CLIENTS = ("aiohttp", "urllib.request", "http.client", "requests", "httpx", "urllib3")


def test_one_module_sends_every_alert():
    """Both processes alert through runs.alerts, the one webhook sender and payload: no
    other module opens an HTTP client (but the targets' caller) or reads the webhook's
    setting, and both the executor and the scheduler load it."""
    clients = {
        name
        for name, tree in MODULES.items()
        if any(m == c or m.startswith(f"{c}.") for m in imported(tree) for c in HTTP_CLIENTS)
    }
    assert clients == {"runs.alerts", "runs.execution.targets"}
    readers = {
        name
        for name, tree in MODULES.items()
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr == "SCHEDULER_ALERT_WEBHOOK_URL"
    }
    assert readers == {"runs.alerts"}
    assert "runs.alerts" in EXECUTOR_SIDE and "runs.alerts" in SCHEDULER_SIDE


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
    """Small helpers that were once repeated (each a trap for a newcomer) keep one home."""
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
        - {"jobs.rules.job"},
    }
    assert homes == {
        "read-only admin": {"jobs.admin.base"},
        "admin actor": {"jobs.admin.base"},
        "unknown fields": {"runs.api.fields"},
        "rfc3339": {"runs.keys"},
        "node id": {"scheduler_project.liveness"},
        "policy fields": {"jobs.admin.forms"},
        "node health": set(),
        "both spellings": {"scheduler_project.urls", "scheduler_project.urlpaths"},
        "preview check": {"jobs.describe"},
    }


def _code(tree: ast.Module) -> str:
    """What a module runs, as text: its code and string literals (SQL included), without
    comments or docstrings, so that prose naming a rule is not taken for a copy of it."""
    tree = copy.deepcopy(tree)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(getattr(first, "value", None), ast.Constant):
                node.body = node.body[1:] or [ast.Pass()]
    return ast.unparse(tree)


def test_engine_and_attempt_rules_have_one_home():
    """Rules both processes apply live in one module each, in Python and in SQL alike:
    whether the database is Citus (its SQL, and every function answering it);
    one statement per partition or one for the batch (a literal one-partition filter, or
    statements sent in a batch with executemany); attempts used (`attempt - deferrals`)
    and used up (`>= max_attempts`). And no switch only tests use overrides one of them:
    the tests patch the policy itself (tests/conftest.py, per_partition_forms)."""
    code = {name: _code(tree) for name, tree in MODULES.items()}
    functions = [*_defs(ast.FunctionDef, None), *_defs(ast.AsyncFunctionDef, None)]
    homes = {
        "citus test": {m for m, text in code.items() if "pg_extension" in text or "INSTALLED_SQL" in text}
        | {m for m, f in functions if "citus" in f.name.lower()},
        "per-partition form": {
            m
            for m, text in code.items()
            if re.search(r"partition_id\s*=\s*%", text) or _calls(MODULES[m], "executemany")
        },
        "attempts used": {m for m, text in code.items() if re.search(r"\battempt\s*-\s*\S*deferrals", text)},
        "attempts used up": {m for m, text in code.items() if re.search(r">=\s*\S*max_attempts", text)},
        "test-only switch": {m for m, f in functions if f.name.startswith("force_")},
    }
    assert homes == {
        "citus test": {"scheduler_project.citus"},
        "per-partition form": {"runs.per_partition"},
        "attempts used": {"runs.attempts"},
        "attempts used up": {"runs.attempts"},
        "test-only switch": set(),
    }


def test_next_fire_time_and_fire_times_share_one_path():
    """One path from a trigger to its fire times: `next_fire_time`
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
