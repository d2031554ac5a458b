"""Expired leases are reclaimed whatever the executor is doing, and a reclaimed run
with no attempts left is dead, not queued again."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from runs.keys import run_key
from tests.support.executor import (
    queue_runs,
    reap_now,
    row,
    set_running,
    task_target,
    wait_log,
    wait_status,
)

EXPIRED = timedelta(seconds=-60)
LATER = datetime.now(UTC) + timedelta(days=1)  # not claimable by the executor under test


@pytest.mark.processes
def test_expired_leases_are_reaped_while_every_slot_is_busy(processes, tenant):
    (busy,) = queue_runs(tenant, task_target("sleep", seconds=300))
    proc = processes.start("run_executor", "--concurrency", "1")
    wait_status(busy, "running")
    # Orphans of a dead executor; queued for later first, so the busy one cannot claim them.
    orphan, last_chance = queue_runs(tenant, task_target("noop"), count=2, not_before=LATER, max_attempts=3)
    set_running(orphan, attempt=1, lease=EXPIRED)
    set_running(last_chance, attempt=3, lease=EXPIRED)

    reclaimed = wait_status(orphan, "retrying", timeout=20)
    assert reclaimed.attempt == 1 and reclaimed.lease_until is None
    assert reclaimed.attempts[-1]["outcome"] == "lease expired"
    dead = wait_status(last_chance, "dead", timeout=20)
    assert dead.finished_at is not None and "lease expired: attempt 3" in dead.last_error
    wait_log(processes, proc, f'"run_key": "{run_key(*last_chance)}"')  # the death alert
    # All of that while the only slot stayed busy with the long call.
    assert row(busy).status == "running" and row(busy).attempt == 1


def test_reaper_respects_max_attempts(transactional_db, tenant):
    below, at_max, beyond = queue_runs(tenant, task_target("noop"), count=3, max_attempts=2)
    set_running(below, attempt=1, lease=EXPIRED)
    set_running(at_max, attempt=2, lease=EXPIRED)
    set_running(beyond, attempt=3, lease=EXPIRED)  # a replayed dead run's extra attempt
    reaped = {(r.job_id, r.scheduled_at): r.status for r in reap_now()}
    assert reaped == {below: "retrying", at_max: "dead", beyond: "dead"}
    assert row(below).status == "retrying" and row(below).finished_at is None
    for key in (at_max, beyond):
        run = row(key)
        assert run.status == "dead" and run.finished_at is not None and run.lease_until is None
