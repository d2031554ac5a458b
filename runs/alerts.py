"""Alerts: one payload schema and one webhook sender for every alert.

The four kinds, and who raises them:
- `run.dead` (executor): a run used its attempts, or failed for good;
- `task.missing` (executor): a run names a task this executor has not registered
  (every such attempt; the run is retried);
- `job.overdue` (the scheduler's sweep, jobs/health.py): the job's next slot is late by
  more than SCHEDULER_OVERDUE_ALERT_SECONDS, once per late slot;
- `job.failing` (the same sweep): the job's consecutive failed attempts reached its
  `alert_after_failures`, once per failure streak.

Every alert has the same top-level fields (`payload()`): `type`, `at`, `tenant` (id and
slug), `job` (id and name), `run` (key, slot, attempt; null for the job-level kinds),
`console_url` (the run, or the job's page, under CRONYARD_PUBLIC_URL) and `detail`
(what only that kind says). It is logged as one line `alert {json}` and POSTed to
SCHEDULER_ALERT_WEBHOOK_URL when set.

Delivery (`WebhookSender`) is asyncio: a POST that waits on a slow webhook is a
suspended task, not a blocked thread, so the executor sends on its own event loop
while its calls and lease heartbeats go on, and a burst of deaths costs tasks rather
than threads. The scheduler's loop is synchronous: `BackgroundSender` runs the same
WebhookSender on a private event loop in one daemon thread; the sweep hands its alerts
over after its transaction has committed its marks and returns at once.

A failed POST is retried with full-jitter backoff (runs/execution/retry.py, the rule
runs' retries follow) for WEBHOOK_ATTEMPTS attempts; a final answer (4xx) is not
retried. The alert is not stored anywhere else: a webhook that stays down loses it (the
log line stays). The webhook is the operator's own endpoint, set in the environment
and often on a private network, so it is not behind the SSRF guard of targets
(docs/decisions/0042-ssrf-guard.md).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import random
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from urllib.parse import quote, urlsplit
from uuid import UUID

import aiohttp
import psycopg

from runs import counters
from runs.execution import retry
from runs.keys import format_utc, run_key

log = logging.getLogger(__name__)

RUN_DEAD = "run.dead"
TASK_MISSING = "task.missing"
JOB_OVERDUE = "job.overdue"
JOB_FAILING = "job.failing"

WEBHOOK_ATTEMPTS = 5
WEBHOOK_TIMEOUT_SECONDS = 10
BACKOFF_SECONDS = 1.0
BACKOFF_CAP_SECONDS = 30.0

DEFAULT_PUBLIC_URL = "http://127.0.0.1:8000"
# The console's pages, as Django's admin spells them. Written out rather than reversed:
# the executor loads no URLconf (it would load the admin and, with it, scheduling code).
JOB_PAGE = "/admin/jobs/job/{job_id}/change/"
RUN_PAGE = "/admin/runs/jobrun/?q={run_key}"  # the runs list finds a run by its key


@dataclass(frozen=True)
class RunRef:
    scheduled_at: datetime
    attempt: int


@dataclass(frozen=True)
class Alert:
    """One alert of any kind; `payload()` turns it into what receivers get."""

    type: str
    at: datetime
    tenant_id: int
    tenant_slug: str | None  # None: the executor looks it up before sending
    job_id: UUID | str
    job_name: str
    run: RunRef | None = None
    detail: dict = field(default_factory=dict)

    @classmethod
    def run_dead(cls, run, *, result_code: int | None, error: str) -> Alert:
        """From a ClaimedRun or ReapedRun (anything with the run's key, tenant, name, attempt)."""
        return cls._of_run(run, RUN_DEAD, {"result_code": result_code, "last_error": error})

    @classmethod
    def task_missing(cls, run, *, task: str, executor: str) -> Alert:
        return cls._of_run(run, TASK_MISSING, {"task": task, "executor": executor})

    @classmethod
    def _of_run(cls, run, kind: str, detail: dict) -> Alert:
        return cls(
            type=kind,
            at=datetime.now(UTC),
            tenant_id=run.tenant_id,
            tenant_slug=None,
            job_id=run.job_id,
            job_name=run.job_name,
            run=RunRef(run.scheduled_at, run.attempt),
            detail=detail,
        )

    @classmethod
    def job_overdue(
        cls, *, at: datetime, tenant_id: int, tenant_slug: str, job_id: UUID, job_name: str, slot: datetime
    ) -> Alert:
        detail = {"scheduled_at": format_utc(slot), "overdue_seconds": round((at - slot).total_seconds(), 3)}
        return cls(JOB_OVERDUE, at, tenant_id, tenant_slug, job_id, job_name, None, detail)

    @classmethod
    def job_failing(
        cls,
        *,
        at: datetime,
        tenant_id: int,
        tenant_slug: str,
        job_id: UUID,
        job_name: str,
        consecutive_failures: int,
        last_failure_at: datetime | None,
    ) -> Alert:
        detail = {
            "consecutive_failures": consecutive_failures,
            "last_failure_at": format_utc(last_failure_at) if last_failure_at else None,
        }
        return cls(JOB_FAILING, at, tenant_id, tenant_slug, job_id, job_name, None, detail)


def payload(alert: Alert, *, public_url: str) -> dict:
    """What is logged and POSTed: the same top-level fields for every kind."""
    base = public_url.rstrip("/")
    run = None
    if alert.run is None:
        console = base + JOB_PAGE.format(job_id=alert.job_id)
    else:
        key = run_key(alert.job_id, alert.run.scheduled_at)
        run = {"key": key, "scheduled_at": format_utc(alert.run.scheduled_at), "attempt": alert.run.attempt}
        console = base + RUN_PAGE.format(run_key=quote(key, safe=""))
    return {
        "type": alert.type,
        # To the second: format_utc's cache is for run slots, not for every instant.
        "at": format_utc(alert.at.replace(microsecond=0)),
        "tenant": {"id": alert.tenant_id, "slug": alert.tenant_slug},
        "job": {"id": str(alert.job_id), "name": alert.job_name},
        "run": run,
        "console_url": console,
        "detail": alert.detail,
    }


@dataclass(frozen=True)
class Destination:
    """Where alerts go (the webhook; none: only logged) and the console their links name."""

    webhook_url: str = ""
    public_url: str = DEFAULT_PUBLIC_URL

    @classmethod
    def from_settings(cls) -> Destination:
        from django.conf import settings
        from django.core.exceptions import ImproperlyConfigured

        public = settings.CRONYARD_PUBLIC_URL
        parts = urlsplit(public)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ImproperlyConfigured(
                f"CRONYARD_PUBLIC_URL must be an http(s) URL such as {DEFAULT_PUBLIC_URL}, not {public!r}"
            )
        return cls(webhook_url=settings.SCHEDULER_ALERT_WEBHOOK_URL, public_url=public)


@dataclass
class AlertCounters:
    sent: int = 0
    delivered: int = 0
    failed: int = 0


_SLUG_SQL = "SELECT slug FROM tenants WHERE id = %s"


class TenantSlugs:
    """A tenant's slug for the executor's alerts: its runs carry only the tenant id.

    Read on a connection of its own, opened at the first alert (none of the executor's
    connections may wait behind an alert), and kept SLUG_SECONDS per tenant, so a burst
    of deaths asks once. A lookup that fails sends the alert with a null slug, and so
    do the tenant's alerts for the next FAILED_SECONDS: they do not queue behind retries.
    """

    SLUG_SECONDS = 60.0
    FAILED_SECONDS = 5.0
    LOOKUP_TIMEOUT_SECONDS = 5.0

    def __init__(self, conninfo: str) -> None:
        self._conninfo = conninfo
        self._conn: psycopg.AsyncConnection | None = None
        self._lock = asyncio.Lock()
        self._known: dict[int, tuple[str | None, float]] = {}

    async def __call__(self, tenant_id: int) -> str | None:
        async with self._lock:  # one statement at a time on the one connection
            known = self._known.get(tenant_id)
            if known is not None and known[1] > time.monotonic():
                return known[0]
            try:
                slug = await asyncio.wait_for(self._read(tenant_id), self.LOOKUP_TIMEOUT_SECONDS)
            except (psycopg.Error, OSError, TimeoutError) as exc:
                log.warning("alert: cannot read the slug of tenant %s (%s)", tenant_id, exc)
                await self.close()
                self._known[tenant_id] = (None, time.monotonic() + self.FAILED_SECONDS)
                return None
            self._known[tenant_id] = (slug, time.monotonic() + self.SLUG_SECONDS)
            return slug

    async def _read(self, tenant_id: int) -> str | None:
        if self._conn is None or self._conn.closed:
            self._conn = await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True)
        cursor = await self._conn.execute(_SLUG_SQL, [tenant_id])
        row = await cursor.fetchone()
        return row[0] if row else None

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                await conn.close()
            except psycopg.Error:
                pass


