"""A success moves its run to run_history, written once; every other run stays in
job_runs; the run key stays unique across the two (docs/decisions/0085-run-history.md).
On Citus the outcome writes a success in place and the executor moves it afterwards
(runs/execution/history_moves.py, docs/decisions/0087-citus-history-moves.md).

The outcomes go through the executor's own statements (runs/execution/outcomes.py and, on
Citus, history_moves.move), the inserts through runs.enqueue, on both engines (make
test-citus runs this file too)."""

from __future__ import annotations

import dataclasses
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, connections, transaction

from runs import history, per_partition
from runs.attempts import AttemptRecord
from runs.enqueue import enqueue_runs
from runs.execution import history_moves, outcomes, queries, turns
from runs.models import JobRun, JobRunRow, RunHistoryRow
from runs.rows import Completion, NewRun
from scheduler_project.citus import citus_installed
from tests.support.executor import on_executor_connection, queue_runs, set_running, set_turn, task_target

pytestmark = pytest.mark.django_db(transaction=True)


def on_citus() -> bool:
    with connection.cursor() as cursor:
        return citus_installed(cursor)


def complete(key, status: str, *, attempt: int = 1, move: bool = True) -> set:
    """The executor's outcome of the attempt and, on Citus, its move of a success (unless
    `move` is False)."""
    entry = AttemptRecord(
        attempt, "x:1", None, None, None, status, 200 if status == "succeeded" else 500, "", None
    )
    run = JobRun.objects.get(job_id=key[0], scheduled_at=key[1])
    completion = Completion(
        job_id=key[0],
        scheduled_at=key[1],
        partition_id=run.partition_id,
        attempt=attempt,
        status=status,
        retry_in_s=0.0 if status == "retrying" else None,
        result_code=200 if status == "succeeded" else 500,
        error="" if status == "succeeded" else "HTTP 500",
        entry=entry,
    )
    move = move and status == "succeeded" and on_citus()

    async def write(conn) -> set:
        written = await outcomes.complete_runs(conn, [completion])
        if written and move:
            await history_moves.move(conn, [(run.partition_id, key[0], key[1])])
        return written

    return on_executor_connection(write)


def where(key) -> tuple[int, int]:
    """(rows in job_runs, rows in run_history) of the run key."""
    found = {"job_id": key[0], "scheduled_at": key[1]}
    return JobRunRow.objects.filter(**found).count(), RunHistoryRow.objects.filter(**found).count()


def again(tenant, key) -> list:
    """The same occurrence inserted once more, as a backfill or a refire would."""
    run = JobRun.objects.get(job_id=key[0], scheduled_at=key[1])
    with transaction.atomic():
        return enqueue_runs(
            [
                NewRun(
                    job_id=run.job_id,
                    scheduled_at=run.scheduled_at,
                    tenant_id=tenant.id,
                    partition_id=run.partition_id,
                    target_version=run.target_version,
                    overlap_check=False,
                )
            ]
        )


def test_a_success_moves_the_run_and_readers_see_it_once(tenant):
    (key,) = queue_runs(tenant, task_target("noop"))
    set_running(key)
    assert where(key) == (1, 0)
    assert len(complete(key, "succeeded")) == 1
    assert where(key) == (0, 1)
    run = JobRun.objects.get(job_id=key[0], scheduled_at=key[1])
    assert (run.status, run.attempt, run.result_code, run.lease_until) == ("succeeded", 1, 200, None)
    assert run.finished_at is not None and run.attempts == []  # a first success stores no entry
    assert JobRun.objects.filter(job_id=key[0]).count() == 1


# What an outcome changes: every other column must read the same after the move.
OUTCOME_COLUMNS = {"status", "lease_until", "finished_at", "result_code", "last_error", "attempts"}
UNCOMMON = {
    "trigger": "manual",
    "priority": 3,
    "overlap_policy": "allow",
    "max_attempts": 2,
    "retry_backoff_seconds": 7,
    "retry_backoff_cap_seconds": 70,
    "lease_seconds": 45,
    "deferrals": 2,
}


