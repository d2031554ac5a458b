"""Claim rules with real executor processes: tenant limits, priority, overlap, poison runs."""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from datetime import timedelta

import pytest
from django.db import connections

from jobs.tenant_services import create_tenant
from runs.attempts import history
from runs.keys import run_key
from runs.models import JobRun
from scheduler_project.citus import citus_installed
from tests.support.executor import http_spec, queue_runs, row, task_target, wait_for, wait_log, wait_status
from tests.support.http_target import Reply

pytestmark = pytest.mark.processes


class Sampler:
    """Counts `running` rows matching a filter every 50 ms in a background thread."""

    def __init__(self, **filters):
        self.filters = filters
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                self.samples.append(JobRun.objects.filter(status="running", **self.filters).count())
                time.sleep(0.05)
        finally:
            connections.close_all()

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def test_tenant_max_concurrency_holds_across_executors(processes, http_target):
    small, _ = create_tenant(slug="small", max_concurrency=2)
    http_target.script("/slow", then=Reply(200, delay=1))
    keys = queue_runs(small, http_spec(http_target.url("/slow")), count=20)
    started = time.monotonic()
    with Sampler(tenant_id=small.id) as sampler:
        # Three claimers that could run three at once between them: only the tenant
        # limit, enforced across processes, keeps it at two.
        for _ in range(3):
            processes.start("run_executor", "--concurrency", "1")
        wait_for(
            lambda: JobRun.objects.filter(tenant_id=small.id, status="succeeded").count() == 20,
            timeout=40,
            what="all 20 runs",
        )
    took = time.monotonic() - started
    assert max(sampler.samples) == 2, sampler.samples
    # Sampled often enough to see a third call, which would last a second: at least twice
    # a second (a count on Citus asks every shard: a sample takes longer there).
    assert len(sampler.samples) >= 2 * took, (len(sampler.samples), took)
    owners = {row(k).owner for k in keys}
    assert len(owners) >= 2  # the claimers really did compete


def test_higher_priority_starts_first_in_a_backlog(processes, tenant, http_target):
    target = http_spec(http_target.url("/ok"))
    low = queue_runs(tenant, target, count=5, priority=0)
    # Later scheduled_at, higher priority: priority wins over age.
    high = queue_runs(tenant, target, count=5, priority=9, start=row(low[-1]).scheduled_at)
    processes.start("run_executor", "--concurrency", "1")
    wait_for(lambda: all(row(k).status == "succeeded" for k in low + high), what="the backlog")
    # When each call arrived at the target: runs claimed ahead in one batch share the
    # row's started_at, the claim's time, and are called in claim order.
    arrived = {r.headers["idempotency-key"]: r.at for r in http_target.received("/ok")}
    called = {k: arrived[run_key(*k)] for k in low + high}
    assert max(called[k] for k in high) < min(called[k] for k in low)
    # Within a priority, oldest scheduled_at first.
    started = [called[k] for k in low]
    assert started == sorted(started) and len(set(started)) == len(started)


def test_poison_task_dies_after_max_attempts_without_blocking_others(processes, tenant):
    (poison,) = queue_runs(
        tenant, task_target("fail"), max_attempts=3, retry_backoff_seconds=0, retry_backoff_cap_seconds=0
    )
    (permanent,) = queue_runs(tenant, task_target("fail_permanently"))
    # An unknown task is retryable (another executor may have it, tests/test_task_registry.py);
    # one allowed attempt makes it die here without waiting out a backoff.
    (unknown,) = queue_runs(tenant, task_target("no_such_task"), max_attempts=1)
    healthy = queue_runs(tenant, task_target("noop"), count=10)
    processes.start("run_executor", "--concurrency", "2")
    run = wait_status(poison, "dead")
    assert run.attempt == 3
    assert [a["outcome"] for a in history(run)] == ["retry", "retry", "dead"]
    assert "RuntimeError: task 'fail' always fails" in run.last_error
    permanent_run = wait_status(permanent, "dead")
    assert permanent_run.attempt == 1 and permanent_run.last_error.startswith("PermanentError")
    unknown_run = wait_status(unknown, "dead")
    assert unknown_run.attempt == 1 and unknown_run.last_error.startswith("unknown task 'no_such_task'")
    for key in healthy:
        assert wait_status(key, "succeeded").attempt == 1


def test_skip_policy_never_runs_two_runs_of_a_job_at_once(processes, tenant, http_target):
    job_id = uuid.uuid4()
    http_target.script("/slow", then=Reply(200, delay=0.5))
    keys = queue_runs(
        tenant, http_spec(http_target.url("/slow")), count=3, job_id=job_id, overlap_policy="skip"
    )
    with Sampler(job_id=job_id) as sampler:
        processes.start("run_executor")
        processes.start("run_executor")
        for key in keys:
            wait_status(key, "succeeded")
    assert max(sampler.samples) == 1, sampler.samples
    # One after another, oldest first: each call arrived at the target after the one
    # before it was answered (the target answers after 0.5 s).
    arrived = {r.headers["idempotency-key"]: r.at for r in http_target.received("/slow")}
    called = [arrived[run_key(*k)] for k in keys]
    for earlier, later in itertools.pairwise(called):
        assert later - earlier >= 0.5
    runs = [row(k) for k in keys]
    # The rows' started_at is the claim's time. On plain PostgreSQL it follows the
    # predecessor's finish too; on Citus the coordinator stamps it when the statement
    # starts, before the worker takes the snapshot that saw the predecessor finished,
    # so it can precede that finish by the coordinator's dispatch latency
    # (docs/decisions/0033-claim-transaction.md).
    with connections["default"].cursor() as cursor:
        on_citus = citus_installed(cursor)
    if not on_citus:
        for earlier, later in itertools.pairwise(runs):
            assert earlier.finished_at <= later.started_at


def test_allow_policy_runs_concurrently(processes, tenant):
    job_id = uuid.uuid4()
    keys = queue_runs(tenant, task_target("sleep", seconds=1), count=3, job_id=job_id, overlap_policy="allow")
    with Sampler(job_id=job_id) as sampler:
        processes.start("run_executor")
        for key in keys:
            wait_status(key, "succeeded")
    assert max(sampler.samples) == 3


def test_cancel_previous_cancels_the_running_older_run(processes, tenant):
    job_id = uuid.uuid4()
    (older,) = queue_runs(
        tenant,
        task_target("sleep", seconds=30),
        job_id=job_id,
        overlap_policy="cancel_previous",
        lease_seconds=3,
    )
    proc = processes.start("run_executor")
    wait_status(older, "running")
    (newer,) = queue_runs(
        tenant,
        task_target("noop"),
        job_id=job_id,
        overlap_policy="cancel_previous",
        start=row(older).scheduled_at + timedelta(minutes=1),
    )
    assert wait_status(newer, "succeeded").attempt == 1
    cancelled = row(older)
    assert cancelled.status == "cancelled" and cancelled.last_error == "cancelled by a newer run"
    assert cancelled.finished_at is not None
    wait_log(processes, proc, "fenced: attempt 1 of", timeout=5)
    assert [a["outcome"] for a in history(row(older))] == ["cancelled"]
