"""HTTP targets end to end: real executor processes, a real HTTP server, real PostgreSQL."""

from __future__ import annotations

import itertools
import re
import socket

import pytest

from runs.attempts import history
from runs.execution.netguard import is_public_address
from runs.keys import format_utc, run_key
from runs.services import replay_run
from tests.support.executor import http_spec, queue_runs, row, wait_for, wait_status
from tests.support.http_target import Reply

pytestmark = pytest.mark.processes


def test_headers_arrive_and_idempotency_key_is_stable_across_retries(processes, http_target, tenant):
    http_target.script("/hook", Reply(503), then=Reply(200))
    target = http_spec(http_target.url("/hook"))
    target["headers"] = {"Authorization": "Bearer s3cret", "X-Custom": "yes"}
    target["body"] = {"hello": "world"}
    (key,) = queue_runs(tenant, target, retry_backoff_seconds=0, retry_backoff_cap_seconds=0)
    processes.start("run_executor")
    run = wait_status(key, "succeeded")
    assert run.attempt == 2
    first, second = http_target.received("/hook")
    for received, attempt in ((first, 1), (second, 2)):
        headers = received.headers
        assert headers["idempotency-key"] == run_key(*key)
        assert headers["x-run-attempt"] == str(attempt)
        assert headers["x-job-id"] == str(key[0])
        assert headers["x-scheduled-at"] == format_utc(key[1])
        assert re.fullmatch(r"00-[0-9a-f]{32}-[0-9a-f]{16}-01", headers["traceparent"])
        assert headers["authorization"] == "Bearer s3cret"
        assert headers["x-custom"] == "yes"
        assert headers["content-type"] == "application/json"
        assert received.method == "POST"
        assert received.body == b'{"hello": "world"}'
    # Same trace for every attempt of a run, a new span each time.
    assert first.headers["traceparent"][:35] == second.headers["traceparent"][:35]
    assert first.headers["traceparent"] != second.headers["traceparent"]
    # Secrets from the target's headers never land in the stored history.
    assert "s3cret" not in str(run.attempts) and "s3cret" not in run.last_error
    assert [a["outcome"] for a in history(run)] == ["retry", "succeeded"]
    assert history(run)[0]["result_code"] == 503 and run.result_code == 200


def test_503_twice_then_200_succeeds_on_attempt_3_within_full_jitter_bounds(processes, http_target, tenant):
    http_target.script("/flaky", Reply(503, body=b"busy"), Reply(503, body=b"busy"), then=Reply(200))
    (key,) = queue_runs(
        tenant, http_spec(http_target.url("/flaky")), retry_backoff_seconds=1, retry_backoff_cap_seconds=4
    )
    processes.start("run_executor")
    run = wait_status(key, "succeeded", timeout=30)
    assert run.attempt == 3 and run.result_code == 200 and run.last_error == ""
    arrivals = [r.at for r in http_target.received("/flaky")]
    assert len(arrivals) == 3
    # Delay after failed attempt n is uniform(0, min(cap, base * 2**n)); allow for the
    # executor's own claim latency on top of the drawn delay.
    slack = 0.6
    for n, (before, after) in enumerate(itertools.pairwise(arrivals), start=1):
        bound = min(4, 1 * 2**n)
        assert 0 <= after - before <= bound + slack, (n, after - before)
    drawn = [a["retry_in_s"] for a in history(run)[:2]]
    assert 0 <= drawn[0] <= 2 and 0 <= drawn[1] <= 4
    assert history(run)[0]["error"].startswith("HTTP 503: busy")


def test_400_is_dead_after_one_attempt(processes, http_target, tenant):
    http_target.script("/bad", then=Reply(400, body=b"no such thing"))
    (key,) = queue_runs(tenant, http_spec(http_target.url("/bad")))
    processes.start("run_executor")
    run = wait_status(key, "dead")
    assert run.attempt == 1 and run.result_code == 400
    assert run.last_error == "HTTP 400: no such thing"
    assert len(http_target.received("/bad")) == 1
    assert run.finished_at is not None


