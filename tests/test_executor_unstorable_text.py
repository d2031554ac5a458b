"""A response body with a NUL byte must not wedge an executor: PostgreSQL rejects NUL
in jsonb/text, and the outcome batch carrying it would fail on every retry."""

from __future__ import annotations

import pytest

from runs.attempts import history
from runs.execution.retry import truncate
from tests.support.executor import http_spec, queue_runs, row, task_target, wait_status
from tests.support.http_target import Reply

pytestmark = pytest.mark.processes


def test_truncate_makes_text_storable():
    assert truncate("boom\x00bin\ud800ary") == "boom\ufffdbin?ary"


def test_nul_in_a_response_body_is_stored_cleaned_and_later_runs_still_finish(processes, http_target, tenant):
    http_target.script("/nul", then=Reply(400, body=b"boom\x00binary"))
    (bad,) = queue_runs(tenant, http_spec(http_target.url("/nul")))
    processes.start("run_executor")
    dead = wait_status(bad, "dead")
    assert "boom\ufffdbinary" in dead.last_error
    assert history(dead)[-1]["outcome"] == "dead"
    (good,) = queue_runs(tenant, task_target("noop"))
    assert wait_status(good, "succeeded").attempt == 1
    assert row(bad).result_code == 400
