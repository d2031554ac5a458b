"""Registered task targets only: a task target names a registered task and its kwargs fit
the task's schema (400 naming target.kwargs.<field>), GET /api/v1/tasks/ lists the
registry, the web process loads EXECUTOR_TASK_MODULES at startup, and an executor that
lacks a task retries the run and alerts with the task's name."""

from __future__ import annotations

import subprocess
import sys
from typing import Literal

import pytest

from jobs.models import Job
from runs import task_schema
from runs.attempts import history
from runs.tasks import TaskContext, register
from tests.support.executor import queue_runs, wait_for, wait_status
from tests.support.processes import ROOT

JOBS = "/api/v1/jobs/"
TASKS = "/api/v1/tasks/"


@register("tests.typed")
def typed(
    context: TaskContext,
    count: int,
    ratio: float = 0.5,
    tags: list[str] | None = None,
    mode: Literal["fast", "slow"] = "fast",
    limits: dict[str, int] | None = None,
) -> None:
    """A task with one parameter of every mapped kind."""


DECLARED = {"type": "object", "properties": {"to": {"type": "string"}}, "required": ["to"]}


@register("tests.declared", schema=DECLARED)
def declared(context: TaskContext, **kwargs) -> None:
    """Declares its schema instead of deriving it."""


@register("tests.ctx_named")
def ctx_named(ctx: TaskContext, **kwargs) -> None:
    """Takes its run context under another name."""


def job(target: dict) -> dict:
    return {"name": "t", "interval_seconds": 60, "target": target}


def task(name: str, **kwargs) -> dict:
    return {"type": "task", "name": name, "kwargs": kwargs}


@pytest.mark.parametrize(
    ("target", "named"),
    [
        (task("nosuch"), "name: no task 'nosuch' is registered"),
        (task("sleep", seconds="x"), "target.kwargs.seconds"),
        (task("sleep", seconds=True), "target.kwargs.seconds"),
        (task("sleep", secs=1), "target.kwargs.secs"),
        (task("noop", a=1), "target.kwargs.a"),
        (task("tests.typed"), "target.kwargs.count"),  # required, missing
        (task("tests.typed", count=1.5), "target.kwargs.count"),
        (task("tests.typed", count=1, ratio="half"), "target.kwargs.ratio"),
        (task("tests.typed", count=1, tags=["a", 2]), "target.kwargs.tags[1]"),
        (task("tests.typed", count=1, tags="a"), "target.kwargs.tags"),
        (task("tests.typed", count=1, mode="medium"), "target.kwargs.mode"),
        (task("tests.typed", count=1, limits={"cpu": "2"}), "target.kwargs.limits.cpu"),
        (task("tests.declared"), "target.kwargs.to"),
        (task("tests.declared", to=5), "target.kwargs.to"),
    ],
)
def test_bad_task_target_is_a_400_naming_the_field(api, target, named):
    response = api.post(JOBS, job(target), format="json")
    assert response.status_code == 400, response.content
    messages = response.json()["target"]
    assert any(named in m for m in messages), messages
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    "target",
    [
        task("noop"),
        task("sleep", seconds=2),  # an int is a number
        task("sleep"),
        task("echo", anything={"goes": [1]}),  # **kwargs: open
        task("tests.typed", count=3, ratio=1, tags=["a"], mode="slow", limits={"cpu": 2}),
        task("tests.typed", count=3, tags=None, limits=None),
        task("tests.declared", to="ops@example.com", cc="x"),
    ],
)
def test_good_task_targets_are_accepted(api, target):
    response = api.post(JOBS, job(target), format="json")
    assert response.status_code == 201, response.content


