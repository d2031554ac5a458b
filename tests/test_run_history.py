"""A success moves its run to run_history, written once; every other run stays in
job_runs; the run key stays unique across the two (docs/decisions/0085-run-history.md).
On Citus a success stays in place (runs/execution/queries.py, COMPLETE, says why).

The outcomes go through the executor's own statement (runs/execution/outcomes.py), the
inserts through runs.enqueue, on both engines (make test-citus runs this file too)."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, connections, transaction

from runs import history
from runs.attempts import AttemptRecord
from runs.enqueue import enqueue_runs
from runs.execution import outcomes
from runs.models import JobRun, JobRunRow, RunHistoryRow
from runs.rows import Completion, NewRun
from scheduler_project.citus import citus_installed
from tests.support.executor import on_executor_connection, queue_runs, set_running, task_target

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def succeeded_in():
    """Where a success's row is: (rows in job_runs, rows in run_history)."""
    with connection.cursor() as cursor:
        return (1, 0) if citus_installed(cursor) else (0, 1)


def complete(key, status: str, *, attempt: int = 1) -> set:
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
    return on_executor_connection(lambda conn: outcomes.complete_runs(conn, [completion]))


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


def test_a_success_moves_the_run_and_readers_see_it_once(tenant, succeeded_in):
    (key,) = queue_runs(tenant, task_target("noop"))
    set_running(key)
    assert where(key) == (1, 0)
    assert len(complete(key, "succeeded")) == 1
    assert where(key) == succeeded_in
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
def test_a_run_reads_the_same_after_its_move(tenant, succeeded_in, values):
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
    assert where(key) == succeeded_in
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
    if succeeded_in == (0, 1):
        # The uncommon ones, with the start and the second attempt.
        assert stored_sparse_values(key) == (0 if values == "common" else len(UNCOMMON) + 2)


@pytest.mark.parametrize("status", ["retrying", "dead"])
def test_any_other_outcome_stays_in_job_runs(tenant, status):
    (key,) = queue_runs(tenant, task_target("noop"))
    set_running(key)
    assert len(complete(key, status)) == 1
    assert where(key) == (1, 0)
    assert JobRun.objects.get(job_id=key[0], scheduled_at=key[1]).status == status


def test_a_retried_run_keeps_its_history_when_it_moves(tenant, succeeded_in):
    (key,) = queue_runs(tenant, task_target("noop"))
    set_running(key)
    complete(key, "retrying")
    set_running(key, attempt=2)
    complete(key, "succeeded", attempt=2)
    run = JobRun.objects.get(job_id=key[0], scheduled_at=key[1])
    assert where(key) == succeeded_in
    assert [entry[5] for entry in run.attempts] == ["retrying", "succeeded"]


def test_a_fenced_off_success_moves_nothing(tenant):
    (key,) = queue_runs(tenant, task_target("noop"))
    set_running(key, attempt=2)
    assert complete(key, "succeeded", attempt=1) == set()
    assert where(key) == (1, 0)


def test_an_occurrence_that_succeeded_is_not_inserted_again(tenant, succeeded_in):
    (key,) = queue_runs(tenant, task_target("noop"))
    set_running(key)
    complete(key, "succeeded")
    assert again(tenant, key) == []
    assert where(key) == succeeded_in


def test_an_insert_waiting_on_the_success_of_its_occurrence_inserts_nothing(tenant, succeeded_in):
    """The success commits while the insert waits on the row it is moving: job_runs' key
    no longer holds the occurrence when the insert goes on, run_history does."""
    if succeeded_in == (1, 0):
        pytest.skip("on Citus no success moves")
    (key,) = queue_runs(tenant, task_target("noop"))
    set_running(key)
    run = JobRun.objects.get(job_id=key[0], scheduled_at=key[1])
    moving = threading.Event()
    commit = threading.Event()

    def succeed_slowly():
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(
                    "WITH m AS (DELETE FROM job_runs WHERE partition_id = %s AND job_id = %s"
                    " AND scheduled_at = %s RETURNING *) " + history.insert_sql("m"),
                    [run.partition_id, key[0], key[1]],
                )
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


def test_legacy_successes_in_job_runs_are_read_and_keep_their_key(tenant):
    """Successes written before run_history existed stay in job_runs until retention."""
    (key,) = queue_runs(tenant, task_target("noop"))
    now = datetime.now(UTC)
    JobRunRow.objects.filter(job_id=key[0], scheduled_at=key[1]).update(
        status="succeeded", attempt=1, finished_at=now, started_at=now - timedelta(seconds=1)
    )
    assert JobRun.objects.get(job_id=key[0], scheduled_at=key[1]).status == "succeeded"
    assert again(tenant, key) == []
    assert where(key) == (1, 0)