class WebhookSender:
    """Logs each alert and POSTs it in a task of the running event loop: `send()` returns at once."""

    def __init__(
        self,
        destination: Destination,
        *,
        tenant_slugs: TenantSlugs | None = None,
        attempts: int = WEBHOOK_ATTEMPTS,
        backoff_seconds: float = BACKOFF_SECONDS,
        backoff_cap_seconds: float = BACKOFF_CAP_SECONDS,
        timeout_seconds: float = WEBHOOK_TIMEOUT_SECONDS,
        rng: random.Random | None = None,
        tally: counters.Tally | None = None,
    ) -> None:
        self.destination = destination
        self.tally = tally  # the process's Prometheus counters: alerts accepted, by type
        self.tenant_slugs = tenant_slugs
        self.attempts = attempts
        self.backoff_seconds = backoff_seconds
        self.backoff_cap_seconds = backoff_cap_seconds
        self.timeout_seconds = timeout_seconds
        self.rng = rng or random.Random()
        self.counters = AlertCounters()
        self._session: aiohttp.ClientSession | None = None
        self._pending: set[asyncio.Task] = set()

    def send(self, alert: Alert) -> asyncio.Task:
        """Log `alert` and POST it in the background; the task ends when delivery does."""
        task = asyncio.get_running_loop().create_task(self._send(alert))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        return task

    async def _send(self, alert: Alert) -> bool:
        self.counters.sent += 1
        if alert.tenant_slug is None and self.tenant_slugs is not None:
            alert = replace(alert, tenant_slug=await self.tenant_slugs(alert.tenant_id))
        body = payload(alert, public_url=self.destination.public_url)
        log.error("alert %s", json.dumps(body, sort_keys=True))
        if not self.destination.webhook_url:
            return False
        return await self.deliver(body)

    async def deliver(self, body: dict) -> bool:
        """POST `body` until the webhook takes it (2xx), refuses it for good (other 4xx),
        or the attempts are used up; between tries, full-jitter backoff."""
        if self._session is None:
            self._session = aiohttp.ClientSession(trust_env=False)
        what = f"{body['type']} of {body['run']['key'] if body['run'] else body['job']['id']}"
        for attempt in range(1, self.attempts + 1):
            retry_after = None
            try:
                async with self._session.post(
                    self.destination.webhook_url,
                    json=body,
                    timeout=aiohttp.ClientTimeout(total=self.timeout_seconds),
                ) as response:
                    kind = retry.classify_status(response.status)
                    if kind == retry.SUCCESS:
                        self.counters.delivered += 1
                        if self.tally is not None:
                            self.tally.add(counters.ALERTS, label=body["type"])
                        return True
                    problem = f"HTTP {response.status}"
                    retry_after = retry.parse_retry_after(
                        response.headers.get("Retry-After"), datetime.now(UTC)
                    )
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                kind, problem = retry.RETRY, f"{type(exc).__name__}: {exc}"
            if kind == retry.PERMANENT:
                break
            log.warning(
                "alert webhook attempt %d/%d for %s failed: %s", attempt, self.attempts, what, problem
            )
            if attempt < self.attempts:
                await asyncio.sleep(
                    retry.retry_delay(
                        attempt, self.backoff_seconds, self.backoff_cap_seconds, retry_after, self.rng
                    )
                )
        self.counters.failed += 1
        log.error("alert webhook gave up on %s after attempt %d: %s", what, attempt, problem)
        return False

    async def flush(self, timeout: float) -> set[asyncio.Task]:
        """Wait up to `timeout` seconds for the alerts sent so far; returns those still pending."""
        if not self._pending:
            return set()
        _done, pending = await asyncio.wait(set(self._pending), timeout=timeout)
        return pending

    async def close(self, timeout: float) -> None:
        """Give pending deliveries up to `timeout` seconds, then drop them."""
        pending = await self.flush(timeout)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self.tenant_slugs is not None:
            await self.tenant_slugs.close()


class BackgroundSender:
    """A WebhookSender for synchronous callers (the scheduler's sweep): it runs on a
    private event loop in one daemon thread, started at the first alert, so `send()`
    only hands the alerts over."""

    def __init__(self, destination: Destination, **options) -> None:
        self.sender = WebhookSender(destination, **options)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def send(self, alerts: Iterable[Alert]) -> list[concurrent.futures.Future]:
        """Log and POST each alert in the background; each future ends when its delivery does."""
        alerts = list(alerts)
        if not alerts:
            return []
        loop = self._running_loop()
        return [asyncio.run_coroutine_threadsafe(self._send(alert), loop) for alert in alerts]

    async def _send(self, alert: Alert) -> bool:
        return await self.sender.send(alert)

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                self._thread = threading.Thread(
                    target=self._loop.run_forever, name="alert-webhook", daemon=True
                )
                self._thread.start()
            return self._loop

    def close(self, timeout: float) -> None:
        """Give pending deliveries up to `timeout` seconds, then stop the loop."""
        with self._lock:
            loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is None or thread is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(self.sender.close(timeout), loop).result(timeout + 1)
        except (concurrent.futures.TimeoutError, TimeoutError):
            pass
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=1)
        if not thread.is_alive():
            loop.close()
