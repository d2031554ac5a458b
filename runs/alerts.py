"""Alerts: a run went `dead`, or names a task its executor lacks (`task.missing`).
Logged as one structured line and POSTed to SCHEDULER_ALERT_WEBHOOK_URL when set;
deaths are counted.

Delivery runs in background tasks with its own retries, so a slow or broken webhook
never holds up the executor. The durable record is the run row itself (status
'dead', in the dead-letter API); counts for /metrics come from there too, the
in-process counters here are for this executor's own logs.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field

import aiohttp

from runs.keys import format_utc, run_key

log = logging.getLogger(__name__)

WEBHOOK_ATTEMPTS = 5
WEBHOOK_TIMEOUT_SECONDS = 10


@dataclass(frozen=True)
class DeadRunAlert:
    """What the `run.dead` alert says about a run that died (not the dead-letter queue's
    runs.models.DeadRun, which is a view of the run rows)."""

    job_id: object
    scheduled_at: object
    tenant_id: int
    job_name: str
    attempt: int
    result_code: int | None
    last_error: str

    @classmethod
    def of(cls, run, *, result_code: int | None, error: str) -> DeadRunAlert:
        """From a ClaimedRun or ReapedRun (anything with the run's key, tenant, name, attempt)."""
        return cls(run.job_id, run.scheduled_at, run.tenant_id, run.job_name, run.attempt, result_code, error)


@dataclass
class AlertCounters:
    dead: int = 0
    webhook_delivered: int = 0
    webhook_failed: int = 0


@dataclass
class Alerter:
    webhook_url: str = ""
    backoff_seconds: float = 1.0
    counters: AlertCounters = field(default_factory=AlertCounters)
    _session: aiohttp.ClientSession | None = None
    _pending: set[asyncio.Task] = field(default_factory=set)

    def payload(self, run: DeadRunAlert) -> dict:
        return {
            "event": "run.dead",
            "run_key": run_key(run.job_id, run.scheduled_at),
            "job_id": str(run.job_id),
            "job_name": run.job_name,
            "tenant_id": run.tenant_id,
            "scheduled_at": format_utc(run.scheduled_at),
            "attempt": run.attempt,
            "result_code": run.result_code,
            "last_error": run.last_error,
        }

    def dead(self, run: DeadRunAlert) -> None:
        """Record a death; returns at once (the webhook POST happens in the background)."""
        self.counters.dead += 1
        body = self.payload(run)
        log.error("alert %s", json.dumps(body, sort_keys=True))
        self._post(body)

    def missing_task(self, run, *, task: str, owner: str) -> None:
        """A run (a ClaimedRun) names a task this executor has not registered: the run is
        retried, and the operator is told which task and which executor, on every attempt."""
        body = {
            "event": "task.missing",
            "task": task,
            "run_key": run_key(run.job_id, run.scheduled_at),
            "job_id": str(run.job_id),
            "scheduled_at": format_utc(run.scheduled_at),
            "attempt": run.attempt,
            "executor": owner,
        }
        log.error("alert %s", json.dumps(body, sort_keys=True))
        self._post(body)

    def _post(self, body: dict) -> None:
        if self.webhook_url:
            task = asyncio.get_running_loop().create_task(self._deliver(body))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)

    async def _deliver(self, body: dict) -> None:
        if self._session is None:
            # The webhook is the operator's own endpoint: no SSRF guard, unlike targets.
            self._session = aiohttp.ClientSession(trust_env=False)
        delay = self.backoff_seconds
        for attempt in range(1, WEBHOOK_ATTEMPTS + 1):
            try:
                async with self._session.post(
                    self.webhook_url, json=body, timeout=aiohttp.ClientTimeout(total=WEBHOOK_TIMEOUT_SECONDS)
                ) as response:
                    if response.status < 300:
                        self.counters.webhook_delivered += 1
                        return
                    problem = f"HTTP {response.status}"
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                problem = f"{type(exc).__name__}: {exc}"
            log.warning("alert webhook attempt %d/%d failed: %s", attempt, WEBHOOK_ATTEMPTS, problem)
            if attempt < WEBHOOK_ATTEMPTS:
                await asyncio.sleep(delay)
                delay *= 2
        self.counters.webhook_failed += 1
        log.error("alert webhook gave up after %d attempts for %s", WEBHOOK_ATTEMPTS, body["run_key"])

    async def close(self, timeout: float) -> None:
        """Give pending deliveries up to `timeout` seconds, then drop them."""
        if self._pending:
            _done, pending = await asyncio.wait(set(self._pending), timeout=timeout)
            for task in pending:
                task.cancel()
        if self._session is not None:
            await self._session.close()
