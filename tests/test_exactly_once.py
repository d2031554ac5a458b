"""The product in one test: schedulers and executors together, SIGKILLed and
SIGSTOPped mid-batch, and afterwards every occurrence exists exactly once, every one
succeeded, and no result was written by an attempt that had been fenced off.

Real processes, real PostgreSQL, a real HTTP target on 127.0.0.1. The stalls are
longer than both leases (3 s), so stalled schedulers lose their partitions and
stalled executors lose the runs they were calling; after SIGCONT they must write
nothing.
"""

from __future__ import annotations

import os
import random
import signal
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.db.models import Q

from jobs.models import Job
from runs.models import ACTIVE_STATUSES, JobRun
from tests.support.exactly_once import RUN_FIELDS, audit
from tests.support.http_target import Reply
from tests.support.scheduler import (
    bulk_interval_jobs,
    expected_interval_slots,
    wait_dispatched,
    wait_drained,
    wait_until,
)

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

LEASE = 3
ENV = {"SCHEDULER_LEASE_SECONDS": str(LEASE)}
SCHEDULED_TRIGGERS = {"schedule", "catch_up"}


def make_jobs(tenant, http_target) -> list[Job]:
    rng = random.Random(7)
    base = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=3)
    common = dict(
        lease_seconds=LEASE,
        max_attempts=20,
        retry_backoff_seconds=1,
        retry_backoff_cap_seconds=2,
        overlap_policy="allow",
        # A job comes back once per dispatch round, so on a machine slow enough for a
        # round to outlast a job's 2-4 s interval its slots fall behind; past the misfire
        # threshold (60 s) the default policy would fire only the latest of them and
        # the rest would read as lost here. Catch-up fires each one, late (up to
        # max_catch_up, 100 slots, behind): a slot this test misses is then one the
        # schedulers lost, not one a slow machine's rounds left behind.
        misfire_policy="catch_up",
    )
    fast_target = {"type": "http", "url": http_target.url("/fast"), "method": "POST", "timeout_seconds": 10}
    slow_target = {"type": "http", "url": http_target.url("/slow"), "method": "POST", "timeout_seconds": 10}
    fast = bulk_interval_jobs(
        tenant,
        target=fast_target,
        anchors_and_intervals=[
            (base + timedelta(milliseconds=rng.randrange(3000)), rng.randint(2, 4)) for _ in range(300)
        ],
        **common,
    )
    # Calls of two seconds: a stalled executor is always caught with some in flight.
    slow = bulk_interval_jobs(
        tenant,
        target=slow_target,
        anchors_and_intervals=[(base + timedelta(milliseconds=rng.randrange(3000)), 3) for _ in range(30)],
        **common,
    )
    return fast + slow


