"""Task targets have a timeout: async tasks are cancelled, sync ones abandoned and fenced."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
import uuid
from datetime import UTC, datetime

import pytest

from runs.attempts import history
from runs.execution import retry, targets
from runs.rows import ClaimedRun
from tests.support import tasks as test_tasks
from tests.support.executor import queue_runs, row, task_target, wait_status


def claimed(target: dict, attempt: int = 1) -> ClaimedRun:
    now = datetime.now(UTC)
    return ClaimedRun(
        job_id=uuid.uuid4(),
        scheduled_at=now,
        tenant_id=1,
        partition_id=0,
        attempt=attempt,
        target=target,
        job_name="hang",
        overlap_policy="skip",
        priority=0,
        max_attempts=5,
        retry_backoff_seconds=0,
        retry_backoff_cap_seconds=0,
        lease_seconds=30,
        started_at=now,
        signing_secrets=(),
    )


def call_timed(target: dict) -> tuple[retry.CallResult, float]:
    started = time.monotonic()
    result = asyncio.run(targets.call_task(claimed(target)))
    return result, time.monotonic() - started


def test_async_task_over_its_timeout_is_cancelled_and_retried():
    result, elapsed = call_timed({**task_target("hang_async"), "timeout_seconds": 1})
    assert result.kind == retry.RETRY
    assert result.error == "task timed out after 1s and was cancelled"
    assert elapsed < 30  # the task itself would sleep an hour


def test_sync_task_over_its_timeout_is_abandoned_and_told_so():
    result, elapsed = call_timed({**task_target("hang_sync", seconds=20), "timeout_seconds": 1})
    assert result.kind == retry.RETRY
    assert result.error.startswith("task timed out after 1s; its thread was abandoned")
    assert elapsed < 20  # did not wait for the thread
    context = test_tasks.SYNC_CALLS[-1]
    assert context.cancelled.is_set()  # a cooperative task could have stopped here
    abandoned = [t for t in threading.enumerate() if t.name == "cronyard-task-hang_sync"]
    assert abandoned and all(t.daemon for t in abandoned)  # they cannot keep the executor from exiting


def test_task_target_stored_without_timeout_gets_the_default(monkeypatch):
    # Targets saved before task timeouts existed carry none; the executor's default
    # (300 s) applies. Shortened here so the test does not wait five minutes.
    assert targets.DEFAULT_TASK_TIMEOUT_SECONDS == 300
    monkeypatch.setattr(targets, "DEFAULT_TASK_TIMEOUT_SECONDS", 1)
    result, _ = call_timed(task_target("hang_async"))
    assert result.error == "task timed out after 1s and was cancelled"


def test_a_task_finishing_in_time_succeeds():
    result, _ = call_timed({**task_target("hang_sync", seconds=0.1), "timeout_seconds": 5})
    assert result.kind == retry.SUCCESS


@pytest.mark.processes
def test_hung_sync_task_is_retried_per_policy_and_its_late_result_never_written(processes, tenant):
    (key,) = queue_runs(
        tenant,
        {**task_target("hang_sync", seconds=4), "timeout_seconds": 1},
        max_attempts=2,
        retry_backoff_seconds=0,
        retry_backoff_cap_seconds=0,
    )
    processes.start("run_executor")
    run = wait_status(key, "dead", timeout=30)
    assert run.attempt == 2
    assert [a["outcome"] for a in history(run)] == ["retry", "dead"]
    assert all("timed out after 1s" in a["error"] for a in history(run))
    # Both abandoned threads return "finished late" within 4 s: nothing of it lands.
    time.sleep(5)
    after = row(key)
    assert (after.status, after.attempt, after.attempts) == ("dead", 2, run.attempts)


@pytest.mark.processes
def test_sigterm_exits_even_with_a_hung_sync_task(processes, tenant):
    (key,) = queue_runs(tenant, task_target("hang_sync"))  # an hour, default 300 s timeout
    proc = processes.start("run_executor", "--grace-seconds", "1")
    wait_status(key, "running")
    proc.send_signal(signal.SIGTERM)
    # A pool thread would be joined at interpreter exit, i.e. never.
    assert proc.wait(timeout=20) == 0
    run = row(key)
    assert (run.status, run.attempt) == ("retrying", 1)
    assert history(run)[-1]["outcome"] == "handed back"