def test_every_column_of_run_history_is_written_by_the_move():
    """runs/history.py names run_history's columns for every INSERT into it: a column the
    table gains must be named there, or a move would leave it empty."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = 'run_history'::regclass"
            " AND attnum > 0 AND NOT attisdropped ORDER BY attnum"
        )
        assert tuple(name for (name,) in cursor.fetchall()) == history.COLUMNS


def stored_sparse_values(key: tuple) -> int:
    """How many of the sparse columns (runs/history.py) the history row stores a value in."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT "
            + " + ".join(f"({column} IS NOT NULL)::int" for column in history.SPARSE)
            + " FROM run_history WHERE job_id = %s AND scheduled_at = %s",
            [key[0], key[1]],
        )
        return cursor.fetchone()[0]


@pytest.mark.parametrize("values", ["common", "uncommon"])
def test_a_run_reads_the_same_after_its_move(tenant, values):
    """run_history stores NULL for a column holding the value nearly every run has, and
    the view gives that value back: a run reads the same in both tables, whatever its
    values (runs/history.py; runs migration 0024 holds the view's half)."""
    (key,) = queue_runs(tenant, task_target("noop"))
    attempt = 2 if values == "uncommon" else 1
    set_running(key, attempt=attempt)
    if values == "uncommon":  # a start the insert did not choose: a job's jitter
        JobRunRow.objects.filter(job_id=key[0], scheduled_at=key[1]).update(
            not_before=key[1] + timedelta(seconds=5), **UNCOMMON
        )
    before = JobRun.objects.filter(job_id=key[0], scheduled_at=key[1]).values().get()
    complete(key, "succeeded", attempt=attempt)
    assert where(key) == (0, 1)
    after = JobRun.objects.filter(job_id=key[0], scheduled_at=key[1]).values().get()
    assert {c: v for c, v in after.items() if c not in OUTCOME_COLUMNS} == {
        c: v for c, v in before.items() if c not in OUTCOME_COLUMNS
    }
    assert (after["status"], after["lease_until"], after["last_error"], after["attempts"]) == (
        "succeeded",
        None,
        "",
        [],
    )
    # The uncommon ones, with the start and the second attempt.
    assert stored_sparse_values(key) == (0 if values == "common" else len(UNCOMMON) + 2)


@pytest.mark.parametrize("status", ["retrying", "dead"])
def test_any_other_outcome_stays_in_job_runs(tenant, status):
    (key,) = queue_runs(tenant, task_target("noop"))
    set_running(key)
    assert len(complete(key, status)) == 1
    assert where(key) == (1, 0)
    assert JobRun.objects.get(job_id=key[0], scheduled_at=key[1]).status == status


def test_one_outcome_batch_writes_runs_of_days_apart(tenant):
    """The outcome statement bounds its references by the batch's day window
    (docs/decisions/0088-outcome-day-window.md): runs of slots days apart, given out of
    order, the newest after the outcome's `now`, and an attempt that failed beside them,
    are all written in one batch."""
    now = datetime.now(UTC)
    keys = [
        queue_runs(tenant, task_target("noop"), start=now - timedelta(days=days, minutes=5))[0]
        for days in (1, 3, 0)
    ]
    for key in keys:
        set_running(key)
    entry = AttemptRecord(1, "x:1", None, None, None, "succeeded", 200, "", None)
    completions = [
        Completion(
            job_id=key[0],
            scheduled_at=key[1],
            partition_id=JobRun.objects.get(job_id=key[0], scheduled_at=key[1]).partition_id,
            attempt=1,
            status=status,
            retry_in_s=0.0 if status == "retrying" else None,
            result_code=200 if status == "succeeded" else 500,
            error="",
            entry=dataclasses.replace(entry, outcome=status),
        )
        for key, status in zip(keys, ("retrying", "succeeded", "succeeded"), strict=True)
    ]
    written = on_executor_connection(
        lambda conn: outcomes.complete_runs(conn, completions, now=now - timedelta(minutes=10))
    )
    assert written == {(*key, 1) for key in keys}
    statuses = {key: JobRun.objects.get(job_id=key[0], scheduled_at=key[1]).status for key in keys}
    assert list(statuses.values()) == ["retrying", "succeeded", "succeeded"]


def test_a_retried_run_keeps_its_history_when_it_moves(tenant):
    (key,) = queue_runs(tenant, task_target("noop"))
    set_running(key)
    complete(key, "retrying")
    set_running(key, attempt=2)
    complete(key, "succeeded", attempt=2)
    run = JobRun.objects.get(job_id=key[0], scheduled_at=key[1])
    assert where(key) == (0, 1)
    assert [entry[5] for entry in run.attempts] == ["retrying", "succeeded"]


