"""cancel_previous: the newest occurrence wins, whatever order the claims come in.

The claim SQL is run directly (runs.execution.claims.claim_runs on an executor connection)
against the real database, with the other occurrence put in each state by hand.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from runs.execution import claims, connections, fair_share
from runs.models import JobRunRow
from tests.conftest import database_url
from tests.support.executor import claim_now, queue_runs, row, set_running, task_target

SUPERSEDED = "cancelled: a newer occurrence of this job supersedes it (cancel_previous)"


@pytest.fixture
def pair(transactional_db, tenant):
    """(older, newer): two queued occurrences of one cancel_previous job, a minute apart."""
    older, newer = queue_runs(
        tenant,
        task_target("noop"),
        count=2,
        job_id=uuid.uuid4(),
        spacing=timedelta(minutes=1),
        overlap_policy="cancel_previous",
    )
    return older, newer


def set_status(key, status: str, **fields) -> None:
    JobRunRow.objects.filter(job_id=key[0], scheduled_at=key[1]).update(status=status, **fields)


def claimed_keys(claimed) -> set:
    return {(c.job_id, c.scheduled_at) for c in claimed}


def running(keys) -> list:
    return [k for k in keys if row(k).status == "running"]


def test_newer_claimed_while_older_runs_cancels_the_older(pair):
    older, newer = pair
    set_running(older)
    assert claimed_keys(claim_now()) == {newer}
    assert row(older).status == "cancelled" and row(older).last_error == "cancelled by a newer run"
    assert running(pair) == [newer]


def test_older_retry_claimed_while_newer_runs_is_cancelled_not_started(pair):
    """The reproduced hole: an older `retrying` occurrence became due while a newer one ran."""
    older, newer = pair
    set_running(newer)
    set_status(older, "retrying", attempt=1)
    assert claim_now() == []
    run = row(older)
    assert (run.status, run.attempt, run.last_error) == ("cancelled", 1, SUPERSEDED)
    assert run.finished_at is not None and run.lease_until is None
    assert running(pair) == [newer]
    assert row(newer).attempt == 1  # untouched


def test_both_waiting_the_newer_starts_and_the_older_is_cancelled(pair):
    older, newer = pair
    assert claimed_keys(claim_now()) == {newer}
    assert row(older).status == "cancelled" and row(older).last_error == SUPERSEDED
    assert row(older).attempt == 0  # it never started


def test_both_waiting_one_slot_at_a_time_never_starts_the_older(pair):
    older, newer = pair
    # The oldest comes first in claim order: it is cancelled, not started, and the
    # newer one is claimed by the next claim.
    started = claimed_keys(claim_now(limit=1)) | claimed_keys(claim_now(limit=1))
    assert started == {newer}
    assert row(older).status == "cancelled" and row(older).attempt == 0


def test_older_due_while_newer_waits_for_its_jitter_is_cancelled(pair):
    older, newer = pair
    set_status(newer, "queued", not_before=datetime.now(UTC) + timedelta(hours=1))
    set_status(older, "retrying", attempt=2)
    assert claim_now() == []
    assert row(older).status == "cancelled"
    assert row(newer).status == "queued"


def test_older_retry_after_the_newer_succeeded_is_cancelled(pair):
    older, newer = pair
    set_status(newer, "succeeded", attempt=1, finished_at=datetime.now(UTC))
    set_status(older, "retrying", attempt=1)
    assert claim_now() == []
    assert row(older).status == "cancelled" and row(older).last_error == SUPERSEDED


@pytest.mark.parametrize("newer_status", ["dead", "cancelled", "skipped"])
def test_older_retry_runs_when_the_newer_never_did_the_work(pair, newer_status):
    older, newer = pair
    set_status(newer, newer_status, finished_at=datetime.now(UTC))
    set_status(older, "retrying", attempt=1)
    assert claimed_keys(claim_now()) == {older}
    assert row(older).attempt == 2


def test_other_policies_are_not_superseded(transactional_db, tenant):
    older, newer = queue_runs(
        tenant,
        task_target("noop"),
        count=2,
        job_id=uuid.uuid4(),
        spacing=timedelta(minutes=1),
        overlap_policy="allow",
    )
    set_running(newer)
    assert claimed_keys(claim_now()) == {older}
    assert sorted(running([older, newer])) == sorted([older, newer])


def test_a_claim_whose_work_map_saw_no_cancel_previous_run_takes_none(pair, per_partition_forms):
    """The per-shard claim leaves cancel_previous's steps out when the work map saw no
    such run in its partitions (queries.CLAIM_IN_SHARD); then it must not take one
    either, or the older occurrence would go on running beside it. A claim whose map
    read sees the run takes it, and cancels the older."""
    older, newer = pair
    set_running(older)
    run = row(newer)

    async def scenario() -> tuple[list, list]:
        conn = await connections.connect_async(database_url())
        try:
            # A planner whose map has not seen the run (as when it was queued after the read).
            lean = await claims._claim_in(
                conn,
                in_shard={run.partition_id: {run.tenant_id: 5}},
                owner="test-claimer",
                aging_seconds=claims.DEFAULT_AGING_SECONDS,
                planner=fair_share.Planner(),
            )
            full = await claims.claim_runs(
                conn, owner="test-claimer", limit=5, holds=claims.Holds(owner="test-claimer")
            )
            return lean, full
        finally:
            await conn.close()

    lean, full = asyncio.run(scenario())
    assert lean == []
    assert claimed_keys(full) == {newer}
    assert row(older).status == "cancelled" and running(pair) == [newer]


@pytest.mark.parametrize("aged", [False, True], ids=["not-aged", "aged"])
@pytest.mark.parametrize("cancel_previous", [False, True], ids=["lean", "cancel_previous"])
def test_every_form_of_the_shard_claim_runs_and_claims(transactional_db, tenant, aged, cancel_previous):
    """Each of the four forms of queries.CLAIM_IN_SHARD, built from optional fragments
    (queries._claim), is a statement that runs and claims a plain run: a form only some
    work maps pick (an aged tenant beside a cancel_previous run) is otherwise met first
    in production."""
    (key,) = queue_runs(tenant, task_target("noop"))
    planner = fair_share.Planner()
    planner.aged = lambda: {tenant.id} if aged else set()
    planner.cancel_previous = lambda partitions, tenants: cancel_previous
    partition = row(key).partition_id

    async def claim() -> list:
        conn = await connections.connect_async(database_url())
        try:
            return await claims._claim_in(
                conn,
                in_shard={partition: {tenant.id: 5}},
                owner="test-claimer",
                aging_seconds=claims.DEFAULT_AGING_SECONDS,
                planner=planner,
            )
        finally:
            await conn.close()

    assert claimed_keys(asyncio.run(claim())) == {key}
    assert row(key).status == "running"
