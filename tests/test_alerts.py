"""Alerts: one payload schema and one sender (runs/alerts.py) for the executor's alerts
(`run.dead`, `task.missing`) and the scheduler's sweep (`job.overdue`, `job.failing`).

The executor's steps and the scheduler's step run in-process against the real database;
every alert arrives over HTTP at a real server on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from datetime import timedelta
from urllib.parse import urlsplit

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, transaction

from jobs.dispatch.partition_leases import NAMESPACE
from jobs.dispatch.scheduler import Scheduler
from jobs.health import SWEEP_LOCK_KEY
from jobs.models import Job
from jobs.services import partition_for
from runs import alerts, rows
from runs.keys import format_utc, run_key
from tests.conftest import database_url
from tests.support.executor import http_spec, queue_runs, task_target, wait_for
from tests.support.http_target import Reply
from tests.support.scheduler import make_job

pytestmark = pytest.mark.django_db(transaction=True)

MINUTE = timedelta(minutes=1)
TOP_LEVEL = {"type", "at", "tenant", "job", "run", "console_url", "detail"}
PUBLIC_URL = "https://cron.example.net:8443"


def db_now():
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


def sweeper() -> Scheduler:
    """A scheduler that owns partition 0 of 1 only: it sweeps every job but dispatches
    none of those made by `job_outside_partition_0` (SCHEDULER_PARTITIONS is 256)."""
    return Scheduler(
        node_id="sweeper",
        conninfo=database_url(),
        heartbeat_thread=False,
        maintain_partitions=False,
        partitions_count=1,
    )


def job_outside_partition_0(tenant, **fields) -> Job:
    job_id = next(i for i in iter(uuid.uuid4, None) if partition_for(i) != 0)
    return make_job(tenant, id=job_id, **fields)


def sweep_once(sched: Scheduler) -> float:
    """One scheduler step that sweeps (as if 5 s had passed); returns how long it took."""
    sched._next_alert_sweep = 0.0
    started = time.monotonic()
    sched.step()
    return time.monotonic() - started


def an_overdue_alert() -> alerts.Alert:
    now = db_now()
    return alerts.Alert.job_overdue(
        at=now, tenant_id=1, tenant_slug="acme", job_id=uuid.uuid4(), job_name="sync", slot=now - MINUTE
    )


@pytest.fixture
def webhook(settings, http_target):
    settings.SCHEDULER_ALERT_WEBHOOK_URL = http_target.url("/alerts")
    settings.CRONYARD_PUBLIC_URL = PUBLIC_URL
    settings.SCHEDULER_PARTITIONS = 256
    return http_target


def test_every_alert_type_arrives_with_one_schema(steps, tenant, webhook, admin_client):
    # The executor's two kinds: a run refused for good (404) dies; a run naming a task no
    # executor registered is retried, and each attempt alerts.
    webhook.script("/gone", then=Reply(404, body=b"no such thing"))
    (dead,) = queue_runs(tenant, http_spec(webhook.url("/gone")), job_name="nightly-report")
    (missing,) = queue_runs(
        tenant, task_target("not_registered_anywhere"), job_name="cleanup", max_attempts=3
    )
    s = steps(alert_destination=alerts.Destination.from_settings())
    s.run(s.executor.claim_once())
    s.calls_done()
    s.run(s.executor.write_outcomes_once())
    s.alerts_done()

    # The scheduler's two kinds, from its sweep.
    now = db_now()
    late = job_outside_partition_0(tenant, name="hourly-sync", next_run_at=now - 10 * MINUTE)
    failing = job_outside_partition_0(tenant, name="backup", next_run_at=now + MINUTE, alert_after_failures=2)
    Job.objects.filter(pk=failing.pk).update(consecutive_failures=2, last_failure_at=now - MINUTE)
    sched = sweeper()
    try:
        sweep_once(sched)
        wait_for(lambda: len(webhook.received("/alerts")) >= 4, what="four alerts")
    finally:
        sched.close()

    bodies = {body["type"]: body for body in webhook.json_bodies("/alerts")}
    assert set(bodies) == {"run.dead", "task.missing", "job.overdue", "job.failing"}
    for kind, body in bodies.items():
        assert set(body) == TOP_LEVEL, kind
        assert body["tenant"] == {"id": tenant.id, "slug": "acme"}, kind
        assert set(body["job"]) == {"id", "name"}, kind
        assert body["at"].endswith("Z") and body["console_url"].startswith(f"{PUBLIC_URL}/admin/"), kind
    for received in webhook.received("/alerts"):
        assert received.method == "POST" and received.headers["content-type"] == "application/json"

    run_dead = bodies["run.dead"]
    assert run_dead["job"] == {"id": str(dead[0]), "name": "nightly-report"}
    assert run_dead["run"] == {"key": run_key(*dead), "scheduled_at": format_utc(dead[1]), "attempt": 1}
    assert run_dead["detail"] == {"result_code": 404, "last_error": "HTTP 404: no such thing"}

    task_missing = bodies["task.missing"]
    assert task_missing["job"] == {"id": str(missing[0]), "name": "cleanup"}
    assert task_missing["run"] == {
        "key": run_key(*missing),
        "scheduled_at": format_utc(missing[1]),
        "attempt": 1,
    }
    assert task_missing["detail"] == {"task": "not_registered_anywhere", "executor": s.executor.owner}

    overdue = bodies["job.overdue"]
    assert overdue["job"] == {"id": str(late.id), "name": "hourly-sync"} and overdue["run"] is None
    assert overdue["detail"]["scheduled_at"] == format_utc(late.next_run_at)
    assert 590 < overdue["detail"]["overdue_seconds"] < 700

    failing_body = bodies["job.failing"]
    assert failing_body["job"] == {"id": str(failing.id), "name": "backup"} and failing_body["run"] is None
    assert failing_body["detail"] == {
        "consecutive_failures": 2,
        "last_failure_at": format_utc(now - MINUTE),
    }

    # The links open the console: the run (found by its key) or the job's page.
    for kind, shows, hides in (
        ("run.dead", "nightly-report", "cleanup"),
        ("task.missing", "cleanup", "nightly-report"),
        ("job.overdue", "hourly-sync", "backup"),
        ("job.failing", "backup", "hourly-sync"),
    ):
        link = urlsplit(bodies[kind]["console_url"])
        page = admin_client.get(f"{link.path}?{link.query}" if link.query else link.path)
        assert page.status_code == 200, kind
        text = page.content.decode()
        assert shows in text and hides not in text, kind


def test_a_webhook_answering_500_is_retried_with_backoff_until_it_takes_the_alert(webhook):
    """Through the scheduler's entry (a private event loop in a thread), the code the
    executor awaits: 500, 500, then 200 is three POSTs, the second and third after the
    full-jitter delays drawn (here drawn at their bounds, base * 2**n)."""

    class Ceiling(random.Random):
        def uniform(self, a: float, b: float) -> float:
            return b

    webhook.script("/alerts", Reply(500), Reply(500), then=Reply(200))
    sender = alerts.BackgroundSender(alerts.Destination.from_settings(), backoff_seconds=0.2, rng=Ceiling())
    alert = an_overdue_alert()
    try:
        (delivered,) = sender.send([alert])
        assert delivered.result(timeout=10) is True
    finally:
        sender.close(timeout=1)
    arrivals = [r.at for r in webhook.received("/alerts")]
    assert len(arrivals) == 3
    assert 0.4 <= arrivals[1] - arrivals[0] < 0.4 + 0.5
    assert 0.8 <= arrivals[2] - arrivals[1] < 0.8 + 0.5
    assert webhook.json_bodies("/alerts")[0] == webhook.json_bodies("/alerts")[2]
    assert sender.sender.counters == alerts.AlertCounters(sent=1, delivered=1, failed=0)


def test_a_webhook_refusing_the_alert_is_not_retried_and_one_that_stays_down_is_given_up(webhook):
    alert = an_overdue_alert()
    sender = alerts.BackgroundSender(alerts.Destination.from_settings(), backoff_seconds=0.01, attempts=3)
    try:
        webhook.script("/alerts", then=Reply(400))
        (refused,) = sender.send([alert])
        assert refused.result(timeout=10) is False
        assert len(webhook.received("/alerts")) == 1

        webhook.script("/alerts", then=Reply(503))
        (down,) = sender.send([alert])
        assert down.result(timeout=10) is False
        assert len(webhook.received("/alerts")) == 1 + 3
    finally:
        sender.close(timeout=1)
    assert sender.sender.counters == alerts.AlertCounters(sent=2, delivered=0, failed=2)


def test_a_slow_webhook_holds_no_lock_and_neither_process_waits_for_it(steps, tenant, webhook):
    webhook.script("/alerts", then=Reply(200, delay=3))
    job = job_outside_partition_0(tenant, name="hourly-sync", next_run_at=db_now() - 10 * MINUTE)
    sched = sweeper()
    try:
        assert sweep_once(sched) < 1.5
        wait_for(lambda: webhook.received("/alerts"), what="the overdue alert's POST")
        # While the webhook has not answered: the sweep's lock is free and the job's row
        # is not locked (the marks were committed before the POST).
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_xact_lock(%s, %s)", [NAMESPACE, SWEEP_LOCK_KEY])
            assert cursor.fetchone()[0] is True
            cursor.execute("SELECT overdue_alerted_for FROM jobs WHERE id = %s FOR UPDATE NOWAIT", [job.id])
            assert cursor.fetchone()[0] == job.next_run_at
    finally:
        sched.close()

    webhook.script("/gone", then=Reply(404))
    queue_runs(tenant, http_spec(webhook.url("/gone")))
    s = steps(alert_destination=alerts.Destination.from_settings())
    s.run(s.executor.claim_once())
    s.calls_done()
    started = time.monotonic()
    assert s.run(s.executor.write_outcomes_once()).written == 1
    assert time.monotonic() - started < 1.5  # the run.dead POST goes on in the background
    s.alerts_done()
    assert [b["type"] for b in webhook.json_bodies("/alerts")] == ["job.overdue", "run.dead"]


def test_the_console_link_needs_an_http_url(settings):
    settings.CRONYARD_PUBLIC_URL = "cron.example.net"
    with pytest.raises(ImproperlyConfigured, match="CRONYARD_PUBLIC_URL"):
        alerts.Destination.from_settings()


def test_an_alert_whose_tenant_slug_cannot_be_read_still_goes_with_a_null_slug(webhook, tenant):
    """The executor reads a tenant's slug before sending (runs carry only its id); a
    database it cannot reach costs the alert its slug, not the alert."""
    (key,) = queue_runs(tenant, task_target("noop"), job_name="nightly-report")
    reaped = rows.ReapedRun(key[0], key[1], tenant.id, "nightly-report", 3, "gone:1", "dead", "lease expired")
    unreachable = alerts.TenantSlugs("postgres://cronyard@127.0.0.1:1/cronyard")
    sender = alerts.WebhookSender(alerts.Destination.from_settings(), tenant_slugs=unreachable)

    async def send() -> bool:
        try:
            return await sender.send(alerts.Alert.run_dead(reaped, result_code=None, error="lease expired"))
        finally:
            await sender.close(timeout=1)

    assert asyncio.run(send()) is True
    (body,) = webhook.json_bodies("/alerts")
    assert body["tenant"] == {"id": tenant.id, "slug": None}
    assert body["run"]["key"] == run_key(*key) and body["detail"]["last_error"] == "lease expired"