def test_a_fenced_off_success_moves_nothing(tenant):
    (key,) = queue_runs(tenant, task_target("noop"))
    set_running(key, attempt=2)
    assert complete(key, "succeeded", attempt=1) == set()
    assert where(key) == (1, 0)


def test_an_occurrence_that_succeeded_is_not_inserted_again(tenant):
    (key,) = queue_runs(tenant, task_target("noop"))
    set_running(key)
    complete(key, "succeeded")
    assert again(tenant, key) == []
    assert where(key) == (0, 1)


def test_an_insert_waiting_on_the_success_of_its_occurrence_inserts_nothing(tenant):
    """The move commits while the insert waits on the row it is moving: job_runs' key no
    longer holds the occurrence when the insert goes on, run_history does. The move is the
    executor's own statement (queries.MOVE_SUCCEEDED, Citus's; on plain PostgreSQL the
    outcome's move is the same DELETE and INSERT), held open in a transaction."""
    (key,) = queue_runs(tenant, task_target("noop"))
    set_running(key)
    JobRunRow.objects.filter(job_id=key[0], scheduled_at=key[1]).update(  # as Citus's outcome writes it
        status="succeeded", finished_at=datetime.now(UTC), lease_until=None
    )
    run = JobRun.objects.get(job_id=key[0], scheduled_at=key[1])
    moving = threading.Event()
    commit = threading.Event()
    form = queries.MOVE_SUCCEEDED.shard if on_citus() else queries.MOVE_SUCCEEDED.many
    params = {
        **per_partition.window(key[1]),
        "run_partitions": [run.partition_id],
        "job_ids": [key[0]],
        "scheduled": [key[1]],
        "partitions": [run.partition_id],
    }

    def succeed_slowly():
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(form, params)
                assert cursor.rowcount == 1
                moving.set()
                commit.wait(10)
        finally:
            connections.close_all()

    mover = threading.Thread(target=succeed_slowly)
    mover.start()
    assert moving.wait(10)
    inserted: list = []
    inserter = threading.Thread(target=lambda: (inserted.append(again(tenant, key)), connections.close_all()))
    inserter.start()
    time.sleep(0.5)
    assert inserter.is_alive(), "the insert did not wait for the row being moved"
    commit.set()
    mover.join(10)
    inserter.join(10)
    assert inserted == [[]]
    assert where(key) == (0, 1)


def test_an_executor_moves_the_successes_it_wrote(steps, tenant):
    """The executor's steps: on Citus write_outcomes_once writes successes in place and
    keeps their keys, and move_history_once moves them; on plain PostgreSQL the outcome
    moved them and no key waits."""
    keys = queue_runs(tenant, task_target("noop"), count=3)
    s = steps()
    s.run(s.executor.claim_once())
    s.calls_done()
    assert s.run(s.executor.write_outcomes_once()).written == 3
    if on_citus():
        assert len(s.executor.moves) == 3
        assert [where(key) for key in keys] == [(1, 0)] * 3
        # Until its move a success reads as one from job_runs.
        statuses = JobRun.objects.filter(job_id__in=[k[0] for k in keys]).values_list("status", flat=True)
        assert set(statuses) == {"succeeded"}
        assert s.run(s.executor.move_history_once()) == 3
    assert len(s.executor.moves) == 0
    assert s.run(s.executor.move_history_once()) == 0
    assert [where(key) for key in keys] == [(0, 1)] * 3


def test_a_move_takes_successes_only_and_each_once(tenant):
    """history_moves.move names runs by key; a run that is not a success in job_runs
    (retrying, or moved already) stays where it is. (The success is written in place as
    the Citus outcome writes it; plain PostgreSQL's outcome would have moved it.)"""
    succeeded, retrying = queue_runs(tenant, task_target("noop"), count=2)
    succeeded_in_place(succeeded, ago=0)
    set_running(retrying)
    complete(retrying, "retrying")
    moves = [
        (JobRun.objects.get(job_id=key[0], scheduled_at=key[1]).partition_id, key[0], key[1])
        for key in (succeeded, retrying)
    ]
    assert on_executor_connection(lambda conn: history_moves.move(conn, moves)) == 1
    assert on_executor_connection(lambda conn: history_moves.move(conn, moves)) == 0
    assert (where(succeeded), where(retrying)) == ((0, 1), (1, 0))


