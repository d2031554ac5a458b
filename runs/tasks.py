"""Registry of Python callables that `{"type": "task", "name": ...}` targets run.

A task is `fn(context: TaskContext, **kwargs)`, sync (run on a thread of its own)
or async (awaited on the event loop). Each call is bounded by the target's
`timeout_seconds`: an async task is cancelled, a sync one abandoned (see
runs.execution.targets.call_task). Modules listed in
settings.EXECUTOR_TASK_MODULES are imported when an executor starts and when the web
process starts (runs.apps.RunsConfig.ready); importing them runs their @register
decorators. Both must list the same modules: the web process refuses a task target
that names no registered task, or whose kwargs do not fit the task's schema.

The kwargs schema is derived from the signature (runs.task_schema) unless the task
declares one: `@register(schema={...})` in the same JSON Schema subset.
"""

from __future__ import annotations

import importlib
import inspect
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

from runs import task_schema

# The registry is filled at import time by decorators, the way Django registers
# admin classes; it is never written after the task modules are loaded.
_TASKS: dict[str, Callable] = {}
# Declared schemas (@register(schema=...)); derived ones are computed on first use,
# when every name the annotations refer to exists.
_SCHEMAS: dict[str, dict] = {}


@dataclass(frozen=True)
class TaskContext:
    job_id: UUID
    scheduled_at: datetime
    attempt: int
    idempotency_key: str
    # Set when this attempt stops counting (timed out, fenced, cancelled, handed back).
    # A sync task cannot be killed: a long one should check this and return early.
    cancelled: threading.Event = field(default_factory=threading.Event)


def register(name: str | Callable | None = None, *, schema: dict | None = None) -> Callable:
    """`@register`, `@register("name")` or `@register(schema={...})`; the default name is
    the function's name, the default schema the one its signature implies."""

    def decorate(fn: Callable) -> Callable:
        task_name = name if isinstance(name, str) else fn.__name__
        if task_name in _TASKS and _TASKS[task_name] is not fn:
            raise ValueError(f"task {task_name!r} is already registered")
        if schema is not None:
            # A declared schema is final here (a derived one on first use): refuse one
            # that names the context parameter as a kwarg before the task is registered.
            _SCHEMAS[task_name] = task_schema.reserve_context(schema, fn)
        _TASKS[task_name] = fn
        return fn

    if callable(name):
        return decorate(name)
    return decorate


def get(name: str) -> Callable | None:
    return _TASKS.get(name)


def names() -> list[str]:
    return sorted(_TASKS)


def schema(name: str) -> dict:
    """JSON Schema of the kwargs of a registered task (KeyError if it is not)."""
    fn = _TASKS[name]
    if name not in _SCHEMAS:
        _SCHEMAS[name] = task_schema.reserve_context(task_schema.kwargs_schema(fn), fn)
    return _SCHEMAS[name]


def kwargs_errors(name: str, kwargs: dict) -> list[str]:
    """Problems of `kwargs` for task `name`, each naming `target.kwargs.<field>`."""
    return task_schema.errors(schema(name), kwargs, task=name)


def catalog() -> list[dict[str, Any]]:
    """Every registered task: name, docstring, kwargs schema, async or not (GET /tasks/)."""
    return [
        {
            "name": task,
            "doc": inspect.getdoc(_TASKS[task]) or "",
            "schema": schema(task),
            "is_async": inspect.iscoroutinefunction(_TASKS[task]),
        }
        for task in names()
    ]


def load_modules(modules: Iterable[str]) -> None:
    for module in modules:
        importlib.import_module(module)
