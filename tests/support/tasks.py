"""Tasks only the tests register: ones that hang, to drill task timeouts.

Executor processes started by the `processes` fixture load this module next to
runs.builtin_tasks (EXECUTOR_TASK_MODULES in tests/conftest.py); in-process tests
import it.
"""

from __future__ import annotations

import asyncio
import time
from typing import Literal

from runs.tasks import TaskContext, register

# Events of the sync task's abandoned threads, for in-process tests to inspect.
SYNC_CALLS: list[TaskContext] = []


@register
async def hang_async(context: TaskContext, seconds: float = 3600.0) -> None:
    """Awaits far longer than any test timeout: only a cancel ends it."""
    await asyncio.sleep(float(seconds))


@register
def hang_sync(context: TaskContext, seconds: float = 3600.0) -> str:
    """Blocks its thread and ignores `context.cancelled`, like a stuck library call;
    returns (a late result nobody may record) after `seconds`."""
    SYNC_CALLS.append(context)
    time.sleep(float(seconds))
    return "finished late"


@register("tests.form_kinds")
def form_kinds(
    context: TaskContext,
    count: int,
    verbose: bool = False,
    mode: Literal["fast", "slow"] = "fast",
    tags: list[str] | None = None,
    label: str = "",
) -> None:
    """One kwarg of each input the admin's kwargs form generates (number, checkbox, select,
    JSON, text); the console tests fill it in a real browser."""