def test_always_500_is_dead_after_exactly_max_attempts_and_alert_is_posted(processes, http_target, tenant):
    http_target.script("/down", then=Reply(500, body=b"x" * 5000))
    (key,) = queue_runs(
        tenant,
        http_spec(http_target.url("/down")),
        max_attempts=5,
        retry_backoff_seconds=0,
        retry_backoff_cap_seconds=0,
        job_name="nightly-report",
    )
    # Five 500s in a row also open the host's circuit breaker, which would defer the
    # replay below to its next probe (tests/test_executor_breakers.py); not under test here.
    env = {"SCHEDULER_ALERT_WEBHOOK_URL": http_target.url("/alerts"), "EXECUTOR_CIRCUIT_FAILURES": "1000"}
    proc = processes.start("run_executor", env=env)
    run = wait_status(key, "dead", timeout=30)
    assert run.attempt == 5
    assert len(http_target.received("/down")) == 5
    assert [a["attempt"] for a in history(run)] == [1, 2, 3, 4, 5]
    assert [a["outcome"] for a in history(run)] == ["retry"] * 4 + ["dead"]
    assert len(run.last_error) <= 2048
    alerts = wait_for(lambda: http_target.json_bodies("/alerts"), what="the alert webhook POST")
    assert len(alerts) == 1
    assert alerts[0]["type"] == "run.dead" and alerts[0]["run"]["key"] == run_key(*key)
    assert alerts[0]["job"]["name"] == "nightly-report" and alerts[0]["run"]["attempt"] == 5
    assert alerts[0]["tenant"] == {"id": tenant.id, "slug": tenant.slug}
    assert http_target.received("/alerts")[0].method == "POST"
    assert '"type": "run.dead"' in processes.log_of(proc)

    # Replay (the operator's fix is in): the same run goes again as attempt 6, same key.
    http_target.script("/down", then=Reply(200))
    replay_run(job_id=key[0], scheduled_at=key[1], actor="test")
    run = wait_status(key, "succeeded", timeout=30)
    assert run.attempt == 6
    last = http_target.received("/down")[-1]
    assert last.headers["x-run-attempt"] == "6"
    assert {r.headers["idempotency-key"] for r in http_target.received("/down")} == {run_key(*key)}


def test_private_target_is_refused_at_connect_time_when_not_allowed(processes, http_target, tenant):
    (by_literal,) = queue_runs(tenant, http_spec(http_target.url("/private")))
    # A name, not a literal: only the connect-time resolver check can catch it.
    host = socket.gethostname()
    if is_public_address(socket.gethostbyname(host)):
        pytest.skip(f"{host} does not resolve to a private address here")
    (by_name,) = queue_runs(tenant, http_spec(f"http://{host}:{http_target.port}/private"))
    processes.start("run_executor", env={"SCHEDULER_ALLOW_PRIVATE_TARGETS": "false"})
    for key in (by_literal, by_name):
        run = wait_status(key, "dead")
        assert run.attempt == 1
        assert "refused target" in run.last_error and "not allowed" in run.last_error, run.last_error
    assert http_target.received("/private") == []
    assert row(by_name).result_code is None


def test_a_request_the_client_cannot_build_fails_once_not_on_every_retry(processes, http_target, tenant):
    """Targets stored before create refused them (the validator bypassed here): a header
    value aiohttp will not send, an address it cannot dial. Waiting changes neither: the
    run is dead after its first attempt, not retried to max_attempts."""
    bad_header = http_spec(http_target.url("/hook"))
    bad_header["headers"] = {"X-Signature": "v1\x0bx"}
    bad_address = http_spec(f"http://[::ffff:127.1]:{http_target.port}/hook")
    keys = [
        queue_runs(tenant, target, max_attempts=3, retry_backoff_seconds=0, retry_backoff_cap_seconds=0)[0]
        for target in (bad_header, bad_address)
    ]
    processes.start("run_executor")
    header_run, address_run = (wait_status(key, "dead") for key in keys)
    assert header_run.attempt == 1 and "Forbidden control character" in header_run.last_error
    assert address_run.attempt == 1 and address_run.last_error.startswith(
        "refused target: host [::ffff:127.1]"
    )
    assert http_target.received("/hook") == []
