"""Registry of Python callables that `{"type": "task", "name": ...}` targets run.

A task is `fn(context: TaskContext, **kwargs)`, sync (run on a thread of its own)
or async (awaited on the event loop). Each call is bounded by the target's
`timeout_seconds`: an async task is cancelled, a sync one abandoned (see
runs.targets.call_task). Modules listed in
settings.EXECUTOR_TASK_MODULES are imported when an executor starts; importing them
runs their @register decorators.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from uuid import UUID

# The registry is filled at import time by decorators, the way Django registers
# admin classes; it is never written after the task modules are loaded.
_TASKS: dict[str, Callable] = {}


@dataclass(frozen=True)
class TaskContext:
    job_id: UUID
    scheduled_at: datetime
    attempt: int
    idempotency_key: str
    # Set when this attempt stops counting (timed out, fenced, cancelled, handed back).
    # A sync task cannot be killed: a long one should check this and return early.
    cancelled: threading.Event = field(default_factory=threading.Event)


def register(name: str | Callable | None = None) -> Callable:
    """`@register` or `@register("name")`; the default name is the function's name."""

    def decorate(fn: Callable) -> Callable:
        task_name = name if isinstance(name, str) else fn.__name__
        if task_name in _TASKS and _TASKS[task_name] is not fn:
            raise ValueError(f"task {task_name!r} is already registered")
        _TASKS[task_name] = fn
        return fn

    if callable(name):
        return decorate(name)
    return decorate


def get(name: str) -> Callable | None:
    return _TASKS.get(name)


def names() -> list[str]:
    return sorted(_TASKS)


def load_modules(modules: Iterable[str]) -> None:
    for module in modules:
        importlib.import_module(module)
