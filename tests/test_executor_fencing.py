"""Fencing, cancellation and shutdown with real executor processes."""

from __future__ import annotations

import os
import re
import signal
import time
from datetime import UTC, datetime

import pytest

from runs.attempts import history
from runs.keys import format_utc, run_key
from runs.models import JobRunRow
from tests.support.executor import http_spec, queue_runs, row, task_target, wait_for, wait_log, wait_status
from tests.support.http_target import Reply

pytestmark = pytest.mark.processes


def owner_of(processes, proc) -> str:
    log = wait_log(processes, proc, "started: concurrency")
    return re.search(r"executor (\S+) started", log).group(1)


def test_stalled_executor_is_fenced_and_writes_nothing(processes, http_target, tenant):
    http_target.script("/hang", Reply(200, delay=20, body=b"attempt 1 finally answers"), then=Reply(200))
    (key,) = queue_runs(tenant, http_spec(http_target.url("/hang")), lease_seconds=3)
    first = processes.start("run_executor")
    first_owner = owner_of(processes, first)
    wait_for(lambda: http_target.received("/hang"), what="attempt 1 to reach the target")
    os.kill(first.pid, signal.SIGSTOP)
    try:
        second = processes.start("run_executor")
        second_owner = owner_of(processes, second)
        run = wait_status(key, "succeeded", timeout=30)
    finally:
        os.kill(first.pid, signal.SIGCONT)
    assert run.attempt == 2 and run.owner == second_owner
    wait_log(processes, first, f"fenced: attempt 1 of {run_key(*key)} is no longer ours")
    time.sleep(1.5)  # a few more heartbeats of the first executor: still nothing written
    after = row(key)
    assert after.status == "succeeded" and after.attempt == 2 and after.attempts == run.attempts
    # Nothing of the outcome was written again either.
    assert (after.finished_at, after.result_code, after.last_error) == (
        run.finished_at,
        run.result_code,
        run.last_error,
    )
    assert [(a["attempt"], a["outcome"]) for a in history(after)] == [(1, "lease expired"), (2, "succeeded")]
    # The lease-expired entry is written by the reclaimer; attempt 1's owner wrote nothing.
    assert history(after)[0]["owner"] == first_owner
    assert history(after)[1]["owner"] == second_owner
    assert "lease expired: attempt 1" in processes.log_of(second)
    assert first.poll() is None  # fenced, not crashed


def test_cancel_through_the_table_stops_the_call_at_the_next_heartbeat(processes, tenant):
    (key,) = queue_runs(tenant, task_target("sleep", seconds=30), lease_seconds=3)
    proc = processes.start("run_executor")
    wait_status(key, "running")
    # What the runs API's cancel does: the row leaves 'running'.
    JobRunRow.objects.filter(job_id=key[0], scheduled_at=key[1]).update(
        status="cancelled", finished_at=datetime.now(UTC), last_error="cancelled by operator"
    )
    wait_log(processes, proc, f"fenced: attempt 1 of {run_key(*key)} is no longer ours", timeout=5)
    run = row(key)
    assert run.status == "cancelled" and run.last_error == "cancelled by operator" and run.attempts == []
    # The slot is free again: a new run starts at once.
    (other,) = queue_runs(tenant, task_target("noop"))
    wait_status(other, "succeeded", timeout=5)


def test_sigterm_hands_back_unfinished_runs_under_their_attempt(processes, http_target, tenant):
    http_target.script("/long", then=Reply(200, delay=30))
    (slow,) = queue_runs(tenant, http_spec(http_target.url("/long")))
    proc = processes.start("run_executor", "--grace-seconds", "1")
    wait_for(lambda: http_target.received("/long"), what="the call to start")
    (quick,) = queue_runs(tenant, task_target("sleep", seconds=0.3))
    wait_status(quick, "running")
    stopped_at = datetime.now(UTC)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=15) == 0
    run = row(slow)
    assert run.status == "retrying" and run.attempt == 1
    assert abs((run.not_before - stopped_at).total_seconds()) < 3
    assert run.lease_until is None
    assert history(run)[-1]["outcome"] == "handed back" and history(run)[-1]["attempt"] == 1
    # The short run finished inside the grace period instead of being handed back.
    assert row(quick).status == "succeeded"
    assert "handed back 1 unfinished run(s)" in processes.log_of(proc)


def test_once_runs_one_batch_and_exits(processes, tenant):
    keys = queue_runs(tenant, task_target("echo", greeting="hi"), count=3)
    proc = processes.start("run_executor", "--once")
    assert proc.wait(timeout=20) == 0
    assert {row(k).status for k in keys} == {"succeeded"}


def test_sigterm_hand_back_with_no_attempts_left_is_dead_not_retrying(processes, tenant, api):
    """Handing back the last allowed attempt must not queue one more: the run is dead."""
    (last,) = queue_runs(tenant, task_target("sleep", seconds=60), max_attempts=2)
    (spare,) = queue_runs(tenant, task_target("sleep", seconds=60), max_attempts=2)
    # `last` already used attempt 1 (a lease expiry, say); its claim now makes attempt 2 of 2.
    JobRunRow.objects.filter(job_id=last[0], scheduled_at=last[1]).update(status="retrying", attempt=1)
    proc = processes.start("run_executor", "--grace-seconds", "1")
    wait_status(last, "running")
    wait_status(spare, "running")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0
    run = row(last)
    assert (run.status, run.attempt) == ("dead", 2)
    assert run.last_error.startswith("handed back with no attempts left: attempt 2 of 2")
    assert run.finished_at is not None and run.lease_until is None
    assert history(run)[-1]["outcome"] == "handed back" and history(run)[-1]["attempt"] == 2
    # A run with attempts to spare is handed back as before.
    assert (row(spare).status, row(spare).attempt) == ("retrying", 1)
    # Like every other death: the dead-letter queue and the alert hook.
    dead_letter = api.get("/api/v1/dead-letter/").json()["results"]
    assert [entry["scheduled_at"] for entry in dead_letter] == [format_utc(last[1])]
    log = processes.log_of(proc)
    assert f'"key": "{run_key(*last)}"' in log and '"type": "run.dead"' in log and "1 of them dead" in log
