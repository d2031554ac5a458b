"""Claiming ahead: once calls are known to be short, a claim fills the free slots and a
queue behind them; queued runs start as calls return, never more calls than slots, and
on shutdown the ones never sent go back without using their attempt."""

from __future__ import annotations

import asyncio
import time

import pytest

from jobs.tenant_services import create_tenant
from runs.models import JobRun
from tests.support.executor import http_spec, queue_runs, row
from tests.support.http_target import Reply

pytestmark = pytest.mark.django_db(transaction=True)


def _calling(s) -> int:
    return sum(1 for e in s.executor.in_flight() if e.task is not None and not e.task.done())


def _waiting(s) -> int:
    return sum(1 for e in s.executor.in_flight() if e.task is None)


def test_short_calls_claim_ahead_of_the_slots_and_the_queue_feeds_them(steps, http_target):
    tenant, _ = create_tenant(slug="ahead", max_concurrency=100)
    http_target.script("/short", then=Reply(200, delay=0.05))
    queue_runs(tenant, http_spec(http_target.url("/short")), count=12)
    s = steps(concurrency=2, claim_batch=12)
    # As measured once calls have returned: 1 ms each, far below CLAIM_AHEAD_SECONDS.
    s.executor._slots.call_seconds = 0.001

    claimed = s.run(s.executor.claim_once()).claimed

    # Two slots plus a queue: one claim for what took several of two runs each.
    assert len(claimed) > 2
    assert (_calling(s), _waiting(s)) == (2, len(claimed) - 2)
    assert JobRun.objects.filter(status="running", owner=s.executor.owner).count() == len(claimed)
    deadline = time.monotonic() + 60
    while _waiting(s) or _calling(s):
        assert _calling(s) <= 2  # the queue never adds calls beyond the slots
        assert time.monotonic() < deadline, "the queued runs were not called"
        s.run(asyncio.sleep(0.01))
    while s.executor._results:
        s.run(s.executor.write_outcomes_once())
    assert all(row((r.job_id, r.scheduled_at)).status == "succeeded" for r in claimed)
    assert len(http_target.received("/short")) == len(claimed) == s.executor.counters.claimed


def test_shutdown_puts_back_queued_runs_without_using_their_attempt(steps, http_target):
    tenant, _ = create_tenant(slug="unsent", max_concurrency=100)
    http_target.script("/slow", then=Reply(200, delay=1))
    keys = queue_runs(tenant, http_spec(http_target.url("/slow")), count=6, max_attempts=1)
    s = steps(concurrency=2, claim_batch=6)
    s.executor._slots.call_seconds = 0.001
    claimed = s.run(s.executor.claim_once()).claimed
    assert len(claimed) > 2
    called = {e.run.job_id for e in s.executor.in_flight() if e.task is not None}
    unsent = {r.job_id for r in claimed} - called

    assert s.run(s.executor.put_back_unsent()) == len(unsent)

    assert _waiting(s) == 0 and _calling(s) == 2
    for key in keys:
        run = row(key)
        if key[0] in called:
            assert run.status == "running"
        elif key[0] in unsent:
            # Its one attempt is still to come: queued, not dead, with no lease and no history.
            assert (run.status, run.attempt, run.deferrals, run.lease_until) == ("queued", 1, 1, None)
            assert run.attempts == []
    s.calls_done()
    while s.executor._results:
        s.run(s.executor.write_outcomes_once())
    assert len(http_target.received("/slow")) == 2


def test_the_claim_batch_follows_the_engine(steps, http_target):
    """On Citus each claim and outcome statement is planned on the coordinator and on its
    worker, so one claim takes up to CITUS_CLAIM_BATCH runs there; plain PostgreSQL keeps
    CLAIM_BATCH."""
    from django.db import connection

    from runs.execution.executor import CITUS_CLAIM_BATCH, CLAIM_BATCH
    from scheduler_project.citus import citus_installed

    with connection.cursor() as cursor:
        batch = CITUS_CLAIM_BATCH if citus_installed(cursor) else CLAIM_BATCH
    tenant, _ = create_tenant(slug="batch", max_concurrency=1000)
    queue_runs(tenant, http_spec(http_target.url("/never-called")), count=CITUS_CLAIM_BATCH + 20)
    s = steps(concurrency=2)
    assert s.executor.claim_batch == batch
    # Calls known to be far shorter than CLAIM_AHEAD_SECONDS: only the batch bounds the queue.
    s.executor._slots.call_seconds = 1e-5
    # The queued runs must not start: the claim alone is under test.
    s.executor._slots.calls = s.executor.concurrency

    claimed = s.run(s.executor.claim_once()).claimed

    assert len(claimed) == batch
    assert JobRun.objects.filter(status="running", owner=s.executor.owner).count() == batch
    s.run(s.executor.put_back_unsent())