@pytest.mark.parametrize(
    ("target", "reserved"),
    [
        (task("echo", context={"job": "mine"}), "context"),
        (task("tests.declared", to="ops@example.com", context=1), "context"),
        (task("tests.ctx_named", ctx=1), "ctx"),
    ],
)
def test_the_run_context_parameter_is_reserved_in_kwargs(api, target, reserved):
    """fn(context, **kwargs) with a kwarg named like the context parameter is a TypeError
    on every run: refused when the target is saved, naming the kwarg."""
    response = api.post(JOBS, job(target), format="json")
    assert response.status_code == 400, response.content
    messages = response.json()["target"]
    assert any(m.startswith(f"target.kwargs.{reserved}: reserved") for m in messages), messages
    assert not Job.objects.exists()
    created = api.post(JOBS, job(task("echo", note="fine")), format="json").json()
    response = api.patch(f"{JOBS}{created['id']}/", {"target": target}, format="json")
    assert response.status_code == 400 and f"target.kwargs.{reserved}" in str(response.json()), (
        response.content
    )
    # Another name is an ordinary kwarg of a task whose context is called `ctx`.
    assert api.post(JOBS, job(task("tests.ctx_named", context=1)), format="json").status_code == 201


def test_the_reserved_name_is_in_the_published_schema():
    from runs import tasks

    assert tasks.schema("echo")["propertyNames"] == {"not": {"const": "context"}}
    assert tasks.schema("tests.declared")["propertyNames"] == {"not": {"const": "context"}}
    assert tasks.schema("tests.ctx_named")["propertyNames"] == {"not": {"const": "ctx"}}
    # A task that takes no **kwargs cannot be given its context's name anyway.
    assert "propertyNames" not in tasks.schema("sleep")
    with pytest.raises(ValueError, match="context"):

        @register("tests.declares_context", schema={"type": "object", "properties": {"context": {}}})
        def declares_context(context: TaskContext, **kwargs) -> None:
            pass


def test_patch_to_an_unknown_task_is_refused(api):
    created = api.post(JOBS, job(task("noop")), format="json").json()
    response = api.patch(f"{JOBS}{created['id']}/", {"target": task("nosuch")}, format="json")
    assert response.status_code == 400 and "target" in response.json(), response.content
    assert Job.objects.get().target["name"] == "noop"


def test_tasks_endpoint_lists_the_registry_with_docstrings_and_schemas(api):
    response = api.get(TASKS)
    assert response.status_code == 200, response.content
    listed = {t["name"]: t for t in response.json()}
    assert {"noop", "sleep", "fail", "fail_permanently", "echo", "tests.typed"} <= set(listed)
    assert [t["name"] for t in response.json()] == sorted(listed)
    sleep = listed["sleep"]
    assert sleep["schema"] == {
        "type": "object",
        "properties": {"seconds": {"type": "number", "default": 1.0}},
        "additionalProperties": False,
    }
    assert sleep["doc"] and sleep["is_async"] is True
    assert listed["echo"]["schema"]["additionalProperties"] is True
    typed_schema = listed["tests.typed"]["schema"]
    assert typed_schema["required"] == ["count"]
    assert typed_schema["properties"]["tags"] == {
        "anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}],
        "default": None,
    }
    assert typed_schema["properties"]["mode"] == {"enum": ["fast", "slow"], "default": "fast"}
    assert listed["tests.declared"]["schema"]["required"] == ["to"]
    assert api.get("/api/v1/tasks").status_code == 200  # without the trailing slash too


def test_tasks_endpoint_needs_a_token_and_is_documented(api):
    from rest_framework.test import APIClient

    assert APIClient().get(TASKS).status_code == 401
    schema = api.get("/api/schema/?format=json").json()
    operation = schema["paths"]["/api/v1/tasks/"]["get"]
    assert "200" in operation["responses"]


def test_schema_mapping_of_annotations():
    assert task_schema.type_schema(int) == {"type": "integer"}
    assert task_schema.type_schema(bool) == {"type": "boolean"}
    assert task_schema.type_schema(tuple[int, ...]) == {"type": "array", "items": {"type": "integer"}}
    assert task_schema.type_schema(object) == {}  # not guessed at: any value
    assert task_schema.type_schema(int | None) == {"anyOf": [{"type": "integer"}, {"type": "null"}]}


