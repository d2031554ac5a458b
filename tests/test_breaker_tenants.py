"""One tenant's failing host never holds back another tenant's runs: circuit breakers and
retry budgets are kept per (tenant, host), and a paused job's runs never probe. Real
executor processes against one real HTTP server on 127.0.0.1 serving /fail and /ok."""

from __future__ import annotations

import time

import pytest

from jobs.services import pause_job
from jobs.tenant_services import create_tenant
from runs.execution.breaker_rules import host_key
from runs.models import JobRun, TargetHost
from tests.support.executor import http_spec, queue_runs, row, wait_for, wait_status
from tests.support.http_target import Reply
from tests.support.scheduler import make_job

pytestmark = pytest.mark.processes


def _breaker(tenant, host: str) -> str:
    found = TargetHost.objects.filter(tenant_id=tenant.id, host=host).first()
    return found.state if found else "closed"


def _deferrals(job) -> int:
    return sum(JobRun.objects.filter(job_id=job.id).values_list("deferrals", flat=True))


def test_another_tenants_failures_never_defer_runs_and_a_paused_job_never_probes(processes, http_target):
    alpha, _ = create_tenant(slug="alpha", max_concurrency=100)
    beta, _ = create_tenant(slug="beta", max_concurrency=100)
    http_target.script("/fail", then=Reply(500, body=b"fail"))
    fail, ok = http_target.url("/fail"), http_target.url("/ok")
    host = host_key(ok)
    assert host_key(fail) == host
    failing = make_job(beta, next_run_at=None, name="failing", target=http_spec(fail))
    queue_runs(
        beta,
        http_spec(fail),
        count=5,
        job_id=failing.id,
        overlap_policy="allow",
        max_attempts=50,
        retry_backoff_seconds=1,
        retry_backoff_cap_seconds=1,
    )
    # Short cool-downs: a probe every 1-2 s while beta's breaker is open.
    processes.start(
        "run_executor",
        env={"EXECUTOR_CIRCUIT_COOLDOWN_SECONDS": "1", "EXECUTOR_CIRCUIT_MAX_COOLDOWN_SECONDS": "2"},
    )
    wait_for(lambda: _breaker(beta, host) != "closed", timeout=30, what="beta's failures to open its breaker")

    # Alpha's runs to the same host go out at once: beta's open breaker is not theirs.
    sent = queue_runs(alpha, http_spec(ok), count=10, max_attempts=1)
    wait_for(
        lambda: all(row(k).status == "succeeded" or row(k).deferrals for k in sent),
        timeout=30,
        what="alpha's runs to be sent or deferred",
    )
    runs = [row(k) for k in sent]
    assert [(r.status, r.deferrals, r.last_error) for r in runs] == [("succeeded", 0, "")] * 10
    assert _breaker(beta, host) != "closed" and _breaker(alpha, host) == "closed"

    # Beta's breaker is probed (one of its job's runs a cool-down) until beta pauses the
    # job: then its deferred runs still come up, but none is sent as the probe.
    wait_for(
        lambda: len(http_target.received("/fail")) > 5,  # one first attempt per run, then probes
        timeout=15,
        what="a probe of beta's open breaker",
    )
    pause_job(job=failing, actor="test")
    time.sleep(1.5)  # a probe admitted before the pause may still arrive
    calls, deferrals = len(http_target.received("/fail")), _deferrals(failing)
    time.sleep(6)  # three cool-downs or more
    assert len(http_target.received("/fail")) == calls, "a paused job's run was sent as the probe"
    assert _deferrals(failing) > deferrals  # they were claimed and held back, not sent
    assert _breaker(beta, host) != "closed"

    # An unpaused job of beta's is the next probe, and its answer closes beta's breaker.
    healthy = make_job(beta, next_run_at=None, name="healthy", target=http_spec(ok))
    (probe,) = queue_runs(beta, http_spec(ok), job_id=healthy.id, max_attempts=1)
    assert wait_status(probe, "succeeded", timeout=15).result_code == 200
