"""The executor's steps, awaited in-process against the real database (and a real HTTP
server on 127.0.0.1): each does one unit of work and returns what it did.

The event loop only runs inside `steps.run(...)`, so between steps the test uses the
ORM on its own thread, like another session would (rows it writes are committed).
"""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime, timedelta

import pytest

from jobs.tenant_services import create_tenant
from runs import attempts
from runs.attempts import history
from runs.execution.inflight import Written
from runs.models import JobRun, JobRunRow
from tests.support.executor import http_spec, queue_runs, row, set_running, task_target
from tests.support.http_target import Reply

pytestmark = pytest.mark.django_db(transaction=True)

LATER = datetime.now(UTC) + timedelta(days=1)  # queued, but not claimable


def keys_of(claimed) -> set:
    return {(r.job_id, r.scheduled_at) for r in claimed}


def test_claim_once_claims_up_to_the_tenant_cap_and_starts_the_calls(steps, http_target):
    small, _ = create_tenant(slug="small", max_concurrency=2)
    http_target.script("/slow", then=Reply(200, delay=0.5))
    queued = queue_runs(small, http_spec(http_target.url("/slow")), count=5)
    s = steps(concurrency=10)

    first = s.run(s.executor.claim_once())
    assert len(first.claimed) == 2 and first.started == first.claimed and not first.full
    assert keys_of(first.claimed) == set(queued[:2])  # oldest first
    assert JobRun.objects.filter(status="running", owner=s.executor.owner).count() == 2
    # The tenant's two slots are taken: nothing more, though the executor has eight free.
    assert s.run(s.executor.claim_once()).claimed == []

    s.calls_done()
    assert s.run(s.executor.write_outcomes_once()) == Written(written=2, fenced=0)
    assert JobRun.objects.filter(status="succeeded").count() == 2
    assert len(http_target.received("/slow")) == 2
    assert keys_of(s.run(s.executor.claim_once()).claimed) == set(queued[2:4])
    assert s.executor.counters.claimed == 4 and s.executor.counters.succeeded == 2


def test_write_outcomes_once_writes_the_shared_history_entry(steps, tenant, http_target):
    (key,) = queue_runs(tenant, http_spec(http_target.url("/ok")))
    s = steps()
    s.run(s.executor.claim_once())
    s.calls_done()
    written = s.run(s.executor.write_outcomes_once())
    assert (written.written, written.fenced) == (1, 0)
    run = row(key)
    assert run.status == "succeeded" and run.result_code == 200
    # A first success stores no entry; its history reads the one its columns say.
    assert run.attempts == []
    (entry,) = attempts.history(run)
    assert set(entry) == set(attempts.FIELDS)
    assert (entry["attempt"], entry["owner"], entry["outcome"]) == (1, s.executor.owner, "succeeded")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", entry["started_at"])
    # Nothing left to write: the step says so.
    assert s.run(s.executor.write_outcomes_once()) == Written()


def test_write_outcomes_once_refuses_a_fenced_write(steps, tenant, http_target):
    (key,) = queue_runs(tenant, http_spec(http_target.url("/ok")))
    s = steps()
    s.run(s.executor.claim_once())
    s.calls_done()
    # Meanwhile our lease lapsed and another executor claimed the run as attempt 2.
    JobRunRow.objects.filter(job_id=key[0], scheduled_at=key[1]).update(attempt=2, owner="other:1")

    written = s.run(s.executor.write_outcomes_once())

    assert (written.written, written.fenced) == (0, 1)
    run = row(key)
    assert (run.status, run.attempt, run.owner, run.attempts) == ("running", 2, "other:1", [])
    assert run.result_code is None and s.executor.counters.fenced == 1
    assert s.executor.in_flight() == []


def test_heartbeat_once_extends_held_leases_and_drops_lost_runs(steps, tenant, http_target):
    http_target.script("/slow", then=Reply(200, delay=5))
    held, cancelled = queue_runs(tenant, http_spec(http_target.url("/slow")), count=2, lease_seconds=60)
    s = steps()
    assert len(s.run(s.executor.claim_once()).claimed) == 2
    soon = datetime.now(UTC) + timedelta(seconds=2)
    JobRunRow.objects.filter(status="running").update(lease_until=soon)
    JobRunRow.objects.filter(job_id=cancelled[0], scheduled_at=cancelled[1]).update(status="cancelled")

    beat = s.run(s.executor.heartbeat_once())

    assert beat.held == 1
    assert [(k[0], k[1]) for k in beat.lost] == [cancelled]
    assert row(held).lease_until > datetime.now(UTC) + timedelta(seconds=30)
    assert [(e.run.job_id, e.run.scheduled_at) for e in s.executor.in_flight()] == [held]
    assert s.executor.counters.fenced == 1
    # The lost run's call was cancelled: it will write nothing.
    s.run(asyncio.sleep(0))
    assert row(cancelled).status == "cancelled" and row(cancelled).attempts == []


def test_reap_once_hands_back_expired_leases_and_kills_runs_out_of_attempts(steps, tenant):
    orphan, last_chance = queue_runs(tenant, task_target("noop"), count=2, not_before=LATER, max_attempts=3)
    set_running(orphan, attempt=1, lease=timedelta(seconds=-60))
    set_running(last_chance, attempt=3, lease=timedelta(seconds=-60))
    s = steps()

    reaped = s.run(s.executor.reap_once())

    assert {(r.job_id, r.scheduled_at): r.status for r in reaped} == {orphan: "retrying", last_chance: "dead"}
    assert row(orphan).status == "retrying" and row(orphan).lease_until is None
    assert row(last_chance).status == "dead" and history(row(last_chance))[-1]["outcome"] == "lease expired"
    assert (s.executor.counters.lease_expiries, s.executor.counters.dead) == (2, 1)
    assert s.run(s.executor.reap_once()) == []  # nothing left to reap


def test_node_beat_once_registers_the_executor_with_its_in_flight_count(steps):
    from runs.models import ExecutorNode

    s = steps(concurrency=7)
    assert s.run(s.executor.node_beat_once()) == 0
    node = ExecutorNode.objects.get(node_id=s.executor.owner)
    assert node.concurrency == 7 and node.in_flight == 0


def test_shutdown_leaves_a_run_whose_outcome_waits_for_the_writer(steps, tenant, http_target):
    """Shutdown hands back the runs whose call did not finish. A call that finished and
    whose outcome still waits for the writer keeps its run: handed back, its run would be
    retried and the target called again."""
    (key,) = queue_runs(tenant, http_spec(http_target.url("/ok")))
    s = steps()
    s.run(s.executor.claim_once())
    s.calls_done()
    assert [c.status for _, c in s.executor._results] == ["succeeded"]  # not written yet
    s.run(s.executor._drain(grace=0.0))
    assert row(key).status == "running"  # its outcome is still to be written, not handed back
    assert s.run(s.executor.write_outcomes_once()) == Written(written=1, fenced=0)
    assert row(key).status == "succeeded"
    assert len(http_target.received("/ok")) == 1