def test_admin_form_refuses_an_unknown_task_and_offers_the_registry(admin_client, tenant):
    from tests.test_admin_jobs import form_data

    data = form_data(tenant, target='{"type": "task", "name": "nosuch", "kwargs": {}}')
    response = admin_client.post("/admin/jobs/job/add/", data)
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert "target" in errors and "nosuch" in str(errors["target"])
    assert not Job.objects.exists()
    page = admin_client.get("/admin/jobs/job/add/").content.decode()
    assert 'id="cronyard-tasks"' in page and "tests.typed" in page  # the task picker's data


def test_web_process_loads_the_task_modules_at_startup(child_env):
    env = {**child_env, "EXECUTOR_TASK_MODULES": "runs.builtin_tasks,tests.support.tasks"}
    code = "import django; django.setup(); from runs import tasks; print(','.join(tasks.names()))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert {"noop", "sleep", "hang_async", "hang_sync"} <= set(out.stdout.strip().split(","))


@pytest.mark.processes
def test_executor_lacking_a_task_retries_the_run_and_alerts_with_its_name(processes, tenant):
    """hang_async is registered where jobs are validated (tests.support.tasks), not in
    this executor: the run is retried, not killed at once, and each attempt alerts."""
    (key,) = queue_runs(
        tenant, task("hang_async"), max_attempts=2, retry_backoff_seconds=0, retry_backoff_cap_seconds=0
    )
    executor = processes.start("run_executor", env={"EXECUTOR_TASK_MODULES": "runs.builtin_tasks"})
    run = wait_status(key, "dead", timeout=60)
    assert [a["outcome"] for a in history(run)] == ["retry", "dead"]
    assert "unknown task 'hang_async'" in run.last_error and "EXECUTOR_TASK_MODULES" in run.last_error
    alert = '"type": "task.missing"'
    log = wait_for(
        lambda: processes.log_of(executor).count(alert) >= 2 and processes.log_of(executor),
        timeout=30,
        what="two task.missing alerts",
    )
    assert '"task": "hang_async"' in log


def test_admin_change_page_embeds_schemas_and_kwargs_errors_by_name(admin_client, tenant):
    """The page carries what its kwargs form is built from (each task's schema, as the
    validator sees it) and, after a refused post, each kwarg's problem under its name."""
    import json
    import re

    from runs import tasks
    from tests.test_admin_jobs import form_data

    def embedded(page: str, element_id: str):
        match = re.search(rf'<script id="{element_id}" type="application/json">(.*?)</script>', page, re.S)
        assert match, f"no {element_id} in the page"
        return json.loads(match.group(1))

    page = admin_client.get("/admin/jobs/job/add/").content.decode()
    catalog = {t["name"]: t for t in embedded(page, "cronyard-tasks")}
    assert catalog["sleep"]["schema"] == tasks.schema("sleep")
    assert catalog["sleep"]["schema"]["properties"]["seconds"] == {"type": "number", "default": 1.0}
    assert catalog["tests.typed"]["schema"]["required"] == ["count"]
    assert embedded(page, "cronyard-kwargs-errors") == {}

    target = {"type": "task", "name": "tests.typed", "kwargs": {"count": 1.5, "tags": ["a", 2], "x": 1}}
    response = admin_client.post("/admin/jobs/job/add/", form_data(tenant, target=json.dumps(target)))
    assert response.status_code == 200 and not Job.objects.exists()
    errors = embedded(response.content.decode(), "cronyard-kwargs-errors")
    assert set(errors) == {"count", "tags", "x"}, errors
    assert errors["count"][0].startswith("target.kwargs.count: ")
    assert errors["tags"][0].startswith("target.kwargs.tags[1]: ")