def succeeded_in_place(key, *, ago: float) -> None:
    """The run written `succeeded` in job_runs `ago` seconds ago, as the Citus outcome
    writes it."""
    set_running(key)
    JobRunRow.objects.filter(job_id=key[0], scheduled_at=key[1]).update(
        status="succeeded", finished_at=datetime.now(UTC) - timedelta(seconds=ago), lease_until=None
    )


def test_a_sweep_moves_only_successes_left_long_enough(tenant):
    """history_moves.sweep: a success in job_runs that finished over SWEEP_AFTER_SECONDS
    ago moves, once; a newer one is left to the executor that wrote it; one that finished
    over SWEEP_WITHIN_SECONDS ago (written before executors moved successes) stays, as
    does one of a run scheduled before the SWEEP_DAYS the sweep reads; a run that is not
    a success stays."""
    left, fresh, old, retrying = queue_runs(tenant, task_target("noop"), count=4)
    before_days = datetime.now(UTC) - timedelta(days=history_moves.SWEEP_DAYS, hours=1)
    (old_day,) = queue_runs(tenant, task_target("noop"), start=before_days)
    for key in (left, old_day):
        succeeded_in_place(key, ago=history_moves.SWEEP_AFTER_SECONDS + 5)
    succeeded_in_place(fresh, ago=history_moves.SWEEP_AFTER_SECONDS - 60)
    succeeded_in_place(old, ago=history_moves.SWEEP_WITHIN_SECONDS + 5)
    set_running(retrying)
    complete(retrying, "retrying")
    JobRunRow.objects.filter(job_id=retrying[0], scheduled_at=retrying[1]).update(
        finished_at=datetime.now(UTC) - timedelta(seconds=history_moves.SWEEP_AFTER_SECONDS + 5)
    )
    keys, _ = on_executor_connection(history_moves.left_behind)
    assert keys == [(JobRun.objects.get(job_id=left[0], scheduled_at=left[1]).partition_id, *left)]
    assert on_executor_connection(history_moves.sweep) == history_moves.Swept(1)
    assert on_executor_connection(history_moves.sweep) == history_moves.Swept(0)
    assert [where(key) for key in (left, fresh, old, old_day, retrying)] == [(0, 1)] + [(1, 0)] * 4


def test_the_sweep_moves_what_a_killed_executor_left(steps, tenant):
    """On Citus the executor that takes the sweep's turn moves successes another executor
    wrote in place and never moved (killed before its move: its keys were in memory).
    On plain PostgreSQL the outcome moved them and no executor sweeps."""
    keys = queue_runs(tenant, task_target("noop"), count=3)
    killed = steps()
    killed.run(killed.executor.claim_once())
    killed.calls_done()
    assert killed.run(killed.executor.write_outcomes_once()).written == 3
    killed.executor.moves = history_moves.Pending()  # what a SIGKILL leaves of them
    JobRunRow.objects.filter(job_id__in=[k[0] for k in keys]).update(
        finished_at=datetime.now(UTC) - timedelta(seconds=history_moves.SWEEP_AFTER_SECONDS + 5)
    )
    set_turn(turns.HISTORY_SWEEP, None)
    try:
        sweeper = steps()
        if on_citus():
            assert [where(key) for key in keys] == [(1, 0)] * 3
        sweeper.run(sweeper.executor._move_step())  # the reaper's step
        assert [where(key) for key in keys] == [(0, 1)] * 3
        # One turn per interval across executors.
        assert killed.run(killed.executor.sweep_history_once()) == 0
    finally:
        set_turn(turns.HISTORY_SWEEP, None)


def test_legacy_successes_in_job_runs_are_read_and_keep_their_key(tenant):
    """Successes written before run_history existed stay in job_runs until retention (on
    Citus, save those of the last day, which the sweep moves once they are five minutes
    old)."""
    (key,) = queue_runs(tenant, task_target("noop"))
    now = datetime.now(UTC)
    JobRunRow.objects.filter(job_id=key[0], scheduled_at=key[1]).update(
        status="succeeded", attempt=1, finished_at=now, started_at=now - timedelta(seconds=1)
    )
    assert JobRun.objects.get(job_id=key[0], scheduled_at=key[1]).status == "succeeded"
    assert again(tenant, key) == []
    assert where(key) == (1, 0)