def test_exactly_once_while_schedulers_and_executors_are_killed_and_stalled(tenant, processes, http_target):
    tenant.max_concurrency = 1000
    tenant.save()
    http_target.script("/slow", then=Reply(delay=2.0))
    jobs = make_jobs(tenant, http_target)

    schedulers = [processes.start("run_scheduler", env=ENV) for _ in range(2)]
    executors = [processes.start("run_executor", "--concurrency", "16", env=ENV) for _ in range(2)]
    stalled_executors = []

    def calls_of(proc) -> int:
        return JobRun.objects.filter(status="running", owner__contains=f":{proc.pid}:").count()

    def caught_mid_call(proc) -> None:
        # The chaos must catch an executor with calls in flight, or nothing is fenced
        # off; wait for that instead of trusting the clock (a slow machine, Citus).
        wait_until(lambda: calls_of(proc) > 0, timeout=30, what=f"executor {proc.pid} to hold a call")

    def stall(proc, seconds: float) -> None:
        os.kill(proc.pid, signal.SIGSTOP)
        time.sleep(seconds)
        os.kill(proc.pid, signal.SIGCONT)

    time.sleep(5)
    for _ in range(2):
        schedulers[0].kill()  # SIGKILL mid-batch: its transaction dies with it
        schedulers[0].wait()
        schedulers[0] = processes.start("run_scheduler", env=ENV)
        time.sleep(2)
        stalled_executors.append(executors[0])
        caught_mid_call(executors[0])
        stall(executors[0], LEASE * 2 + 1)
        time.sleep(1)
        caught_mid_call(executors[1])
        executors[1].kill()
        executors[1].wait()
        executors[1] = processes.start("run_executor", "--concurrency", "16", env=ENV)
        time.sleep(2)
        stall(schedulers[1], LEASE * 2 + 1)
        time.sleep(1)
    chaos_ended = datetime.now(UTC)
    # Slots due well before the chaos ended must all have been dispatched by now.
    cutoff = chaos_ended - timedelta(seconds=LEASE * 2)
    wait_dispatched(jobs, cutoff=cutoff, timeout=60)
    for proc in schedulers:
        proc.terminate()
    for proc in schedulers:
        assert proc.wait(timeout=20) == 0, processes.log_of(proc)[-3000:]
    # A scheduler dispatches slots that are due, never ahead: none can be later than this.
    stopped = datetime.now(UTC)

    job_ids = [j.id for j in jobs]
    # On Citus (make test-citus) two executors drain a few dozen runs a second here, and
    # the backlog the chaos leaves varies by machine: wait while runs keep finishing.
    took = wait_drained(
        lambda: JobRun.objects.filter(job_id__in=job_ids, status__in=ACTIVE_STATUSES).count(),
        # A run deferred to a later minute stalls it (the retry budget once held 100 re-sends
        # at 10 a minute: past either bound).
        stalled_after=30,
        timeout=300,
        what="dispatched runs waiting to finish",
    )
    print(f"the backlog drained in {took:.1f}s after the schedulers stopped")
    for proc in executors:
        proc.terminate()
    for proc in executors:
        assert proc.wait(timeout=30) == 0, processes.log_of(proc)[-3000:]

    runs = list(JobRun.objects.filter(job_id__in=job_ids).values_list(*RUN_FIELDS))
    seen = {(r.headers["idempotency-key"], r.headers["x-run-attempt"]) for r in http_target.received()}
    # Slots after the cutoff, up to the schedulers' exit (however long the dispatch took to
    # catch up), may or may not have fired; none may be off the grid.
    grid_end = expected_interval_slots(jobs, cutoff=stopped)
    result = audit(runs, expected=grid_end, seen=seen)
    # How far behind the schedulers fell: slots found past the misfire threshold fire as catch_up.
    print(f"runs fired late through catch-up: {result.triggers.get('catch_up', 0)}")

    # Exactly once: nothing duplicated, nothing missing up to the cutoff, nothing off the grid.
    assert result.duplicates == []
    expected = expected_interval_slots(jobs, cutoff=cutoff)
    assert len(expected) > 3000
    assert expected - {(r[0], r[1]) for r in runs} == set(), "missing occurrences"
    assert result.extra == [], "occurrences that are not slots of their job"
    # Only the schedule fired them: on time, or late through catch-up (make_jobs).
    assert set(result.triggers) <= SCHEDULED_TRIGGERS

    # Every run finished well, and its stored result is its final attempt's.
    assert result.statuses == {"succeeded": len(runs)}
    assert result.bad_histories == []
    assert result.fenced_writes == [], "a fenced-off attempt wrote a result"

    # The chaos really fenced executors off: attempts were reclaimed, and the stalled
    # executors noticed after SIGCONT instead of writing.
    assert result.reclaimed_attempts > 0
    assert any("fenced" in processes.log_of(p) for p in stalled_executors)

    # The target saw every final attempt under the run's idempotency key.
    assert result.final_attempt_not_at_target == []
    assert not JobRun.objects.filter(Q(job_id__in=job_ids) & ~Q(trigger__in=SCHEDULED_TRIGGERS)).exists()
