"""Real `run_scheduler` processes on the test database: exactly-once under concurrency,
under SIGKILL/SIGSTOP chaos, and rebalancing of partition leases."""

from __future__ import annotations

import os
import random
import re
import signal
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from jobs.models import Job, SchedulerNode
from runs.models import JobRun
from tests.support.scheduler import (
    bulk_interval_jobs,
    duplicates,
    expected_interval_slots,
    lease_pid_of,
    locks_by_pid,
    parse_batches,
    wait_dispatched,
    wait_until,
)

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

LEASE = 3
SCHED_ENV = {"SCHEDULER_LEASE_SECONDS": str(LEASE), "LOG_LEVEL": "DEBUG"}
N_JOBS = 2000
# Slots older than this before the stop must all exist; generous, so that a loaded
# CI machine (dispatch lag) cannot fail the test for the wrong reason.
MARGIN = timedelta(seconds=5)


def make_jobs(tenant, *, lead_seconds: float) -> list[Job]:
    rng = random.Random(42)
    base = datetime.now(UTC) + timedelta(seconds=lead_seconds)
    pairs = []
    for _ in range(N_JOBS):
        interval = rng.randint(2, 5)
        pairs.append((base + timedelta(milliseconds=rng.randrange(interval * 1000)), interval))
    return bulk_interval_jobs(tenant, anchors_and_intervals=pairs)


def stop(processes, procs) -> datetime:
    """SIGTERM every scheduler (after SIGCONT, in case); each must exit 0. Returns the stop time."""
    at = datetime.now(UTC)
    for proc in procs:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.terminate()
    for proc in procs:
        proc.wait(timeout=20)
    return at


def check_exactly_once(jobs: list[Job], *, cutoff: datetime, stopped_at: datetime) -> int:
    """Every expected slot up to cutoff exists once; nothing exists that is not a slot. Returns #runs."""
    rows = list(JobRun.objects.values_list("job_id", "scheduled_at"))
    assert duplicates(rows) == []
    actual = set(rows)
    expected = expected_interval_slots(jobs, cutoff=cutoff)
    upto_cutoff = {r for r in actual if r[1] <= cutoff}
    missing = expected - upto_cutoff
    extra = upto_cutoff - expected
    assert not missing, f"{len(missing)} slots never fired, e.g. {sorted(missing, key=lambda r: r[1])[:3]}"
    assert not extra, f"{len(extra)} runs that are not slots, e.g. {sorted(extra)[:3]}"
    # After the cutoff: only real slots, none in the future of the stop.
    later = actual - upto_cutoff
    valid_later = expected_interval_slots(jobs, cutoff=stopped_at + timedelta(seconds=1))
    assert later <= valid_later
    # And each job's next_run_at is the slot right after its last run: no slot was jumped over.
    last = {}
    for job_id, at in actual:
        last[job_id] = max(at, last.get(job_id, at))
    by_id = {j.id: j for j in jobs}
    for job in Job.objects.all():
        assert job.next_run_at == last[job.id] + timedelta(seconds=by_id[job.id].interval_seconds)
    return len(actual)


def all_batches(processes, procs):
    return [b for proc in procs for b in parse_batches(processes.log_of(proc))]


def test_two_then_three_schedulers_fire_every_slot_exactly_once(tenant, processes):
    jobs = make_jobs(tenant, lead_seconds=3)
    procs = [processes.start("run_scheduler", env=SCHED_ENV) for _ in range(2)]
    time.sleep(25)
    procs.append(processes.start("run_scheduler", env=SCHED_ENV))
    with connection.cursor() as cursor:
        wait_until(
            lambda: len(locks_by_pid(cursor)) == 3, timeout=3 * LEASE + 5, what="third node holds a share"
        )
    time.sleep(20)
    cutoff = datetime.now(UTC) - MARGIN
    wait_dispatched(jobs, cutoff=cutoff, timeout=60)
    stopped_at = stop(processes, procs)
    assert [p.returncode for p in procs] == [0, 0, 0], processes.log_of(procs[0])[-2000:]
    total = check_exactly_once(jobs, cutoff=cutoff, stopped_at=stopped_at)
    assert total > 10_000
    batches = all_batches(processes, procs)
    assert sum(b.inserted for b in batches) == total
    # The scheduler's own fencing never tried a second insert of an occurrence (the
    # unique key is there as a last line, not as the mechanism) and no CAS was refused.
    assert sum(b.conflicts for b in batches) == 0 and sum(b.stale for b in batches) == 0
    # Every node dispatched, and all released their leases on SIGTERM.
    assert len({b.node for b in batches}) == 3
    assert SchedulerNode.objects.count() == 0
    with connection.cursor() as cursor:
        assert locks_by_pid(cursor) == {}


