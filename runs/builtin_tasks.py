"""Small tasks that ship with Cronyard: smoke tests, benchmarks and failure drills."""

from __future__ import annotations

import asyncio
import logging

from runs.errors import PermanentError
from runs.tasks import TaskContext, register

log = logging.getLogger(__name__)


@register
async def noop(context: TaskContext) -> None:
    """Does nothing: measures the executor itself."""


@register
async def sleep(context: TaskContext, seconds: float = 1.0) -> None:
    """Waits `seconds`: a stand-in for slow work in drills and benchmarks."""
    # Async so that a cancel (fenced, cancelled, SIGTERM hand-back) stops it at once.
    await asyncio.sleep(float(seconds))


@register
def fail(context: TaskContext, message: str = "task 'fail' always fails") -> None:
    """Raises every time (a retryable failure): drills retries and the dead letter."""
    raise RuntimeError(message)


@register
def fail_permanently(context: TaskContext, message: str = "task 'fail_permanently' always fails") -> None:
    """Raises PermanentError: the run dies on its first attempt."""
    raise PermanentError(message)


@register
def echo(context: TaskContext, **kwargs) -> dict:
    """Logs and returns its kwargs (any)."""
    log.info("echo %s attempt %s: %s", context.idempotency_key, context.attempt, kwargs)
    return kwargs