def test_chaos_sigkill_and_sigstop_still_exactly_once(tenant, processes):
    jobs = make_jobs(tenant, lead_seconds=3)
    stalled = processes.start("run_scheduler", env=SCHED_ENV)
    steady = processes.start("run_scheduler", env=SCHED_ENV)
    victims = [processes.start("run_scheduler", env=SCHED_ENV)]
    done = threading.Event()
    kills = []

    def killer():
        while not done.wait(2.5):
            victims[-1].kill()
            victims[-1].wait()
            kills.append(time.monotonic())
            victims.append(processes.start("run_scheduler", env=SCHED_ENV))

    with connection.cursor() as cursor:
        wait_until(lambda: len(locks_by_pid(cursor)) == 3, timeout=15, what="three nodes hold shares")
        old_pid = lease_pid_of(cursor, stalled.pid)
        assert old_pid in locks_by_pid(cursor)
    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    time.sleep(5)

    stopped_at = datetime.now(UTC)
    os.kill(stalled.pid, signal.SIGSTOP)
    with connection.cursor() as cursor:
        # The server ends the silent session after one lease; the others take its partitions.
        wait_until(lambda: lease_pid_of(cursor, stalled.pid) is None, timeout=LEASE + 2, what="session ended")
        lost_after = (datetime.now(UTC) - stopped_at).total_seconds()
        wait_until(
            lambda: (
                old_pid not in locks_by_pid(cursor)
                and set().union(*locks_by_pid(cursor).values()) == set(range(256))
            ),
            timeout=2 * LEASE,
            what="the other nodes own every partition",
        )
    time.sleep(max(0.0, 9 - (datetime.now(UTC) - stopped_at).total_seconds()))
    continued_at = datetime.now(UTC)
    os.kill(stalled.pid, signal.SIGCONT)
    with connection.cursor() as cursor:
        wait_until(
            lambda: lease_pid_of(cursor, stalled.pid), timeout=2 * LEASE, what="stalled node re-registers"
        )
    time.sleep(8)
    done.set()
    thread.join()
    time.sleep(4)  # let the last restarted victim settle before the cutoff window
    cutoff = datetime.now(UTC) - MARGIN
    wait_dispatched(jobs, cutoff=cutoff, timeout=60)
    procs = [stalled, steady, *victims]
    stopped = stop(processes, procs)
    assert stalled.returncode == 0 and steady.returncode == 0
    assert len(kills) >= 5

    total = check_exactly_once(jobs, cutoff=cutoff, stopped_at=stopped)
    assert total > 10_000
    batches = all_batches(processes, procs)
    assert sum(b.stale for b in batches) == 0

    # The stalled node: nothing dispatched under its old session once it was stopped,
    # "lease lost" on resume, a new session, then dispatching again under it.
    log = processes.log_of(stalled)
    mine = parse_batches(log)
    old = [b for b in mine if b.session_pid == old_pid]
    assert old and all(b.db_now < stopped_at + timedelta(seconds=1) for b in old), (
        "dispatched on a dead lease"
    )
    lost = re.search(rf"^.* lease lost node=\S+ session_pid={old_pid} .*$", log, re.M)
    assert lost, "no 'lease lost' line for the stalled session"
    lost_at = lost.start()
    assert "lease session started" in log[lost_at:] and "generation=2" in log[lost_at:]
    # A batch logged after that line under the old session was committed before the
    # stop and printed on resume (its line races the lease thread's); none began later.
    late_lines = [b for b in parse_batches(log[lost_at:]) if b.session_pid == old_pid]
    assert all(b.db_now < stopped_at + timedelta(seconds=1) for b in late_lines)
    resumed = [b for b in mine if b.session_pid != old_pid and b.inserted > 0]
    assert resumed and all(b.db_now > continued_at for b in resumed)
    print(
        f"\nchaos: runs={total} kills={len(kills)} session ended {lost_after:.1f}s after SIGSTOP, "
        f"conflicts={sum(b.conflicts for b in batches)}"
    )


def test_rebalance_within_three_leases(processes):
    first = processes.start("run_scheduler", env=SCHED_ENV)
    with connection.cursor() as cursor:
        wait_until(lambda: [len(v) for v in locks_by_pid(cursor).values()] == [256], timeout=15, what="256")
        second = processes.start("run_scheduler", env=SCHED_ENV)
        wait_until(lambda: lease_pid_of(cursor, second.pid), timeout=15, what="second node registered")
        joined = time.monotonic()

        def split():
            shares = locks_by_pid(cursor)
            return (
                len(shares) == 2
                and all(127 <= len(v) <= 129 for v in shares.values())
                and set().union(*shares.values()) == set(range(256))
            )

        wait_until(split, timeout=3 * LEASE, what="128/128 split")
        split_after = time.monotonic() - joined
        # The share shows on the node rows too (the dashboard reads them).
        wait_until(
            lambda: sorted(len(n.partitions) for n in SchedulerNode.objects.all()) == [128, 128],
            timeout=LEASE,
            what="node rows",
        )
        first.terminate()
        assert first.wait(timeout=15) == 0
        left = time.monotonic()
        wait_until(
            lambda: [len(v) for v in locks_by_pid(cursor).values()] == [256], timeout=3 * LEASE, what="256"
        )
        takeover_after = time.monotonic() - left
        assert list(SchedulerNode.objects.values_list("pid", flat=True)) == [second.pid]
    print(f"\nrebalance: split {split_after:.1f}s after join, takeover {takeover_after:.1f}s after SIGTERM")
